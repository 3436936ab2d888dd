"""Attention over an image's feature grid: each word's map smoothly upsampled over the image (the
Show-Attend-Tell figure).

An image attention row is a distribution over a ``grid = (h, w)`` of feature cells, given
flattened ``[h*w]`` (row-major, as the encoder flattens its feature map) or as ``[h, w]``.  Pure
numpy/PIL helpers (``upsample_attention``, ``render_overlay``, ``brightest_cell``, ...) do the
math; the figure functions lay them out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from captioning.viz.figures import (
    MARKER_COLOR,
    PANELS_PER_ROW,
    blend,
    display_image,
    normalise_map,
    save_figure,
    short_word,
    word_panels,
)


def _as_grid(att: np.ndarray, grid: tuple[int, int] | None) -> np.ndarray:
    """Return ``att`` ([h*w] or [h, w]) as a float64 [h, w] array."""
    a = np.asarray(att, dtype=np.float64)
    if a.ndim == 2:
        if grid is not None and tuple(a.shape) != tuple(grid):
            raise ValueError(f"attention map shape {a.shape} does not match grid {tuple(grid)}")
        return a
    if a.ndim != 1:
        raise ValueError(f"attention map must be [h*w] or [h, w], got shape {a.shape}")
    if grid is None:
        side = math.isqrt(a.size)
        if side * side != a.size:
            raise ValueError(f"attention of length {a.size} is not square; pass grid=(h, w)")
        grid = (side, side)
    h, w = int(grid[0]), int(grid[1])
    if h * w != a.size:
        raise ValueError(
            f"attention of length {a.size} does not fit grid {h}x{w} (= {h * w} cells)"
        )
    return a.reshape(h, w)


def _gaussian_kernel(sigma: float) -> np.ndarray:
    radius = max(1, int(math.ceil(3.0 * sigma)))
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    k = np.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()


def gaussian_blur(a: np.ndarray, sigma: float) -> np.ndarray:
    """Separable gaussian blur of a 2-D map [H, W] (reflect padding); ``sigma`` in pixels."""
    a = np.asarray(a, dtype=np.float64)
    if sigma <= 0:
        return a
    k = _gaussian_kernel(sigma)
    r = len(k) // 2
    # reflect padding needs r < size; fall back to edge padding for tiny maps
    mode_h = "reflect" if a.shape[0] > r else "edge"
    mode_w = "reflect" if a.shape[1] > r else "edge"
    p = np.pad(a, ((r, r), (0, 0)), mode=mode_h)
    a = sum(k[i] * p[i : i + a.shape[0]] for i in range(len(k)))
    p = np.pad(a, ((0, 0), (r, r)), mode=mode_w)
    return sum(k[i] * p[:, i : i + a.shape[1]] for i in range(len(k)))


def _cubic_matrix(n_out: int, n_in: int, a: float = -0.5) -> np.ndarray:
    """[n_out, n_in] bicubic (Keys) interpolation matrix, half-pixel centres, edge-clamped taps."""
    x = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5  # output pixel centre in input coordinates
    base = np.floor(x).astype(int)
    m = np.zeros((n_out, n_in))
    for off in (-1, 0, 1, 2):
        idx = base + off
        d = np.abs(x - idx)
        w = np.where(
            d <= 1,
            (a + 2) * d**3 - (a + 3) * d**2 + 1,
            np.where(d < 2, a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a, 0.0),
        )
        np.add.at(m, (np.arange(n_out), np.clip(idx, 0, n_in - 1)), w)
    return m


def upsample_attention(
    att: np.ndarray,
    size: tuple[int, int],
    *,
    grid: tuple[int, int] | None = None,
    sigma: float | None = None,
    normalise: bool = True,
) -> np.ndarray:
    """Smoothly upsample one attention map to an image size.

    att: [h, w] (or [h*w] with ``grid``; a square length is inferred); size: (H, W) in pixels.
    Bicubic interpolation with cell centres mapped onto pixel centres (half-pixel convention, so
    cell (r, c) lands at pixel ((r + .5) * H / h, (c + .5) * W / w); border cells extend flat to
    the image edge), clipped to the input's value range (no bicubic over/undershoot), then a
    gaussian blur of ``sigma`` pixels (default: 0.25 of
    a cell, removing the interpolation's faint ridges). Returns float32 [H, W], min-max scaled to
    [0, 1] when ``normalise`` (a flat map becomes all ones).
    """
    g = _as_grid(att, grid)
    g = np.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0)
    H, W = int(size[0]), int(size[1])
    if H <= 0 or W <= 0:
        raise ValueError(f"target size must be positive, got {size}")
    lo, hi = float(g.min()), float(g.max())
    out = _cubic_matrix(H, g.shape[0]) @ g @ _cubic_matrix(W, g.shape[1]).T
    out = np.clip(out, lo, hi)
    if sigma is None:
        sigma = 0.25 * min(H / g.shape[0], W / g.shape[1])
    out = gaussian_blur(out, float(sigma))
    return normalise_map(out) if normalise else out.astype(np.float32)


def brightest_cell(att: np.ndarray, grid: tuple[int, int] | None = None) -> tuple[int, int]:
    """(row, col) of the largest weight in one attention map ([h, w], or [h*w] with ``grid``)."""
    g = _as_grid(att, grid)
    r, c = np.unravel_index(int(np.nanargmax(g)), g.shape)
    return int(r), int(c)


def cell_center(
    cell: tuple[int, int], grid: tuple[int, int], size: tuple[int, int]
) -> tuple[float, float]:
    """Pixel centre (x, y) of grid cell (row, col) in an image of size (H, W)."""
    r, c = cell
    h, w = grid
    H, W = size
    return (c + 0.5) * W / w, (r + 0.5) * H / h


def render_overlay(
    image: np.ndarray,
    att_map: np.ndarray,
    grid: tuple[int, int] | None = None,
    *,
    cmap: str = "jet",
    alpha: float = 0.6,
    sigma: float | None = None,
    vmax: float | None = None,
    gray_base: bool = True,
) -> np.ndarray:
    """Alpha-blend one smoothly upsampled attention map over an image.

    image: [H, W, 3] uint8; att_map: [h, w] or [h*w] (with ``grid``). The map is upsampled to
    (H, W) (``upsample_attention``) and scaled to a heat in [0, 1]: min-max per map when ``vmax``
    is None, else ``weight / vmax`` (0 = no attention; pass the caption-wide maximum to make
    words comparable). The heat is coloured with ``cmap`` ("jet" like Show-Attend-Tell,
    "inferno", or "gray" for tests) and blended over the image (turned to grayscale first when
    ``gray_base``, so the image's own colours do not mix with the colormap) with an opacity that
    grows with the heat, so unattended regions stay legible:
    ``a = alpha * (0.4 + 0.6 * heat); out = (1 - a) * base + a * cmap(heat)``. Returns [H, W, 3] uint8.
    """
    img = np.asarray(image)
    if img.ndim != 3 or img.shape[-1] < 3:
        raise ValueError(f"image must be [H, W, 3], got shape {img.shape}")
    if vmax is None:
        heat = upsample_attention(att_map, img.shape[:2], grid=grid, sigma=sigma)
    else:
        raw = upsample_attention(att_map, img.shape[:2], grid=grid, sigma=sigma, normalise=False)
        heat = np.clip(raw / max(float(vmax), 1e-12), 0.0, 1.0)
    return blend(img, heat, cmap=cmap, alpha=alpha, gray_base=gray_base)


def _image_attention_rows(
    attention: np.ndarray, grid: tuple[int, int], n_tokens: int
) -> np.ndarray:
    a = np.asarray(attention, dtype=np.float64)
    h, w = int(grid[0]), int(grid[1])
    if a.ndim == 3:
        if a.shape[1:] != (h, w):
            raise ValueError(f"attention shape {a.shape} does not match grid {h}x{w}")
        a = a.reshape(a.shape[0], h * w)
    if a.ndim != 2 or a.shape[1] != h * w:
        raise ValueError(
            f"attention must be [T, {h * w}] or [T, {h}, {w}] for grid {h}x{w}, got {a.shape}"
        )
    if a.shape[0] != n_tokens:
        raise ValueError(
            f"{n_tokens} tokens but {a.shape[0]} attention rows; need one row per token"
        )
    return a


def build_image_attention_figure(
    image: np.ndarray,
    tokens: Sequence[str],
    attention: np.ndarray,
    grid: tuple[int, int],
    *,
    hard_points: Sequence[tuple[int, int]] | None = None,
    title: str | None = None,
    cmap: str = "jet",
    alpha: float = 0.6,
    normalise: str = "caption",
    panels_per_row: int = PANELS_PER_ROW,
) -> Figure:
    """Build (not save) the Show-Attend-Tell figure; ``fig.axes`` is [input, word_1 .. word_T].

    image: [H, W, 3] uint8; attention: [T, h*w] or [T, h, w]; grid: (h, w); hard_points: one
    (row, col) cell per token (the sampled/argmax location of a hard-attention model), marked on
    each panel. normalise: "caption" (heat = weight / the largest upsampled weight of the whole
    caption, so diffuse words look dim) or "word" (min-max per panel, as in Show-Attend-Tell).
    """
    if normalise not in ("caption", "word"):
        raise ValueError(f"normalise must be 'caption' or 'word', got {normalise!r}")
    tokens = [str(t) for t in tokens]
    rows_att = _image_attention_rows(attention, grid, len(tokens))
    if hard_points is not None and len(hard_points) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but {len(hard_points)} hard_points")
    img = display_image(image)
    H, W = img.shape[:2]
    ups = [upsample_attention(r, (H, W), grid=grid, normalise=False) for r in rows_att]
    if normalise == "caption":
        vmax = max([float(u.max()) for u in ups], default=1.0)
        heats = [np.clip(u / max(vmax, 1e-12), 0.0, 1.0) for u in ups]
    else:
        heats = [normalise_map(u) for u in ups]
    fig, flat = word_panels(img, tokens, title, panels_per_row)
    for i, tok in enumerate(tokens):
        ax = flat[i + 1]
        ax.imshow(
            blend(img, heats[i], cmap=cmap, alpha=alpha, gray_base=True), interpolation="bilinear"
        )
        ax.set_title(short_word(tok), fontsize=13, fontweight="bold", parse_math=False)
        if hard_points is not None:
            x, y = cell_center(tuple(hard_points[i]), grid, (H, W))
            ax.plot(
                [x],
                [y],
                marker="o",
                markersize=11,
                markerfacecolor="none",
                markeredgecolor=MARKER_COLOR,
                markeredgewidth=2.5,
            )
            ax.plot([x], [y], marker="+", markersize=11, color=MARKER_COLOR, markeredgewidth=2.0)
    return fig


def image_attention_figure(
    image: np.ndarray,
    tokens: Sequence[str],
    attention: np.ndarray,
    grid: tuple[int, int],
    out_path: str | Path,
    *,
    hard_points: Sequence[tuple[int, int]] | None = None,
    title: str | None = None,
    dpi: int = 100,
    cmap: str = "jet",
    alpha: float = 0.6,
    normalise: str = "caption",
) -> Path:
    """Save the per-word attention figure of an image caption as PNG; returns ``out_path``.

    image: [H, W, 3] uint8; attention: [T, h*w] or [T, h, w] (row i = weights used to emit
    tokens[i]); grid: (h, w). Panels: the input, then one overlay per word, 6 per row.
    """
    fig = build_image_attention_figure(
        image,
        tokens,
        attention,
        grid,
        hard_points=hard_points,
        title=title,
        cmap=cmap,
        alpha=alpha,
        normalise=normalise,
    )
    return save_figure(fig, out_path, dpi)
