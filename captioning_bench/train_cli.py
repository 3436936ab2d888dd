"""``captioning-bench train --cli``: the training job as a user runs it, beside the benchmark's step.

The benchmark times one training step of the decoder on one batch held on the device; a user runs
``captioning-train``, where the loader, Lightning, logging, progress, checkpoints and validation
come on top.  This runs the real CLI (a subprocess, as a user would) with its default callbacks,
loggers and progress, on a synthetic dataset of the benchmark's shape (``--regions`` x
``--feature-dim`` fp16 features in a FeatureStore, 5 captions per item of ``length // 2 .. length``
words drawn uniformly from ``--vocab`` words) and the benchmark's model, over epochs of at least
``--cli-steps`` steps, and reads the wall time at the end of every training batch (``StepClock``,
one more callbacks node).  Beside it, each bound on its own, in this process:

- the loader alone (``loader_alone``): the job's data module's training batches on the device, with
  no model: the rate the input pipeline can feed;
- the loop alone (``loop_alone``): the job's Trainer, module, callbacks and loggers over one batch
  already on the device: what Lightning and the module cost around the step.

Steady state: the steps after the first ``warmup`` (compilation, CUDA graph recording, the first
loader batches) and after each epoch's first, per second of the time they took (loader waits and
logging included); validation and the checkpoint at each epoch's end are timed apart
(``epoch_end_s``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from captioning.store.writer import FeatureStoreWriter
from captioning_bench.scale.synthetic import item_id, word

__all__ = ["StepClock", "cli_figures", "cli_items", "cli_overrides", "loader_alone", "loop_alone", "run_cli",
           "steady_state", "write_dataset"]

CAPTIONS_PER_ITEM = 5


class StepClock(pl.Callback):
    """Records ``(epoch, seconds)`` at the end of every training batch and the start and end of
    every epoch; writes them as JSON to ``path`` when the fit ends (rank 0)."""

    def __init__(self, path: str | None = None) -> None:
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
        if self.path and trainer.global_rank == 0:
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
        images.append({"filepath": "synthetic", "filename": f"{i + 1:012d}.jpg", "imgid": i, "cocoid": int(item_id(i)),
                       "split": split, "sentences": sents, "sentids": [s["sentid"] for s in sents]})
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset_coco.json").write_text(json.dumps({"images": images, "dataset": "coco"}))
    grid = int(round(regions ** 0.5))
    if grid * grid != regions:
        raise ValueError(f"--regions {regions} is not a square grid")
    # 64 random items cycled: the timing does not depend on the values, and a 1,000-step epoch at
    # 14x14x2048 (13,000 items, 10 GB) is written in seconds instead of drawn for minutes
    pool = np.maximum(rng.standard_normal((min(64, total), regions, dim), dtype=np.float32), 0).astype(np.float16)
    meta = {"settings": {"backbone": "synthetic-random", "weights": "none", "seed": seed}, "kind": "image",
            "positions": regions, "dim": dim, "grid": [grid, grid], "dtype": "float16"}
    with FeatureStoreWriter(root / "features", meta) as writer:
        for i in range(total):
            writer.add(item_id(i), pool[i % len(pool)], copy=False)


def cli_items(args: Any) -> int:
    """Training items for epochs of ``--cli-steps`` steps (``--cli-items`` when given)."""
    if args.cli_items:
        return int(args.cli_items)
    if args.batching == "caption":
        return math.ceil(args.cli_steps * args.batch_size / CAPTIONS_PER_ITEM)
    return args.cli_steps * max(1, round(args.batch_size / CAPTIONS_PER_ITEM))


def cli_overrides(args: Any, root: Path, device: str, compile_setting: str, clock: Path | None) -> list[str]:
    """``captioning-train`` overrides: the synthetic data, the benchmark's model and batch, the
    trainer of ``device``, the clock; everything else (callbacks, loggers, progress) the job's own."""
    return [
        "data=coco", f"data.root={root}", "data.min_count=1", f"data.max_length={args.length}",
        f"data.batch_size={args.batch_size}", f"data.num_workers={args.cli_workers}", f"features_dir={root}/features",
        f"data.batching={args.batching}", f"data.cache={args.cli_cache}",
        "model=soft_attention", f"model.embed_dim={args.embed}", f"model.hidden_dim={args.hidden}",
        f"model.attention_dim={args.attention_dim}", f"model.deep_output={str(bool(args.deep_output)).lower()}",
        "model.dropout=0.3", f"trainer={'gpu' if device == 'cuda' else 'cpu'}", f"trainer.max_epochs={args.cli_epochs}",
        f"compile={compile_setting}", f"eval_batch_size={args.batch_size}", "decode=greedy",
        *([f"+callbacks.clock._target_={__name__}.StepClock", f"+callbacks.clock.path={clock}"] if clock else []),
        f"hydra.run.dir={root}/run", f"seed={args.seed}",
    ]


