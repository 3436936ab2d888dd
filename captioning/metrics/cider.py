"""CIDEr-D as the COCO caption toolkit computes it (pycocoevalcap ``Cider``, the scorer behind ``CIDEr``).

TF-IDF vectors of 1..4-grams with document frequencies from the references of the scored set,
``idf = log(N) - log(max(1, df))``, clipped hypothesis weights ``min(h, r) * r``, a Gaussian length
penalty ``exp(-(delta^2) / (2 sigma^2))`` with ``sigma = 6`` where delta is the difference of the
numbers of bigrams, averaged over n and over references, times 10.  This reproduces
``expected_scores.json`` of the fakecap reference (CIDEr 0.5997905185184199).  ``CiderD`` keeps the
document frequencies of a fixed corpus (the training references) for rewards (SCST).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from itertools import chain

import numpy as np

from captioning.metrics import METRICS, Scored
from captioning.metrics.ngrams import NgramTable, Shared, Tokens, mean, ngram_counts, unique_sorted


def cider_d(
    hypotheses: Sequence[Tokens],
    references: Sequence[Sequence[Tokens]],
    n: int = 4,
    sigma: float = 6.0,
    *,
    table: NgramTable | None = None,
) -> tuple[float, list[float]]:
    """(corpus mean, per-item) CIDEr as pycocoevalcap's ``Cider`` (CIDEr-D: clipping + length penalty, x10).

    Document frequencies come from the references of the items scored here.
    """
    t = table if table is not None and table.n == n else NgramTable(hypotheses, references, n)
    N = t.num_items
    if N == 0:
        return float("nan"), []
    G = t.num_ngrams
    ref, r_item, r_gid, r_ord, r_cnt = t.ref_entries()
    h_item, h_gid, h_ord, h_cnt = t.hyp_entries()
    R = len(t.ref_item)
    # document frequency: number of items whose references contain the n-gram
    item_gram = unique_sorted(r_item * G + r_gid)
    df = np.bincount(item_gram % G, minlength=G).astype(np.float64)
    ref_len = np.log(float(N))
    idf = ref_len - np.log(np.maximum(1.0, df))  # [G]
    wh = h_cnt.astype(np.float64) * idf[h_gid]
    wr = r_cnt.astype(np.float64) * idf[r_gid]
    norm_h = np.sqrt(np.bincount(h_item * n + h_ord, wh * wh, minlength=N * n)).reshape(N, n)
    norm_r = np.sqrt(np.bincount(ref * n + r_ord, wr * wr, minlength=R * n)).reshape(R, n)
    # the toolkit's "length" is the number of bigrams
    len_h = np.maximum(t.lengths[:N] - 1, 0)
    len_r = np.maximum(t.lengths[N:] - 1, 0)
    # clipped dot products: sum over shared n-grams of min(wh, wr) * wr
    hkey = h_item * G + h_gid  # sorted
    rkey = r_item * G + r_gid
    if len(hkey):
        pos = np.minimum(np.searchsorted(hkey, rkey), len(hkey) - 1)
        hit = hkey[pos] == rkey
        contrib = np.where(hit, np.minimum(wh[pos], wr) * wr, 0.0)
    else:
        contrib = np.zeros(len(rkey))
    val = np.bincount(ref * n + r_ord, contrib, minlength=R * n).reshape(R, n)
    denom = norm_h[t.ref_item] * norm_r
    val = np.where(denom != 0, val / np.where(denom != 0, denom, 1.0), val)
    delta = (len_h[t.ref_item] - len_r).astype(np.float64)
    val *= np.power(np.e, -(delta**2) / (2 * sigma**2))[:, None]
    score = np.add.reduceat(val, t.ref_offsets, axis=0)  # [N, n], refs summed in order
    total = score[:, 0].copy()
    for k in range(1, n):
        total += score[:, k]
    per_item = total / n / t.ref_counts * 10.0
    return mean(per_item), per_item.tolist()


class CiderD:
    """CIDEr-D with document frequencies from a FIXED reference corpus, computed once.

    ``cider_d`` takes document frequencies from the references of the items it scores (the
    toolkit's behaviour); a reward for self-critical training needs them from the whole training
    set instead (Rennie et al. 2017; ruotianluo's ``CiderD(df='corpus')``), and it scores a few
    hundred captions per batch, so the corpus statistics and each item's reference vectors are
    computed once and reused.  ``corpus``: per item its tokenized references.  Scoring every
    corpus item's hypothesis against its own references gives exactly ``cider_d``'s per-item
    scores (same definition, same document frequencies).
    """

    def __init__(self, corpus: Sequence[Sequence[Tokens]], n: int = 4, sigma: float = 6.0) -> None:
        self.n, self.sigma = n, sigma
        self.corpus = [[list(r) for r in refs] for refs in corpus]
        df: Counter = Counter()
        for refs in self.corpus:
            df.update(set(chain.from_iterable(ngram_counts(r, n) for r in refs)))
        self.log_n = math.log(float(max(len(self.corpus), 1)))
        self.log_df = {g: math.log(max(1.0, float(c))) for g, c in df.items()}
        self._refs: dict[int, list[tuple[list[dict], list[float], int]]] = {}

    def _vector(self, tokens: Tokens) -> tuple[list[dict], list[float], int]:
        """TF-IDF vectors per order (n-gram -> weight), their norms, and the number of bigrams."""
        vec: list[dict] = [{} for _ in range(self.n)]
        for g, tf in ngram_counts(tokens, self.n).items():
            vec[len(g) - 1][g] = float(tf) * (self.log_n - self.log_df.get(g, 0.0))
        norms = [math.sqrt(sum(w * w for w in v.values())) for v in vec]
        return vec, norms, max(len(tokens) - 1, 0)

    def _item(self, index: int) -> list[tuple[list[dict], list[float], int]]:
        if index not in self._refs:
            self._refs[index] = [self._vector(r) for r in self.corpus[index]]
        return self._refs[index]

    def score(self, hypothesis: Tokens, index: int) -> float:
        """CIDEr-D of one caption against corpus item ``index``'s references."""
        vec_h, norm_h, len_h = self._vector(hypothesis)
        refs = self._item(index)
        total = 0.0
        for vec_r, norm_r, len_r in refs:
            penalty = math.exp(-((len_h - len_r) ** 2) / (2 * self.sigma**2))
            for k in range(self.n):
                val = sum(min(w, vec_r[k][g]) * vec_r[k][g] for g, w in vec_h[k].items() if g in vec_r[k])
                if norm_h[k] != 0 and norm_r[k] != 0:
                    val /= norm_h[k] * norm_r[k]
                total += val * penalty
        return total / self.n / max(len(refs), 1) * 10.0

    def __call__(self, hypotheses: Sequence[Tokens], indices: Sequence[int]) -> np.ndarray:
        """Per hypothesis its CIDEr-D against the references of corpus item ``indices[i]``."""
        return np.array([self.score(h, int(i)) for h, i in zip(hypotheses, indices, strict=True)])


@METRICS.register("cider", keys=("CIDEr",), default=True)
def score_cider(hypotheses: Sequence[Tokens], references: Sequence[Sequence[Tokens]], shared: Shared) -> Scored:
    corpus, items = cider_d(hypotheses, references, table=shared.ngrams())
    return Scored(scores={"CIDEr": corpus}, per_item={"CIDEr": items})
