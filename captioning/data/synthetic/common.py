"""Primitives shared by the synthetic generators: palette, shape rasterisation, textured
backgrounds, noise, split sizes, caption statistics and a deterministic parallel map.

All randomness comes from ``numpy.random.Generator`` objects seeded per item, so an item's
pixels depend only on (seed, item index), never on the order items are generated in.
The dataset table and ``ensure_generated`` live in :mod:`captioning.data.synthetic.datasets`
(which imports the generators; the generators import only this module).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from captioning.errors import ConfigError

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

# a pixel "has colour c" when it is within this RGB distance of PALETTE[c]
COLOUR_TOLERANCE = 70.0


def item_rng(seed: int, index: int, stream: int = 0) -> np.random.Generator:
    """The RNG of one item: depends only on (seed, index, stream)."""
    return np.random.default_rng([int(seed), int(index), int(stream)])


def shape_polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Vertices of a polygonal shape of 'radius' ``r`` centred at (cx, cy), rotated by ``angle``.

    Unrotated, every shape fits in the square ``[cx - r, cx + r] x [cy - r, cy + r]`` and its
    bounding box is (about) centred on (cx, cy): the triangle is shifted down by r/4 so that its
    box spans y in [cy - 0.75 r, cy + 0.75 r] (a star's spans [cy - r, cy + 0.81 r]).
    """

    def rot(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
        c, s = math.cos(angle), math.sin(angle)
        return [(cx + x * c - y * s, cy + x * s + y * c) for x, y in pts]

    if kind == "square":
        h = r * 0.82
        return rot([(-h, -h), (h, -h), (h, h), (-h, h)])
    if kind == "triangle":
        return rot([(r * math.cos(a), r * math.sin(a) + 0.25 * r)
                    for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)])
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
    """Vocabulary and caption lengths (in tokens, with a histogram) of a list of captions."""
    lengths = [len(caption_tokens(c)) for c in captions]
    vocab = sorted({t for c in captions for t in caption_tokens(c)})
    histogram: dict[str, int] = {}
    for n in sorted(lengths):
        histogram[str(n)] = histogram.get(str(n), 0) + 1
    return {
        "vocab_size": len(vocab),
        "vocabulary": vocab,
        "max_tokens": max(lengths, default=0),
        "mean_tokens": round(float(np.mean(lengths)) if lengths else 0.0, 3),
        "length_histogram": histogram,
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
