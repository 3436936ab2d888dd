"""Shared pieces of the synthetic generators: palette, shape rasterisation, textured
backgrounds, split sizes, and ``ensure_generated`` (skip / temp folder / stamp logic).

All randomness comes from ``numpy.random.Generator`` objects seeded per item, so an item's
pixels depend only on (seed, item index), never on the order items are generated in.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from captioning.errors import ConfigError
from captioning.utils.io import atomic_write_json, read_json

log = logging.getLogger(__name__)

# Saturated colours that stay far (> ~110 in RGB distance) from the grey backgrounds and
# (> 2 * COLOUR_TOLERANCE) from each other, so "which colour is this pixel" is unambiguous (tests rely on it).
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (215, 35, 35),
    "green": (40, 175, 50),
    "blue": (30, 90, 235),
    "yellow": (240, 215, 40),
    "purple": (170, 45, 190),
    "white": (245, 245, 245),
}
COLOURS: tuple[str, ...] = tuple(PALETTE)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross")
PLURALS: dict[str, str] = {
    "circle": "circles",
    "square": "squares",
    "triangle": "triangles",
    "star": "stars",
    "cross": "crosses",
}
NUMBERS: dict[int, str] = {1: "one", 2: "two", 3: "three", 4: "four"}

# a pixel "has colour c" when it is within this RGB distance of PALETTE[c]
COLOUR_TOLERANCE = 70.0
STAMP = "generated.json"


def item_rng(seed: int, index: int, stream: int = 0) -> np.random.Generator:
    """The RNG of one item: depends only on (seed, index, stream)."""
    return np.random.default_rng([int(seed), int(index), int(stream)])


def shape_polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Vertices of a polygonal shape of 'radius' ``r`` (half its extent) centred at (cx, cy)."""

    def rot(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
        c, s = math.cos(angle), math.sin(angle)
        return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]

    if kind == "square":
        h = r * 0.82
        return rot([(-h, -h), (h, -h), (h, h), (-h, h)])
    if kind == "triangle":
        return rot([(r * math.cos(a), r * math.sin(a)) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)])
    if kind == "star":
        pts = []
        for i in range(10):
            rad = r if i % 2 == 0 else r * 0.47
            a = -math.pi / 2 + i * math.pi / 5
            pts.append((rad * math.cos(a), rad * math.sin(a)))
        return rot(pts)
    if kind == "cross":
        w = r * 0.36
        return rot([(-w, -r), (w, -r), (w, -w), (r, -w), (r, w), (w, w), (w, r), (-w, r),
                    (-w, w), (-r, w), (-r, -w), (-w, -w)])
    raise ValueError(f"unknown shape kind {kind!r}")


def shape_mask(kind: str, cx: float, cy: float, r: float, angle: float, width: int, height: int) -> np.ndarray:
    """Boolean mask [H, W] of one shape (no anti-aliasing: every pixel is in or out)."""
    im = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(im)
    if kind == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=255)
    else:
        draw.polygon(shape_polygon(kind, cx, cy, r, angle), fill=255)
    return np.asarray(im) > 0


def mask_box(mask: np.ndarray) -> list[int]:
    """Tight pixel box [x0, y0, x1, y1] of a non-empty mask (x1/y1 exclusive)."""
    ys = np.flatnonzero(mask.any(axis=1))
    xs = np.flatnonzero(mask.any(axis=0))
    return [int(xs[0]), int(ys[0]), int(xs[-1]) + 1, int(ys[-1]) + 1]


