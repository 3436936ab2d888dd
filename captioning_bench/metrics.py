"""Benchmark: our BLEU + ROUGE-L + CIDEr vs pycocoevalcap's scorers on the same captions.

Synthetic data: ``--items`` items with ``--refs`` references each; captions of 6-16 words drawn
from a Zipf-distributed vocabulary so that n-grams repeat as in real captions.  Both sides
score the same tokenized strings (no tokenization timed).  Reported: wall time of each side
(best of ``--repeats``), the speed-up and the largest absolute score difference.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from captioning.metrics import compute_metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--items", type=int, default=5000, help="number of scored items")
    parser.add_argument("--refs", type=int, default=5, help="references per item")
    parser.add_argument("--vocab", type=int, default=1000, help="vocabulary size")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per side (best kept)")
    parser.add_argument("--seed", type=int, default=0)


def synthetic_captions(
    items: int, refs: int, vocab: int = 1000, seed: int = 0
) -> tuple[dict[int, list[str]], dict[int, str]]:
    """Random tokenized captions: ({id: [ref, ...]}, {id: hyp})."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    weights = [1.0 / (i + 1) for i in range(vocab)]

    def caption() -> str:
        return " ".join(rng.choices(words, weights, k=rng.randint(6, 16)))

    references = {i: [caption() for _ in range(refs)] for i in range(items)}
    hypotheses = {i: caption() for i in range(items)}
    return references, hypotheses


def _theirs(references: dict, hypotheses: dict) -> dict[str, float]:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    gts = {k: list(v) for k, v in references.items()}
    res = {k: [hypotheses[k]] for k in references}
    out: dict[str, float] = {}
    b, _ = Bleu(4).compute_score(gts, res, verbose=0)
    out.update({f"Bleu_{i + 1}": float(s) for i, s in enumerate(b)})
    out["ROUGE_L"] = float(Rouge().compute_score(gts, res)[0])
    out["CIDEr"] = float(Cider().compute_score(gts, res)[0])
    return out


def _ours(references: dict, hypotheses: dict) -> dict[str, float]:

    return compute_metrics(
        references, hypotheses, metrics=("bleu", "rouge", "cider"), tokenize=False
    ).scores


def _best_time(fn: Any, repeats: int, *args: Any) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        result = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best, result


def run(args: argparse.Namespace) -> list[dict]:
    references, hypotheses = synthetic_captions(args.items, args.refs, args.vocab, args.seed)
    size = f"{args.items}x{args.refs}"
    t_ours, ours = _best_time(_ours, args.repeats, references, hypotheses)
    results: list[dict] = [
        {"name": "metrics/ours_bleu_rouge_cider", "unit": "s", "value": round(t_ours, 4), "size": size}
    ]
    try:
        import pycocoevalcap  # noqa: F401
    except ImportError:
        results.append({"name": "metrics/pycocoevalcap", "unit": "s", "value": None,
                        "note": "pycocoevalcap not installed: pip install 'captioning[eval]'"})  # fmt: skip
        return results
    t_theirs, theirs = _best_time(_theirs, args.repeats, references, hypotheses)
    diff = max(abs(ours[k] - theirs[k]) for k in theirs)
    results += [
        {"name": "metrics/pycocoevalcap_bleu_rouge_cider", "unit": "s", "value": round(t_theirs, 4), "size": size},
        {"name": "metrics/speedup", "unit": "x", "value": round(t_theirs / t_ours, 2), "size": size},
        {"name": "metrics/max_abs_score_diff", "unit": "score", "value": diff,
         "equal_1e-9": diff <= 1e-9, "scores_ours": ours, "scores_theirs": theirs},
    ]  # fmt: skip
    return results