def run_cli(args: Any, root: Path, device: str, compile_setting: str) -> dict[str, Any]:
    """Train with ``captioning-train`` on the dataset at ``root``: its steady state and seconds."""
    clock = root / "clock.json"
    cmd = [sys.executable, "-m", "captioning.cli.train", *cli_overrides(args, root, device, compile_setting, clock)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
    if device == "cpu" and getattr(args, "threads", 0):
        env["OMP_NUM_THREADS"] = str(args.threads)  # the CLI on the benchmark's threads
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 or not clock.is_file():
        raise RuntimeError(f"captioning-train exited {proc.returncode}: {proc.stderr[-3000:]}")
    return {**steady_state(json.loads(clock.read_text()), warmup=max(5, args.warmup)), "cli_s": seconds}


def _job(args: Any, root: Path, device: str, compile_setting: str) -> tuple[Any, Any]:
    """The job's own config and data module for the CLI's overrides (composed as the CLI composes)."""
    from hydra import compose, initialize_config_dir

    import captioning.cli.train  # noqa: F401  (registers the config schemas)
    from captioning.config import CONF_DIR, to_config
    from captioning.data.datamodule import CaptionDataModule
    from captioning.train.inputs import run_inputs
    from captioning.train.job import TrainConfig

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        node = compose(config_name="train", overrides=cli_overrides(args, root, device, compile_setting, None))
    node.output_dir = str(root / "alone")
    cfg = to_config(node, TrainConfig)
    inputs = run_inputs(cfg.data, cfg.features_dir, cfg.encoder)
    dm = CaptionDataModule(inputs.table, inputs.store, inputs.vocab, max_length=cfg.data.max_length,
                           batch_size=cfg.data.batch_size, eval_batch_size=cfg.eval_batch_size,
                           num_workers=cfg.data.num_workers, batching=cfg.data.batching,
                           captions_per_image=cfg.data.captions_per_image, cache=cfg.data.cache, seed=cfg.seed)
    return cfg, dm


class _Attached:
    """What a data module reads of its Trainer when no Trainer runs it (``loader_alone``)."""

    def __init__(self, device: torch.device) -> None:
        self.strategy, self.current_epoch = type("S", (), {"root_device": device})(), 0


def loader_alone(args: Any, root: Path, device: str, batches: int) -> dict[str, float]:
    """Training batches/s of the job's data module on ``device`` (cache fill included), no model."""
    _, dm = _job(args, root, device, "false")
    dm.trainer = _Attached(torch.device(device))
    loader = dm.train_dataloader()
    done, t0 = 0, None
    while done < batches:
        for batch in loader:
            batch = dm.on_after_batch_transfer(batch.to(device), 0)
            done += 1
            if done == 5:  # the loader's start-up apart
                _sync(device)
                t0 = time.perf_counter()
            if done >= batches:
                break
    _sync(device)
    return {"batches_per_s": (batches - 5) / (time.perf_counter() - t0), "batches": batches - 5}


def loop_alone(args: Any, root: Path, device: str, compile_setting: str, steps: int) -> dict[str, float]:
    """Steps/s of the job's Trainer, module, callbacks and loggers over ONE training batch already on
    ``device``, repeated ``steps`` times: the step plus what Lightning and the module add to it."""
    from captioning.train.job import build_trainer, new_module
    from captioning.train.module import config_dict
    from captioning.train.settings import ModuleSettings

    cfg, dm = _job(args, root, device, compile_setting)
    cfg.trainer.max_epochs, cfg.trainer.limit_val_batches = 1, 0
    for name in ("early_stopping", "checkpoint"):  # they act on validation scores, at an epoch's end
        cfg.callbacks.pop(name, None)
    dm.trainer = _Attached(torch.device(device))
    batch = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())).to(device), 0)
    settings = ModuleSettings.of(cfg).resolved(steps)
    model = new_module(cfg, settings, config_dict(cfg), dm.vocab.to_dict(), dict(dm.store.meta), initial_weights=True)
    clock = StepClock()
    trainer = build_trainer(cfg, root / "alone", None)
    trainer.callbacks.append(clock)
    trainer.fit(model, train_dataloaders=_Repeated(batch, steps))
    return steady_state({"batches": clock.batches}, warmup=max(5, args.warmup))


