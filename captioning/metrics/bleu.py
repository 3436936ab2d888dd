"""BLEU-1..4 as the COCO caption toolkit computes it (pycocoevalcap ``Bleu``, ``option='closest'``).

Corpus level: clipped n-gram counts against the per-n-gram maximum over the references, the
brevity penalty with the *closest* reference length (ties: the shorter reference), the toolkit's
epsilons ``tiny = 1e-15`` (numerators) and ``small = 1e-9`` (denominators).  Per-item scores are
computed the same way on one item's statistics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from captioning.metrics import METRICS, Scored
from captioning.metrics.ngrams import NgramTable, Shared, Tokens

KEYS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4")
_TINY = 1e-15  # the toolkit's BLEU epsilons
_SMALL = 1e-9


@dataclass
class BleuResult:
    """Corpus BLEU-1..n, per-item BLEU-1..n and the toolkit's statistics line."""

    scores: list[float]
    per_item: list[list[float]]  # [items][n]
    stats: dict[str, Any]  # testlen, reflen, guess [n], correct [n], ratio


def _bleu_from_stats(
    testlen: float, reflen: float, guess: Sequence[int], correct: Sequence[int]
) -> tuple[list[float], float]:
    out = []
    b = 1.0
    for k in range(len(guess)):
        b *= float(correct[k] + _TINY) / (guess[k] + _SMALL)
        out.append(b ** (1.0 / (k + 1)))
    ratio = (testlen + _TINY) / (reflen + _SMALL)
    if ratio < 1:
        bp = math.exp(1 - 1 / ratio)
        out = [s * bp for s in out]
    return out, ratio


def bleu(
    hypotheses: Sequence[Tokens],
    references: Sequence[Sequence[Tokens]],
    n: int = 4,
    *,
    table: NgramTable | None = None,
) -> BleuResult:
    """Corpus and per-item BLEU-1..n exactly as pycocoevalcap (``option='closest'``).

    ``hypotheses[i]`` is a token list, ``references[i]`` a non-empty list of token lists.
    """
    t = table if table is not None and table.n == n else NgramTable(hypotheses, references, n)
    N = t.num_items
    if N == 0:
        return BleuResult([0.0] * n, [], {"testlen": 0, "reflen": 0, "guess": [0] * n,
                                          "correct": [0] * n, "ratio": 0.0})  # fmt: skip
    G = t.num_ngrams
    # clipped counts: hypothesis count vs the maximum count over the item's references
    _, r_item, r_gid, _, r_cnt = t.ref_entries()
    rkey = r_item * G + r_gid
    idx = np.argsort(rkey, kind="stable")
    rkey, r_cnt = rkey[idx], r_cnt[idx]
    starts = np.flatnonzero(np.r_[True, rkey[1:] != rkey[:-1]])
    ukey, maxc = rkey[starts], np.maximum.reduceat(r_cnt, starts) if len(starts) else r_cnt[:0]
    h_item, h_gid, h_ord, h_cnt = t.hyp_entries()
    hkey = h_item * G + h_gid
    pos = np.minimum(np.searchsorted(ukey, hkey), max(len(ukey) - 1, 0))
    hit = (ukey[pos] == hkey) if len(ukey) else np.zeros(len(hkey), bool)
    clipped = np.where(hit, np.minimum(h_cnt, maxc[pos] if len(ukey) else 0), 0)
    correct = np.bincount(h_item * n + h_ord, clipped, minlength=N * n).reshape(N, n)
    correct = correct.round().astype(np.int64)
    testlen = t.lengths[:N]
    guess = np.maximum(0, testlen[:, None] - np.arange(n)[None, :])
    # closest reference length, ties to the shorter one
    rl = t.lengths[N:]
    big = int(rl.max(initial=0)) + 1
    closeness = np.abs(rl - testlen[t.ref_item]) * big + rl
    reflen = np.minimum.reduceat(closeness, t.ref_offsets) % big
    # per item (vectorised toolkit formula)
    per = np.empty((N, n))
    b = np.ones(N)
    for k in range(n):
        b = b * ((correct[:, k].astype(np.float64) + _TINY) / (guess[:, k] + _SMALL))
        per[:, k] = b ** (1.0 / (k + 1))
    ratio = (testlen + _TINY) / (reflen + _SMALL)
    short = ratio < 1
    if short.any():
        per[short] *= np.exp(1 - 1 / ratio[short])[:, None]
    tot_test, tot_ref = int(testlen.sum()), int(reflen.sum())
    tot_guess = [int(x) for x in guess.sum(0)]
    tot_correct = [int(x) for x in correct.sum(0)]
    scores, tot_ratio = _bleu_from_stats(tot_test, tot_ref, tot_guess, tot_correct)
    stats = {"testlen": tot_test, "reflen": tot_ref, "guess": tot_guess,
             "correct": tot_correct, "ratio": tot_ratio}  # fmt: skip
    return BleuResult(scores=scores, per_item=per.tolist(), stats=stats)


@METRICS.register("bleu", keys=KEYS, default=True)
def score_bleu(hypotheses: Sequence[Tokens], references: Sequence[Sequence[Tokens]], shared: Shared) -> Scored:
    res = bleu(hypotheses, references, table=shared.ngrams())
    return Scored(scores=dict(zip(KEYS, res.scores, strict=True)),
                  per_item={k: [p[i] for p in res.per_item] for i, k in enumerate(KEYS)}, stats=res.stats)
