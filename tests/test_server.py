"""Evaluation-server files: the COCO server's name and fields, one caption per image id of the
split, checked and zipped; ``captioning-evaluate server=coco``."""

from __future__ import annotations

import json
import shutil
import zipfile
from dataclasses import asdict
from pathlib import Path

import pytest
from conftest import make_tiny_image_dataset
from test_caption_cli import image_ckpt, save_checkpoint  # noqa: F401  (image_ckpt: a fixture)

from captioning.config import DataConfig, TrainerConfig
from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError, DataError
from captioning.evaluation.job import EvaluateConfig, evaluate
from captioning.evaluation.server import (
    SERVER_SETS,
    algorithm_name,
    check_image_set,
    check_request,
    coco_image_set,
    coco_results_name,
    image_set_files,
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


def test_write_and_pack_the_upload_of_both_sets(tmp_path) -> None:
    path = write_coco_results({42: "a cat", 7: "a dog"}, [7, 42], tmp_path / "val", "val2014", "my method")
    assert path.name == "captions_val2014_my-method_results.json"
    assert json.loads(path.read_text()) == [{"image_id": 7, "caption": "a dog"}, {"image_id": 42, "caption": "a cat"}]
    with pytest.raises(DataError, match="no caption"):
        write_coco_results({42: "a cat"}, [7, 42], tmp_path / "bad", "val2014", "m")
    assert not (tmp_path / "bad").exists()  # nothing written when the check fails
    with pytest.raises(DataError, match="scores val2014 and test2014 files only"):
        write_coco_results({42: "a cat"}, [42], tmp_path / "bad", "val", "m")
    test_file = write_coco_results({1: "a bird"}, [1], tmp_path / "test", "test2014", "my method")
    both = pack([path, test_file], tmp_path / "upload.zip")
    with zipfile.ZipFile(both) as z:
        assert sorted(z.namelist()) == sorted([path.name, test_file.name])  # at the zip's root
    assert read_zip(both) == {path.name: json.loads(path.read_text()), test_file.name: [{"image_id": 1,
                                                                                          "caption": "a bird"}]}
    with pytest.raises(DataError, match="both or nothing"):  # the server takes both sets or none
        pack([path], tmp_path / "one.zip")
    other_alg = write_coco_results({1: "a bird"}, [1], tmp_path / "test2", "test2014", "other")
    with pytest.raises(DataError, match="of the same <alg>"):
        pack([path, other_alg], tmp_path / "two.zip")
    odd = tmp_path / "results.json"
    odd.write_text(json.dumps(GOOD))
    with pytest.raises(DataError, match="named captions_<set>_<alg>_results.json"):
        pack([odd])


def test_a_server_file_covers_its_whole_set_or_is_refused_naming_what_is_missing() -> None:
    """Karpathy's layout: the val and test splits are both val2014 images; a server file of one of
    them would hold half the set the server scores it against."""
    from captioning.data.records import CaptionRecord

    def rec(i: int, split: str, image_set: str) -> CaptionRecord:
        return CaptionRecord(item_id=str(i), source_id=i, path=f"{image_set}/COCO_{image_set}_{i:012d}.jpg",
                             captions=("a cat",), split=split)

    karpathy = [rec(1, "train", "train2014"), rec(2, "train", "val2014"), rec(3, "val", "val2014"),
                rec(4, "test", "val2014"), rec(5, "test", "val2014")]
    assert check_image_set(None, karpathy, "test") is None
    with pytest.raises(DataError, match=r"split 'test' holds 2 of the 4 val2014 images of this data \(2 missing, "
                                        r"e.g. ids \[2, 3\]\); caption the whole set from its images"):
        check_image_set("coco", karpathy, "test")
    official = [rec(1, "train", "train2014"), rec(2, "val", "val2014"), rec(3, "val", "val2014"),
                rec(4, "test", "test2014")]
    assert check_image_set("coco", official, "val") == ("val2014", [2, 3])
    assert check_image_set("coco", official, "test") == ("test2014", [4])
    with pytest.raises(DataError, match="name no COCO set the server scores"):
        check_image_set("coco", official, "train")
    assert SERVER_SETS == {"val2014": 40504, "test2014": 40775}


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


def coco_layout(run: dict, dest: Path, sets: dict[str, str]) -> Path:
    """A copy of the tiny data whose image files are named as COCO's: ``<set>/COCO_<set>_<id>.jpg``
    with ``sets[split]`` the set of each split (``{"val": "val2014", "test": "val2014"}``: Karpathy's)."""
    shutil.copytree(run["root"], dest)
    for split, image_set in sets.items():
        path = dest / "annotations" / f"captions_{split}.json"
        data = json.loads(path.read_text())
        for im in data["images"]:
            im["file_name"] = f"{image_set}/COCO_{image_set}_{im['id']:012d}.jpg"
        path.write_text(json.dumps(data))
    return dest


def _evaluate(run: dict, out: Path, **kw) -> dict:
    return evaluate(EvaluateConfig(ckpt_path=str(run["ckpt"]), split="val", decode=DecodeConfig(beam_size=2, max_length=5),
                                   trainer=TrainerConfig(accelerator="cpu", enable_progress_bar=False),
                                   output_dir=str(out), metrics=["bleu"], num_workers=0, **kw))


def test_evaluate_writes_the_server_file_of_a_whole_set(tiny_run, tmp_path) -> None:
    root = coco_layout(tiny_run, tmp_path / "coco", {"train": "train2014", "val": "val2014", "test": "test2014"})
    _evaluate(tiny_run, tmp_path / "eval", server="coco", data_root=str(root))
    path = tmp_path / "eval" / "captions_val2014_shapes-soft-s0_results.json"  # <alg>: the run's folder name
    entries = validate_results(path, root / "annotations" / "captions_val.json")  # the whole set, round trip
    assert sorted(e["image_id"] for e in entries) == sorted(tiny_run["splits"]["val"])
    ours = {r["image_id"]: r["caption"] for r in json.loads((tmp_path / "eval" / "results.json").read_text())}
    assert {e["image_id"]: e["caption"] for e in entries} == ours
    _evaluate(tiny_run, tmp_path / "named", server="coco", server_alg="attn2", data_root=str(root))
    assert (tmp_path / "named" / "captions_val2014_attn2_results.json").is_file()


def test_evaluate_refuses_a_server_file_the_server_would_not_take(tiny_run, tmp_path) -> None:
    karpathy = coco_layout(tiny_run, tmp_path / "karpathy", {"train": "train2014", "val": "val2014", "test": "val2014"})
    n_val, n_test = len(tiny_run["splits"]["val"]), len(tiny_run["splits"]["test"])
    with pytest.raises(DataError, match=rf"split 'val' holds {n_val} of the {n_val + n_test} val2014 images of this "
                                        rf"data \({n_test} missing, e.g. ids \[{min(tiny_run['splits']['test'])},"):
        _evaluate(tiny_run, tmp_path / "a", server="coco", data_root=str(karpathy))
    with pytest.raises(DataError, match="name no COCO set"):  # the synthetic file names: no COCO set
        _evaluate(tiny_run, tmp_path / "b", server="coco")
    with pytest.raises(ConfigError, match="unset max_items"):
        _evaluate(tiny_run, tmp_path / "c", server="coco", max_items=2)
    with pytest.raises(ConfigError, match="server='nocaps'"):
        _evaluate(tiny_run, tmp_path / "d", server="nocaps")
    assert not [p for p in tmp_path.rglob("results.json")]  # all refused before decoding


def test_a_whole_set_in_coco_layout_round_trips(image_ckpt, tmp_path) -> None:  # noqa: F811
    """docs/configuration.md's end-to-end way: both sets captioned from their image files with the
    checkpoint's own backbone, each file written against its official image list, zipped, and read
    back whole (val2014 with captions_val2014.json, test2014 with image_info_test2014.json)."""
    from captioning import Captioner

    coco = tmp_path / "coco"
    lists = {}
    for k, (image_set, images) in enumerate([("val2014", image_ckpt["images"][:5]),
                                             ("test2014", image_ckpt["images"][5:])]):
        (coco / "images" / image_set).mkdir(parents=True)
        entries = []
        for n, src in enumerate(images):
            image_id = 1000 * (k + 1) + n
            name = f"COCO_{image_set}_{image_id:012d}.jpg"
            shutil.copy(src, coco / "images" / image_set / name)
            entries.append({"id": image_id, "file_name": name, "width": 128, "height": 128})
        lists[image_set] = coco / "annotations" / ("captions_val2014.json" if image_set == "val2014"
                                                   else "image_info_test2014.json")
        lists[image_set].parent.mkdir(exist_ok=True)
        lists[image_set].write_text(json.dumps({"images": entries, **({"annotations": []} if k == 0 else {})}))

    captioner = Captioner.from_checkpoint(image_ckpt["soft"], device="cpu")
    files = []
    for image_set, image_list in lists.items():  # as in the docs
        ids, paths = image_set_files(image_list, coco / "images" / image_set)
        image_id = {str(p): i for i, p in zip(ids, paths, strict=True)}
        results = captioner.iter_caption(paths, batch_size=4, num_workers=0, beam_size=2, max_length=6)
        captions = {image_id[r.input]: r.caption for r in results if r.error is None}
        files.append(write_coco_results(captions, image_list, tmp_path / "server", image_set, "myattn"))
    upload = read_zip(pack(files, tmp_path / "server" / "results.zip"))
    assert sorted(upload) == ["captions_test2014_myattn_results.json", "captions_val2014_myattn_results.json"]
    for image_set, image_list in lists.items():
        entries = validate_results(upload[f"captions_{image_set}_myattn_results.json"], image_list)
        assert len(entries) == len(json.loads(image_list.read_text())["images"]) and all(e["caption"] for e in entries)
    (coco / "images" / "test2014" / sorted(p.name for p in (coco / "images" / "test2014").iterdir())[0]).unlink()
    with pytest.raises(DataError, match=r"1 of the 7 images of .*image_info_test2014.json are not in"):
        image_set_files(lists["test2014"], coco / "images" / "test2014")
