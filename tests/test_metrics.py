"""Caption metrics: the fakecap reference scores, pycocoevalcap on random data, hand-computed cases."""

from __future__ import annotations

import json
import math
import random
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from captioning.errors import DataError
from captioning.metrics import MetricError, compute_metrics
from captioning.metrics import meteor as meteor_module
from captioning.metrics.bleu import bleu
from captioning.metrics.cider import cider_d
from captioning.metrics.ngrams import ngram_counts
from captioning.metrics.rouge import lcs_length, rouge_l

FAKECAP = Path(__file__).resolve().parents[1].parent / "shared/reference/coco-caption-fakecap"
needs_fakecap = pytest.mark.skipif(not FAKECAP.is_dir(), reason=f"reference data not found: {FAKECAP}")
HAS_JAVA = shutil.which("java") is not None
try:
    import pycocoevalcap  # noqa: F401

    HAS_TOOLKIT = True
except ImportError:
    HAS_TOOLKIT = False
needs_toolkit = pytest.mark.skipif(not HAS_TOOLKIT, reason="pycocoevalcap not installed")
needs_meteor = pytest.mark.skipif(not (HAS_JAVA and HAS_TOOLKIT), reason="METEOR needs Java + pycocoevalcap")
NO_METEOR = ("bleu", "rouge", "cider")


def _fakecap():
    refs: dict[int, list[str]] = defaultdict(list)
    for a in json.loads((FAKECAP / "captions_val2014_fakecap_refs_tokenized.json").read_text())["annotations"]:
        refs[a["image_id"]].append(a["caption"])
    res = {r["image_id"]: r["caption"] for r in json.loads((FAKECAP / "captions_val2014_fakecap_results.json").read_text())}
    expected = json.loads((FAKECAP / "expected_scores.json").read_text())
    return refs, res, expected


@needs_fakecap
@pytest.mark.parametrize("tokenize", [False, True])
def test_fakecap_reference_scores(tokenize):
    refs, res, expected = _fakecap()
    out = compute_metrics(refs, res, metrics=NO_METEOR, tokenize=tokenize)
    full = expected["corpus_full_precision"]
    for key in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L"):
        assert out.scores[key] == pytest.approx(full[key], abs=1e-6), key
    # re-tokenizing the tokenized references turns "...to bat." into "...to bat" (README)
    cider = 0.5998952 if tokenize else full["CIDEr"]
    assert out.scores["CIDEr"] == pytest.approx(cider, abs=1e-6 if not tokenize else 5e-8)
    stats = expected["notebook_bleu_stats"]
    for key in ("testlen", "reflen", "guess", "correct"):
        assert out.bleu_stats[key] == stats[key], key
    assert out.bleu_stats["ratio"] == pytest.approx(stats["ratio"], abs=1e-12)
    for key, value in expected["notebook_expected_3dp"].items():
        if key in out.scores:
            assert round(out.scores[key], 3) == value, key
    assert len(out.per_item) == 1000
    assert set(out.per_item[404464]) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"}


@needs_fakecap
@needs_meteor
def test_fakecap_meteor():
    refs, res, expected = _fakecap()
    out = compute_metrics(refs, res, metrics=("meteor",), tokenize=False)
    assert out.scores["METEOR"] == pytest.approx(expected["corpus_full_precision"]["METEOR"], abs=1e-4)
    assert len(out.per_item) == 1000 and all(0 <= v["METEOR"] <= 1 for v in out.per_item.values())


# ------------------------------------------------------------------ pycocoevalcap on random data

WORDS = [f"w{i}" for i in range(40)]


def _caption(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choices(WORDS[: rng.randint(4, 40)], k=rng.randint(lo, hi)))


def _toolkit(gts: dict, res: dict) -> dict:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    g = {k: list(v) for k, v in gts.items()}
    r = {k: [res[k]] for k in gts}
    b, b_items = Bleu(4).compute_score(g, r, verbose=0)
    rouge, rouge_items = Rouge().compute_score(g, r)
    cider, cider_items = Cider().compute_score(g, r)
    return {"bleu": (b, b_items), "rouge": (rouge, rouge_items), "cider": (cider, cider_items)}