class _Repeated:
    """One batch, ``n`` times: a training "loader" that costs nothing."""

    def __init__(self, batch: Any, n: int) -> None:
        self.batch, self.n = batch, n

    def __iter__(self):
        return (self.batch for _ in range(self.n))

    def __len__(self) -> int:
        return self.n


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def cli_figures(args: Any, device: str, compile_setting: str, ours_s: float, baseline_s: float | None,
                shape: dict) -> list[dict]:
    """``train/cli`` (steps/s of the CLI), ``train/cli_vs_ours`` (of the benchmark's median step;
    target 0.9 on a GPU, 0.85 at the CPU proxy's shape), with the baseline ``train/cli_vs_baseline``
    (the tutorial decoder's step), and ``train/cli_loader`` / ``train/cli_loop`` (each bound alone)."""
    items = cli_items(args)
    eval_items = max(1, args.batch_size // 2)
    common = {"compile": compile_setting, "batching": args.batching, "cache": args.cli_cache, **shape}
    with tempfile.TemporaryDirectory(prefix="bench-train-cli-") as tmp:
        root = Path(tmp) / "data"
        t0 = time.perf_counter()
        write_dataset(root, items, eval_items, args.regions, args.feature_dim, args.vocab, args.length, args.seed)
        data_s = time.perf_counter() - t0
        got = run_cli(args, root, device, compile_setting)
        alone = min(300, max(50, got["steps"] // max(1, args.cli_epochs)))  # about an epoch, at most 300
        loader = loader_alone(args, root, device, alone)
        loop = loop_alone(args, root, device, compile_setting, alone)
    rate, per = got["steps_per_s"], args.batch_size if args.batching == "caption" else \
        max(1, round(args.batch_size / CAPTIONS_PER_ITEM)) * CAPTIONS_PER_ITEM
    out = [{"name": "train/cli", "unit": "steps/s", "value": round(rate, 3), "captions_per_s": round(rate * per, 1),
            "steps_timed": got["steps"], "epoch_end_s": round(got["epoch_end_s"], 2), "cli_s": round(got["cli_s"], 1),
            "data_s": round(data_s, 1), "items": items, "epochs": args.cli_epochs, "workers": args.cli_workers,
            **common},
           {"name": "train/cli_vs_ours", "unit": "fraction", "value": round(rate * ours_s, 3),
            "target": 0.9 if device == "cuda" else 0.85, **common},
           {"name": "train/cli_loader", "unit": "batches/s", "value": round(loader["batches_per_s"], 2),
            "vs_ours": round(loader["batches_per_s"] * ours_s, 3), "batches": loader["batches"], **common},
           {"name": "train/cli_loop", "unit": "steps/s", "value": round(loop["steps_per_s"], 3),
            "vs_ours": round(loop["steps_per_s"] * ours_s, 3), "steps_timed": loop["steps"], **common}]
    if baseline_s is not None:
        out.append({"name": "train/cli_vs_baseline", "unit": "x", "value": round(rate * per / args.batch_size
                                                                               * baseline_s, 2),
                    "target": 10.0 if device == "cuda" else None, **common})
    return out
