"""End-to-end training through the real CLI: checkpoints, resume after SIGKILL, DDP, NaN handling."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, data_overrides, make_tiny_image_dataset, run_cli

pytestmark = pytest.mark.slow

FAST = [
    "model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16", "model.dropout=0.1",
    "optim.lr=0.01", "optim.warmup_steps=0", "logger=csv", "callbacks.progress_bar=none",
    "callbacks.early_stopping=false", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
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


def test_resume_after_sigkill_reproduces_run(tmp_path):
    data = make_tiny_image_dataset(tmp_path / "tiny", n=900)
    args = ["trainer.max_epochs=3", "data.batch_size=16", "optim.scheduler=none"]
    full = tmp_path / "full"
    run_cli("train", *train_args(data, full, *args))
    reference = read_losses(full)

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "captioning.cli.train", *train_args(data, killed, *args)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "MPLBACKEND": "Agg"})
    last = killed / "checkpoints" / "last.ckpt"
    deadline = time.time() + 300
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # into the next epoch
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "train_summary.json").exists(), "the run finished before it could be killed"

    run_cli("train", *train_args(data, killed, *args))  # same command: resumes from last.ckpt
    a = json.loads((full / "train_summary.json").read_text())
    b = json.loads((killed / "train_summary.json").read_text())
    assert a["global_step"] == b["global_step"]
    resumed = read_losses(killed)
    steps = sorted(reference)
    assert sorted(resumed) == steps
    np.testing.assert_allclose([resumed[s] for s in steps], [reference[s] for s in steps], rtol=1e-5, atol=1e-6)
    assert a["best_val_CIDEr"] == pytest.approx(b["best_val_CIDEr"], abs=1e-9)


def test_ddp_cpu_validation_equals_single_process_evaluation(tiny_images, tmp_path):
    run_dir = tmp_path / "ddp"
    run_cli("train", *train_args(tiny_images, run_dir, "trainer=ddp_cpu", "trainer.max_epochs=3",
                                 "callbacks.save_top_k=0"), timeout=900)
    summary = json.loads((run_dir / "train_summary.json").read_text())
    logged = summary["metrics"]
    out = tmp_path / "eval"
    run_cli("evaluate", f"ckpt_path={run_dir}/checkpoints/last.ckpt", "split=val", "decode=greedy",
            f"output_dir={out}", "metrics=[bleu,cider]", "num_workers=0", "grounding=false",
            f"hydra.run.dir={tmp_path}/hydra")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["CIDEr"] == pytest.approx(logged["val/CIDEr"], abs=1e-6)
    assert metrics["Bleu_4"] == pytest.approx(logged["val/BLEU_4"], abs=1e-6)
    assert logged["val/items"] == len(tiny_images["splits"]["val"])


def _poison(data: dict) -> None:
    """Put NaN into one training item's committed feature row on disk (bit rot after extraction;
    the writer itself refuses non-finite features)."""
    import shutil

    from captioning.data.store import FeatureStore

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
    """compile=true (CaptionDecoder.compute_loss_static under torch.compile, captions padded to
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
