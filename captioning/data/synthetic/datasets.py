"""The table of embedded synthetic datasets and ``ensure_generated`` (skip / temp folder / stamp).

This module imports both generators; the generators import only :mod:`.common`, so there is no
import cycle.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captioning.data.synthetic import moving_shapes, shapes
from captioning.errors import ConfigError
from captioning.utils.io import atomic_write_json, read_json

log = logging.getLogger(__name__)

STAMP = "generated.json"
# 2: shapes with shared colours/shapes in 2-6 objects on a 7x7 layout grid; moving_shapes with
# brief, frame-permutation-symmetric events (see the two generator modules).
GENERATOR_VERSION = 2


@dataclass(frozen=True)
class _Dataset:
    default_items: int
    media_dir: str


DATASETS: dict[str, _Dataset] = {
    "shapes": _Dataset(default_items=shapes.DEFAULT_NUM_IMAGES, media_dir="images"),
    "moving_shapes": _Dataset(default_items=moving_shapes.DEFAULT_NUM_VIDEOS, media_dir="videos"),
}


def generation_params(
    dataset: str,
    num_items: int | None = None,
    seed: int = 0,
    image_size: int = 224,
    frames: int = moving_shapes.DEFAULT_FRAMES,
    video_size: int = 96,
    events: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The parameters that determine a generated dataset (what the stamp records)."""
    if dataset not in DATASETS:
        raise ConfigError(f"unknown synthetic dataset {dataset!r}: use one of {sorted(DATASETS)}")
    n = DATASETS[dataset].default_items if num_items is None else int(num_items)
    if n < 1:
        raise ConfigError(f"num_items must be >= 1 for dataset={dataset}, got {n}")
    params: dict[str, Any] = {"dataset": dataset, "version": GENERATOR_VERSION, "num_items": n, "seed": int(seed)}
    if dataset == "shapes":
        if image_size < 64:
            raise ConfigError(f"image_size must be >= 64 for dataset=shapes, got {image_size}")
        params["image_size"] = int(image_size)
    else:
        if frames < moving_shapes.UNITS:
            raise ConfigError(f"frames must be >= {moving_shapes.UNITS} for dataset=moving_shapes "
                              f"(a multiple of {moving_shapes.UNITS} is best), got {frames}")
        if video_size < 32 or video_size % 2:
            raise ConfigError(f"video_size must be an even number >= 32 for dataset=moving_shapes, got {video_size}")
        params["frames"] = int(frames)
        params["video_size"] = int(video_size)
        params["events"] = list(moving_shapes.check_events(moving_shapes.DEFAULT_EVENTS if events is None else events))
    return params


def read_stamp(root: str | Path) -> dict[str, Any] | None:
    """The stamp of a finished generation under ``root``, or None (missing or unreadable)."""
    path = Path(root) / STAMP
    if not path.is_file():
        return None
    try:
        stamp = read_json(path, "generation stamp")
    except Exception:  # a corrupt stamp means "not finished"
        return None
    return stamp if isinstance(stamp, dict) else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temps(root: Path) -> None:
    """Delete temp folders of interrupted generations of ``root`` whose process is gone."""
    if not root.parent.is_dir():
        return
    for p in root.parent.glob(f".{root.name}.tmp-*"):
        m = re.fullmatch(rf"\.{re.escape(root.name)}\.tmp-(\d+)", p.name)
        if m and p.is_dir() and not _pid_alive(int(m.group(1))):
            log.info("removing leftover temp folder %s", p)
            shutil.rmtree(p, ignore_errors=True)


def ensure_generated(
    dataset: str,
    root: str | Path | None = None,
    *,
    num_items: int | None = None,
    seed: int = 0,
    image_size: int = 224,
    frames: int = moving_shapes.DEFAULT_FRAMES,
    video_size: int = 96,
    events: Sequence[str] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Generate a synthetic dataset into ``root`` unless it is already there with the same parameters.

    The data are written into a temp folder next to ``root`` and moved in when complete; the
    stamp ``root/generated.json`` (parameters + summary) is written last, atomically, so an
    interrupted generation never looks finished.  Other content of ``root`` (e.g. extracted
    ``features/``) is left alone.  Returns ``{"generated": bool, "root", "params", "summary",
    "seconds"}``.
    """
    params = generation_params(dataset, num_items, seed, image_size, frames, video_size, events)
    root = Path(root) if root is not None else Path("data") / dataset
    stamp = read_stamp(root)
    if stamp is not None and stamp.get("params") == params and not force:
        log.info("%s already generated in %s with the same parameters: skipping (force=true regenerates)", dataset, root)
        return {"generated": False, "root": str(root), "params": params, "summary": stamp.get("summary"), "seconds": 0.0}

    _remove_stale_temps(root)
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    t0 = time.perf_counter()
    try:
        if dataset == "shapes":
            summary = shapes.generate_shapes(tmp, num_images=params["num_items"], seed=params["seed"],
                                             image_size=params["image_size"])
        else:
            summary = moving_shapes.generate_moving_shapes(
                tmp, num_videos=params["num_items"], seed=params["seed"], frames=params["frames"],
                size=params["video_size"], events=params["events"])
        summary = {k: v for k, v in summary.items() if k != "root"}
        root.mkdir(parents=True, exist_ok=True)
        (root / STAMP).unlink(missing_ok=True)  # from here on the old data no longer count as finished
        for name in (DATASETS[dataset].media_dir, "annotations"):
            old = root / f".{name}.old-{os.getpid()}"
            if (root / name).exists():
                os.replace(root / name, old)
            os.replace(tmp / name, root / name)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.perf_counter() - t0
    if (root / "features").exists():
        log.warning("%s was regenerated: features under %s/features were extracted from the old data; "
                    "re-extract them", dataset, root)
    atomic_write_json(root / STAMP, {"params": params, "summary": summary})
    return {"generated": True, "root": str(root), "params": params, "summary": summary, "seconds": seconds}
