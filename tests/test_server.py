"""Evaluation-server files: the COCO server's name and fields, one caption per image id of the
split, checked and zipped; ``captioning-evaluate server=coco``."""

from __future__ import annotations

import json
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest
from conftest import make_tiny_image_dataset
from test_caption_cli import save_checkpoint

from captioning.config import DataConfig, TrainerConfig
from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError, DataError
from captioning.evaluation.job import EvaluateConfig, evaluate
from captioning.evaluation.server import (
    algorithm_name,
    check_request,
    coco_image_set,
    coco_results_name,
    pack,
    read_zip,
    validate_results,
    write_coco_results,
)
from captioning.models.search import DecodeConfig
from captioning.store.feature_store import FeatureStore

GOOD = [{"image_id": 42, "caption": "a cat"}, {"image_id": 7, "caption": "a dog on a mat"}]


def test_names_and_image_sets() -> None:
    assert coco_results_name("val2014", "fakecap") == "captions_val2014_fakecap_results.json"
    assert algorithm_name("shapes-soft_attention-s0") == "shapes-soft-attention-s0"
    with pytest.raises(ConfigError, match="server_alg"):
        algorithm_name("__")
    assert coco_image_set(["val2014/COCO_val2014_000000391895.jpg", "COCO_val2014_000000000042.jpg"], "test") == "val2014"
    assert coco_image_set(["COCO_test2014_000000000001.jpg"], "test") == "test2014"
    assert coco_image_set(["000001.jpg", "000002.jpg"], "test") == "test"  # no COCO set named: the split
    with pytest.raises(ConfigError, match="mixes images"):
        coco_image_set(["COCO_val2014_000000000042.jpg", "train2014/COCO_train2014_000000000009.jpg"], "test")


@pytest.mark.parametrize(("entries", "problem"), [
    ({"image_id": 1, "caption": "x"}, "JSON list"),
    ([{"image_id": 1, "caption": "x", "score": 0.5}], "exactly image_id and caption"),
    ([{"image_id": "42", "caption": "x"}], "integers"),
    ([{"image_id": True, "caption": "x"}], "integers"),
    ([{"image_id": 42, "caption": "  "}], "non-empty"),
    ([{"image_id": 42, "caption": None}], "non-empty"),
    ([{"image_id": 42, "caption": "a"}, {"image_id": 42, "caption": "b"}], "two captions"),
])
def test_validate_refuses_malformed_results(entries, problem: str) -> None:
    with pytest.raises(DataError, match=problem):
        validate_results(entries)


def test_validate_against_the_split_ids_and_annotation_file(tmp_path) -> None:
    assert validate_results(GOOD, [7, 42]) == GOOD
    with pytest.raises(DataError, match=r"1 image\(s\) of the split have no caption \(e.g. \[9\]\) and 0 caption"):
        validate_results(GOOD, [7, 42, 9])
    with pytest.raises(DataError, match=r"0 image\(s\) .* and 1 caption\(s\) are for images not in it \(e.g. \[42\]\)"):
        validate_results(GOOD, [7])
    ann = tmp_path / "image_info_test2014.json"
    ann.write_text(json.dumps({"images": [{"id": 7, "file_name": "a.jpg"}, {"id": 42, "file_name": "b.jpg"}]}))
    results = tmp_path / "captions_test2014_x_results.json"
    results.write_text(json.dumps(GOOD))
    assert validate_results(results, ann) == GOOD
    results.write_text(json.dumps(GOOD[:1]))
    with pytest.raises(DataError, match=f"{results}: 1 image.* of {ann} have no caption"):
        validate_results(results, ann)


