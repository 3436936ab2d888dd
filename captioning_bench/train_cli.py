"""``captioning-bench train --cli``: the training CLI's own step rate beside the benchmark's.

The benchmark times one training step of the decoder on one batch held in memory; a user runs
``captioning-train``, where the loader, Lightning, logging, checkpoints and validation come on
top.  This runs the real CLI (a subprocess, as a user would) on a synthetic dataset of the
benchmark's shape (``--regions`` x ``--feature-dim`` fp16 features in a FeatureStore, 5 captions
per item of ``length // 2 .. length`` words drawn uniformly from ``--vocab`` words, like the
benchmark's batch) with the benchmark's model, and reads the wall time at the end of every
training batch (``StepClock``, a Lightning callback given to the CLI as one more callbacks node).

Steady state: the steps after the first ``warmup`` (compilation, CUDA graph recording, the first
loader batches) and after each epoch's first, per second of the time they took (loader waits and
logging included); validation and the checkpoint at each epoch's end are timed apart
(``epoch_end_s``): on COCO an epoch is ~8,900 steps of 64 captions, here a few dozen, so in a
steps/s figure they would weigh hundreds of times more than they do in a real run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl

from captioning_bench.scale.synthetic import word, write_store

__all__ = ["StepClock", "cli_figures", "run_cli", "steady_state", "write_dataset"]

CAPTIONS_PER_ITEM = 5


class StepClock(pl.Callback):
    """Records ``(epoch, seconds)`` at the end of every training batch and the start and end of
    every epoch; writes them as JSON to ``path`` when the fit ends (rank 0)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.batches: list[tuple[int, float]] = []
        self.epochs: list[tuple[str, int, float]] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.epochs.append(("start", trainer.current_epoch, time.perf_counter()))

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        self.batches.append((trainer.current_epoch, time.perf_counter()))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.epochs.append(("end", trainer.current_epoch, time.perf_counter()))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_rank == 0:
            Path(self.path).write_text(json.dumps({"batches": self.batches, "epochs": self.epochs}))


def steady_state(clock: dict, warmup: int) -> dict[str, float]:
    """Steps/s after the first ``warmup`` steps, each epoch's first step left out (its interval
    holds the previous epoch's validation and checkpoint), and the mean seconds from one epoch's
    last step to the next epoch's first (validation, checkpoint, loader restart)."""
    batches = clock["batches"]
    intervals, gaps = [], []
    for k in range(1, len(batches)):
        (e0, t0), (e1, t1) = batches[k - 1], batches[k]
        if e1 != e0:
            gaps.append(t1 - t0)
        elif k >= warmup:
            intervals.append(t1 - t0)
    if not intervals:
        raise RuntimeError(f"no steady-state steps: {len(batches)} steps, warmup {warmup}")
    return {"steps_per_s": len(intervals) / sum(intervals), "steps": len(intervals),
            "epoch_end_s": float(np.mean(gaps)) if gaps else 0.0}


