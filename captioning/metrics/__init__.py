"""Caption metrics, registered: one module per metric, the COCO caption toolkit's exactly.

``METRICS`` maps a name to a scoring function ``(hypotheses, references, shared) -> Scored`` (token
lists in, the toolkit's result keys out) with metadata: ``keys`` (its result keys) and
``default`` (scored when no list is given).  Every module of this package is imported the first
time the registry is read, so a new metric is one module that registers itself::

    @METRICS.register("distinct", keys=("Distinct_1", "Distinct_2"), default=False)
    def score_distinct(hypotheses, references, shared): ...

``compute_metrics`` takes strings (PTB-tokenized as the toolkit does, or split on spaces) and
scores the chosen metrics in registration order; ``scoring`` scores results files.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from captioning.data.tokenizer import tokenize as ptb_tokenize
from captioning.errors import CaptioningError, DataError
from captioning.metrics.ngrams import Shared
from captioning.registry import Registry

__all__ = ["METRICS", "MetricError", "MetricResult", "Scored", "Shared", "compute_metrics", "default_metrics",
           "result_keys"]


class MetricError(CaptioningError):
    """A metric cannot be computed (e.g. METEOR without Java)."""


@dataclass
class Scored:
    """One metric's corpus scores and per-item scores by result key (+ statistics, e.g. BLEU's)."""

    scores: dict[str, float]
    per_item: dict[str, list[float]]
    stats: dict[str, Any] | None = None


Scorer = Callable[[Sequence[Sequence[str]], Sequence[Sequence[Sequence[str]]], Shared], Scored]
METRICS: Registry[Scorer] = Registry("metric", config_key="metrics", discover=__name__)


def default_metrics() -> list[str]:
    """The metrics scored when none are named (the toolkit's: BLEU, METEOR, ROUGE-L, CIDEr)."""
    return METRICS.names(default=True)


def result_keys(names: Sequence[str]) -> list[str]:
    """The result keys the named metrics give (``bleu`` -> ``Bleu_1`` .. ``Bleu_4``)."""
    return [k for n in names for k in METRICS.entry(n).meta["keys"]]


@dataclass
class MetricResult:
    """Corpus scores (the toolkit's keys), per-item scores, BLEU statistics and the seconds each
    step took (``tokenize``, ``ngrams``: the n-gram table BLEU and CIDEr-D share, then each metric)."""

    scores: dict[str, float]
    per_item: dict[Hashable, dict[str, float]] = field(default_factory=dict)
    bleu_stats: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def _tokenized(references: Mapping[Hashable, Sequence[str]], hypotheses: Mapping[Hashable, str],
               tok: Callable[[str], list[str]]) -> tuple[list[list[str]], list[list[list[str]]]]:
    hyps: list[list[str]] = []
    refs: list[list[list[str]]] = []
    for k, h in hypotheses.items():
        if not isinstance(h, str):
            raise DataError(f"hypothesis for id {k!r} is {type(h).__name__}, not a string")
        if k not in references:
            raise DataError(f"id {k!r} has a hypothesis but no references")
        rs = references[k]
        if isinstance(rs, str) or len(rs) == 0:
            raise DataError(f"id {k!r}: references must be a non-empty list of strings")
        for r in rs:
            if not isinstance(r, str):
                raise DataError(f"id {k!r}: reference {r!r} is not a string")
        hyps.append(tok(h))
        refs.append([tok(r) for r in rs])
    return hyps, refs


def compute_metrics(
    references: Mapping[Hashable, Sequence[str]],
    hypotheses: Mapping[Hashable, str],
    metrics: Sequence[str] | None = None,
    tokenize: bool = True,
) -> MetricResult:
    """Score ``hypotheses[key]`` against ``references[key]`` for every key of ``hypotheses``.

    ``metrics``: registered names (default: ``default_metrics()``), scored in registration order.
    ``tokenize=True`` applies the toolkit's PTB tokenization + punctuation removal
    (:func:`captioning.data.tokenizer.tokenize`) to both sides; ``tokenize=False`` splits the
    captions on whitespace.  Keys of ``references`` without a hypothesis are ignored (and do
    not count towards CIDEr's document frequencies), as with the toolkit's ``loadRes``.
    """
    names = default_metrics() if metrics is None else list(metrics)
    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise MetricError(f"unknown metric {unknown[0]!r}: choose from {', '.join(METRICS.names())}")
    clock = time.perf_counter()
    hyps, refs = _tokenized(references, hypotheses, ptb_tokenize if tokenize else str.split)
    seconds = {"tokenize": time.perf_counter() - clock}
    shared = Shared(hyps, refs)
    scores: dict[str, float] = {}
    per: dict[str, list[float]] = {}
    stats: dict[str, Any] = {}
    for name in (n for n in METRICS.names() if n in names):
        clock, before = time.perf_counter(), sum(shared.seconds.values())
        out = METRICS.get(name)(hyps, refs, shared)
        seconds[name] = time.perf_counter() - clock - (sum(shared.seconds.values()) - before)
        scores.update(out.scores)
        per.update(out.per_item)
        if out.stats is not None:
            stats[name] = out.stats
    seconds = {**seconds, **shared.seconds}
    per_item = {k: {key: float(v[i]) for key, v in per.items()} for i, k in enumerate(hypotheses)}
    return MetricResult(scores={k: float(v) for k, v in scores.items()}, per_item=per_item,
                        bleu_stats=stats.get("bleu"), seconds=seconds)
