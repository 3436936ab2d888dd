"""Attention figures: per-word spatial heatmaps (images) and word x frame alignments (videos).

Pure numpy/PIL helpers (``upsample_attention``, ``render_overlay``, ``brightest_cell``, ...) do the
math; the figure functions lay them out with matplotlib's object API (no pyplot global state, so
they are safe in worker processes and need no display).

Shapes: an image attention row is a distribution over a ``grid = (h, w)`` of feature cells, given
flattened ``[h*w]`` (row-major, as the encoder flattens its feature map) or as ``[h, w]``. A video
attention row is a distribution over the ``K`` sampled frames.  ``plot_result`` draws the figure of
one ``captioning.caption.api.CaptionResult``.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from PIL import Image

from captioning.utils.io import atomic_write

__all__ = [
    "upsample_attention",
    "gaussian_blur",
    "render_overlay",
    "brightest_cell",
    "cell_center",
    "brightest_frame",
    "most_attended_frames",
    "select_strip_frames",
    "build_image_attention_figure",
    "image_attention_figure",
    "build_video_attention_figure",
    "video_attention_figure",
    "box_heat",
    "scale_boxes",
    "build_box_attention_figure",
    "build_region_matrix_figure",
    "build_result_figure",
    "plot_result",
]

PANELS_PER_ROW = 6
PANEL_INCHES = 2.3
MAX_DISPLAY_SIDE = 320  # images are resized to at most this many pixels a side before overlaying
MAX_STRIP_FRAMES = 16
HIGHLIGHT_OVERALL = "#e8132a"  # red: the frame with the most attention over the whole caption
HIGHLIGHT_WORD = "#ff9f1c"  # orange: a frame that is the argmax for at least one word
MARKER_COLOR = "#00e5ff"  # cyan: hard-attention locations on the image panels
BOX_COLOR = "#ffffff"  # white: box outlines, opacity = the box's weight / the word's largest weight


# ----------------------------------------------------------------------------------------------
# pure helpers
# ----------------------------------------------------------------------------------------------


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


def _normalise(a: np.ndarray) -> np.ndarray:
    """Min-max scale to [0, 1] (NaN -> min). A flat map becomes all ones (uniform attention)."""
    a = np.nan_to_num(np.asarray(a, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = float(a.min()), float(a.max())
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return np.ones_like(a, dtype=np.float32)
    return ((a - lo) / (hi - lo)).astype(np.float32)


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
    return _normalise(out) if normalise else out.astype(np.float32)


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


def brightest_frame(att: np.ndarray) -> int:
    """Index (0..K-1, position in the sampled clip) of the most attended frame; att: [K]."""
    a = np.asarray(att, dtype=np.float64).reshape(-1)
    return int(np.nanargmax(a))


def most_attended_frames(attention: np.ndarray, top: int = 1) -> list[int]:
    """Positions of the ``top`` frames with the largest attention summed over words; attention: [T, K]."""
    a = np.nan_to_num(np.asarray(attention, dtype=np.float64))
    if a.ndim != 2:
        raise ValueError(f"video attention must be [T, K], got shape {a.shape}")
    total = a.sum(axis=0)
    order = np.argsort(-total, kind="stable")
    return [int(i) for i in order[: max(0, min(top, a.shape[1]))]]


def select_strip_frames(
    num_frames: int, must_show: Sequence[int] = (), max_frames: int = MAX_STRIP_FRAMES
) -> list[int]:
    """Positions of the frames to draw in the strip: all of them when ``num_frames <= max_frames``,
    else ``max_frames`` evenly spaced ones, with each of ``must_show`` swapped in for its nearest
    evenly spaced neighbour. Sorted, unique."""
    if num_frames <= max_frames:
        return list(range(num_frames))
    chosen = [int(round(x)) for x in np.linspace(0, num_frames - 1, max_frames)]
    for m in must_show:
        if m in chosen or not 0 <= m < num_frames:
            continue
        pinned = set(must_show)
        # replace the nearest chosen frame that is not itself pinned
        candidates = [i for i, c in enumerate(chosen) if c not in pinned]
        if not candidates:
            break
        j = min(candidates, key=lambda i: abs(chosen[i] - m))
        chosen[j] = int(m)
    return sorted(set(chosen))


def _display_image(image: np.ndarray, max_side: int = MAX_DISPLAY_SIDE) -> np.ndarray:
    img = np.asarray(image)
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    if img.ndim != 3 or img.shape[-1] not in (3, 4):
        raise ValueError(f"image must be [H, W, 3] uint8, got shape {img.shape}")
    img = img[..., :3]
    if img.dtype != np.uint8:
        img = np.clip(img, 0, 255).astype(np.uint8)
    H, W = img.shape[:2]
    scale = max_side / max(H, W)
    if scale < 1.0:
        size = (max(1, round(W * scale)), max(1, round(H * scale)))
        img = np.asarray(Image.fromarray(img).resize(size, Image.BILINEAR))
    return img


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
    return _blend(img, heat, cmap=cmap, alpha=alpha, gray_base=gray_base)


def _blend(
    img: np.ndarray, heat: np.ndarray, *, cmap: str, alpha: float, gray_base: bool
) -> np.ndarray:
    """Blend a [H, W] heat in [0, 1] over an [H, W, 3] image (see ``render_overlay``)."""
    base = img[..., :3].astype(np.float64)
    if gray_base:
        lum = base @ np.array([0.299, 0.587, 0.114])
        base = np.repeat(lum[..., None], 3, axis=-1)
    colour = colormaps[cmap](heat)[..., :3] * 255.0
    a = (alpha * (0.4 + 0.6 * heat))[..., None]
    out = (1.0 - a) * base + a * colour
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def box_heat(weights: np.ndarray, boxes: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Attention over boxes as a map: each pixel holds the summed weight of the boxes covering it.

    weights: [n]; boxes: [n, 4] (x1, y1, x2, y2) in the pixels of an image of ``size`` = (H, W);
    pixel (r, c) lies in a box when its centre (c + .5, r + .5) does (x1 <= c + .5 < x2, same in
    y).  Summed-area construction: O(n + H W).  Returns float64 [H, W].
    """
    H, W = int(size[0]), int(size[1])
    w = np.nan_to_num(np.asarray(weights, dtype=np.float64).reshape(-1))
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if len(w) != len(b):
        raise ValueError(f"{len(w)} weights but {len(b)} boxes")
    c0 = np.clip(np.ceil(b[:, 0] - 0.5), 0, W).astype(int)  # first pixel column whose centre is >= x1
    c1 = np.clip(np.ceil(b[:, 2] - 0.5), 0, W).astype(int)  # first column past the box
    r0 = np.clip(np.ceil(b[:, 1] - 0.5), 0, H).astype(int)
    r1 = np.clip(np.ceil(b[:, 3] - 0.5), 0, H).astype(int)
    corners = np.zeros((H + 1, W + 1))
    np.add.at(corners, (r0, c0), w)
    np.add.at(corners, (r0, c1), -w)
    np.add.at(corners, (r1, c0), -w)
    np.add.at(corners, (r1, c1), w)
    return corners.cumsum(0).cumsum(1)[:H, :W]


