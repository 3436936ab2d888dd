"""Structured accuracy of captions on the synthetic data: colour-shape binding, left-to-right order
and event order, each with the accuracy a random arrangement of the same words would get.

BLEU/CIDEr reward the right words; these metrics ask whether the words are put together right,
read from ``grounding.json`` (see docs/CONTRACTS.md), one caption per item.

Images (``kind: image``; ``word_classes`` with ``colour`` and ``shape``; objects with
``colour``, ``shape``, ``rank`` = left-to-right position, 0 = leftmost):

- a caption *names a pair* wherever a colour word is immediately followed by a shape word
  ("a red circle" -> (red, circle)); other colour or shape words name no pair (the data have no
  plural or counted forms).  A named pair *matches* the image's object with that colour and shape
  (pairs are distinct within an image), if any.
- **binding accuracy**: share of captions that name >= 1 pair and whose every named pair exists
  in the image.  Chance: the same, for the caption's own colours re-paired with its own shapes by
  a uniformly random permutation: ``perm(A) / k!`` with ``A[i, j] = 1`` when (colour_i, shape_j)
  exists (k named pairs; 0 when k = 0).
- **order accuracy**, over captions with >= 2 matched mentions: the matched objects are
  mentioned in strictly increasing left-to-right rank (the captions list objects left to right;
  mentioning an object twice breaks the order).  Chance: a uniformly random order of those
  mentions, ``1 / k!`` (0 when an object is mentioned twice).
- **object recall**: share of the image's objects that the caption matches; **pair precision**:
  share of named pairs that match (pooled over captions); **exact accuracy**: share of captions
  that name exactly the image's objects, each once, left to right, and no other pair.

Videos (``kind: video``; events with ``words`` and ``rank`` = time order, 0 = first; top-level
``reverse_order_words``, e.g. ["after"]):

- an event is *mentioned* wherever its ``words`` occur contiguously in the caption ("a red
  circle appears" mentions ["red", "circle", "appears"]); mentions are read in caption order.
- two consecutive mentions claim "first, then second" unless a reverse-order word lies between
  them ("B after A": A came first); a reverse word before the first mention ("after A, B") does
  not reverse anything.
- **event-order accuracy**, over captions of items with >= 2 events: the caption mentions every
  event exactly once and each claimed relation holds.  Chance: the same with the events assigned
  to the caption's mention slots in a uniformly random order (0.5 for two events named once;
  0 when the caption misses or repeats an event).  ``order_accuracy_all_named`` is the same
  restricted to captions that mention every event exactly once.
- **event recall**: share of the item's events the caption mentions.

All accuracies are means over captions (None when there is none to score); ``by_count`` splits
them by the item's number of objects / events.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from captioning.errors import DataError

# ------------------------------------------------------------------------------------- parsing


def tokens_of(caption: str | Sequence[str]) -> list[str]:
    """A caption as lower-case word tokens: a string is split into [a-z]+ words (punctuation dropped)."""
    if isinstance(caption, str):
        return re.findall(r"[a-z]+", caption.lower())
    return [str(t).lower() for t in caption]


def named_pairs(tokens: Sequence[str], colours: Sequence[str], shapes: Sequence[str]) -> list[tuple[str, str]]:
    """(colour, shape) for every colour word immediately followed by a shape word, in caption order."""
    cs, ss = set(colours), set(shapes)
    return [(a, b) for a, b in itertools.pairwise(tokens) if a in cs and b in ss]


def event_mentions(tokens: Sequence[str], events: Sequence[Sequence[str]]) -> list[tuple[int, int, int]]:
    """(start, end, event index) of every contiguous occurrence of an event's words, by start."""
    out = []
    for e, words in enumerate(events):
        k = len(words)
        if k == 0:
            continue
        out += [(s, s + k, e) for s in range(len(tokens) - k + 1) if list(tokens[s:s + k]) == list(words)]
    return sorted(out)


def claimed_forward(tokens: Sequence[str], mentions: Sequence[tuple[int, int, int]],
                    reverse_words: Sequence[str]) -> list[bool]:
    """For each pair of consecutive mentions: True when the caption says the first came first."""
    rev = set(reverse_words)
    return [not (rev & set(tokens[a[1]:b[0]])) for a, b in itertools.pairwise(mentions)]


