"""COCO caption metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr), in process and fast.

The definitions follow the COCO caption evaluation toolkit (tylin/coco-caption, packaged as
``pycocoevalcap``) exactly, so that scores are comparable with published numbers:

- **BLEU** (:func:`bleu`): corpus level, clipped n-gram counts against the per-n-gram maximum
  over the references, brevity penalty with the *closest* reference length (ties: the shorter
  reference), the toolkit's epsilons ``tiny = 1e-15`` (numerators) and ``small = 1e-9``
  (denominators).  Per-item scores are computed the same way on one item's statistics.
- **ROUGE-L** (:func:`rouge_l`): per item, LCS precision and recall against every reference,
  F-measure with ``beta = 1.2`` of the *maximum* precision and *maximum* recall; the corpus
  score is the mean over items.  As in the toolkit an empty caption counts as one empty token.
- **CIDEr** (:func:`cider_d`): what the toolkit's ``Cider`` class (the scorer behind the
  ``CIDEr`` key of ``COCOEvalCap``) computes, i.e. the CIDEr-D variant: TF-IDF vectors of 1..4
  grams with document frequencies taken from the references of the scored set,
  ``idf = log(N) - log(max(1, df))``, clipped hypothesis weights ``min(h, r) * r``, a Gaussian
  length penalty ``exp(-(Δ²) / (2 σ²))`` with ``σ = 6`` where Δ is the difference of the
  numbers of bigrams, averaged over n and over references, times 10.  This reproduces
  ``expected_scores.json`` of the fakecap reference (CIDEr 0.5997905185184199).
- **METEOR** (:func:`meteor`): the toolkit's METEOR 1.5 jar (``-l en -norm``) run through Java.

All functions take already tokenized captions (lists of tokens).  :func:`compute_metrics`
is the convenience entry point taking strings and an optional PTB-style tokenization.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from captioning.data.tokenizer import tokenize as ptb_tokenize
from captioning.errors import CaptioningError, DataError

__all__ = [
    "METRICS",
    "BleuResult",
    "MetricError",
    "MetricResult",
    "NgramTable",
    "bleu",
    "cider_d",
    "compute_metrics",
    "lcs_length",
    "meteor",
    "meteor_jar",
    "ngram_counts",
    "rouge_l",
]

#: Metric names accepted by :func:`compute_metrics`, with the toolkit's result keys.
METRICS: dict[str, tuple[str, ...]] = {
    "bleu": ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"),
    "meteor": ("METEOR",),
    "rouge": ("ROUGE_L",),
    "cider": ("CIDEr",),
}

Tokens = Sequence[str]

_TINY = 1e-15  # the toolkit's BLEU epsilons
_SMALL = 1e-9


class MetricError(CaptioningError):
    """A metric cannot be computed (e.g. METEOR without Java)."""


# --------------------------------------------------------------------------------------
# n-grams
# --------------------------------------------------------------------------------------


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
        _check_lengths(hypotheses, references)
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


# --------------------------------------------------------------------------------------
# BLEU
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# ROUGE-L
# --------------------------------------------------------------------------------------


def _position_masks(tokens: Tokens) -> dict[str, int]:
    masks: dict[str, int] = {}
    for i, t in enumerate(tokens):
        masks[t] = masks.get(t, 0) | (1 << i)
    return masks


def _lcs_masks(masks: dict[str, int], m: int, other: Tokens) -> int:
    # Bit-parallel LCS (Hyyro 2004): one big-int update per token of ``other``.
    full = (1 << m) - 1
    v = full
    get = masks.get
    for t in other:
        u = v & get(t, 0)
        if u:
            v = ((v + u) | (v - u)) & full
    return m - v.bit_count()


def lcs_length(a: Tokens, b: Tokens) -> int:
    """Length of the longest common subsequence of two token lists."""
    if not a or not b:
        return 0
    return _lcs_masks(_position_masks(a), len(a), b)


def rouge_l(
    hypotheses: Sequence[Tokens], references: Sequence[Sequence[Tokens]], beta: float = 1.2
) -> tuple[float, list[float]]:
    """(corpus mean, per-item) ROUGE-L F-measure as pycocoevalcap's ``Rouge``."""
    _check_lengths(hypotheses, references)
    b2 = beta**2
    per_item = []
    for hyp, refs in zip(hypotheses, references, strict=True):
        hyp = hyp or ("",)  # the toolkit's "".split(" ") == [""]
        m = len(hyp)
        masks = _position_masks(hyp)
        prec_max = 0.0
        rec_max = 0.0
        for ref in refs:
            ref = ref or ("",)
            lcs = _lcs_masks(masks, m, ref)
            p = lcs / float(m)
            r = lcs / float(len(ref))
            if p > prec_max:
                prec_max = p
            if r > rec_max:
                rec_max = r
        if prec_max != 0 and rec_max != 0:
            per_item.append(((1 + b2) * prec_max * rec_max) / float(rec_max + b2 * prec_max))
        else:
            per_item.append(0.0)
    return _mean(per_item), per_item