def scale_boxes(boxes: np.ndarray, frm: tuple[int, int], to: tuple[int, int]) -> np.ndarray:
    """Pixel boxes [n, 4] of an image of ``frm`` = (W, H) in the pixels of the same image resized to ``to``."""
    sx, sy = to[0] / max(frm[0], 1), to[1] / max(frm[1], 1)
    return np.asarray(boxes, dtype=np.float64) * np.array([sx, sy, sx, sy])


# ----------------------------------------------------------------------------------------------
# figures
# ----------------------------------------------------------------------------------------------


def _short(word: str, limit: int = 16) -> str:
    return word if len(word) <= limit else word[: limit - 1] + "\u2026"


FIGURE_FORMATS = ("png", "jpg", "jpeg", "pdf", "svg")


def figure_format(path: str | Path) -> str:
    """The file format a figure path asks for by its suffix (``png`` when it names none of
    ``FIGURE_FORMATS``): the bytes must match the name, since the temp file has no suffix."""
    suffix = Path(path).suffix.lower().lstrip(".")
    return suffix if suffix in FIGURE_FORMATS else "png"


def _save(fig: Figure, out_path: str | Path, dpi: int) -> Path:
    FigureCanvasAgg(fig)
    fmt = figure_format(out_path)

    def write(p: Path) -> None:
        fig.savefig(p, format=fmt, dpi=dpi, facecolor="white")
        os.chmod(p, 0o644)  # the atomic temp file is 0600; figures are meant to be shared/served

    return atomic_write(out_path, write)


