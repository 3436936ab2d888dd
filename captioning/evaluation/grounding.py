"""Attention grounding on the synthetic datasets: does the model look at the object it names?

The synthetic generators store where each word's object is (``grounding.json``, see
docs/CONTRACTS.md): a pixel box per object (images) or a frame span per event (videos), each with
the ``words`` that refer to it, and the words to score (top-level ``word_classes``).  For every
emitted class word that names exactly one object/event of its item (after resolving words that
name several by their neighbours, :func:`owners_in_context`) we measure, on the attention row
``alpha`` [N] of that word:

- attention-in-object: the attention mass inside the object (image: sum over cells of
  ``alpha * fraction of the cell inside the box``; video: sum over the sampled frames whose source
  index lies in the span ``[f0, f1)``);
- pointing: whether the argmax position lies in the object (image: argmax cell centre inside the
  box; video: argmax frame in the span).

Chance levels are the same metrics for uniform attention over the valid positions (image: the
box's share of the crop area and the share of cells whose centre is in the box; video: the share of
sampled valid frames in the span), averaged over the same evaluated words.

Images: attention cells tile the network input (``size x size`` after "resize shorter side to
``resize`` then centre crop ``size``", or a plain squash); :class:`Geometry` maps a box from the
original image into that frame.  ``Geometry()`` (or ``None``) means the grid covers the whole
original image (identity when the image already is the network input).
Videos: positions are frames (``pooled`` features, N = K) or frame-major cells (``grid``
features, N = K*h*w; the cells of a frame are summed).
Image regions (detector boxes, ``captioning-import``): the positions are boxes in the original
image's pixels instead of cells: attention-in-object sums ``alpha * fraction of the region's box
inside the object's box``, pointing asks whether the argmax region's box centre is in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from captioning.errors import ConfigError, DataError

# ------------------------------------------------------------------------------------ geometry


@dataclass(frozen=True)
class Geometry:
    """How an original image becomes the network input that the attention grid tiles.

    ``size``: side of the square network input (None: the grid covers the whole original image,
    whatever its size); ``resize``: shorter side before the centre crop (None: ``size``);
    ``crop``: "center" (resize shorter side then centre crop ``size x size``, like torchvision) or
    "none" (squash the whole image to ``size x size``).
    """

    size: int | None = None
    resize: int | None = None
    crop: str = "center"

    def __post_init__(self) -> None:
        if self.crop not in ("center", "none"):
            raise ConfigError(f"grounding geometry crop={self.crop!r} is not valid: use center | none")
        if self.size is not None and self.size < 1:
            raise ConfigError(f"grounding geometry size={self.size!r} must be >= 1 or None")

    @classmethod
    def from_preprocessing(cls, pre: Mapping[str, Any] | None) -> Geometry:
        """From a FeatureStore meta's ``settings["preprocessing"]`` dict ({size, resize, crop, ...})."""
        if not pre:
            return cls()
        return cls(size=int(pre["size"]), resize=None if pre.get("resize") is None else int(pre["resize"]),
                   crop=str(pre.get("crop", "center")))

    @classmethod
    def from_store_meta(cls, meta: Mapping[str, Any] | None) -> Geometry:
        """From a FeatureStore meta dict (reads ``settings.preprocessing``; identity when absent)."""
        settings = (meta or {}).get("settings") or {}
        return cls.from_preprocessing(settings.get("preprocessing"))

    def transform(self, image_size: Sequence[int]) -> tuple[float, float, float, float, float, float]:
        """(sx, sy, ox, oy, out_w, out_h): a point x of the original maps to ``x * sx - ox``.

        The network input spans ``[0, out_w) x [0, out_h)``.
        """
        w, h = float(image_size[0]), float(image_size[1])
        if w <= 0 or h <= 0:
            raise DataError(f"grounding: image size {list(image_size)} must be positive")
        if self.size is None:
            return 1.0, 1.0, 0.0, 0.0, w, h
        s = float(self.size)
        if self.crop == "none":
            return s / w, s / h, 0.0, 0.0, s, s
        resize = self.resize or self.size
        iw, ih = int(image_size[0]), int(image_size[1])
        if min(iw, ih) == resize:
            nw, nh = iw, ih
        elif iw <= ih:  # torchvision: the long side is int(resize * long / short)
            nw, nh = resize, int(resize * ih / iw)
        else:
            nw, nh = int(resize * iw / ih), resize
        left = int(round((nw - self.size) / 2.0))
        top = int(round((nh - self.size) / 2.0))
        return nw / w, nh / h, float(left), float(top), s, s