# --------------------------------------------------------------------------------------
# CIDEr (pycocoevalcap's ``Cider``, the CIDEr-D formulation)
# --------------------------------------------------------------------------------------


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
    item_gram = _unique(r_item * G + r_gid)
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
    return _mean(per_item), per_item.tolist()


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


# --------------------------------------------------------------------------------------
# METEOR (the toolkit's jar)
# --------------------------------------------------------------------------------------


def meteor_jar() -> Path:
    """Path of pycocoevalcap's bundled ``meteor-1.5.jar``."""
    import importlib.util

    spec = importlib.util.find_spec("pycocoevalcap")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        jar = Path(root) / "meteor" / "meteor-1.5.jar"
        if jar.is_file():
            return jar
    raise MetricError(
        "METEOR needs pycocoevalcap's meteor-1.5.jar: pip install 'captioning[eval]' "
        "(or drop meteor from metrics)"
    )


def _meteor_clean(tokens: Tokens) -> str:
    return " ".join(tokens).replace("|||", "").replace("  ", " ")


def meteor(
    hypotheses: Sequence[Tokens], references: Sequence[Sequence[Tokens]], timeout: float = 600.0
) -> tuple[float, list[float]]:
    """(corpus, per-item) METEOR 1.5 via the toolkit's jar (``-stdio -l en -norm``); needs Java."""
    _check_lengths(hypotheses, references)
    if not hypotheses:
        return float("nan"), []
    java = shutil.which("java")
    if java is None:
        raise MetricError(
            "METEOR needs Java (the toolkit's meteor-1.5.jar): install a JRE (e.g. apt-get install "
            "default-jre-headless) or drop meteor from metrics, e.g. metrics=[bleu,rouge,cider]"
        )
    jar = meteor_jar()
    cmd = [java, "-Xmx2G", "-Duser.language=en", "-Duser.country=US", "-jar", str(jar),
           "-", "-", "-stdio", "-l", "en", "-norm"]  # fmt: skip
    lines = [
        " ||| ".join(("SCORE", " ||| ".join(_meteor_clean(r) for r in refs), _meteor_clean(hyp)))
        for hyp, refs in zip(hypotheses, references, strict=True)
    ]
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=str(jar.parent),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as e:
        raise MetricError(f"cannot start Java for METEOR ({java}): {e}") from e
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    err_chunks: list[bytes] = []
    err_thread = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
    err_thread.start()

    def write_all() -> None:
        try:
            for line in lines:
                proc.stdin.write((line + "\n").encode("utf-8"))
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        writer = threading.Thread(target=write_all, daemon=True)
        writer.start()
        stats = []
        for _ in lines:
            out = proc.stdout.readline()
            if not out:
                break
            stats.append(out.decode("utf-8").strip())
        writer.join()
        if len(stats) != len(lines):
            raise MetricError(_meteor_failure(proc, err_thread, err_chunks))
        proc.stdin.write(("EVAL ||| " + " ||| ".join(stats) + "\n").encode("utf-8"))
        proc.stdin.flush()
        values = []
        for _ in range(len(lines) + 1):
            out = proc.stdout.readline()
            if not out:
                raise MetricError(_meteor_failure(proc, err_thread, err_chunks))
            values.append(float(out.decode("utf-8").strip()))
        proc.stdin.close()
        proc.wait(timeout=60)
    except (BrokenPipeError, ValueError) as e:
        raise MetricError(f"METEOR jar returned unexpected output: {e}") from e
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return values[-1], values[:-1]


