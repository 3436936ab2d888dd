"""End-to-end training through the real CLI: checkpoints, DDP gathering over odd splits, NaN handling, compile."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import data_overrides, make_tiny_image_dataset, run_cli

pytestmark = pytest.mark.slow

FAST = [
    "model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16", "model.dropout=0.1",
    "optim.lr=0.01", "optim.warmup_steps=0", "logger=csv", "callbacks.progress=null",
    "callbacks.early_stopping=null", "callbacks.attention_images=null", "trainer.log_every_n_steps=1",
    "trainer.enable_progress_bar=false",
]


def train_args(data: dict, run_dir: Path, *extra: str) -> list[str]:
    return [*data_overrides(data["root"], data["features_dir"]), *FAST, f"hydra.run.dir={run_dir}", *extra]


def read_losses(run_dir: Path) -> dict[int, float]:
    """step -> train/loss_step from the CSV log."""
    out: dict[int, float] = {}
    with open(run_dir / "csv" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            if row.get("train/loss_step"):
                out[int(row["step"])] = float(row["train/loss_step"])
    return out


def test_train_learns_and_writes_safe_checkpoint(tiny_images, tmp_path):
    run_dir = tmp_path / "run"
    run_cli("train", *train_args(tiny_images, run_dir, "trainer.max_epochs=12"))
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["global_step"] > 0
    assert summary["best_val_CIDEr"] > 1.0, summary  # captions are determined by the features
    ckpt = torch.load(summary["best_checkpoint"], weights_only=True)
    hp = ckpt["hyper_parameters"]
    assert hp["vocab"]["itos"][:4] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert hp["config"]["model"]["variant"] == "soft_attention"
    assert hp["feature_meta"]["dim"] == 16
    assert (run_dir / "vocab.json").is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()


# Resuming after SIGKILL (at every checkpoint commit step, mid-epoch, hard attention, compile=true)
# is tested in faults/test_interrupted_jobs.py: killed at a chosen point, never at a polled moment.


@pytest.fixture(scope="module")
def odd_split(tmp_path_factory) -> dict:
    """42 items: 28 train, 7 val, 7 test. Odd, so over 2 ranks DistributedSampler pads each of
    val and test with a repeated item that the gathering must drop."""
    data = make_tiny_image_dataset(tmp_path_factory.mktemp("odd") / "tiny", n=42)
    assert [len(data["splits"][s]) for s in ("train", "val", "test")] == [28, 7, 7]
    return data


def rank_payloads(proc, probe: Path, kind: type) -> dict[int, list]:
    """What each of the 2 ranks contributed to its last gather of ``kind`` items (lists for
    validation's (index, caption) pairs, dicts for predict's), asserting that 2 processes ran:
    Lightning's per-rank lines, and two probed processes with ranks 0 and 1 that gathered."""
    from faults.faultlib import probe_events

    for rank in (0, 1):
        assert f"Initializing distributed: GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/2" in proc.stdout + proc.stderr
    payloads: dict[int, tuple[int, list]] = {}
    for pid, events in probe_events(probe).items():
        for e in events:
            if (e["event"] == "all_gather_object" and e["payload"] and isinstance(e["payload"], list)
                    and isinstance(e["payload"][0], kind)):
                assert e["world_size"] == 2
                payloads[e["rank"]] = (pid, e["payload"])
    assert sorted(payloads) == [0, 1] and payloads[0][0] != payloads[1][0], payloads
    return {rank: payload for rank, (_, payload) in payloads.items()}


def evaluate(ckpt: Path, split: str, out: Path, *extra: str, env: dict | None = None):
    return run_cli("evaluate", f"ckpt_path={ckpt}", f"split={split}", "decode=greedy", f"output_dir={out}",
                   "metrics=[bleu,cider]", "num_workers=0", "grounding=false", "trainer.enable_progress_bar=false",
                   f"hydra.run.dir={out}/hydra", *extra, env=env, timeout=900)