def _as_geometry(geometry: Geometry | Mapping[str, Any] | None) -> Geometry:
    if geometry is None:
        return Geometry()
    if isinstance(geometry, Geometry):
        return geometry
    if isinstance(geometry, Mapping):
        if "settings" in geometry:
            return Geometry.from_store_meta(geometry)
        return Geometry.from_preprocessing(geometry)
    raise ConfigError(f"grounding geometry must be a Geometry, a preprocessing dict or None, got {type(geometry).__name__}")


def box_in_input(image_size: Sequence[int], box: Sequence[float],
                 geometry: Geometry | None = None) -> tuple[float, float, float, float, float, float]:
    """The box [x0, y0, x1, y1) in network-input coordinates, clipped: (x0, y0, x1, y1, W_in, H_in)."""
    if len(box) != 4:
        raise DataError(f"grounding: box {list(box)} must be [x0, y0, x1, y1]")
    sx, sy, ox, oy, out_w, out_h = _as_geometry(geometry).transform(image_size)
    x0, y0, x1, y1 = (float(v) for v in box)
    x0, x1 = np.clip([x0 * sx - ox, x1 * sx - ox], 0.0, out_w)
    y0, y1 = np.clip([y0 * sy - oy, y1 * sy - oy], 0.0, out_h)
    return float(x0), float(y0), float(max(x0, x1)), float(max(y0, y1)), out_w, out_h


def cell_box_overlap(grid: Sequence[int], image_size: Sequence[int], box: Sequence[float],
                     geometry: Geometry | Mapping[str, Any] | None = None) -> np.ndarray:
    """Fraction of each attention cell's area inside ``box``: float64 [h*w], row-major.

    ``grid``: (h, w) cells tiling the network input; ``image_size``: (W, H) of the original image;
    ``box``: [x0, y0, x1, y1] pixels of the original (x1/y1 exclusive); ``geometry``: the
    preprocessing (None: the grid covers the whole original image).
    """
    gh, gw = int(grid[0]), int(grid[1])
    if gh < 1 or gw < 1:
        raise DataError(f"grounding: grid {list(grid)} must be (h, w) with h, w >= 1")
    x0, y0, x1, y1, out_w, out_h = box_in_input(image_size, box, _as_geometry(geometry))
    xs = np.linspace(0.0, out_w, gw + 1)
    ys = np.linspace(0.0, out_h, gh + 1)
    fx = np.clip(np.minimum(xs[1:], x1) - np.maximum(xs[:-1], x0), 0.0, None) / np.diff(xs)  # [w]
    fy = np.clip(np.minimum(ys[1:], y1) - np.maximum(ys[:-1], y0), 0.0, None) / np.diff(ys)  # [h]
    return np.outer(fy, fx).reshape(-1)


def cell_centres_in_box(grid: Sequence[int], image_size: Sequence[int], box: Sequence[float],
                        geometry: Geometry | Mapping[str, Any] | None = None) -> np.ndarray:
    """bool [h*w]: whether each cell's centre lies inside the box (half-open, input coordinates)."""
    gh, gw = int(grid[0]), int(grid[1])
    x0, y0, x1, y1, out_w, out_h = box_in_input(image_size, box, _as_geometry(geometry))
    cx = (np.arange(gw) + 0.5) * out_w / gw
    cy = (np.arange(gh) + 0.5) * out_h / gh
    inside_x = (cx >= x0) & (cx < x1)
    inside_y = (cy >= y0) & (cy < y1)
    return np.outer(inside_y, inside_x).reshape(-1)