def write_dataset(root: Path, items: int, eval_items: int, regions: int, dim: int, vocab: int, length: int,
                  seed: int = 0) -> None:
    """A Karpathy-layout caption file (``root/dataset_coco.json``: ``items`` train items and
    ``eval_items`` each for val and test) and a FeatureStore (``root/features``) of random
    ``[regions, dim]`` fp16 items."""
    rng = np.random.default_rng(seed)
    words = [word(r) for r in range(max(1, vocab - 4))]
    images = []
    total = items + 2 * eval_items
    for i in range(total):
        split = "train" if i < items else ("val" if i < items + eval_items else "test")
        sents = []
        for k in range(CAPTIONS_PER_ITEM):
            n = int(rng.integers(max(1, length // 2), length + 1))
            tokens = [words[j] for j in rng.integers(0, len(words), n)]
            sents.append({"tokens": tokens, "raw": " ".join(tokens), "imgid": i, "sentid": i * 5 + k})
        images.append({"filepath": "synthetic", "filename": f"{i + 1:012d}.jpg", "imgid": i, "cocoid": i + 1,
                       "split": split, "sentences": sents, "sentids": [s["sentid"] for s in sents]})
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset_coco.json").write_text(json.dumps({"images": images, "dataset": "coco"}))
    grid = int(round(regions ** 0.5))
    if grid * grid != regions:
        raise ValueError(f"--regions {regions} is not a square grid")
    write_store(root / "features", total, grid, dim, seed)


def cli_overrides(args: Any, root: Path, device: str, compile_setting: str, clock: Path) -> list[str]:
    """``captioning-train`` overrides: the synthetic data, the benchmark's model and batch, the
    trainer of ``device``, the clock; no progress bar, attention images or early stopping."""
    return [
        "data=coco", f"data.root={root}", "data.min_count=1", f"data.max_length={args.length}",
        f"data.batch_size={args.batch_size}", f"data.num_workers={args.cli_workers}", f"features_dir={root}/features",
        "model=soft_attention", f"model.embed_dim={args.embed}", f"model.hidden_dim={args.hidden}",
        f"model.attention_dim={args.attention_dim}", f"model.deep_output={str(bool(args.deep_output)).lower()}",
        "model.dropout=0.3", f"trainer={'gpu' if device == 'cuda' else 'cpu'}", f"trainer.max_epochs={args.cli_epochs}",
        f"compile={compile_setting}", f"eval_batch_size={args.batch_size}", "decode=greedy", "logger=csv",
        "callbacks.progress=null", "callbacks.attention_images=null", "callbacks.early_stopping=null",
        "trainer.enable_progress_bar=false", f"+callbacks.clock._target_={__name__}.StepClock",
        f"+callbacks.clock.path={clock}", f"hydra.run.dir={root}/run", f"seed={args.seed}",
    ]


def run_cli(args: Any, device: str, compile_setting: str) -> dict[str, Any]:
    """Train with ``captioning-train`` on a synthetic dataset of the benchmark's shape; its
    steady state (``steady_state``) and the command's seconds."""
    eval_items = max(1, args.batch_size // 2)
    with tempfile.TemporaryDirectory(prefix="bench-train-cli-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        write_dataset(root / "data", args.cli_items, eval_items, args.regions, args.feature_dim, args.vocab,
                      args.length, args.seed)
        data_s = time.perf_counter() - t0
        clock = root / "clock.json"
        cmd = [sys.executable, "-m", "captioning.cli.train",
               *cli_overrides(args, root / "data", device, compile_setting, clock)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0 or not clock.is_file():
            raise RuntimeError(f"captioning-train exited {proc.returncode}: {proc.stderr[-3000:]}")
        state = steady_state(json.loads(clock.read_text()), warmup=max(5, args.warmup))
    return {**state, "cli_s": seconds, "data_s": data_s}


def cli_figures(args: Any, device: str, compile_setting: str, ours_s: float, baseline_s: float | None,
                shape: dict) -> list[dict]:
    """``train/cli`` (steps/s of the CLI), ``train/cli_vs_ours`` (of the benchmark's median step,
    target 0.9) and, with the baseline, ``train/cli_vs_baseline`` (the tutorial decoder's step)."""
    got = run_cli(args, device, compile_setting)
    rate = got["steps_per_s"]
    common = {"compile": compile_setting, **shape}
    out = [{"name": "train/cli", "unit": "steps/s", "value": round(rate, 3), "captions_per_s": round(
        rate * args.batch_size, 1), "steps_timed": got["steps"], "epoch_end_s": round(got["epoch_end_s"], 2),
        "cli_s": round(got["cli_s"], 1), "data_s": round(got["data_s"], 1), "items": args.cli_items,
        "epochs": args.cli_epochs, "workers": args.cli_workers, **common},
        {"name": "train/cli_vs_ours", "unit": "fraction", "value": round(rate * ours_s, 3), "target": 0.9,
         **common}]
    if baseline_s is not None:
        out.append({"name": "train/cli_vs_baseline", "unit": "x", "value": round(rate * baseline_s, 2),
                    "target": 10.0 if device == "cuda" else None, **common})
    return out
