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

Image regions (detector boxes, ``captioning-import``): attention-in-object sums ``alpha * fraction
of the region's box inside the object's box``, pointing asks whether the argmax region's box centre
is in it.  Where each object lies among the positions (cells after the extractor's resize and crop,
region boxes, sampled frames): ``captioning.evaluation.object_regions``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from captioning.errors import ConfigError, DataError
from captioning.evaluation.object_regions import (
    AttentionPositions,
    Geometry,
    Region,
    as_geometry,
)

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


def class_of_word(word_classes: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """word -> its class (a word listed under several classes keeps the first)."""
    word_class: dict[str, str] = {}
    for c, ws in word_classes.items():
        for w in list(ws):
            word_class.setdefault(str(w), c)
    return word_class


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
    positions = AttentionPositions(kind, grid, as_geometry(geometry), boxes, image_sizes or {},
                                   {str(k): list(v) for k, v in (frame_indices or {}).items()},
                                   {str(k): int(v) for k, v in (valid or {}).items()})
    word_class = class_of_word(word_classes or word_classes_of(grounding))
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