def region_box_overlap(regions: np.ndarray, box: Sequence[float]) -> np.ndarray:
    """Fraction of each region box's area inside ``box``: float64 [n]; regions [n, 4] and box
    [x0, y0, x1, y1] in the same pixels.  A region of no area counts 1 when its point is inside."""
    r = np.asarray(regions, dtype=np.float64).reshape(-1, 4)
    x0, y0, x1, y1 = (float(v) for v in box)
    w = np.clip(np.minimum(r[:, 2], x1) - np.maximum(r[:, 0], x0), 0.0, None)
    h = np.clip(np.minimum(r[:, 3], y1) - np.maximum(r[:, 1], y0), 0.0, None)
    area = (r[:, 2] - r[:, 0]) * (r[:, 3] - r[:, 1])
    point = ((r[:, 0] >= x0) & (r[:, 0] < x1) & (r[:, 1] >= y0) & (r[:, 1] < y1)).astype(np.float64)
    return np.where(area > 0, w * h / np.where(area > 0, area, 1.0), point)


def region_centres_in_box(regions: np.ndarray, box: Sequence[float]) -> np.ndarray:
    """bool [n]: whether each region box's centre lies inside ``box`` (half-open)."""
    r = np.asarray(regions, dtype=np.float64).reshape(-1, 4)
    cx, cy = (r[:, 0] + r[:, 2]) / 2, (r[:, 1] + r[:, 3]) / 2
    return (cx >= box[0]) & (cx < box[2]) & (cy >= box[1]) & (cy < box[3])


def _normalised(alpha: np.ndarray, valid: int | None = None) -> np.ndarray:
    """alpha over the valid positions, renormalised to sum 1 (zeros stay zeros)."""
    a = np.asarray(alpha, dtype=np.float64).reshape(-1)
    if valid is not None:
        a = a[:valid]
    a = np.where(np.isfinite(a), np.clip(a, 0.0, None), 0.0)
    total = a.sum()
    return a / total if total > 0 else a


# -------------------------------------------------------------------------------------- video


def frames_in_span(frame_indices: Sequence[int], span: Sequence[int]) -> np.ndarray:
    """bool [K]: whether each sampled frame's source index lies in ``[f0, f1)``."""
    f0, f1 = int(span[0]), int(span[1])
    idx = np.asarray(list(frame_indices), dtype=np.int64)
    return (idx >= f0) & (idx < f1)


def frame_attention(alpha: np.ndarray, num_frames: int, valid_frames: int | None = None) -> np.ndarray:
    """Per-frame attention [K_valid] from alpha [K] (pooled) or [K*h*w] (frame-major grid), renormalised."""
    a = np.asarray(alpha, dtype=np.float64).reshape(-1)
    k = int(num_frames)
    if k < 1 or a.size % k:
        raise DataError(f"grounding: attention has {a.size} positions, not a multiple of the {k} sampled frames")
    per_frame = a.reshape(k, -1).sum(axis=1) if a.size != k else a
    return _normalised(per_frame, valid_frames)


# ------------------------------------------------------------------------------- word classes


def coverage_entropy(predictions: Sequence[Mapping[str, Any]]) -> float:
    """Mean normalised entropy of each caption's coverage ``sum_t alpha_t`` over its positions
    (1 = attention spread evenly over all of them; what the doubly stochastic term pushes towards).
    ``predictions``: entries with an ``attention`` [T, N] array (``captioning.predictions.read_predictions``);
    entries without one are skipped."""
    values = []
    for p in predictions:
        att = p.get("attention")
        if att is None or len(att) == 0:
            continue
        cov = np.asarray(att, dtype=np.float64).sum(0)
        if cov.size < 2 or cov.sum() <= 0:
            continue
        q = cov / cov.sum()
        values.append(float(-(q[q > 0] * np.log(q[q > 0])).sum() / np.log(cov.size)))
    return float(np.mean(values)) if values else float("nan")


