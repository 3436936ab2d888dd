"""Attention figures of a caption: per-word spatial heatmaps (image grids), per-word box shading
(image regions) and word x frame alignments (videos).

``plot_result`` draws the figure of one ``captioning.caption.api.CaptionResult``, choosing by what
it attended over: ``image_grid`` (cells of a feature grid), ``region_boxes`` (detector regions),
``video_frames`` (sampled frames); ``figures`` holds what they share.  Pure numpy/PIL helpers do
the math; the figures use matplotlib's object API (no pyplot global state, so they are safe in
worker processes and need no display).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from captioning.viz.figures import save_figure
from captioning.viz.image_grid import brightest_cell, build_image_attention_figure
from captioning.viz.region_boxes import build_box_attention_figure, build_region_matrix_figure
from captioning.viz.video_frames import build_video_attention_figure

__all__ = ["build_result_figure", "plot_result"]


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
    return save_figure(build_result_figure(result), out_path, dpi)
