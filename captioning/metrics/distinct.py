"""Distinct-n (Li et al. 2016): how varied a set of captions is, not how right.

``Distinct_n`` = the number of distinct n-grams over all hypotheses divided by the number of
generated tokens (Li et al.'s definition; diverse-captioning papers report Distinct-1/2 beside
BLEU and CIDEr).  Per item: the same ratio within its caption.  References are not used.  Off
by default: ``metrics=[bleu,meteor,rouge,cider,distinct]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from captioning.metrics import METRICS, Scored
from captioning.metrics.ngrams import Shared, Tokens

ORDERS = (1, 2)


def ngrams(tokens: Tokens, n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def distinct(hypotheses: Sequence[Tokens], n: int) -> tuple[float, list[float]]:
    """(corpus, per-item) distinct n-grams / generated tokens; 0 for no tokens."""
    seen = {g for h in hypotheses for g in ngrams(h, n)}
    total = sum(len(h) for h in hypotheses)
    per_item = [len(set(ngrams(h, n))) / len(h) if len(h) else 0.0 for h in hypotheses]
    return (len(seen) / total if total else 0.0), per_item


@METRICS.register("distinct", keys=tuple(f"Distinct_{n}" for n in ORDERS), default=False)
def score_distinct(hypotheses: Sequence[Tokens], references: Sequence[Sequence[Tokens]], shared: Shared) -> Scored:
    scores, per = {}, {}
    for n in ORDERS:
        scores[f"Distinct_{n}"], per[f"Distinct_{n}"] = distinct(hypotheses, n)
    return Scored(scores=scores, per_item=per)
