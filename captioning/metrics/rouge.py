"""ROUGE-L as the COCO caption toolkit computes it (pycocoevalcap ``Rouge``).

Per item: LCS precision and recall against every reference, the F-measure with ``beta = 1.2`` of
the *maximum* precision and *maximum* recall; the corpus score is the mean over items.  As in the
toolkit an empty caption counts as one empty token.
"""

from __future__ import annotations

from collections.abc import Sequence

from captioning.metrics import METRICS, Scored
from captioning.metrics.ngrams import Shared, Tokens, check_lengths, mean


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
    check_lengths(hypotheses, references)
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
    return mean(per_item), per_item


@METRICS.register("rouge", keys=("ROUGE_L",), default=True)
def score_rouge(hypotheses: Sequence[Tokens], references: Sequence[Sequence[Tokens]], shared: Shared) -> Scored:
    corpus, items = rouge_l(hypotheses, references)
    return Scored(scores={"ROUGE_L": corpus}, per_item={"ROUGE_L": items})