def test_write_zip_and_pack(tmp_path) -> None:
    path, zipped = write_coco_results({42: "a cat", 7: "a dog"}, [7, 42], tmp_path / "val", "val2014", "my method")
    assert path.name == "captions_val2014_my-method_results.json" and zipped.name == "results.zip"
    assert json.loads(path.read_text()) == [{"image_id": 7, "caption": "a dog"}, {"image_id": 42, "caption": "a cat"}]
    assert read_zip(zipped) == {path.name: json.loads(path.read_text())}
    with pytest.raises(DataError, match="no caption"):
        write_coco_results({42: "a cat"}, [7, 42], tmp_path / "bad", "val2014", "m")
    assert not (tmp_path / "bad").exists()  # nothing written when the check fails
    test_file, _ = write_coco_results({1: "a bird"}, [1], tmp_path / "test", "test2014", "my method")
    both = pack([path, test_file], tmp_path / "upload.zip")
    with zipfile.ZipFile(both) as z:
        assert sorted(z.namelist()) == sorted([path.name, test_file.name])  # at the zip's root
    odd = tmp_path / "results.json"
    odd.write_text(json.dumps(GOOD))
    with pytest.raises(DataError, match="named captions_<set>_<alg>_results.json"):
        pack([odd])


def test_requests_refused_before_decoding() -> None:
    check_request(None, "video", 3)
    check_request("coco", "image", None)
    with pytest.raises(ConfigError, match="not a known evaluation server"):
        check_request("nocaps", "image", None)
    with pytest.raises(ConfigError, match="takes image captions"):
        check_request("coco", "video", None)
    with pytest.raises(ConfigError, match="unset max_items"):
        check_request("coco", "image", 10)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("server")
    d = make_tiny_image_dataset(tmp / "tiny")
    root = d["root"]
    data = asdict(DataConfig(name="tiny", kind="image", format="coco", root=str(root), media_dir=str(root / "images"),
                             annotations={s: str(root / "annotations" / f"captions_{s}.json")
                                          for s in ("train", "val", "test")}, num_workers=0))
    vocab = Vocabulary.build([["a", "red", "circle"]], min_count=1).to_dict()
    (tmp / "shapes-soft-s0" / "checkpoints").mkdir(parents=True)
    ckpt = save_checkpoint(tmp / "shapes-soft-s0" / "checkpoints" / "last.ckpt",
                           dict(FeatureStore.open(d["features_dir"]).meta), vocab, data, d["features_dir"])
    return {**d, "ckpt": ckpt}


def _evaluate(run: dict, out: Path, **kw) -> dict:
    return evaluate(EvaluateConfig(ckpt_path=str(run["ckpt"]), split="val", decode=DecodeConfig(beam_size=2, max_length=5),
                                   trainer=TrainerConfig(accelerator="cpu", enable_progress_bar=False),
                                   output_dir=str(out), metrics=["bleu"], num_workers=0, **kw))


def test_evaluate_writes_the_server_file_of_the_split(tiny_run, tmp_path) -> None:
    _evaluate(tiny_run, tmp_path, server="coco")
    path = tmp_path / "captions_val_shapes-soft-s0_results.json"  # file names name no COCO set: the split
    entries = validate_results(path, tiny_run["root"] / "annotations" / "captions_val.json")
    assert sorted(e["image_id"] for e in entries) == sorted(tiny_run["splits"]["val"])
    ours = {r["image_id"]: r["caption"] for r in json.loads((tmp_path / "results.json").read_text())}
    assert {e["image_id"]: e["caption"] for e in entries} == ours
    assert read_zip(tmp_path / "results.zip") == {path.name: entries}
    _evaluate(tiny_run, tmp_path / "named", server="coco", server_alg="attn2")
    assert (tmp_path / "named" / "captions_val_attn2_results.json").is_file()


def test_evaluate_refuses_an_incomplete_server_file(tiny_run, tmp_path) -> None:
    with pytest.raises(ConfigError, match="unset max_items"):
        _evaluate(tiny_run, tmp_path, server="coco", max_items=2)
    with pytest.raises(ConfigError, match="server='nocaps'"):
        _evaluate(tiny_run, tmp_path, server="nocaps")
    assert not (tmp_path / "results.json").exists()  # refused before decoding
