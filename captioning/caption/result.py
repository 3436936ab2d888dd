"""A caption of one input with the attention behind each of its words, and how attention rows map
onto the input (``AttentionLayout``: the feature grid of an image, its regions, or a video's frames)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioning.errors import CheckpointError
from captioning.store.streams import stream_metas
from captioning.viz.heatmaps import plot_result


@dataclass
class CaptionResult:
    """The caption of one input and the attention that emitted each of its words.

    attention: float64 ``[T, H*W]`` for an image (row-major over the feature grid,
    ``attention_shape = [H, W]``) or ``[T, K]`` for a video (one weight per sampled frame,
    ``attention_shape = [K]``, the frames' numbers in ``frame_indices``); row ``t`` holds the
    weights used to emit ``tokens[t]``.  ``has_attention`` is False for models without
    attention (uniform weights are reported).  ``image``: the crop the model saw, uint8
    ``[S, S, 3]`` or ``[K, S, S, 3]`` (None for features given without pixels).  Image regions
    (features imported from a detector, ``captioning-import``): ``attention`` [T, n] over the n
    real regions, ``attention_shape = [n]``, ``boxes`` [n, 4] their pixel boxes (x1, y1, x2, y2)
    in an image of ``image_size`` (W, H) when the store has them, ``image`` the whole image.  An
    input that failed has ``error`` (one line) and no caption.
    """

    input: str
    kind: str  # image | video
    caption: str = ""
    tokens: list[str] = field(default_factory=list)
    attention: np.ndarray | None = None
    attention_shape: list[int] = field(default_factory=list)
    frame_indices: list[int] | None = None
    score: float | None = None  # the beam's ranking score (summed log-probs, length-normalised if set)
    token_log_probs: list[float] = field(default_factory=list)  # each word's log-prob, then <eos>'s
    nbest: list[tuple[str, float]] = field(default_factory=list)  # (caption, score), best first, when decode
    # asks for several (n_best > 1, diverse groups, num_samples > 1); empty otherwise
    has_attention: bool = True
    hard_attention: bool = False  # the model attends to one location per word (figures mark it)
    image: np.ndarray | None = field(default=None, repr=False)
    path: str | None = None
    error: str | None = None
    boxes: np.ndarray | None = field(default=None, repr=False)
    image_size: list[int] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def figure(self, path: str | Path, **kwargs: Any) -> Path:
        """Save this caption's attention figure (PNG, or JPEG/PDF/SVG by the path's suffix;
        ``captioning.viz.heatmaps.plot_result``)."""
        return plot_result(self, path, **kwargs)


def hwc(pixels: torch.Tensor | None) -> np.ndarray | None:
    """uint8 [3,S,S] -> [S,S,3] or [K,3,S,S] -> [K,S,S,3] numpy."""
    if pixels is None:
        return None
    x = pixels.detach().cpu()
    x = x.permute(1, 2, 0) if x.ndim == 3 else x.permute(0, 2, 3, 1)
    return np.ascontiguousarray(x.numpy().astype(np.uint8))


@dataclass(frozen=True)
class AttentionLayout:
    """What a model's N attended positions are, from its feature meta: an image's ``grid`` (H, W)
    (row-major), an image's ``regions`` (imported detector features: no grid), or a video's frames
    (``cells`` > 1: each frame's h*w grid cells, frame-major, summed per frame)."""

    kind: str  # image | video
    grid: tuple[int, int] | None
    regions: bool
    cells: int

    @classmethod
    def of(cls, feature_meta: Mapping[str, Any]) -> AttentionLayout:
        kind = feature_meta.get("kind", "image")
        raw = feature_meta.get("grid")
        grid = (int(raw[0]), int(raw[1])) if raw else None
        regions = kind == "image" and grid is None and bool(feature_meta.get("regions"))
        if kind == "image" and grid is None and not regions:
            raise CheckpointError("image features without a grid in the checkpoint's feature_meta")
        video = stream_metas(feature_meta)[0].get("settings", {}).get("video") or {}
        cells = grid[0] * grid[1] if video.get("video_features") == "grid" and grid else 1
        return cls(kind, grid, regions, cells)

    def result(self, hyps: Sequence[Any], f: Any, itos: Sequence[str], n: int, *,
               hard_attention: bool) -> CaptionResult:
        """The ``CaptionResult`` of one decoded item: ``hyps`` its hypotheses, best first (tokens,
        score, token_log_probs, attention [T, N] or None); ``f`` its ``Featurized`` (valid, boxes,
        image_size, frame_indices); ``n`` = N, the batch's positions."""
        h = hyps[0]
        tokens = [itos[t] for t in h.tokens]
        if h.attention is None:  # show_tell / mean_pool: the context is the uniform mean
            att = np.zeros((len(tokens), n), dtype=np.float64)
            att[:, : int(f.valid)] = 1.0 / int(f.valid)
        else:
            att = h.attention[: len(tokens)].float().cpu().numpy().astype(np.float64)
        r = CaptionResult(f.item_id, self.kind, caption=" ".join(tokens), tokens=tokens, score=float(h.score),
                          token_log_probs=list(h.token_log_probs),
                          has_attention=h.attention is not None, hard_attention=hard_attention,
                          nbest=[(" ".join(itos[t] for t in x.tokens), float(x.score)) for x in hyps]
                          if len(hyps) > 1 else [])
        if self.regions:  # the real regions only, with their boxes when known
            n_real = int(f.valid)
            r.attention, r.attention_shape = att[:, :n_real], [n_real]
            r.boxes = None if f.boxes is None else np.asarray(f.boxes[:n_real], dtype=np.float64)
            r.image_size = None if f.image_size is None else [int(s) for s in f.image_size]
        elif self.kind == "image":
            assert self.grid is not None
            r.attention, r.attention_shape = att, list(self.grid)
        else:
            if self.cells > 1:  # [T, K*h*w] frame-major -> weight per frame [T, K]
                att = att.reshape(att.shape[0], -1, self.cells).sum(axis=-1)
            r.attention, r.attention_shape = att, [int(att.shape[1])]
            r.frame_indices = [int(i) for i in (f.frame_indices or range(att.shape[1]))]
        return r