def _caption_title(title: str | None, tokens: Sequence[str], width: int) -> str:
    text = title if title is not None else " ".join(tokens)
    return "\n".join(textwrap.wrap(text, width=max(20, width))) or " "


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
    img = _display_image(image)
    H, W = img.shape[:2]
    ups = [upsample_attention(r, (H, W), grid=grid, normalise=False) for r in rows_att]
    if normalise == "caption":
        vmax = max([float(u.max()) for u in ups], default=1.0)
        heats = [np.clip(u / max(vmax, 1e-12), 0.0, 1.0) for u in ups]
    else:
        heats = [_normalise(u) for u in ups]
    fig, flat = _word_panels(img, tokens, title, panels_per_row)
    for i, tok in enumerate(tokens):
        ax = flat[i + 1]
        ax.imshow(
            _blend(img, heats[i], cmap=cmap, alpha=alpha, gray_base=True), interpolation="bilinear"
        )
        ax.set_title(_short(tok), fontsize=13, fontweight="bold", parse_math=False)
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


def _word_panels(img: np.ndarray, tokens: Sequence[str], title: str | None,
                 panels_per_row: int = PANELS_PER_ROW) -> tuple[Figure, list[Any]]:
    """A figure of panels over ``img`` [H, W, 3]: the input (drawn), then one per word (left for the
    caller), ``panels_per_row`` a row; returns (fig, axes in order)."""
    H, W = img.shape[:2]
    n_panels = len(tokens) + 1
    ncols = max(1, min(panels_per_row, n_panels))
    nrows = math.ceil(n_panels / ncols)
    panel_h = PANEL_INCHES * min(max(H / W, 0.5), 2.0)
    title_text = _caption_title(title, tokens, width=int(ncols * 18))
    title_lines = title_text.count("\n") + 1
    fig_w = ncols * PANEL_INCHES + 0.3
    fig_h = nrows * (panel_h + 0.45) + 0.3 * title_lines + 0.3
    fig = Figure(figsize=(fig_w, fig_h), layout="constrained")
    fig.get_layout_engine().set(w_pad=0.04, h_pad=0.04, wspace=0.02, hspace=0.02)
    fig.suptitle(title_text, fontsize=14, parse_math=False)
    flat = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    flat[0].imshow(img, interpolation="bilinear")
    flat[0].set_title("input", fontsize=13, style="italic", parse_math=False)
    for ax in flat:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlim(-0.5, W - 0.5)
        ax.set_ylim(H - 0.5, -0.5)
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat


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
    return _save(fig, out_path, dpi)


