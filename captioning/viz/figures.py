"""What every attention figure shares: display-sized images, the heat blend, titles, the panel
layout of per-word figures and the atomic save (the format from the path's suffix).

Figures use matplotlib's object API (no pyplot global state, so they are safe in worker processes
and need no display).
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
from PIL import Image

from captioning.utils.io import atomic_write

PANELS_PER_ROW = 6
PANEL_INCHES = 2.3
MAX_DISPLAY_SIDE = 320  # images are resized to at most this many pixels a side before overlaying
MARKER_COLOR = "#00e5ff"  # cyan: hard-attention locations on the image panels, the heaviest box
FIGURE_FORMATS = ("png", "jpg", "jpeg", "pdf", "svg")


def normalise_map(a: np.ndarray) -> np.ndarray:
    """Min-max scale to [0, 1] (NaN -> min). A flat map becomes all ones (uniform attention)."""
    a = np.nan_to_num(np.asarray(a, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    lo, hi = float(a.min()), float(a.max())
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return np.ones_like(a, dtype=np.float32)
    return ((a - lo) / (hi - lo)).astype(np.float32)


def display_image(image: np.ndarray, max_side: int = MAX_DISPLAY_SIDE) -> np.ndarray:
    """image [H, W] or [H, W, 3|4] -> uint8 [H', W', 3], shrunk to at most ``max_side`` pixels a side."""
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


def blend(
    img: np.ndarray, heat: np.ndarray, *, cmap: str, alpha: float, gray_base: bool
) -> np.ndarray:
    """Blend a [H, W] heat in [0, 1] over an [H, W, 3] image (see ``image_grid.render_overlay``)."""
    base = img[..., :3].astype(np.float64)
    if gray_base:
        lum = base @ np.array([0.299, 0.587, 0.114])
        base = np.repeat(lum[..., None], 3, axis=-1)
    colour = colormaps[cmap](heat)[..., :3] * 255.0
    a = (alpha * (0.4 + 0.6 * heat))[..., None]
    out = (1.0 - a) * base + a * colour
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def short_word(word: str, limit: int = 16) -> str:
    """``word``, cut to ``limit`` characters with an ellipsis (panel titles, matrix labels)."""
    return word if len(word) <= limit else word[: limit - 1] + "\u2026"


def figure_format(path: str | Path) -> str:
    """The file format a figure path asks for by its suffix (``png`` when it names none of
    ``FIGURE_FORMATS``): the bytes must match the name, since the temp file has no suffix."""
    suffix = Path(path).suffix.lower().lstrip(".")
    return suffix if suffix in FIGURE_FORMATS else "png"


def save_figure(fig: Figure, out_path: str | Path, dpi: int) -> Path:
    """Write ``fig`` to ``out_path`` atomically, in the format its suffix names (``figure_format``)."""
    FigureCanvasAgg(fig)
    fmt = figure_format(out_path)

    def write(p: Path) -> None:
        fig.savefig(p, format=fmt, dpi=dpi, facecolor="white")
        os.chmod(p, 0o644)  # the atomic temp file is 0600; figures are meant to be shared/served

    return atomic_write(out_path, write)


def caption_title(title: str | None, tokens: Sequence[str], width: int) -> str:
    """``title`` (default: the caption) wrapped at ``width`` characters."""
    text = title if title is not None else " ".join(tokens)
    return "\n".join(textwrap.wrap(text, width=max(20, width))) or " "


def word_panels(img: np.ndarray, tokens: Sequence[str], title: str | None,
                 panels_per_row: int = PANELS_PER_ROW) -> tuple[Figure, list[Any]]:
    """A figure of panels over ``img`` [H, W, 3]: the input (drawn), then one per word (left for the
    caller), ``panels_per_row`` a row; returns (fig, axes in order)."""
    H, W = img.shape[:2]
    n_panels = len(tokens) + 1
    ncols = max(1, min(panels_per_row, n_panels))
    nrows = math.ceil(n_panels / ncols)
    panel_h = PANEL_INCHES * min(max(H / W, 0.5), 2.0)
    title_text = caption_title(title, tokens, width=int(ncols * 18))
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