def _assert_same(gts: dict, res: dict) -> None:
    theirs = _toolkit(gts, res)
    ours = compute_metrics(gts, res, metrics=NO_METEOR, tokenize=False)
    keys = list(gts)
    for k in range(4):
        assert ours.scores[f"Bleu_{k + 1}"] == pytest.approx(theirs["bleu"][0][k], rel=1e-12, abs=1e-15)
        ours_items = [ours.per_item[i][f"Bleu_{k + 1}"] for i in keys]
        assert ours_items == pytest.approx(theirs["bleu"][1][k], rel=1e-12, abs=1e-15)
    assert ours.scores["ROUGE_L"] == pytest.approx(theirs["rouge"][0], rel=1e-12, abs=1e-15)
    assert [ours.per_item[i]["ROUGE_L"] for i in keys] == pytest.approx(list(theirs["rouge"][1]), rel=1e-12, abs=1e-15)
    assert ours.scores["CIDEr"] == pytest.approx(theirs["cider"][0], rel=1e-9, abs=1e-12)
    assert [ours.per_item[i]["CIDEr"] for i in keys] == pytest.approx(list(theirs["cider"][1]), rel=1e-9, abs=1e-12)


@needs_toolkit
@pytest.mark.parametrize("seed", range(12))
def test_random_sets_match_toolkit(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 7, 25, 60])
    gts, res = {}, {}
    for i in range(n):
        # references of very different lengths; hypotheses often shorter than 4 tokens
        gts[i] = [_caption(rng, 1, rng.choice([3, 12, 30])) for _ in range(rng.randint(1, 6))]
        res[i] = _caption(rng, 0, rng.choice([2, 3, 10, 25]))
    _assert_same(gts, res)


@needs_toolkit
def test_edge_cases_match_toolkit():
    gts = {
        "a": ["a b c d e f", "a b"],
        "b": ["x y z", "x y z w v u t s r q p o n m"],
        "c": ["one"],
        "d": ["a a a a", "b b"],
    }
    res = {"a": "", "b": "x", "c": "one", "d": "a a a a a a a a"}
    _assert_same(gts, res)
    _assert_same({"only": ["a cat on a mat", "a dog"]}, {"only": "a cat"})  # single image
    _assert_same({1: ["a b"], 2: ["a b"]}, {1: "", 2: ""})  # all hypotheses empty


def test_empty_hypothesis_scores_zero():
    out = compute_metrics({1: ["a cat sits", "a cat"], 2: ["a dog"]}, {1: "", 2: "a dog"}, metrics=NO_METEOR)
    assert out.per_item[1] == {"Bleu_1": 0.0, "Bleu_2": 0.0, "Bleu_3": 0.0, "Bleu_4": 0.0, "ROUGE_L": 0.0, "CIDEr": 0.0}
    assert out.bleu_stats["testlen"] == 2 and out.bleu_stats["reflen"] == 4


# ------------------------------------------------------------------ hand-computed values


def test_bleu_hand_computed():
    # hyp "the cat sat" vs ref "the cat sat down": p1 = 3/3, p2 = 2/2, p3 = 1/1; bp = exp(1 - 4/3)
    res = bleu([["the", "cat", "sat"]], [[["the", "cat", "sat", "down"]]])
    bp = math.exp(1 - 4 / 3)
    assert res.scores[0] == pytest.approx(bp, rel=1e-9)
    assert res.scores[2] == pytest.approx(bp, rel=1e-9)
    assert res.scores[3] == pytest.approx(bp * (1e-15 / 1e-9) ** 0.25, rel=1e-6)  # no 4-gram: toolkit epsilons
    assert res.stats == {"testlen": 3, "reflen": 4, "guess": [3, 2, 1, 0], "correct": [3, 2, 1, 0],
                         "ratio": pytest.approx((3 + 1e-15) / (4 + 1e-9))}
    # clipping: "the the the" vs "the cat": 1 correct unigram of 3
    res = bleu([["the", "the", "the"]], [[["the", "cat"], ["a", "the", "cat", "sat"]]])
    assert res.stats["correct"][0] == 1 and res.stats["reflen"] == 2  # closest: |3-2| = |3-4|, shorter wins


def test_rouge_l_hand_computed():
    # LCS("a b c d", "a c e") = 2: P = 2/3, R = 2/4; F = (1+b^2) P R / (R + b^2 P)
    corpus, items = rouge_l([["a", "c", "e"]], [[["a", "b", "c", "d"]]])
    p, r, b2 = 2 / 3, 2 / 4, 1.2**2
    assert items[0] == pytest.approx((1 + b2) * p * r / (r + b2 * p))
    assert corpus == items[0]


