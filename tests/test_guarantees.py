"""Guarantees of docs/reliability.md met the way a user meets them, through the real CLIs.

- A checkpoint is never resumed or evaluated with another vocabulary or another encoder's
  features: exit status 2, one ``error:`` line naming the problem and the fix, no traceback.
- A non-finite loss (NaN, or inf features, which give a NaN loss) with ``optim.nonfinite=skip``
  is reported with its epoch and batch, both checked against the whole grid of batches; with
  ``stop`` the run ends with that message and the last checkpoint is left as it was.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import data_overrides, make_tiny_image_dataset, run_cli

pytestmark = pytest.mark.slow

N_ITEMS, BATCH = 24, 8  # 16 train items x 3 captions = 48 samples: 6 batches per epoch
BATCHES = 6
FAST = ["model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16", "optim.lr=0.01",
        "optim.warmup_steps=0", "optim.scheduler=none", "logger=csv", "callbacks.progress=null",
        "callbacks.early_stopping=null", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
        "data.grounding=null"]
ENV = {"OMP_NUM_THREADS": "1"}


def train(data: dict, run_dir: Path, *extra: str, features: Path | None = None, check: bool = True):
    args = [*data_overrides(data["root"], features or data["features_dir"]), f"data.batch_size={BATCH}", *FAST,
            f"hydra.run.dir={run_dir}", *extra]
    return run_cli("train", *args, env=ENV, check=check)


def one_error_line(proc) -> str:
    """The run's single ``error:`` line; exit status 2 and no traceback."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A tiny dataset and a finished 1-epoch run on it (copied by each test that resumes it)."""
    root = tmp_path_factory.mktemp("guarantees")
    data = make_tiny_image_dataset(root / "tiny", n=N_ITEMS)
    assert len(data["splits"]["train"]) * 3 == BATCHES * BATCH
    train(data, root / "run", "trainer.max_epochs=1")
    return {**data, "run": root / "run", "tmp": root}


def copy_run(trained: dict, dest: Path) -> Path:
    shutil.copytree(trained["run"], dest)
    return dest


def store_with(trained: dict, dest: Path, *, settings: dict | None = None, poison: float | None = None) -> Path:
    """A copy of the run's FeatureStore: with other encoder ``settings`` (same features), or with
    every training item's stored rows set to ``poison`` (bit rot after extraction: the writer
    itself refuses non-finite features)."""
    from captioning.store.feature_store import FeatureStore
    from captioning.store.writer import FeatureStoreWriter

    src = FeatureStore.open(trained["features_dir"])
    if settings is not None:
        writer = FeatureStoreWriter(dest, {**dict(src.meta), "settings": settings}, shard_size=16)
        for item_id in src.ids:
            writer.add(item_id, np.asarray(src[item_id].features, np.float32))
        writer.close()
        return dest
    shutil.copytree(trained["features_dir"], dest)
    store = FeatureStore.open(dest)
    for item_id in trained["splits"]["train"]:
        shard, row = store._index[str(item_id)][:2]
        arr = np.load(dest / "shards" / store._shards[shard], mmap_mode="r+")
        arr[row] = poison
        arr.flush()
        del arr
    return dest


# ------------------------------------------------------------------ vocabulary / encoder mismatch


def test_resume_with_another_vocabulary_is_refused(trained: dict, tmp_path: Path) -> None:
    """The same settings over other annotations (a file edited since: the paths are not part of the
    run's identity, its content is checked through the vocabulary)."""
    run = copy_run(trained, tmp_path / "run")
    before = (run / "checkpoints" / "last.ckpt").read_bytes()
    edited = tmp_path / "captions_train.json"
    source = Path(trained["root"]) / "annotations" / "captions_train.json"
    edited.write_text(source.read_text().replace(" red ", " crimson "))
    line = one_error_line(train(trained, run, "trainer.max_epochs=2", f"data.annotations.train={edited}", check=False))
    assert line.startswith("error: vocabulary mismatch: ") and str(run / "checkpoints" / "last.ckpt") in line
    assert "data.min_count" in line and "run_name=<name>" in line  # the fixes
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == before


