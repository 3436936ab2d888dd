"""Attention over a video's sampled frames: a strip of the most attended frames above the words x
frames alignment matrix.  A video attention row is a distribution over the ``K`` sampled frames."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from captioning.viz.figures import caption_title, save_figure, short_word

MAX_STRIP_FRAMES = 16
HIGHLIGHT_OVERALL = "#e8132a"  # red: the frame with the most attention over the whole caption
HIGHLIGHT_WORD = "#ff9f1c"  # orange: a frame that is the argmax for at least one word


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
    title_text = caption_title(title, tokens, width=int(fig_w * 9))
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
    ax.set_yticklabels([short_word(t, 20) for t in tokens], fontsize=11)
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
    return save_figure(fig, out_path, dpi)