# ---------------------------------------------------------------------------------- chance math


def permanent(a: np.ndarray) -> float:
    """Permanent of a square matrix (Ryser's formula, O(2^k k^2)); 1 for the empty matrix."""
    a = np.asarray(a, dtype=np.float64)
    k = a.shape[0]
    if a.shape != (k, k):
        raise ValueError(f"permanent needs a square matrix, got shape {a.shape}")
    if k == 0:
        return 1.0
    total = 0.0
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            total += (-1) ** size * float(np.prod(a[:, cols].sum(axis=1)))
    return (-1) ** k * total


def binding_chance(pairs: Sequence[tuple[str, str]], existing: set[tuple[str, str]]) -> float:
    """P(every re-paired (colour_i, shape_pi(i)) exists) for a uniformly random permutation pi."""
    k = len(pairs)
    if k == 0:
        return 0.0
    a = np.array([[(c, s) in existing for _, s in pairs] for c, _ in pairs], dtype=np.float64)
    return permanent(a) / math.factorial(k)


def increasing(ranks: Sequence[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(ranks))


def order_chance(ranks: Sequence[int]) -> float:
    """P(a uniformly random order of the mentions is strictly increasing): 1/k!, 0 on repeats."""
    return 1.0 / math.factorial(len(ranks)) if len(set(ranks)) == len(ranks) else 0.0


def relations_hold(ranks: Sequence[int], forward: Sequence[bool]) -> bool:
    """Whether consecutive ranks go up where ``forward`` and down where not."""
    return all((a < b) == f for (a, b), f in zip(itertools.pairwise(ranks), forward, strict=True))


def relations_chance(ranks: Sequence[int], forward: Sequence[bool]) -> float:
    """Share of the orderings of ``ranks`` over the mention slots for which the relations hold."""
    perms = list(itertools.permutations(ranks))
    return sum(relations_hold(p, forward) for p in perms) / len(perms)


# ------------------------------------------------------------------------------------- scoring


@dataclass(frozen=True)
class ImageCaptionScore:
    pairs: int  # named pairs
    matched: int  # named pairs that exist in the image
    binding: bool
    binding_chance: float
    ordered: bool  # >= 2 matched mentions: the order is scored
    order: bool
    order_chance: float
    recall: float
    exact: bool


def score_image_caption(tokens: Sequence[str], objects: Sequence[Mapping[str, Any]],
                        colours: Sequence[str], shapes: Sequence[str]) -> ImageCaptionScore:
    """Binding, order, recall and exactness of one caption against one image's objects."""
    rank = {(str(o["colour"]), str(o["shape"])): int(o["rank"]) for o in objects}
    pairs = named_pairs(tokens, colours, shapes)
    ranks = [rank[p] for p in pairs if p in rank]
    binding = bool(pairs) and len(ranks) == len(pairs)
    ordered = len(ranks) >= 2
    return ImageCaptionScore(
        pairs=len(pairs), matched=len(ranks), binding=binding,
        binding_chance=binding_chance(pairs, set(rank)),
        ordered=ordered, order=ordered and increasing(ranks),
        order_chance=order_chance(ranks) if ordered else 0.0,
        recall=len(set(ranks)) / len(objects) if objects else 0.0,
        exact=binding and ranks == sorted(rank.values()),
    )


@dataclass(frozen=True)
class VideoCaptionScore:
    events: int
    all_named: bool  # every event mentioned exactly once
    order: bool
    order_chance: float
    recall: float


def score_video_caption(tokens: Sequence[str], events: Sequence[Mapping[str, Any]],
                        reverse_words: Sequence[str]) -> VideoCaptionScore:
    """Event order and recall of one caption against one video's events."""
    mentions = event_mentions(tokens, [[str(w) for w in e["words"]] for e in events])
    named = [m[2] for m in mentions]
    all_named = len(events) >= 1 and sorted(named) == list(range(len(events)))
    ranks = [int(events[e]["rank"]) for e in named]
    forward = claimed_forward(tokens, mentions, reverse_words)
    scored = all_named and len(events) >= 2
    return VideoCaptionScore(
        events=len(events), all_named=all_named,
        order=scored and relations_hold(ranks, forward),
        order_chance=relations_chance(ranks, forward) if scored else 0.0,
        recall=len(set(named)) / len(events) if events else 0.0,
    )


# ----------------------------------------------------------------------------------- aggregate


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _image_summary(scores: Sequence[ImageCaptionScore]) -> dict[str, Any]:
    ordered = [s for s in scores if s.ordered]
    named = sum(s.pairs for s in scores)
    return {
        "captions": len(scores),
        "binding_accuracy": _mean([s.binding for s in scores]),
        "chance_binding_accuracy": _mean([s.binding_chance for s in scores]),
        "order_accuracy": _mean([s.order for s in ordered]),
        "chance_order_accuracy": _mean([s.order_chance for s in ordered]),
        "captions_ordered": len(ordered),
        "object_recall": _mean([s.recall for s in scores]),
        "pair_precision": sum(s.matched for s in scores) / named if named else None,
        "pairs_named": named,
        "exact_accuracy": _mean([s.exact for s in scores]),
    }


def _video_summary(scores: Sequence[VideoCaptionScore]) -> dict[str, Any]:
    multi = [s for s in scores if s.events >= 2]
    named = [s for s in multi if s.all_named]
    return {
        "captions": len(scores),
        "event_order_accuracy": _mean([s.order for s in multi]),
        "chance_event_order_accuracy": _mean([s.order_chance for s in multi]),
        "captions_ordered": len(multi),
        "order_accuracy_all_named": _mean([s.order for s in named]),
        "chance_order_accuracy_all_named": _mean([s.order_chance for s in named]),
        "captions_all_named": len(named),
        "event_recall": _mean([s.recall for s in scores]),
    }


@dataclass
class _Collected:
    scores: list[Any] = field(default_factory=list)
    by_count: dict[int, list[Any]] = field(default_factory=dict)

    def add(self, count: int, score: Any) -> None:
        self.scores.append(score)
        self.by_count.setdefault(count, []).append(score)


def _word_class(grounding: Mapping[str, Any], name: str) -> list[str]:
    classes = grounding.get("word_classes")
    if not isinstance(classes, Mapping) or name not in classes:
        raise DataError(f"grounding file has no word_classes.{name}: it was written by an older generator; "
                        f"regenerate it (captioning-generate dataset=<name> force=true)")
    return [str(w) for w in classes[name]]


def evaluate_structure(predictions: Mapping[Any, str | Sequence[str]], grounding: Mapping[str, Any]) -> dict[str, Any]:
    """Structured accuracy of one caption per item against a loaded ``grounding.json``.

    ``predictions``: item key (the dataset source id; int or str) -> the caption as tokens or as
    a string.  Returns the metrics of the module docstring for the file's ``kind``, their chance
    levels, ``items`` / ``items_missing`` (keys not in the file) and ``by_count`` (the same
    metrics by number of objects / events of the item).
    """
    kind = grounding.get("kind")
    items = grounding.get("items")
    if kind not in ("image", "video") or not isinstance(items, Mapping):
        raise DataError("grounding file needs 'kind' (image | video) and an 'items' mapping; "
                        "regenerate the synthetic dataset")
    if kind == "image":
        colours, shapes = _word_class(grounding, "colour"), _word_class(grounding, "shape")
    elif "reverse_order_words" not in grounding:
        raise DataError("grounding file has no 'reverse_order_words': it was written by an older generator; "
                        "regenerate it (captioning-generate dataset=moving_shapes force=true)")
    reverse = [str(w) for w in grounding.get("reverse_order_words") or []]
    collected, missing = _Collected(), 0
    for key, caption in predictions.items():
        entry = items.get(str(key))
        if entry is None:
            missing += 1
            continue
        tokens = tokens_of(caption)
        try:
            if kind == "image":
                objects = entry["objects"]
                collected.add(len(objects), score_image_caption(tokens, objects, colours, shapes))
            else:
                events = entry["events"]
                collected.add(len(events), score_video_caption(tokens, events, reverse))
        except KeyError as e:
            raise DataError(f"grounding file: item {key} lacks {e}; regenerate the synthetic dataset") from None
    summary = _image_summary if kind == "image" else _video_summary
    return {
        "kind": kind,
        **summary(collected.scores),
        "items": len(collected.scores),
        "items_missing": missing,
        "by_count": {str(n): summary(s) for n, s in sorted(collected.by_count.items())},
    }
