"""Shared fixtures: tiny COCO/MSR-VTT style datasets with a FeatureStore, and CLI runners."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Under pytest-xdist (`make test`) the workers share the cores: each gets cores / workers torch
# threads (inherited by the CLIs it starts), since 2 workers x 2 OpenMP threads on 2 cores
# oversubscribe them and spinning threads cost more than the second worker gains.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    _threads = max(1, _cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(_threads))
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# pytest-xdist's --dist loadfile with --no-loadscope-reorder (the Makefile's; by default xdist hands
# out the files with the most tests first) hands test files out in collection order: the longest
# file (one ~6-minute end-to-end reproduction) goes first, not last where it alone would run on
# while the other workers sit idle.
LONGEST_FIRST = ("test_reproduce.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the rest keep their order


REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FAKECAP = SHARED / "reference" / "coco-caption-fakecap"

WORDS = ["red", "green", "blue", "circle", "square", "triangle"]


def run_cli(module: str, *args: str, cwd: Path | None = None, timeout: int = 600, env: dict | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m captioning.cli.<module> args...`` (a real CLI process, as a user would)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", **(env or {})}
    full_env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [sys.executable, "-m", f"captioning.cli.{module}", *args],
        cwd=cwd or REPO, env=full_env, capture_output=True, text=True, timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{module} {' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n"
            f"--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def run_bench(name: str, argv: str) -> list[dict]:
    """``captioning-bench <name> --device cpu <argv>`` in process: its result records."""
    import argparse
    import importlib

    bench = importlib.import_module(f"captioning_bench.{name}")
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    bench.add_arguments(parser)
    return bench.run(parser.parse_args(argv.split()))


def make_tiny_image_dataset(root: Path, n: int = 48, positions: int = 4, dim: int = 16, seed: int = 0) -> dict:
    """A COCO-format dataset whose captions are determined by its (synthetic) region features.

    Each item has one coloured shape at one of ``positions`` regions; its feature row there is a
    one-hot code of (colour, shape); the caption is "a <colour> <shape>". A decoder with
    attention can learn this in a few epochs.
    """
    from captioning.store.writer import FeatureStoreWriter

    rng = np.random.default_rng(seed)
    colours, shapes = WORDS[:3], WORDS[3:]
    splits = {"train": [], "val": [], "test": []}
    items = []
    for i in range(n):
        c, s, p = rng.integers(3), rng.integers(3), rng.integers(positions)
        feats = (rng.normal(0, 0.05, size=(positions, dim))).astype(np.float32)
        feats[p, c] += 1.0
        feats[p, 3 + s] += 1.0
        split = "train" if i < n * 2 // 3 else ("val" if i < n * 5 // 6 else "test")
        caps = [f"a {colours[c]} {shapes[s]}.", f"A {colours[c]} {shapes[s]}", f"there is a {colours[c]} {shapes[s]}"]
        items.append((i + 1, split, caps, feats))
        splits[split].append(i + 1)
    ann_dir = root / "annotations"
    ann_dir.mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    for split in splits:
        images = [{"id": i, "file_name": f"{i:06d}.jpg", "width": 64, "height": 64} for i, sp, _, _ in items if sp == split]
        anns = []
        for i, sp, caps, _ in items:
            if sp == split:
                anns += [{"id": i * 10 + k, "image_id": i, "caption": c} for k, c in enumerate(caps)]
        (ann_dir / f"captions_{split}.json").write_text(json.dumps({"images": images, "annotations": anns}))
    meta = {"settings": {"backbone": "synthetic", "weights": "none"}, "kind": "image",
            "positions": positions, "dim": dim, "grid": [2, positions // 2], "dtype": "float16"}
    writer = FeatureStoreWriter(root / "features" / "synthetic", meta, shard_size=16)
    for i, _, _, feats in items:
        writer.add(str(i), feats)
    writer.close()
    return {"root": root, "features_dir": root / "features" / "synthetic", "splits": splits}


def data_overrides(root: Path, features_dir: Path) -> list[str]:
    """Command-line overrides that point ``data=coco_format`` at a tiny dataset."""
    return [
        "data=shapes",
        "data.name=tiny",
        f"data.root={root}",
        "data.synthetic=null",
        f"data.grounding={root}/annotations/grounding.json",
        f"features_dir={features_dir}",
        "data.num_workers=0",
        "data.batch_size=8",
    ]


@pytest.fixture
def tiny_images(tmp_path: Path) -> dict:
    return make_tiny_image_dataset(tmp_path / "tiny")


def featurize_files(backbone, paths, kind: str, **kwargs) -> list:
    """``captioning.features.featurize.featurize`` for a list of files, in their order (ids = positions)."""
    from captioning.features.featurize import featurize

    got = {}
    for batch in featurize(backbone, [(str(i), str(p)) for i, p in enumerate(paths)], kind, **kwargs):
        got.update({f.item_id: f for f in batch})
    return [got[str(i)] for i in range(len(paths))]