def textured_background(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A dim, low-saturation textured background, float32 [H, W, 3] in about [20, 175].

    Smooth random blobs (upsampled coarse noise) plus faint oriented stripes; the colour
    stays greyish so that it never looks like a palette colour.
    """
    base = rng.uniform(65.0, 115.0)
    tint = rng.uniform(-8.0, 8.0, size=3)
    grid = int(rng.integers(3, 9))
    coarse = rng.normal(0.0, 1.0, size=(grid, grid)).astype(np.float32)
    smooth = np.array(
        Image.fromarray(coarse, mode="F").resize((width, height), Image.Resampling.BILINEAR),
        dtype=np.float32,
    )
    smooth /= max(float(np.abs(smooth).max()), 1e-6)
    amp = rng.uniform(8.0, 22.0)
    theta = rng.uniform(0.0, math.pi)
    period = rng.uniform(6.0, 18.0) * max(width, height) / 224.0 + 3.0
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    stripes = np.sin(2 * math.pi * (xx * math.cos(theta) + yy * math.sin(theta)) / period)
    stripe_amp = rng.uniform(0.0, 7.0)
    grey = base + amp * smooth + stripe_amp * stripes
    return (grey[..., None] + tint[None, None, :]).astype(np.float32)


def add_noise(rng: np.random.Generator, canvas: np.ndarray, sigma: float) -> np.ndarray:
    """Add per-pixel noise of std ``sigma`` and quantise: float [H, W, 3] -> uint8 [H, W, 3].

    The noise is triangular (sum of two uniforms): Gaussian-looking and 2x cheaper to draw.
    """
    noisy = rng.random(size=canvas.shape, dtype=np.float32)
    noisy += rng.random(size=canvas.shape, dtype=np.float32)
    noisy -= np.float32(1.0)
    noisy *= np.float32(sigma * math.sqrt(6.0))
    noisy += canvas
    np.rint(noisy, out=noisy)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def colour_masks(pixels: np.ndarray, tolerance: float = COLOUR_TOLERANCE) -> dict[str, np.ndarray]:
    """For uint8 pixels [..., 3]: colour name -> bool mask of pixels within ``tolerance`` of it."""
    px = pixels.astype(np.float32)
    return {
        name: np.sqrt(((px - np.asarray(rgb, np.float32)) ** 2).sum(-1)) < tolerance
        for name, rgb in PALETTE.items()
    }


def split_sizes(n: int, splits: Sequence[float]) -> tuple[int, int, int]:
    """(train, val, test) counts for ``n`` items and fractions ``splits`` (summing to 1)."""
    if len(splits) != 3 or any(float(s) < 0 for s in splits) or abs(sum(splits) - 1.0) > 1e-6:
        raise ConfigError(
            f"synthetic splits must be three non-negative fractions summing to 1 "
            f"(train, val, test), got {tuple(splits)}"
        )
    n_train = int(round(n * float(splits[0])))
    n_val = min(n - n_train, int(round(n * float(splits[1]))))
    return n_train, n_val, n - n_train - n_val


def caption_tokens(caption: str) -> list[str]:
    """Lower-case word tokens (punctuation dropped), as the PTB tokenizer sees our captions."""
    return re.findall(r"[a-z]+", caption.lower())


def caption_stats(captions: Sequence[str]) -> dict[str, Any]:
    lengths = [len(caption_tokens(c)) for c in captions]
    vocab = sorted({t for c in captions for t in caption_tokens(c)})
    return {
        "vocab_size": len(vocab),
        "vocabulary": vocab,
        "max_tokens": max(lengths, default=0),
        "mean_tokens": round(float(np.mean(lengths)) if lengths else 0.0, 3),
    }


def parallel_map(fn: Callable[[Any], Any], tasks: Sequence[Any], workers: int | None = None) -> list[Any]:
    """``[fn(t) for t in tasks]``, in order, on up to ``workers`` processes (None: up to 4 CPUs).

    Each item depends only on its own task, so the result does not depend on ``workers``.
    """
    if workers is None:
        workers = min(4, os.cpu_count() or 1) if len(tasks) >= 64 else 1
    if workers <= 1 or len(tasks) < 2:
        return [fn(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, tasks, chunksize=max(1, min(32, len(tasks) // (4 * workers)))))


@dataclass(frozen=True)
class _Dataset:
    default_items: int
    media_dir: str


DATASETS: dict[str, _Dataset] = {
    "shapes": _Dataset(default_items=3000, media_dir="images"),
    "moving_shapes": _Dataset(default_items=1200, media_dir="videos"),
}
GENERATOR_VERSION = 1


def generation_params(
    dataset: str,
    num_items: int | None = None,
    seed: int = 0,
    image_size: int = 224,
    frames: int = 48,
    video_size: int = 96,
) -> dict[str, Any]:
    """The parameters that determine a generated dataset (what the stamp records)."""
    if dataset not in DATASETS:
        raise ConfigError(f"unknown synthetic dataset {dataset!r}: use one of {sorted(DATASETS)}")
    n = DATASETS[dataset].default_items if num_items is None else int(num_items)
    if n < 1:
        raise ConfigError(f"num_items must be >= 1 for dataset={dataset}, got {n}")
    params: dict[str, Any] = {"dataset": dataset, "version": GENERATOR_VERSION, "num_items": n, "seed": int(seed)}
    if dataset == "shapes":
        if image_size < 32:
            raise ConfigError(f"image_size must be >= 32 for dataset=shapes, got {image_size}")
        params["image_size"] = int(image_size)
    else:
        if frames < 8:
            raise ConfigError(f"frames must be >= 8 for dataset=moving_shapes, got {frames}")
        if video_size < 32 or video_size % 2:
            raise ConfigError(f"video_size must be an even number >= 32 for dataset=moving_shapes, got {video_size}")
        params["frames"] = int(frames)
        params["video_size"] = int(video_size)
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
    frames: int = 48,
    video_size: int = 96,
    force: bool = False,
) -> dict[str, Any]:
    """Generate a synthetic dataset into ``root`` unless it is already there with the same parameters.

    The data are written into a temp folder next to ``root`` and moved in when complete; the
    stamp ``root/generated.json`` (parameters + summary) is written last, atomically, so an
    interrupted generation never looks finished.  Other content of ``root`` (e.g. extracted
    ``features/``) is left alone.  Returns ``{"generated": bool, "root", "params", "summary",
    "seconds"}``.
    """
    from captioning.data.synthetic.moving_shapes import generate_moving_shapes
    from captioning.data.synthetic.shapes import generate_shapes

    params = generation_params(dataset, num_items, seed, image_size, frames, video_size)
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
            summary = generate_shapes(tmp, num_images=params["num_items"], seed=params["seed"],
                                      image_size=params["image_size"])
        else:
            summary = generate_moving_shapes(tmp, num_videos=params["num_items"], seed=params["seed"],
                                             frames=params["frames"], size=params["video_size"])
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