def _meteor_failure(proc: subprocess.Popen, err_thread: threading.Thread, chunks: list) -> str:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    err_thread.join(timeout=5)
    msg = b"".join(chunks).decode("utf-8", "replace").strip().splitlines()
    detail = msg[-1] if msg else f"exit status {proc.returncode}"
    return f"METEOR jar failed: {detail}"


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


@dataclass
class MetricResult:
    """Corpus scores (the toolkit's keys), per-item scores, BLEU statistics and the seconds each
    step took (``tokenize``, ``ngrams``: the n-gram table BLEU and CIDEr-D share, then each metric)."""

    scores: dict[str, float]
    per_item: dict[Hashable, dict[str, float]] = field(default_factory=dict)
    bleu_stats: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def compute_metrics(
    references: Mapping[Hashable, Sequence[str]],
    hypotheses: Mapping[Hashable, str],
    metrics: Sequence[str] = ("bleu", "meteor", "rouge", "cider"),
    tokenize: bool = True,
) -> MetricResult:
    """Score ``hypotheses[key]`` against ``references[key]`` for every key of ``hypotheses``.

    ``tokenize=True`` applies the toolkit's PTB tokenization + punctuation removal
    (:func:`captioning.data.tokenizer.tokenize`) to both sides; ``tokenize=False`` splits the
    captions on whitespace.  Keys of ``references`` without a hypothesis are ignored (and do
    not count towards CIDEr's document frequencies), as with the toolkit's ``loadRes``.
    """
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise MetricError(f"unknown metric {unknown[0]!r}: choose from {', '.join(METRICS)}")
    tok = ptb_tokenize if tokenize else str.split
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    keys = list(hypotheses)
    hyps: list[list[str]] = []
    refs: list[list[list[str]]] = []
    for k in keys:
        h = hypotheses[k]
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

    scores: dict[str, float] = {}
    per: dict[str, list[float]] = {}
    stats = None
    need_counts = "bleu" in metrics or "cider" in metrics
    seconds["tokenize"] = time.perf_counter() - clock
    table = NgramTable(hyps, refs) if need_counts and hyps else None
    seconds["ngrams"] = time.perf_counter() - clock - seconds["tokenize"]
    for m in ("bleu", "meteor", "rouge", "cider"):
        if m not in metrics:
            continue
        clock = time.perf_counter()
        if m == "bleu":
            res = bleu(hyps, refs, table=table)
            for k, name in enumerate(METRICS["bleu"]):
                scores[name] = res.scores[k]
                per[name] = [p[k] for p in res.per_item]
            stats = res.stats
        else:
            fn = {"meteor": meteor, "rouge": rouge_l, "cider": cider_d}[m]
            kwargs = {"table": table} if m == "cider" else {}
            corpus, items = fn(hyps, refs, **kwargs)
            name = METRICS[m][0]
            scores[name] = corpus
            per[name] = items
        seconds[m] = time.perf_counter() - clock
    per_item = {k: {name: float(v[i]) for name, v in per.items()} for i, k in enumerate(keys)}
    return MetricResult(scores={k: float(v) for k, v in scores.items()}, per_item=per_item, bleu_stats=stats,
                        seconds=seconds)


def _unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique's hash path is slow on large int arrays)."""
    s = np.sort(a)
    return s[np.r_[True, s[1:] != s[:-1]]] if len(s) else s


def _mean(values: Sequence[float]) -> float:
    # numpy's pairwise summation, as the toolkit's np.mean
    return float(np.mean(np.asarray(values, dtype=np.float64))) if len(values) else float("nan")


def _check_lengths(hypotheses: Sequence, references: Sequence) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    for i, refs in enumerate(references):
        if len(refs) == 0:
            raise ValueError(f"item {i} has no references")