def test_resume_with_features_of_another_encoder_is_refused(trained: dict, tmp_path: Path) -> None:
    other = store_with(trained, tmp_path / "resnet50", settings={"backbone": "resnet50", "weights": "none"})
    run = copy_run(trained, tmp_path / "run")
    before = (run / "checkpoints" / "last.ckpt").read_bytes()
    line = one_error_line(train(trained, run, "trainer.max_epochs=2", features=other, check=False))
    assert line.startswith(f"error: {run} holds another run") and "store_id" in line  # the store is part of the run
    assert f"point features_dir at the run's ({trained['features_dir']})" in line
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == before


def test_evaluate_with_features_of_another_encoder_is_refused(trained: dict, tmp_path: Path) -> None:
    other = store_with(trained, tmp_path / "resnet50", settings={"backbone": "resnet50", "weights": "none"})
    ckpt = trained["run"] / "checkpoints" / "last.ckpt"
    proc = run_cli("evaluate", f"ckpt_path={ckpt}", f"features_dir={other}", "split=val", f"output_dir={tmp_path}/eval",
                   "num_workers=0", f"hydra.run.dir={tmp_path}/hydra", env=ENV, check=False)
    line = one_error_line(proc)
    assert line.startswith("error: encoder mismatch: ") and str(ckpt) in line and "point features_dir at" in line
    assert not (tmp_path / "eval" / "metrics.json").exists()


# ------------------------------------------------------------------------------ non-finite loss

MESSAGE = re.compile(r"non-finite loss \((\w+)\) at epoch (\d+), batch (\d+) \(global step (\d+)\)")


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nonfinite_skip_names_the_epoch_and_the_batch(trained: dict, tmp_path: Path, value: float) -> None:
    """Every training item corrupted: every batch of both epochs is skipped and reported once, by
    its epoch (0, 1) and its batch within the epoch (0..5); none is missed, none named twice."""
    bad = store_with(trained, tmp_path / "bad", poison=value)
    proc = train(trained, tmp_path / "run", "trainer.max_epochs=2", "optim.nonfinite=skip", features=bad)
    log = proc.stdout + proc.stderr  # the warnings go to Hydra's console log
    found = [m.groups() for m in MESSAGE.finditer(log)]
    assert sorted((int(e), int(b)) for _, e, b, _ in found) == [(e, b) for e in range(2) for b in range(BATCHES)]
    assert all(int(step) == int(e) * BATCHES + int(b) for _, e, b, step in found)
    assert {loss for loss, *_ in found} == {"nan"}  # inf features give a NaN loss (inf - inf in attention)
    assert log.count("optimizer step skipped (optim.nonfinite=skip)") == 2 * BATCHES
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["epoch"] == 1 and all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nonfinite_stop_ends_the_run_and_keeps_the_last_checkpoint(trained: dict, tmp_path: Path,
                                                                   value: float) -> None:
    """Resuming the finished epoch-0 run on corrupted features with ``stop``: it stops at the first
    batch of epoch 1 (global step 6), says so in one line, and last.ckpt is the epoch-0 one."""
    bad = store_with(trained, tmp_path / "bad", poison=value)
    run = copy_run(trained, tmp_path / "run")
    last = run / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    proc = train(trained, run, "trainer.max_epochs=2", "optim.nonfinite=stop", features=bad, check=False)
    line = one_error_line(proc)
    assert line.startswith(f"error: non-finite loss (nan) at epoch 1, batch 0 (global step {BATCHES}), items ")
    assert "stopping" in line and "the last checkpoint is kept" in line and "optim.nonfinite=skip" in line
    assert last.read_bytes() == before
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["global_step"] == BATCHES and all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