def word_classes_of(grounding: Mapping[str, Any]) -> dict[str, list[str]]:
    """The words to score, by class, from a grounding file's top-level ``word_classes``.

    The generator that wrote the file lists them (e.g. ``{"colour": [...], "shape": [...],
    "verb": [...]}``), so this module does not depend on any generator's vocabulary.
    """
    classes = grounding.get("word_classes")
    if not isinstance(classes, Mapping) or not classes:
        raise DataError("grounding file has no top-level 'word_classes' (class -> words to score): it was "
                        "written by an older generator; regenerate it (captioning-generate dataset=<name> "
                        "force=true) or pass word_classes explicitly")
    return {str(c): [str(w) for w in ws] for c, ws in classes.items()}


def owners_in_context(tokens: Sequence[str], owners: Sequence[set[int]]) -> list[set[int]]:
    """Resolve words that name several objects by the words next to them.

    ``owners[t]``: the objects whose ``words`` contain token t.  When token t names several
    objects, it is narrowed to those also named by its left and then its right neighbour (when
    the neighbour names any of them): in "a red square" with a red circle, a red square and a
    blue square in the image, "red" -> {red circle, red square} & {red square, blue square} =
    {red square}, and "square" likewise.  Words naming one object, or none, are left alone.
    """
    out = []
    for t, own in enumerate(owners):
        own = set(own)
        for n in (t - 1, t + 1):
            if len(own) > 1 and 0 <= n < len(tokens) and own & owners[n]:
                own &= owners[n]
        out.append(own)
    return out


# ---------------------------------------------------------------------------------- aggregate


@dataclass
class _Tally:
    evaluated: int = 0
    ambiguous: int = 0
    not_in_item: int = 0
    unobservable: int = 0
    mass: float = 0.0
    hits: int = 0
    chance_mass: float = 0.0
    chance_hits: float = 0.0

    def add(self, mass: float, hit: bool, chance_mass: float, chance_hit: float) -> None:
        self.evaluated += 1
        self.mass += mass
        self.hits += int(hit)
        self.chance_mass += chance_mass
        self.chance_hits += chance_hit

    def to_dict(self) -> dict[str, Any]:
        n = self.evaluated

        def mean(x: float) -> float | None:
            return x / n if n else None

        return {
            "attention_in_object": mean(self.mass),
            "pointing_accuracy": mean(self.hits),
            "chance_attention_in_object": mean(self.chance_mass),
            "chance_pointing_accuracy": mean(self.chance_hits),
            "words_evaluated": n,
            "words_ambiguous": self.ambiguous,
            "words_not_in_item": self.not_in_item,
            "words_unobservable": self.unobservable,
        }


@dataclass
class GroundingResult:
    """Running totals of :func:`evaluate_grounding`; ``to_dict()`` gives the JSON-ready summary.

    Counts: ``words_evaluated`` (name exactly one object/event of the item), ``words_ambiguous``
    (name several), ``words_not_in_item`` (a class word that names nothing in the item, e.g. a
    hallucinated colour), ``words_unobservable`` (the object was cropped away / no sampled frame
    falls in the span).  Words outside every class (function words) are not counted.
    """

    kind: str
    total: _Tally = field(default_factory=_Tally)
    by_class: dict[str, _Tally] = field(default_factory=dict)
    by_word: dict[str, _Tally] = field(default_factory=dict)
    items: int = 0
    items_missing: int = 0

    def tally(self, word: str, cls: str) -> list[_Tally]:
        return [self.total, self.by_class.setdefault(cls, _Tally()), self.by_word.setdefault(word, _Tally())]

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind, **self.total.to_dict(), "items": self.items,
               "items_missing": self.items_missing}
        out["by_class"] = {c: t.to_dict() for c, t in sorted(self.by_class.items())}
        out["by_word"] = {w: t.to_dict() for w, t in sorted(self.by_word.items(), key=lambda kv: -kv[1].evaluated)}
        return out