def test_lcs_length_matches_dynamic_programming():
    def dp(a, b):
        t = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i, x in enumerate(a):
            for j, y in enumerate(b):
                t[i + 1][j + 1] = t[i][j] + 1 if x == y else max(t[i][j + 1], t[i + 1][j])
        return t[-1][-1]

    rng = random.Random(0)
    for _ in range(300):
        a = rng.choices("abcd", k=rng.randint(0, 70))
        b = rng.choices("abcde", k=rng.randint(0, 70))
        assert lcs_length(a, b) == dp(a, b)


def test_cider_identical_captions_and_single_image():
    # two images, hypotheses equal to their single reference: every tf-idf cosine is 1 where
    # the n-gram weights are non-zero; n-grams shared by both images get idf log(2) - log(2) = 0
    corpus, items = cider_d([["a", "b"], ["c", "d"]], [[["a", "b"]], [["c", "d"]]])
    assert items == pytest.approx([10 * 2 / 4, 10 * 2 / 4])  # unigrams + bigrams match, no 3/4-grams
    # one image: log(N) = 0, so every weight is 0 (the toolkit's behaviour)
    assert cider_d([["a", "b"]], [[["a", "b"]]])[1] == [0.0]


def test_ngram_counts():
    c = ngram_counts(["a", "b", "a", "b"], n=2)
    assert c == {("a",): 2, ("b",): 2, ("a", "b"): 2, ("b", "a"): 1}


def test_tokenize_flag():
    refs, hyps = {1: ["A dog, running."]}, {1: "a DOG running"}
    assert compute_metrics(refs, hyps, metrics=("bleu",)).scores["Bleu_1"] == pytest.approx(1.0)
    assert compute_metrics(refs, hyps, metrics=("bleu",), tokenize=False).scores["Bleu_1"] < 0.5


def test_errors():
    with pytest.raises(DataError, match="'x'"):
        compute_metrics({1: ["a"]}, {"x": "a"}, metrics=("bleu",))
    with pytest.raises(DataError, match="not a string"):
        compute_metrics({1: ["a"]}, {1: 5}, metrics=("bleu",))
    with pytest.raises(DataError, match="non-empty"):
        compute_metrics({1: []}, {1: "a"}, metrics=("bleu",))
    with pytest.raises(MetricError, match="unknown metric"):
        compute_metrics({1: ["a"]}, {1: "a"}, metrics=("spice",))


def test_meteor_without_java_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(meteor_module.shutil, "which", lambda name: None)
    with pytest.raises(MetricError, match="Java"):
        compute_metrics({1: ["a cat"]}, {1: "a cat"}, metrics=("meteor",))


@needs_meteor
@pytest.mark.slow
def test_meteor_matches_toolkit_with_empty_hypothesis():
    from pycocoevalcap.meteor.meteor import Meteor

    gts = {1: ["a cat sits on a mat", "a cat"], 2: ["two dogs run in a park"], 3: ["a red bus"]}
    res = {1: "a cat on the mat", 2: "", 3: "a red bus"}
    score, items = Meteor().compute_score({k: list(v) for k, v in gts.items()}, {k: [v] for k, v in res.items()})
    ours = compute_metrics(gts, res, metrics=("meteor",), tokenize=False)
    assert ours.scores["METEOR"] == pytest.approx(score, abs=1e-9)
    assert [ours.per_item[k]["METEOR"] for k in gts] == pytest.approx(items, abs=1e-9)


def test_distinct_n_by_hand_and_through_compute_metrics():
    from captioning.metrics import METRICS, default_metrics
    from captioning.metrics.distinct import distinct

    hyps = [["a", "b", "a"], ["a", "c"]]  # 5 tokens; unigrams {a, b, c}; bigrams {ab, ba, ac}
    assert distinct(hyps, 1) == (pytest.approx(3 / 5), [pytest.approx(2 / 3), 1.0])
    assert distinct(hyps, 2) == (pytest.approx(3 / 5), [pytest.approx(2 / 3), pytest.approx(1 / 2)])
    assert distinct([[]], 1) == (0.0, [0.0])
    assert "distinct" in METRICS and "distinct" not in default_metrics()  # a registered metric, off by default
    res = compute_metrics({1: ["x"], 2: ["y"]}, {1: "a b a", 2: "a c"}, metrics=["distinct"], tokenize=False)
    assert res.scores == {"Distinct_1": pytest.approx(0.6), "Distinct_2": pytest.approx(0.6)}
    assert res.per_item[2] == {"Distinct_1": 1.0, "Distinct_2": 0.5}