def _region_canvas(image: np.ndarray | None, boxes: np.ndarray, image_size: Sequence[int] | None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(the image the boxes lie in at display size, the boxes [n, 4] in its pixels).  Without the
    image: a gray canvas of ``image_size`` (W, H), else of the boxes' extent."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if image_size is not None:
        frm = (int(image_size[0]), int(image_size[1]))
    elif image is not None:
        frm = (int(image.shape[1]), int(image.shape[0]))
    else:
        frm = (max(1, math.ceil(b[:, 2].max(initial=1.0))), max(1, math.ceil(b[:, 3].max(initial=1.0))))
    if image is None:
        scale = min(1.0, MAX_DISPLAY_SIDE / max(frm))
        img = np.full((max(1, round(frm[1] * scale)), max(1, round(frm[0] * scale)), 3), 128, np.uint8)
    else:
        img = _display_image(image)
    return img, scale_boxes(b, frm, (img.shape[1], img.shape[0]))


def _box(ax: Any, box: Sequence[float], **style: Any) -> None:
    x1, y1, x2, y2 = (float(v) for v in box)
    ax.add_patch(Rectangle((x1 - 0.5, y1 - 0.5), x2 - x1, y2 - y1, fill=False, **style))


def build_box_attention_figure(
    image: np.ndarray | None,
    tokens: Sequence[str],
    attention: np.ndarray,
    boxes: np.ndarray,
    *,
    image_size: Sequence[int] | None = None,
    title: str | None = None,
    cmap: str = "jet",
    alpha: float = 0.6,
    normalise: str = "caption",
    panels_per_row: int = PANELS_PER_ROW,
) -> Figure:
    """Build (not save) the per-word figure of attention over boxes (detector regions);
    ``fig.axes`` is [input, word_1 .. word_T].

    image: [H, W, 3] uint8 or None (a gray canvas); attention: [T, n]; boxes: [n, 4] pixel
    (x1, y1, x2, y2) in an image of ``image_size`` = (W, H) (default: ``image``'s size).  Each
    word's panel shades every box by its weight (``box_heat``: overlapping boxes add up) and outlines
    the boxes with an opacity of their weight over the word's largest (the largest in cyan); the
    input panel outlines all n boxes.  normalise: "caption" (one scale for all words) | "word".
    """
    if normalise not in ("caption", "word"):
        raise ValueError(f"normalise must be 'caption' or 'word', got {normalise!r}")
    tokens = [str(t) for t in tokens]
    a = np.nan_to_num(np.asarray(attention, dtype=np.float64))
    n = len(np.asarray(boxes).reshape(-1, 4))
    if a.ndim != 2 or a.shape != (len(tokens), n):
        raise ValueError(f"attention must be [T={len(tokens)}, n={n} boxes], got shape {list(a.shape)}")
    img, b = _region_canvas(image, boxes, image_size)
    H, W = img.shape[:2]
    maps = [box_heat(row, b, (H, W)) for row in a]
    vmax = max([float(m.max()) for m in maps], default=1.0)
    heats = [np.clip(m / max(vmax, 1e-12), 0, 1) if normalise == "caption" else _normalise(m) for m in maps]
    fig, flat = _word_panels(img, tokens, title, panels_per_row)
    for box in b:
        _box(flat[0], box, edgecolor=BOX_COLOR, linewidth=0.8, alpha=0.7)
    for i, tok in enumerate(tokens):
        ax = flat[i + 1]
        ax.imshow(_blend(img, heats[i], cmap=cmap, alpha=alpha, gray_base=True), interpolation="bilinear")
        ax.set_title(_short(tok), fontsize=13, fontweight="bold", parse_math=False)
        top = float(a[i].max()) if n else 0.0
        for j in np.argsort(a[i], kind="stable"):  # the heaviest drawn last (on top)
            if top > 0 and a[i, j] >= 0.1 * top:
                _box(ax, b[j], edgecolor=MARKER_COLOR if a[i, j] == top else BOX_COLOR,
                     linewidth=1.0 + 1.5 * a[i, j] / top, alpha=float(a[i, j] / top))
    return fig


def build_region_matrix_figure(tokens: Sequence[str], attention: np.ndarray, *, title: str | None = None,
                               cmap: str = "gray") -> Figure:
    """Build (not save) the words x regions matrix of attention over regions without boxes:
    attention [T, n], row t the weights used to emit ``tokens[t]``."""
    tokens = [str(t) for t in tokens]
    a = np.nan_to_num(np.asarray(attention, dtype=np.float64))
    if a.ndim != 2 or a.shape[0] != len(tokens):
        raise ValueError(f"attention must be [T={len(tokens)}, n regions], got shape {list(a.shape)}")
    T, n = a.shape
    fig = Figure(figsize=(max(0.3 * n + 2.5, 6.0), max(0.3 * T, 1.5) + 1.6), layout="constrained")
    fig.suptitle(_caption_title(title, tokens, width=60), fontsize=13, parse_math=False)
    ax = fig.subplots(1, 1)
    im = ax.imshow(a if T else np.zeros((1, max(n, 1))), cmap=cmap, aspect="auto", interpolation="nearest",
                   vmin=0.0, vmax=max(float(a.max()) if a.size else 1.0, 1e-12))
    ax.set_yticks(range(T))
    ax.set_yticklabels([_short(t, 20) for t in tokens], fontsize=11)
    for text in ax.get_yticklabels():
        text.set_parse_math(False)
    ax.set_xticks(range(0, n, 1 if n <= 24 else 2))
    ax.set_xlabel("region (the store holds no boxes to draw them)", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.01).set_label("attention weight", fontsize=10)
    return fig


def _checked_video_inputs(
    frames: np.ndarray, tokens: Sequence[str], attention: np.ndarray, frame_indices: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Checked inputs of a video figure: (frames [K, H, W, C], attention [T, K] float64 with NaN
    -> 0, the K frame indices as ints); a one-line ValueError on any shape mismatch."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] < 3:
        raise ValueError(f"frames must be [K, H, W, 3] uint8, got shape {frames.shape}")
    K = frames.shape[0]
    a = np.nan_to_num(np.asarray(attention, dtype=np.float64))
    if a.ndim != 2 or a.shape[1] != K:
        raise ValueError(f"attention must be [T, K={K}], got shape {a.shape}")
    if a.shape[0] != len(tokens):
        raise ValueError(
            f"{len(tokens)} tokens but {a.shape[0]} attention rows; need one row per token"
        )
    frame_indices = [int(f) for f in frame_indices]
    if len(frame_indices) != K:
        raise ValueError(f"{K} frames but {len(frame_indices)} frame_indices")
    return frames, a, frame_indices


def _video_canvas(
    tokens: Sequence[str], title: str | None, num_frames: int, strip_len: int, frame_aspect: float
) -> tuple[Figure, Any, Any]:
    """The figure of a video caption, sized for a strip of ``strip_len`` thumbnails (height/width
    ``frame_aspect``) above a [T, ``num_frames``] matrix with its word labels and colorbar;
    returns (fig, strip subfigure, matrix subfigure)."""
    K, S, T = num_frames, strip_len, len(tokens)
    # width: enough for the strip and for K matrix columns, plus y labels and the colorbar
    label_w = 0.12 * max((len(t) for t in tokens), default=4) + 0.5
    matrix_w = max(0.32 * K, 3.0)
    fig_w = max(min(1.05 * S, 16.0), matrix_w + label_w + 1.2, 8.0)
    strip_w = fig_w - 0.4
    thumb_w = strip_w / S
    strip_h = thumb_w * frame_aspect + 0.35
    matrix_h = max(0.3 * T, 1.5) + 0.7
    title_text = _caption_title(title, tokens, width=int(fig_w * 9))
    title_lines = title_text.count("\n") + 1
    fig_h = strip_h + matrix_h + 0.3 * title_lines + 0.9
    fig = Figure(figsize=(fig_w, fig_h), layout="constrained")
    fig.suptitle(title_text, fontsize=14, parse_math=False)
    top, bottom = fig.subfigures(2, 1, height_ratios=[strip_h + 0.3, matrix_h + 0.5])
    return fig, top, bottom


def _draw_frame_strip(
    top: Any, frames: np.ndarray, frame_indices: Sequence[int], strip: Sequence[int],
    overall: int, per_word: Sequence[int],
) -> list[Any]:
    """The frames at positions ``strip`` (of frames [K, H, W, C]) side by side, labelled by their
    frame index and outlined red (``overall``), orange (some word's argmax) or gray; their axes."""
    S, K = len(strip), frames.shape[0]
    strip_axes = top.subplots(1, S, squeeze=False)[0]
    word_set = set(per_word)
    for ax, k in zip(strip_axes, strip, strict=True):
        ax.imshow(frames[k][..., :3], interpolation="bilinear")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_xlabel(str(frame_indices[k]), fontsize=9 if S > 12 else 11, labelpad=2)
        if k == overall:
            colour, width = HIGHLIGHT_OVERALL, 5.0
        elif k in word_set:
            colour, width = HIGHLIGHT_WORD, 3.0
        else:
            colour, width = "#bbbbbb", 0.8
        for sp in ax.spines.values():
            sp.set_edgecolor(colour)
            sp.set_linewidth(width)
    shown = "all frames" if S == K else f"{S} of {K} sampled frames"
    top.suptitle(
        f"{shown} (label = frame index); red border: most attended overall, "
        f"orange: most attended by some word",
        fontsize=10,
        parse_math=False,
    )
    return list(strip_axes)


def _draw_alignment_matrix(
    bottom: Any, a: np.ndarray, tokens: Sequence[str], frame_indices: Sequence[int],
    per_word: Sequence[int], *, cmap: str, hard: bool,
) -> Any:
    """The words x frames matrix of attention a [T, K] (rows labelled by word, columns by frame
    index, each word's argmax frame boxed) with its colorbar; returns its axes."""
    T, K = a.shape
    ax = bottom.subplots(1, 1)
    im = ax.imshow(
        a if T else np.zeros((1, K)),
        cmap=cmap,
        aspect="auto",
        interpolation="nearest",
        vmin=0.0,
        vmax=max(float(a.max()) if a.size else 1.0, 1e-12),
    )
    ax.set_yticks(range(T))
    ax.set_yticklabels([_short(t, 20) for t in tokens], fontsize=11)
    step = 1 if K <= 24 else 2
    ax.set_xticks(range(0, K, step))
    ax.set_xticklabels(
        [str(frame_indices[k]) for k in range(0, K, step)], fontsize=9, rotation=90 if K > 16 else 0
    )
    ax.set_xlabel("frame index", fontsize=11)
    for t, k in enumerate(per_word):
        ax.add_patch(
            Rectangle((k - 0.5, t - 0.5), 1, 1, fill=False, edgecolor=HIGHLIGHT_WORD, linewidth=2.0)
        )
    for text in ax.get_yticklabels():
        text.set_parse_math(False)
    for text in ax.get_xticklabels():
        text.set_parse_math(False)
    cb = bottom.colorbar(im, ax=ax, fraction=0.04, pad=0.01)
    cb.set_label("attention weight", fontsize=10)
    kind = (
        "hard (sampled) attention: box = chosen frame"
        if hard
        else "soft attention: box = argmax frame per word"
    )
    ax.set_title(kind, fontsize=10, parse_math=False)
    return ax


def build_video_attention_figure(
    frames: np.ndarray,
    tokens: Sequence[str],
    attention: np.ndarray,
    frame_indices: Sequence[int],
    *,
    hard: bool = False,
    title: str | None = None,
    cmap: str = "gray",
    max_strip_frames: int = MAX_STRIP_FRAMES,
) -> tuple[Figure, dict]:
    """Build (not save) the video attention figure.

    frames: [K, H, W, 3] uint8; attention: [T, K]; frame_indices: K original frame numbers.
    Returns (fig, info) with info = {"strip": positions drawn in the strip, "strip_axes": their
    axes, "matrix_ax": the alignment axes, "overall": position of the most attended frame,
    "per_word": argmax position per word}.
    """
    tokens = [str(t) for t in tokens]
    frames, a, frame_indices = _checked_video_inputs(frames, tokens, attention, frame_indices)
    K, T = frames.shape[0], len(tokens)
    per_word = [brightest_frame(row) for row in a] if T else []
    overall = most_attended_frames(a, 1)[0] if T else 0
    strip = select_strip_frames(K, [overall, *sorted(set(per_word))], max_strip_frames)
    fh, fw = frames.shape[1:3]
    fig, top, bottom = _video_canvas(tokens, title, K, len(strip), fh / fw)
    strip_axes = _draw_frame_strip(top, frames, frame_indices, strip, overall, per_word)
    ax = _draw_alignment_matrix(bottom, a, tokens, frame_indices, per_word, cmap=cmap, hard=hard)
    info = {
        "strip": strip,
        "strip_axes": strip_axes,
        "matrix_ax": ax,
        "overall": overall,
        "per_word": per_word,
    }
    return fig, info


def video_attention_figure(
    frames: np.ndarray,
    tokens: Sequence[str],
    attention: np.ndarray,
    frame_indices: Sequence[int],
    out_path: str | Path,
    *,
    hard: bool = False,
    title: str | None = None,
    dpi: int = 100,
    cmap: str = "gray",
) -> Path:
    """Save the video attention figure as PNG: a frame strip (most attended frames outlined) above
    the words x frames alignment matrix. frames: [K, H, W, 3] uint8; attention: [T, K];
    frame_indices: K original frame numbers. Returns ``out_path``."""
    fig, _ = build_video_attention_figure(
        frames, tokens, attention, frame_indices, hard=hard, title=title, cmap=cmap
    )
    return _save(fig, out_path, dpi)


def build_result_figure(result: Any, title: str | None = None) -> Figure:
    """Build (not save) the attention figure of one ``captioning.caption.api.CaptionResult``.

    Image grid: the crop the model saw, then one heatmap per word over ``attention_shape`` [H, W]
    (argmax hard attention: the attended cell marked); image regions (``attention_shape`` [n]):
    the image with each word's weights over its boxes (``build_box_attention_figure``), or the
    words x regions matrix when the result has no boxes; video: a frame strip above the words x
    frames alignment.  A result without pixels is drawn on gray.  ``title``: default the caption.
    """
    if result.error is not None:
        raise ValueError(f"{result.input} has no caption to draw: {result.error}")
    att = np.asarray(result.attention, dtype=np.float64)
    title = " ".join(result.tokens) if title is None else title
    if result.kind == "image" and len(result.attention_shape) == 1:
        if result.boxes is None:
            return build_region_matrix_figure(result.tokens, att, title=title)
        return build_box_attention_figure(result.image, result.tokens, att, result.boxes,
                                          image_size=result.image_size, title=title)
    if result.kind == "image":
        grid = (int(result.attention_shape[0]), int(result.attention_shape[1]))
        image = result.image if result.image is not None else np.full((224, 224, 3), 128, np.uint8)
        points = [brightest_cell(row, grid) for row in att] if result.hard_attention else None
        return build_image_attention_figure(image, result.tokens, att, grid, hard_points=points, title=title)
    frames = result.image if result.image is not None else np.full((att.shape[1], 64, 64, 3), 128, np.uint8)
    fig, _ = build_video_attention_figure(frames, result.tokens, att, result.frame_indices,
                                          hard=result.hard_attention, title=title)
    return fig


def plot_result(result: Any, out_path: str | Path, *, dpi: int = 100) -> Path:
    """Save the attention figure of one caption (``build_result_figure``) as PNG (or JPEG/PDF/SVG
    by the path's suffix).  Returns ``out_path``."""
    return _save(build_result_figure(result), out_path, dpi)