def _item_attention(tokens: Sequence[str], attention: Any, key: str) -> np.ndarray:
    a = np.asarray(attention, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < len(tokens):
        raise DataError(f"grounding: item {key}: attention has shape {list(a.shape)}, expected "
                        f"[T >= {len(tokens)} tokens, N positions]")
    return a


def _checked_items(grounding: Mapping[str, Any], kind: str | None, *, grid: Sequence[int] | None,
                   boxes: Mapping[Any, Any] | None, frame_indices: Mapping[Any, Sequence[int]] | None,
                   ) -> tuple[str, Mapping[str, Any]]:
    """(kind, the file's ``items``) of a grounding request, or a one-line error naming what is
    missing: a kind that is not the file's, no items, no positions to score against."""
    kind = kind or grounding.get("kind")
    if kind not in ("image", "video"):
        raise ConfigError(f"grounding kind={kind!r} is not valid: use image | video")
    if grounding.get("kind", kind) != kind:
        raise DataError(f"grounding file is for kind={grounding.get('kind')!r} but kind={kind!r} was asked for")
    items = grounding.get("items")
    if not isinstance(items, Mapping):
        raise DataError("grounding file has no 'items' mapping; regenerate the synthetic dataset")
    if kind == "image" and grid is None and boxes is None:
        raise ConfigError("image grounding needs grid=(h, w) of the attention cells (FeatureStore meta 'grid') "
                          "or the boxes of the attended regions")
    if kind == "video" and frame_indices is None:
        raise ConfigError("video grounding needs frame_indices (the sampled source frames per video)")
    return kind, items


def _class_of_word(word_classes: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """word -> its class (a word listed under several classes keeps the first)."""
    word_class: dict[str, str] = {}
    for c, ws in word_classes.items():
        for w in list(ws):
            word_class.setdefault(str(w), c)
    return word_class


@dataclass(frozen=True)
class _Positions:
    """What the N attention positions of every item are: cells of ``grid`` (images, after
    ``geometry``), region ``boxes`` (image regions, in ``image_sizes``), or the sampled
    ``frame_indices`` (videos, frames or frame-major cells); ``valid``: key -> N_valid."""

    kind: str
    grid: Sequence[int] | None
    geometry: Geometry
    boxes: Mapping[Any, Any] | None
    image_sizes: Mapping[Any, Sequence[int]]
    frame_indices: Mapping[str, list[int]]
    valid: Mapping[str, int]

    def regions(self, raw_key: Any, entry: Mapping[str, Any], objects: Sequence[Mapping[str, Any]],
                positions: int) -> list[Region | None]:
        """Each object/event of one item among its ``positions`` attention positions (None where
        it is unobservable)."""
        key = str(raw_key)
        if self.kind == "image" and self.boxes is not None:
            return _box_regions(entry, objects, self.boxes.get(raw_key, self.boxes.get(key)),
                                self.image_sizes.get(raw_key, self.image_sizes.get(key)), key)
        if self.kind == "image":
            return _image_regions(entry, objects, self.grid, self.geometry, positions, self.valid.get(key), key)
        return _video_regions(objects, self.frame_indices.get(key), positions, self.valid.get(key), self.grid, key)


def _tally_words(result: GroundingResult, tokens: Sequence[str], alpha: np.ndarray,
                 objects: Sequence[Mapping[str, Any]], regions: Sequence[Region | None],
                 word_class: Mapping[str, str]) -> None:
    """Count each class word of one caption (tokens [T], alpha [T', N]) into ``result``: scored
    when it names exactly one observable object, else as not in the item / ambiguous /
    unobservable."""
    named = owners_in_context(tokens, [{i for i, o in enumerate(objects) if w in o.get("words", ())}
                                       for w in tokens])
    for t, word in enumerate(tokens):
        cls = word_class.get(word)
        if cls is None:
            continue
        owners = sorted(named[t])
        tallies = result.tally(word, cls)
        if not owners:
            for tl in tallies:
                tl.not_in_item += 1
            continue
        if len(owners) > 1:
            for tl in tallies:
                tl.ambiguous += 1
            continue
        region = regions[owners[0]]
        if region is None:
            for tl in tallies:
                tl.unobservable += 1
            continue
        mass, hit = region.score(alpha[t])
        for tl in tallies:
            tl.add(mass, hit, region.chance_mass, region.chance_hit)


def evaluate_grounding(
    predictions: Mapping[Any, tuple[Sequence[str], Any]],
    grounding: Mapping[str, Any],
    *,
    kind: str | None = None,
    grid: Sequence[int] | None = None,
    frame_indices: Mapping[Any, Sequence[int]] | None = None,
    geometry: Geometry | Mapping[str, Any] | None = None,
    valid: Mapping[Any, int] | None = None,
    word_classes: Mapping[str, Sequence[str]] | None = None,
    boxes: Mapping[Any, Any] | None = None,
    image_sizes: Mapping[Any, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """Attention grounding of decoded captions against a loaded ``grounding.json``.

    ``predictions``: item key (the dataset source id, int or str) -> (tokens [T], attention [T', N]
    with T' >= T; row t is the attention used to emit token t).  ``grid``: (h, w) of the image
    feature grid (images; videos with ``grid`` features).  ``frame_indices``: key -> the K source
    frame indices of the sampled frames (videos).  ``valid``: key -> number of real positions N_valid
    as the FeatureStore counts them (padded video frames are ignored; default: all).
    ``geometry``: image preprocessing (:class:`Geometry` or a preprocessing dict; None: identity).
    ``word_classes``: class -> words to evaluate (default: the file's top-level ``word_classes``,
    :func:`word_classes_of`; a clear error when it has none).  ``boxes``: key -> [n, 4] pixel boxes
    of the n valid regions, for image regions instead of a ``grid``; ``image_sizes``: key -> (W, H)
    they lie in (default: the grounding file's size of the image).

    Returns ``attention_in_object``, ``pointing_accuracy``, their ``chance_*`` levels (None when
    no word was evaluated), the word counts, ``items``, ``items_missing`` and ``by_class`` /
    ``by_word`` breakdowns with the same fields.
    """
    kind, items = _checked_items(grounding, kind, grid=grid, boxes=boxes, frame_indices=frame_indices)
    positions = _Positions(kind, grid, _as_geometry(geometry), boxes, image_sizes or {},
                           {str(k): list(v) for k, v in (frame_indices or {}).items()},
                           {str(k): int(v) for k, v in (valid or {}).items()})
    word_class = _class_of_word(word_classes or word_classes_of(grounding))
    result = GroundingResult(kind=kind)
    for raw_key, (tokens, attention) in predictions.items():
        key = str(raw_key)
        entry = items.get(key)
        if entry is None or attention is None:
            result.items_missing += 1
            continue
        result.items += 1
        tokens = [str(t) for t in tokens]
        alpha = _item_attention(tokens, attention, key)
        objects = entry.get("objects" if kind == "image" else "events") or []
        regions = positions.regions(raw_key, entry, objects, alpha.shape[1])
        _tally_words(result, tokens, alpha, objects, regions, word_class)
    return result.to_dict()


@dataclass
class Region:
    """Where one object lies among the valid positions: ``weight`` [N_valid], the fraction of each
    position inside it, and ``inside`` [N_valid], whether pointing at that position hits it.
    ``frames``: for videos, the K sampled frames (attention over K*h*w grid positions is summed
    per frame).  ``score(alpha)``: the attention mass inside and whether the argmax hits."""

    weight: np.ndarray
    inside: np.ndarray
    frames: int | None = None

    @classmethod
    def of_box(cls, grid: Sequence[int], image_size: Sequence[int], box: Sequence[float],
               geometry: Geometry | Mapping[str, Any] | None = None) -> Region:
        """An image object's box on the feature grid (after the extractor's resize and crop)."""
        return cls(cell_box_overlap(grid, image_size, box, geometry), cell_centres_in_box(grid, image_size, box, geometry))

    @classmethod
    def of_span(cls, frame_indices: Sequence[int], span: Sequence[int], valid_frames: int | None = None) -> Region:
        """A video event's frame span ``[f0, f1)`` among the valid sampled frames."""
        k_valid = len(frame_indices) if valid_frames is None else int(valid_frames)
        inside = frames_in_span(frame_indices, span)[:k_valid]
        return cls(inside.astype(np.float64), inside, frames=len(frame_indices))

    @property
    def chance_mass(self) -> float:
        return float(self.weight.mean())

    @property
    def chance_hit(self) -> float:
        return float(self.inside.mean())

    def score(self, alpha: np.ndarray) -> tuple[float, bool]:
        """(attention mass in the object, argmax hit) of alpha [N] (renormalised over the valid positions)."""
        n = self.weight.size
        a = frame_attention(alpha, self.frames, n) if self.frames is not None else _normalised(alpha, n)
        if a.size != n:
            raise DataError(f"grounding: attention has {a.size} valid positions but the object's region has {n}")
        return float((a * self.weight).sum()), bool(self.inside[int(np.argmax(a))]) if n else False


def _image_regions(entry: Mapping[str, Any], objects: Sequence[Mapping[str, Any]], grid: Sequence[int],
                   geom: Geometry, positions: int, valid: int | None, key: str) -> list[Region | None]:
    size = entry.get("size")
    if not size or len(size) != 2:
        raise DataError(f"grounding file: item {key} has no 'size': [W, H]; regenerate the dataset")
    cells = int(grid[0]) * int(grid[1])
    if positions != cells:
        raise DataError(f"grounding: item {key}: attention has {positions} positions but the grid "
                        f"{list(grid)} has {cells} cells")
    if valid is not None and valid != cells:
        raise DataError(f"grounding: item {key}: valid={valid} but an image has {cells} cells")
    regions = [Region.of_box(grid, size, o["box"], geom) for o in objects]
    return [r if r.weight.sum() > 0 else None for r in regions]


def _box_regions(entry: Mapping[str, Any], objects: Sequence[Mapping[str, Any]], boxes: Any,
                 boxes_size: Sequence[int] | None, key: str) -> list[Region | None]:
    """Each object among the valid region boxes (moved from ``boxes_size`` to the file's image size)."""
    size = entry.get("size")
    if not size or len(size) != 2:
        raise DataError(f"grounding file: item {key} has no 'size': [W, H]; regenerate the dataset")
    if boxes is None:
        raise DataError(f"grounding: item {key} has no region boxes")
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if boxes_size is not None:
        sx, sy = float(size[0]) / float(boxes_size[0]), float(size[1]) / float(boxes_size[1])
        b = b * np.array([sx, sy, sx, sy])
    out: list[Region | None] = []
    for o in objects:
        weight = region_box_overlap(b, o["box"])
        out.append(Region(weight, region_centres_in_box(b, o["box"])) if weight.sum() > 0 else None)
    return out


def _video_regions(events: Sequence[Mapping[str, Any]], frames: Sequence[int] | None, positions: int,
                   valid: int | None, grid: Sequence[int] | None, key: str) -> list[Region | None]:
    if not frames:
        raise DataError(f"grounding: video {key} has no frame_indices; pass the sampled frames of every video")
    k = len(frames)
    cells = positions // k if positions % k == 0 else 0
    if cells < 1 or (cells > 1 and grid is not None and cells != int(grid[0]) * int(grid[1])):
        raise DataError(f"grounding: video {key}: attention has {positions} positions, which is neither "
                        f"the {k} sampled frames nor {k} frames x grid cells")
    k_valid = k if valid is None else max(0, min(k, int(valid) // cells))
    if k_valid < 1:
        return [None] * len(events)
    regions = [Region.of_span(frames, e["span"], k_valid) for e in events]
    return [r if r.inside.any() else None for r in regions]
