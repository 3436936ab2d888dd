"""Evaluation report: length binning, the by-length plot, vocabulary usage, report files."""

from __future__ import annotations

import json

import pytest

from captioning.errors import DataError
from captioning.evaluation.report import (
    length_bins,
    metrics_by_length,
    plot_metrics_by_length,
    vocabulary_usage,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _data():
    refs = {
        1: ["a red circle", "red circle on grey"],  # mean 3.5 -> <=6
        2: ["a red circle to the left of it", "a blue square left of a star"],  # 8, 7 -> 7.5 -> 7-8
        3: ["w " * 20, "x " * 18],  # mean 19 -> 16+
        4: ["one two three four five six", "one two three four five six"],  # 6 -> <=6
    }
    refs = {k: [" ".join(r.split()) for r in v] for k, v in refs.items()}
    hyps = {1: "a red circle", 2: "a red circle to the left of it", 3: "completely different words here",
            4: "one two three four five six"}
    return refs, hyps


def test_length_bins_labels():
    assert [b[0] for b in length_bins()] == ["<=6", "7-8", "9-10", "11-12", "13-15", "16+"]
    assert [b[0] for b in length_bins((3, 4, 9))] == ["<=3", "4", "5-9", "10+"]
    with pytest.raises(DataError, match="increasing"):
        length_bins((8, 6))


def test_metrics_by_length_counts_and_scores():
    refs, hyps = _data()
    rows = metrics_by_length(refs, hyps)
    assert [r["bin"] for r in rows] == ["<=6", "7-8", "9-10", "11-12", "13-15", "16+"]
    assert [r["count"] for r in rows] == [2, 1, 0, 0, 0, 1]
    assert rows[0]["mean_ref_length"] == pytest.approx((3.5 + 6) / 2)
    assert rows[0]["mean_hyp_length"] == pytest.approx((3 + 6) / 2)
    assert rows[1]["mean_ref_length"] == pytest.approx(7.5)
    # exact matches of a reference: BLEU-4 and ROUGE-L are 1 (real toolkit definitions)
    assert rows[1]["Bleu_4"] == pytest.approx(1.0, abs=1e-6)
    assert rows[1]["ROUGE_L"] == pytest.approx(1.0)
    # disjoint words: all zero
    assert rows[5]["Bleu_4"] == pytest.approx(0.0, abs=1e-6)
    assert rows[5]["ROUGE_L"] == 0.0 and rows[5]["CIDEr"] == 0.0
    # empty bins carry the same keys, None
    assert rows[2]["Bleu_4"] is None and rows[2]["CIDEr"] is None and rows[2]["mean_ref_length"] is None
    # configurable bins
    rows = metrics_by_length(refs, hyps, bins=(4, 10))
    assert [(r["bin"], r["count"]) for r in rows] == [("<=4", 1), ("5-10", 2), ("11+", 1)]
    with pytest.raises(DataError, match="no reference"):
        metrics_by_length({}, {5: "a b"})


def test_metrics_by_length_uses_compute_metrics_without_tokenizing(monkeypatch):
    import captioning.evaluation.report as report
    import captioning.metrics as metrics

    calls = []

    def fake(references, hypotheses, metrics=(), tokenize=True):
        calls.append((sorted(hypotheses), tuple(metrics), tokenize))
        return metrics_module.MetricResult(scores={"CIDEr": 1.5})

    metrics_module = metrics
    monkeypatch.setattr(report, "compute_metrics", fake)
    refs, hyps = _data()
    rows = metrics_by_length(refs, hyps, metrics=("cider",))
    assert calls == [([1, 4], ("cider",), False), ([2], ("cider",), False), ([3], ("cider",), False)]
    assert rows[0]["CIDEr"] == 1.5 and rows[2]["CIDEr"] is None


def test_plot_metrics_by_length_single_and_several_models(tmp_path):
    refs, hyps = _data()
    rows = metrics_by_length(refs, hyps)
    one = plot_metrics_by_length(rows, tmp_path / "one.png", title="toy")
    assert one.read_bytes()[:8] == PNG_MAGIC
    worse = [{**r, "Bleu_4": None if r["Bleu_4"] is None else r["Bleu_4"] / 2} for r in rows]
    several = plot_metrics_by_length({"soft": rows, "hard": worse}, tmp_path / "sub" / "two.png")
    assert several.read_bytes()[:8] == PNG_MAGIC
    assert not list(tmp_path.glob("**/*.tmp"))
    with pytest.raises(DataError):
        plot_metrics_by_length([], tmp_path / "none.png")


def test_vocabulary_usage_hand_computed():
    hyps = {1: "a red circle", 2: "a red circle", 3: "a blue <unk>"}
    refs = {1: ["a red circle"], 2: ["a green square"], 3: ["a blue star", "one blue star"]}
    v = vocabulary_usage(hyps, refs, vocab_size=14, train_captions=["a red circle", "a green star"])
    assert v["distinct_words"] == 4  # a red circle blue (<unk> is not a word)
    assert v["vocab_used"] == pytest.approx(4 / 10)
    assert v["reference_words"] == 8  # a red circle green square blue star one
    assert v["reference_vocab_covered"] == pytest.approx(4 / 8)
    assert v["words_not_in_references"] == 0
    assert v["mean_length"] == pytest.approx(3.0)
    assert v["mean_reference_length"] == pytest.approx(3.0)
    assert v["distinct_captions"] == pytest.approx(2 / 3)
    assert v["novel_captions"] == pytest.approx(1 / 3)
    assert v["unk_tokens"] == 1
    assert v["top_words"][0] == ["a", 3]
    assert len(vocabulary_usage(hyps, refs, 14, top_k=2)["top_words"]) == 2
    assert vocabulary_usage(hyps, refs, 14)["novel_captions"] is None


def test_write_report_files(tmp_path):
    refs, hyps = _data()
    rows = metrics_by_length(refs, hyps)
    grounding = {"attention_in_object": 0.6, "chance_attention_in_object": 0.2, "pointing_accuracy": 0.7,
                 "chance_pointing_accuracy": 0.25, "words_evaluated": 10, "words_ambiguous": 2,
                 "by_class": {"colour": {"words_evaluated": 5, "attention_in_object": 0.5}}}
    meta = {"checkpoint": tmp_path / "last.ckpt", "split": "test", "decode": {"beam_size": 3},
            "nan": float("nan"), "bleu_stats": {"guess": list(range(200))}}
    path = write_report(tmp_path / "eval", {"Bleu_4": 0.31, "CIDEr": 0.95}, rows,
                        vocabulary_usage(hyps, refs, 20), grounding, meta)
    out = tmp_path / "eval"
    assert path == out / "report.md"
    data = json.loads((out / "report.json").read_text())
    assert data["metrics"]["CIDEr"] == 0.95
    assert data["meta"]["nan"] is None and data["meta"]["checkpoint"].endswith("last.ckpt")
    assert [r["count"] for r in data["by_length"]] == [2, 1, 0, 0, 0, 1]
    assert data["grounding"]["pointing_accuracy"] == 0.7 and data["plot"] == "metrics_by_length.png"
    assert (out / "metrics_by_length.png").read_bytes()[:8] == PNG_MAGIC
    md = path.read_text()
    for text in ("## Metrics", "| Bleu_4 | 0.3100 |", "## Metrics by mean reference length", "| 7-8 | 1 |",
                 "![scores by reference length](metrics_by_length.png)", "## Vocabulary usage",
                 "## Attention grounding", "| pointing accuracy | 0.7000 | 0.2500 |", "| colour | 5 |",
                 "(see report.json)"):
        assert text in md, text
    # no grounding, no rows with items: no grounding section, no plot
    empty = [{**r, "count": 0} for r in rows]
    path = write_report(tmp_path / "e2", {}, empty, None, None, {})
    assert "Attention grounding" not in path.read_text()
    assert not (tmp_path / "e2" / "metrics_by_length.png").exists()
