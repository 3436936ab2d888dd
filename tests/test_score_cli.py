"""``captioning-score`` as a user runs it, and the file loaders' refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from captioning.errors import DataError
from captioning.metrics.scoring import load_annotations, load_results, score_files

FAKECAP = Path(__file__).resolve().parents[1].parent / "shared/reference/coco-caption-fakecap"
needs_fakecap = pytest.mark.skipif(not FAKECAP.is_dir(), reason=f"reference data not found: {FAKECAP}")
RESULTS = FAKECAP / "captions_val2014_fakecap_results.json"
REFS = FAKECAP / "captions_val2014_fakecap_refs_tokenized.json"


@needs_fakecap
@pytest.mark.parametrize("tokenize,cider", [("false", 0.5997905185184199), ("true", 0.5998952)])
def test_score_cli_fakecap(tmp_path, tokenize, cider):
    out = tmp_path / "metrics.json"
    proc = run_cli("score", f"results={RESULTS}", f"annotations={REFS}", "metrics=[bleu,rouge,cider]",
                   f"tokenize={tokenize}", f"output={out}", "per_item=true", cwd=tmp_path)
    scores = json.loads(out.read_text())
    expected = json.loads((FAKECAP / "expected_scores.json").read_text())["corpus_full_precision"]
    for key in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L"):
        assert scores[key] == pytest.approx(expected[key], abs=1e-6)
    assert scores["CIDEr"] == pytest.approx(cider, abs=5e-8)
    assert "METEOR" not in scores
    assert len(scores["per_item"]) == 1000 and set(scores["per_item"]["404464"]) >= {"Bleu_4", "CIDEr"}
    assert "CIDEr" in proc.stdout and "testlen 9893" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]  # no Hydra litter


def _write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


@pytest.fixture
def coco_annotations(tmp_path) -> Path:
    return _write(tmp_path / "ann.json", {
        "images": [{"id": 1}, {"id": 2}],
        "annotations": [{"image_id": 1, "id": 10, "caption": "A red circle."},
                        {"image_id": 1, "id": 11, "caption": "a red round shape"},
                        {"image_id": 2, "id": 12, "caption": "A blue square"}],
    })


@pytest.mark.parametrize("results,message", [
    ([{"image_id": 1, "caption": "a red circle"}, {"image_id": 1, "caption": "a circle"}], "duplicate id 1"),
    ([{"image_id": 1, "caption": "a red circle"}, {"image_id": 7, "caption": "a circle"}], "id 7 is not in annotation file"),
    ([{"image_id": 1, "caption": ["a", "red", "circle"]}], "caption of id 1 is list"),
])
def test_score_cli_refuses_bad_results(tmp_path, coco_annotations, results, message):
    res = _write(tmp_path / "res.json", results)
    proc = run_cli("score", f"results={res}", f"annotations={coco_annotations}", "metrics=[bleu]",
                   cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(res) in lines[0], proc.stderr


def test_score_cli_unknown_metric(tmp_path, coco_annotations):
    res = _write(tmp_path / "res.json", [{"image_id": 1, "caption": "a red circle"}])
    proc = run_cli("score", f"results={res}", f"annotations={coco_annotations}", "metrics=[spice]",
                   cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "spice" in proc.stderr


def test_score_files_scores_only_result_ids(tmp_path, coco_annotations):
    res = _write(tmp_path / "res.json", [{"image_id": 1, "caption": "a red circle"}])
    out = score_files(res, coco_annotations, metrics=("bleu", "rouge"))
    assert list(out.per_item) == [1]
    assert out.scores["Bleu_1"] == pytest.approx(1.0) and out.bleu_stats["reflen"] == 3


def test_msrvtt_annotations_and_video_ids(tmp_path):
    ann = _write(tmp_path / "videodatainfo.json", {
        "videos": [{"video_id": "video0", "split": "test"}, {"video_id": "video1", "split": "test"}],
        "sentences": [{"video_id": "video0", "caption": "a man is singing", "sen_id": 0},
                      {"video_id": "video0", "caption": "a person sings", "sen_id": 1},
                      {"video_id": "video1", "caption": "a cat plays", "sen_id": 2}],
    })
    res = _write(tmp_path / "res.json", [{"video_id": "video0", "caption": "a man is singing"},
                                         {"video_id": "video1", "caption": "a dog plays"}])
    out = score_files(res, ann, metrics=("bleu", "cider"), tokenize=False)
    assert set(out.per_item) == {"video0", "video1"}
    assert out.per_item["video0"]["Bleu_4"] == pytest.approx(1.0)


@pytest.mark.parametrize("content,message", [
    ("{not json", "malformed JSON"),
    ('{"image_id": 1}', "expected a JSON list"),
    ("[]", "empty"),
    ('[{"caption": "a"}]', "no 'image_id'"),
    ('[{"image_id": 1.5, "caption": "a"}]', "integer or a string"),
    ('[{"image_id": 1}]', "no 'caption'"),
])
def test_load_results_refuses_malformed(tmp_path, content, message):
    p = tmp_path / "res.json"
    p.write_text(content)
    with pytest.raises(DataError, match=message) as e:
        load_results(p)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("content,message", [
    ('{"images": []}', "'annotations' list"),
    ('{"annotations": [{"image_id": 1}]}', "'image_id' and 'caption'"),
    ('{"annotations": [{"image_id": 1, "caption": null}]}', "not a string"),
    ('{"annotations": []}', "no captions"),
])
def test_load_annotations_refuses_malformed(tmp_path, content, message):
    p = tmp_path / "ann.json"
    p.write_text(content)
    with pytest.raises(DataError, match=message) as e:
        load_annotations(p)
    assert str(p) in str(e.value)
