"""Tokenized captions as n-grams: the 1..n-gram table BLEU and CIDEr-D share, and small numeric helpers.

Captions are token lists (``Tokens``); an item has one hypothesis and one or more references.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

Tokens = Sequence[str]


def ngram_counts(tokens: Tokens, n: int = 4) -> Counter:
    """Counts of all 1..n-grams of ``tokens`` (as tuples)."""
    t = tuple(tokens)
    return Counter(chain.from_iterable(zip(*(t[i:] for i in range(k)), strict=False) for k in range(1, n + 1)))


class NgramTable:
    """The 1..n-gram counts of every hypothesis and reference, as flat numpy arrays.

    Built once and shared by BLEU and CIDEr.  Sentences ``0..N-1`` are the hypotheses and
    ``N..N+R-1`` the references, grouped by item.  Every distinct n-gram has an integer id
    (ids of one order are contiguous).  ``sent``, ``gid``, ``order`` (n-1) and ``count`` [E]
    list each (sentence, n-gram) pair once, sorted by sentence then id.
    """

    def __init__(
        self, hypotheses: Sequence[Tokens], references: Sequence[Sequence[Tokens]], n: int = 4
    ) -> None:
        check_lengths(hypotheses, references)
        self.n = n
        self.num_items = N = len(hypotheses)
        self.ref_counts = np.fromiter((len(r) for r in references), dtype=np.int64, count=N)  # [N]
        self.ref_item = np.repeat(np.arange(N, dtype=np.int64), self.ref_counts)  # [R]
        self.ref_offsets = np.concatenate([[0], np.cumsum(self.ref_counts)[:-1]]).astype(np.int64)
        sentences: list[Tokens] = [*hypotheses, *chain.from_iterable(references)]
        self.lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        vocab: dict[str, int] = {}
        setdefault = vocab.setdefault
        flat = np.fromiter(
            (setdefault(w, len(vocab)) for s in sentences for w in s),
            dtype=np.int64,
            count=int(self.lengths.sum()),
        )
        V = max(len(vocab), 1)
        sent_of_pos = np.repeat(np.arange(len(sentences), dtype=np.int64), self.lengths)
        sents, gids, orders = [], [], []
        offset = 0
        ids = flat  # compact ids of the k-grams starting at each position (crossing ones too)
        for k in range(n):
            if k > 0:
                if len(ids) <= 1:
                    break
                ids = np.unique(ids[:-1] * V + flat[k:], return_inverse=True)[1].reshape(-1)
            L = len(ids)
            valid = sent_of_pos[:L] == sent_of_pos[k : k + L]
            uniq, inv = np.unique(ids[valid], return_inverse=True)
            sents.append(sent_of_pos[:L][valid])
            gids.append(inv.reshape(-1).astype(np.int64) + offset)
            orders.append(np.full(len(inv), k, dtype=np.int64))
            offset += len(uniq)
        self.num_ngrams = G = max(offset, 1)
        key = np.concatenate([s * G + g for s, g in zip(sents, gids, strict=True)]) if sents else np.zeros(0, np.int64)
        order = np.concatenate(orders) if orders else np.zeros(0, np.int64)
        ukey, first, count = np.unique(key, return_index=True, return_counts=True)
        self.sent = ukey // G
        self.gid = ukey % G
        self.order = order[first]
        self.count = count.astype(np.int64)
        self.is_hyp = self.sent < N

    def hyp_entries(self) -> tuple[np.ndarray, ...]:
        """(item, gid, order, count) of hypothesis n-grams, sorted by (item, gid)."""
        m = self.is_hyp
        return self.sent[m], self.gid[m], self.order[m], self.count[m]

    def ref_entries(self) -> tuple[np.ndarray, ...]:
        """(ref index, item, gid, order, count) of reference n-grams, sorted by (ref, gid)."""
        m = ~self.is_hyp
        ref = self.sent[m] - self.num_items
        return ref, self.ref_item[ref], self.gid[m], self.order[m], self.count[m]


def unique_sorted(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique's hash path is slow on large int arrays)."""
    s = np.sort(a)
    return s[np.r_[True, s[1:] != s[:-1]]] if len(s) else s


def mean(values: Sequence[float]) -> float:
    # numpy's pairwise summation, as the toolkit's np.mean
    return float(np.mean(np.asarray(values, dtype=np.float64))) if len(values) else float("nan")


def check_lengths(hypotheses: Sequence, references: Sequence) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    for i, refs in enumerate(references):
        if len(refs) == 0:
            raise ValueError(f"item {i} has no references")


class Shared:
    """What several metrics compute from the same captions, built once on first use (the 1..4-gram
    table BLEU and CIDEr-D share); ``seconds`` records how long it took."""

    def __init__(self, hypotheses: Sequence[Sequence[str]], references: Sequence[Sequence[Sequence[str]]]) -> None:
        self.hypotheses, self.references = hypotheses, references
        self.seconds: dict[str, float] = {}
        self._ngrams: Any = None

    def ngrams(self) -> Any:
        if self._ngrams is None:
            clock = time.perf_counter()
            self._ngrams = NgramTable(self.hypotheses, self.references)
            self.seconds["ngrams"] = time.perf_counter() - clock
        return self._ngrams
