"""Prediction files (captioning.predictions): JSON entries + one float16 attention array."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from captioning.errors import DataError
from captioning.evaluation.grounding import coverage_entropy
from captioning.predictions import (
    ATTENTION_FILE,
    read_predictions,
    stack_attention,
    write_predictions,
)


def test_stack_attention_by_hand():
    a = np.array([[0.5, 0.5], [1.0, 0.0]])  # 2 words over 2 positions
    b = np.array([[0.25, 0.25, 0.5]])  # 1 word over 3 positions
    rows, spans, widths = stack_attention([a, None, b])
    assert rows.dtype == np.float16 and rows.shape == (3, 3)
    assert rows.tolist() == [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.25, 0.25, 0.5]]
    assert spans == [[0, 2], None, [2, 3]]
    assert widths == [2, None, 3]


def test_round_trip_keeps_entries_and_attention(tmp_path):
    rng = np.random.default_rng(0)
    maps = [rng.dirichlet(np.ones(49), size=t).astype(np.float32) for t in (3, 5, 1)]
    entries = [{"image_id": i, "caption": "a b", "tokens": ["a", "b"], "score": -1.5 * i} for i in range(3)]
    path = write_predictions(tmp_path, entries, maps)
    stored = json.loads(path.read_text())
    assert [e["attention"] for e in stored] == [[0, 3], [3, 8], [8, 9]]  # row spans, no floats
    assert "attention_width" not in stored[0]  # every item as wide as the file
    back = read_predictions(path)
    for e, m, got in zip(entries, maps, back, strict=True):
        assert {k: got[k] for k in e} == e
        assert got["attention"].dtype == np.float32 and got["attention"].shape == m.shape
        # float16: relative error <= 2^-11 per weight (the module docstring's claim)
        np.testing.assert_allclose(got["attention"], m, rtol=2.0**-11, atol=1e-7)
        np.testing.assert_allclose(got["attention"].sum(1), 1.0, atol=1e-3)


def test_ragged_widths_and_models_without_attention(tmp_path):
    maps = [np.full((2, 3), 1 / 3), np.full((1, 5), 0.2)]  # region counts differ per item
    path = write_predictions(tmp_path, [{"input": "a.jpg"}, {"input": "b.jpg"}], maps)
    stored = json.loads(path.read_text())
    assert [e["attention_width"] for e in stored] == [3, 5]
    back = read_predictions(path)
    assert [e["attention"].shape for e in back] == [(2, 3), (1, 5)]
    # no attention at all (mean pooling): no array file, attention null, and a stale array removed
    none = write_predictions(tmp_path, [{"input": "a.jpg"}], [None])
    assert not (tmp_path / ATTENTION_FILE).exists()
    assert read_predictions(none) == [{"input": "a.jpg", "attention": None}]


def test_inline_attention_of_older_files_reads_the_same(tmp_path):
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps([{"image_id": 1, "attention": [[0.5, 0.5], [0.0, 1.0]]}]))
    (e,) = read_predictions(path)
    assert e["attention"].tolist() == [[0.5, 0.5], [0.0, 1.0]]
    assert coverage_entropy([e]) == pytest.approx(-(0.25 * np.log(0.25) + 0.75 * np.log(0.75)) / np.log(2))


def test_mismatched_or_missing_attention_file_names_the_files(tmp_path):
    path = write_predictions(tmp_path, [{"image_id": 1}], [np.ones((4, 2)) / 2])
    np.save(tmp_path / ATTENTION_FILE, np.zeros((2, 2), dtype=np.float16))  # from another, shorter run
    with pytest.raises(DataError, match=r"points at attention rows 0:4 but .*attention.npy has 2"):
        read_predictions(path)
    (tmp_path / ATTENTION_FILE).unlink()
    with pytest.raises(DataError, match=r"attention.npy, which is missing"):
        read_predictions(path)
    (tmp_path / ATTENTION_FILE).write_text("not an array")
    with pytest.raises(DataError, match="not a readable attention file"):
        read_predictions(path)


def test_writing_five_thousand_items_is_cheap(tmp_path):
    """The evaluation's size: 5,000 captions x 20 words over a 14x14 grid (4M weights)."""
    rng = np.random.default_rng(0)
    maps = [rng.random((20, 196), dtype=np.float32) for _ in range(5000)]
    entries = [{"image_id": i, "caption": " ".join(["w"] * 19), "tokens": ["w"] * 19, "score": -3.0}
               for i in range(5000)]
    t0 = time.perf_counter()
    path = write_predictions(tmp_path, entries, maps)
    seconds = time.perf_counter() - t0
    assert (tmp_path / ATTENTION_FILE).stat().st_size < 5000 * 20 * 196 * 2 + 1024  # 2 bytes a weight
    assert path.stat().st_size < 2_000_000  # the JSON holds no weights
    assert seconds < 5.0, seconds  # the write alone (random maps made before the clock starts)
