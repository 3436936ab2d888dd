"""Attention over image regions (detector boxes, ``captioning-import``): each word's weights shaded
over its boxes, or a words x regions matrix when the store holds no boxes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from captioning.viz.figures import (
    MARKER_COLOR,
    MAX_DISPLAY_SIDE,
    PANELS_PER_ROW,
    blend,
    caption_title,
    display_image,
    normalise_map,
    short_word,
    word_panels,
)

BOX_COLOR = "#ffffff"  # white: box outlines, opacity = the box's weight / the word's largest weight


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
        img = display_image(image)
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
    heats = [np.clip(m / max(vmax, 1e-12), 0, 1) if normalise == "caption" else normalise_map(m) for m in maps]
    fig, flat = word_panels(img, tokens, title, panels_per_row)
    for box in b:
        _box(flat[0], box, edgecolor=BOX_COLOR, linewidth=0.8, alpha=0.7)
    for i, tok in enumerate(tokens):
        ax = flat[i + 1]
        ax.imshow(blend(img, heats[i], cmap=cmap, alpha=alpha, gray_base=True), interpolation="bilinear")
        ax.set_title(short_word(tok), fontsize=13, fontweight="bold", parse_math=False)
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
    fig.suptitle(caption_title(title, tokens, width=60), fontsize=13, parse_math=False)
    ax = fig.subplots(1, 1)
    im = ax.imshow(a if T else np.zeros((1, max(n, 1))), cmap=cmap, aspect="auto", interpolation="nearest",
                   vmin=0.0, vmax=max(float(a.max()) if a.size else 1.0, 1e-12))
    ax.set_yticks(range(T))
    ax.set_yticklabels([short_word(t, 20) for t in tokens], fontsize=11)
    for text in ax.get_yticklabels():
        text.set_parse_math(False)
    ax.set_xticks(range(0, n, 1 if n <= 24 else 2))
    ax.set_xlabel("region (the store holds no boxes to draw them)", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.01).set_label("attention weight", fontsize=10)
    return fig
