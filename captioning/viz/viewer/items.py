"""What the viewer shows: items, each with one caption per run, and what the attention positions are.

A run is one model's decoding (the evaluated checkpoint, and with ``viewer.compare`` another
run's ``predictions.json``).  A ``ViewerItem`` is one image or video: the pixels the model saw and,
per run, a ``ViewerRun``: its words, the attention row behind each word ``[T, N]``, the per-word
log-probabilities and n-best list when the decoder wrote them, per-item metrics and, on data with a
grounding file, where each grounded word's object lies and whether the word's attention points
into it.  ``Layout`` says what the N positions are (a grid of cells, region boxes, frames or
frames x cells), so the page can draw a row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captioning.errors import ConfigError, DataError
from captioning.predictions import read_predictions
from captioning.utils.io import read_json

__all__ = ["Layout", "ViewerRun", "ViewerItem", "layout_of_meta", "layout_of_result", "infer_layout",
           "run_of_result", "read_compare", "entry_key"]


@dataclass(frozen=True)
class Layout:
    """The N attention positions of a run: ``grid`` (h x w cells of the image, row-major),
    ``regions`` (one box each), ``frames`` (K sampled frames, each ``cells`` positions laid out as
    ``grid`` when ``cells > 1``: frame-major) or ``positions`` (nothing known: drawn as a strip)."""

    type: str
    grid: tuple[int, int] | None = None
    frames: int | None = None
    cells: int = 1

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["grid"] = list(self.grid) if self.grid else None
        return d


def layout_of_meta(meta: Mapping[str, Any]) -> Layout:
    """The layout of a FeatureStore's positions (its ``meta``: kind, positions, frames, grid, regions)."""
    grid = tuple(int(g) for g in meta["grid"]) if meta.get("grid") else None
    if meta.get("kind") == "video":
        frames = int(meta.get("frames") or meta["positions"])
        cells = max(1, int(meta["positions"]) // frames)
        return Layout("frames", grid if cells > 1 else None, frames, cells)
    if meta.get("regions") or grid is None:
        return Layout("regions")
    return Layout("grid", grid)


def layout_of_result(result: Any) -> Layout:
    """The layout of a ``CaptionResult``'s attention (video rows are already summed per frame)."""
    shape = [int(s) for s in result.attention_shape]
    if result.kind == "video":
        return Layout("frames", None, shape[0], 1)
    if len(shape) == 2:
        return Layout("grid", (shape[0], shape[1]))
    return Layout("regions")


def infer_layout(width: int, like: Layout) -> Layout:
    """The layout of another run's rows of ``width`` positions, on the data ``like`` describes:
    ``like`` itself when the widths agree, else a square grid, K frames of square grids, or plain
    positions."""
    if like.type == "frames" and like.frames:
        k = like.frames
        if width == k:
            return Layout("frames", None, k, 1)
        side = math.isqrt(width // k) if width % k == 0 else 0
        return Layout("frames", (side, side), k, side * side) if side * side * k == width else Layout("positions")
    if like.type == "regions":
        return like
    if like.type == "grid" and like.grid and like.grid[0] * like.grid[1] == width:
        return like
    side = math.isqrt(width)
    return Layout("grid", (side, side)) if side * side == width and side > 1 else Layout("positions")


@dataclass
class ViewerRun:
    """One run's caption of one item.

    attention: ``[T, N]`` (row t emitted ``tokens[t]``), None for a model without attention;
    log_probs: ``[T]`` log p(word | prefix, item) when the decoder recorded them; nbest: (caption,
    score) best first; grounding: per grounded word ``{"t", "hit", "mass"}`` and ``"box"`` (x0, y0,
    x1, y1 as fractions of the shown image) or ``"frames"`` (the positions k of the sampled frames in
    the event); metrics: per-item scores (``CIDEr``, ...)."""

    tokens: list[str]
    attention: np.ndarray | None
    score: float | None = None
    log_probs: list[float] | None = None
    nbest: list[tuple[str, float]] = field(default_factory=list)
    grounding: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def caption(self) -> str:
        return " ".join(self.tokens)


@dataclass
class ViewerItem:
    """One image or video: ``key`` (its id or input), ``runs`` (one per run, None where that run has no
    caption of it), ``pixels`` what the model saw (uint8 ``[S, S, 3]``; video ``[K, S, S, 3]``;
    image regions: the whole image), ``frame_indices`` (video), ``boxes`` ``[n, 4]`` pixel boxes of the
    regions in an image of ``image_size`` (W, H), ``references`` and a ``note`` (e.g. why no image)."""

    key: str
    runs: list[ViewerRun | None]
    pixels: np.ndarray | None = None
    frame_indices: list[int] | None = None
    boxes: np.ndarray | None = None
    image_size: tuple[int, int] | None = None
    references: list[str] = field(default_factory=list)
    note: str | None = None


def run_of_result(result: Any) -> ViewerRun:
    """The ``ViewerRun`` of a ``captioning.caption.api.CaptionResult``."""
    att = None if result.attention is None or not result.has_attention else np.asarray(result.attention)
    log_probs = getattr(result, "token_log_probs", None)
    return ViewerRun(list(result.tokens), att, score=result.score,
                     log_probs=None if log_probs is None else [float(v) for v in log_probs],
                     nbest=[(str(c), float(s)) for c, s in result.nbest])


def entry_key(entry: Mapping[str, Any]) -> str:
    """The item an entry of a predictions / captions file describes: its image_id, video_id or input."""
    for key in ("image_id", "video_id", "input"):
        if key in entry:
            return str(entry[key])
    raise DataError("a predictions entry has no image_id, video_id or input")


def _prediction_file(path: Path) -> Path:
    if path.is_dir():
        for name in ("predictions.json", "captions.json"):
            if (path / name).is_file():
                return path / name
    if not path.is_file():
        raise ConfigError(f"viewer.compare={path}: no such predictions file; pass another run's "
                          f"predictions.json (captioning-evaluate) or captions.json (captioning-caption)")
    return path


def read_compare(path: str | Path) -> tuple[Path, dict[str, ViewerRun]]:
    """Another run's captions by item key: (the file read, key -> ``ViewerRun``), with its n-best
    lists from the ``nbest.json`` beside it when there is one.  Entries that failed are left out."""
    path = _prediction_file(Path(path))
    entries = read_predictions(path)
    nbest: dict[str, list[tuple[str, float]]] = {}
    if (path.parent / "nbest.json").is_file():
        for e in read_json(path.parent / "nbest.json", "n-best file"):
            nbest[entry_key(e)] = [(str(c["caption"]), float(c["score"])) for c in e.get("captions", [])]
    runs: dict[str, ViewerRun] = {}
    for e in entries:
        if "error" in e or "tokens" not in e:
            continue
        key = entry_key(e)
        lp = e.get("token_log_probs")
        runs[key] = ViewerRun([str(t) for t in e["tokens"]], e.get("attention"), score=e.get("score"),
                              log_probs=None if lp is None else [float(v) for v in lp],
                              nbest=nbest.get(key) or [(str(c), float(s)) for c, s in e.get("nbest", [])])
    return path, runs


def width_of(runs: Sequence[ViewerRun]) -> int | None:
    """The attention width N of the first run with attention (None: no attention at all)."""
    return next((int(r.attention.shape[1]) for r in runs if r.attention is not None and r.attention.ndim == 2), None)