def test_ddp_gathers_odd_splits_like_one_process_item_by_item(odd_split, tmp_path):
    """trainer=ddp_cpu over 7 val / 7 test items, 2 processes.  Validation during training: each rank
    decodes 4 items (DistributedSampler repeats one), the gathering drops the repeat, and the logged
    metrics and the captions item by item equal a single-process evaluation.  captioning-evaluate:
    the ranks decode 4 + 3 items, rank 0 writes the results, equal item by item to one process's."""
    from faults.faultlib import inject_env

    run_dir = tmp_path / "ddp"
    train = run_cli("train", *train_args(odd_split, run_dir, "trainer=ddp_cpu", "trainer.max_epochs=2",
                                         "trainer.limit_train_batches=2", "callbacks.checkpoint.save_top_k=0"),
                    env=inject_env(CAPTIONING_PROBE_DIR=tmp_path / "p-train"), timeout=900)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    ranks = rank_payloads(train, tmp_path / "p-train", list)  # the last validation's (index, caption) pairs
    assert [len(ranks[0]), len(ranks[1])] == [4, 4]
    pairs = [tuple(p) for r in (0, 1) for p in ranks[r]]
    assert len({i for i, _ in pairs}) == 7  # 8 decoded, one of them twice
    assert len(set(pairs)) == 7  # and the repeat gave the same caption
    logged = json.loads((run_dir / "train_summary.json").read_text())["metrics"]
    assert logged["val/items"] == 7

    one = tmp_path / "one-val"
    evaluate(ckpt, "val", one)
    single = json.loads((one / "predictions.json").read_text())
    assert [c for _, c in sorted(set(pairs))] == [p["caption"] for p in single]  # item by item
    metrics = json.loads((one / "metrics.json").read_text())
    assert logged["val/CIDEr"] == pytest.approx(metrics["CIDEr"], abs=1e-6)
    assert logged["val/BLEU_4"] == pytest.approx(metrics["Bleu_4"], abs=1e-6)

    ddp, one = tmp_path / "ddp-test", tmp_path / "one-test"
    proc = evaluate(ckpt, "test", ddp, "trainer=ddp_cpu", env=inject_env(CAPTIONING_PROBE_DIR=tmp_path / "p-eval"))
    ranks = rank_payloads(proc, tmp_path / "p-eval", dict)
    indices = [p["index"] for r in (0, 1) for p in ranks[r]]
    assert [len(ranks[0]), len(ranks[1])] == [4, 3]  # Lightning's predict sampler splits without repeats
    assert sorted(indices) == list(range(7))
    evaluate(ckpt, "test", one)
    for name in ("results.json", "metrics.json"):
        assert json.loads((ddp / name).read_text()) == json.loads((one / name).read_text()), name
    a, b = (json.loads((d / "predictions.json").read_text()) for d in (ddp, one))
    assert [p["image_id"] for p in a] == [p["image_id"] for p in b] == sorted(odd_split["splits"]["test"])
    assert [p["tokens"] for p in a] == [p["tokens"] for p in b]
    assert [p["score"] for p in a] == pytest.approx([p["score"] for p in b], rel=1e-5)


def _poison(data: dict) -> None:
    """Put NaN into one training item's committed feature row on disk (bit rot after extraction;
    the writer itself refuses non-finite features)."""
    import shutil

    from captioning.store.feature_store import FeatureStore

    root = data["features_dir"].parent / "poisoned"
    shutil.copytree(data["features_dir"], root)
    store = FeatureStore.open(root)
    shard, row = store._index[str(data["splits"]["train"][0])][:2]
    arr = np.load(root / "shards" / store._shards[shard], mmap_mode="r+")
    arr[row] = np.nan
    arr.flush()
    del arr
    data["features_dir"] = root


def test_nonfinite_loss_skip_and_stop(tiny_images, tmp_path):
    _poison(tiny_images)
    ok = run_cli("train", *train_args(tiny_images, tmp_path / "skip", "trainer.max_epochs=1",
                                      "optim.nonfinite=skip"))
    assert "non-finite loss" in ok.stderr + ok.stdout and "optimizer step skipped" in ok.stderr + ok.stdout
    ckpt = torch.load(tmp_path / "skip" / "checkpoints" / "last.ckpt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())

    bad = run_cli("train", *train_args(tiny_images, tmp_path / "stop", "trainer.max_epochs=1",
                                       "optim.nonfinite=stop"), check=False)
    assert bad.returncode == 2
    assert "non-finite loss" in bad.stderr and "batch" in bad.stderr


def test_compiled_fixed_shape_loss_trains_like_the_eager_loss(tiny_images, tmp_path):
    """compile=true (CaptionDecoder.compute_loss(static=True) under torch.compile, captions padded to
    data.max_length) gives the eager run's loss curve, under DDP (2 CPU processes, gradients
    synchronised through the compiled backward); hard attention is refused up front."""
    fast = [a for a in FAST if not a.startswith("model.dropout")]
    args = [*data_overrides(tiny_images["root"], tiny_images["features_dir"]), *fast, "model.dropout=0.0",
            "trainer=ddp_cpu", "trainer.max_epochs=2", "data.batch_size=16", "data.max_length=5",
            "optim.scheduler=none"]
    run_cli("train", *args, f"hydra.run.dir={tmp_path / 'eager'}")
    run_cli("train", *args, "compile=true", f"hydra.run.dir={tmp_path / 'compiled'}", timeout=900)
    eager, compiled = read_losses(tmp_path / "eager"), read_losses(tmp_path / "compiled")
    steps = sorted(eager)
    assert len(steps) >= 4 and sorted(compiled) == steps
    np.testing.assert_allclose([compiled[s] for s in steps], [eager[s] for s in steps], rtol=1e-4, atol=1e-5)

    bad = run_cli("train", *args, "compile=true", "model=hard_attention", f"hydra.run.dir={tmp_path / 'hard'}",
                  check=False)
    assert bad.returncode == 2 and "hard_attention" in bad.stderr and "compile=false" in bad.stderr
