"""Run probes on a model: questions -> candidate word ids -> scores -> credit per item.

``run_probes`` asks every probe of ``names`` about every item, scores each distinct candidate
caption once per item (``captioning.models.likelihood``, batched over items), and returns per
probe a ``ProbeResult``: accuracy (mean over items of the share of its questions answered
right, ties split), its exact chance (mean over items of the mean 1/k of its questions), how
many items could be perturbed, and per item and per question what was asked and scored.
Candidates are compared as word ids: a perturbation that the vocabulary maps onto the
reference (e.g. two swapped unknown words) or onto an earlier candidate is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from captioning.evaluation.probes import PROBES, ProbeItem, Question
from captioning.models.likelihood import Candidate, caption_log_likelihoods

Ids = tuple[int, ...]
Features = Callable[[list[int]], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class ProbeResult:
    """One probe's outcome; ``per_item``: key -> [questions, credit, chance sum]; ``clusters``:
    key -> the unit it was drawn with, where that is not the item itself (``ProbeItem.cluster``)."""

    probe: str
    items_total: int = 0
    per_item: dict[str, list[float]] = field(default_factory=dict)
    clusters: dict[str, str] = field(default_factory=dict)
    details: list[dict[str, Any]] = field(default_factory=list)

    @property
    def items(self) -> int:
        return len(self.per_item)

    @property
    def questions(self) -> int:
        return int(sum(q for q, _, _ in self.per_item.values()))

    def _mean(self, k: int) -> float | None:
        vals = [v[k] / v[0] for v in self.per_item.values()]
        return sum(vals) / len(vals) if vals else None

    def summary(self) -> dict[str, Any]:
        """The numbers a report quotes (no per-question details)."""
        acc, chance = self._mean(1), self._mean(2)
        return {"probe": self.probe, "accuracy": acc, "chance": chance, "items": self.items,
                "items_total": self.items_total, "questions": self.questions, "ties": "split",
                "per_item": {k: [int(q), round(c, 6), round(ch, 6)] for k, (q, c, ch) in self.per_item.items()},
                **({"clusters": dict(self.clusters)} if self.clusters else {})}


def credit(scores: Sequence[float]) -> float:
    """Credit of candidate 0 (the reference): 1/m when it ties m - 1 others at the top, else 0."""
    top = max(scores)
    return 1.0 / sum(s == top for s in scores) if scores[0] == top else 0.0


def encode_question(q: Question, encode: Callable[[Sequence[str]], Ids]) -> dict[Ids, str] | None:
    """The question's candidates: word ids -> text, reference first, candidates with the ids of
    an earlier one dropped; None when no perturbation survives."""
    out: dict[Ids, str] = {}
    for tokens in (q.reference, *q.perturbations):
        out.setdefault(encode(tokens), " ".join(tokens))
    return out if len(out) > 1 else None


def run_probes(names: Sequence[str], decoder, vocab, items: Sequence[ProbeItem], features: Features,
               batch_items: int = 32) -> dict[str, ProbeResult]:
    """Every probe of ``names`` on ``items``; ``features(rows)`` gives ``([B,N,C], [B,N])`` of
    the items at those positions of ``items``."""
    probes = {n: PROBES.get(n) for n in names}
    results = {n: ProbeResult(n, len(items)) for n in names}

    def encode(tokens: Sequence[str]) -> Ids:
        return tuple(vocab.encode(list(tokens)))

    for start in range(0, len(items), batch_items):
        rows = list(range(start, min(start + batch_items, len(items))))
        asked = {n: [(r, ids, q) for r in rows for q in probe(items[r])
                     if (ids := encode_question(q, encode)) is not None] for n, probe in probes.items()}
        unique = list(dict.fromkeys((r, c) for qs in asked.values() for r, ids, _ in qs for c in ids))
        if not unique:
            continue
        feats, mask = features(rows)
        scored = caption_log_likelihoods(decoder, feats, mask, [Candidate(r - start, c) for r, c in unique],
                                         vocab.bos, vocab.eos)
        score = {key: s / n for key, (s, n) in zip(unique, scored, strict=True)}  # length-normalised
        for name, qs in asked.items():
            _tally(results[name], items, qs, score)
    return results


def _tally(result: ProbeResult, items: Sequence[ProbeItem], asked: list, score: dict) -> None:
    for r, ids, q in asked:
        scores = [score[(r, c)] for c in ids]  # reference first
        got = credit(scores)
        entry = result.per_item.setdefault(items[r].key, [0, 0.0, 0.0])
        if items[r].cluster != items[r].key:
            result.clusters[items[r].key] = items[r].cluster
        entry[0] += 1
        entry[1] += got
        entry[2] += 1.0 / len(ids)
        result.details.append({"item": items[r].key, "kind": q.kind, "candidates": list(ids.values()),
                               "scores": [round(s, 6) for s in scores], "credit": got})
