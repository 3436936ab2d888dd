"""Annotation readers on hand-written fixtures in each format's shape, and every bad-input case."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from captioning.config import DataConfig
from captioning.data.annotations import DatasetRecords, read_dataset
from captioning.errors import ConfigError, DataError

FIX = Path(__file__).parent / "fixtures" / "annotations"


def cfg_for(fmt: str, annotations: dict, media_dir: str | Path = "media", on_error: str = "raise", **kw) -> DataConfig:
    kind = "image" if fmt in ("coco", "karpathy") else "video"
    return DataConfig(name="t", kind=kind, format=fmt, root=".", media_dir=str(media_dir),
                      annotations={k: str(v) for k, v in annotations.items()}, on_error=on_error, **kw)


def load(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def dump(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def by_id(ds: DatasetRecords) -> dict:
    return {r.item_id: r for r in ds.records}


# --------------------------------------------------------------------------- good input
def test_coco_records_splits_ids_paths():
    ds = read_dataset(cfg_for("coco", {"train": FIX / "captions_train.json", "val": FIX / "captions_val.json"}))
    assert [r.item_id for r in ds.split("train")] == ["9", "25", "30"]
    assert [r.item_id for r in ds.split("val")] == ["42", "73"]
    assert ds.split("test") == [] and ds.skipped == []
    r = by_id(ds)["9"]
    assert r.source_id == 9 and isinstance(r.source_id, int)
    assert r.path == "COCO_train2014_000000000009.jpg" and r.kind == "image"
    # whitespace normalised, order of the annotations kept
    assert r.captions == ("A plate of food with broccoli and bread.",
                          "Closeup of bins of food that include broccoli and bread.")
    assert by_id(ds)["25"].captions == ("A giraffe eating food from the top of the tree.",
                                        "A giraffe standing up nearby a tree")
    assert ds.counts() == {"train": 3, "val": 2, "test": 0} and len(ds) == 5


def test_karpathy_coco_restval_is_train_and_paths_use_filepath():
    ds = read_dataset(cfg_for("karpathy", {"all": FIX / "dataset_coco.json"}))
    recs = by_id(ds)
    assert set(recs) == {"391895", "522418", "184613", "318219"}
    assert recs["391895"].split == "test" and recs["184613"].split == "val"
    assert recs["522418"].split == "train"  # restval -> train
    assert recs["522418"].extra["karpathy_split"] == "restval"
    assert recs["318219"].split == "train"
    assert recs["391895"].source_id == 391895
    assert recs["391895"].path == "val2014/COCO_val2014_000000391895.jpg"
    assert recs["391895"].captions[0] == "A man with a red helmet on a small moped on a dirt road."
    assert len(recs["391895"].captions) == 2


def test_karpathy_flickr_uses_imgid_and_filename():
    ds = read_dataset(cfg_for("karpathy", {"all": FIX / "dataset_flickr8k.json"}))
    assert [(r.item_id, r.source_id, r.split, r.path) for r in ds.records] == [
        ("0", 0, "train", "2513260012_03d33305cf.jpg"),
        ("1", 1, "val", "2903617548_d3e38d7f88.jpg"),
        ("2", 2, "test", "3338291921_fe7ae0c8f8.jpg"),
    ]


def test_karpathy_tokens_used_when_raw_missing(tmp_path):
    data = load(FIX / "dataset_flickr8k.json")
    del data["images"][1]["sentences"][0]["raw"]
    ds = read_dataset(cfg_for("karpathy", {"all": dump(tmp_path / "k.json", data)}))
    assert by_id(ds)["1"].captions == ("a little baby plays croquet",)


def test_karpathy_sentences_are_kept_as_their_raw_text_while_parsing():
    from captioning.data.formats.karpathy import raw_sentence

    assert raw_sentence({"tokens": ["a", "dog"], "raw": "A dog.", "imgid": 0, "sentid": 7}) == "A dog."
    no_raw = {"tokens": ["a", "dog"], "imgid": 0, "sentid": 7}
    image = {"sentences": ["A dog."], "sentid": 3, "raw": "not a sentence"}
    assert raw_sentence(no_raw) is no_raw and raw_sentence(image) is image  # read as before
    assert raw_sentence({"raw": "no sentid"}) == {"raw": "no sentid"}


def test_msvd_txt_order_split_and_paths(tmp_path, caplog):
    media = tmp_path / "videos"
    media.mkdir()
    (media / "-7KMZQEsJW4_205_208.MP4").write_bytes(b"")  # the extension in any case
    (media / "-_aaMGK6GGw_57_61.webm").write_bytes(b"")
    (media / "-8y1Q0rA3n8_108_115.mov").write_bytes(b"")
    (media / "-8y1Q0rA3n8_108_115.txt").write_bytes(b"")  # not a video: no second candidate
    (media / "-_hbPLsZvvo_19_25.mp4").mkdir()  # a folder, not a video file
    with caplog.at_level(logging.WARNING):
        ds = read_dataset(cfg_for("msvd", {"all": FIX / "AllVideoDescriptions.txt"}, media_dir=media))
    ids = [r.item_id for r in ds.records]
    # order of first appearance; 5 clips split with the standard fractions: 3 train, 1 val, 1 test
    assert ids == ["-4wsuPCjDBc_5_15", "-7KMZQEsJW4_205_208", "-8y1Q0rA3n8_108_115",
                   "-_hbPLsZvvo_19_25", "-_aaMGK6GGw_57_61"]
    assert [r.split for r in ds.records] == ["train", "train", "train", "val", "test"]
    assert "not the standard 1970" in caplog.text
    recs = by_id(ds)
    assert recs["-4wsuPCjDBc_5_15"].captions == (
        "a squirrel is eating a peanut in it's shell.", "a chipmunk is eating.", "a squirrel eats a nut.")
    assert recs["-4wsuPCjDBc_5_15"].path == "-4wsuPCjDBc_5_15.avi"  # no file: .avi
    assert recs["-7KMZQEsJW4_205_208"].path == "-7KMZQEsJW4_205_208.MP4"
    assert recs["-_aaMGK6GGw_57_61"].path == "-_aaMGK6GGw_57_61.webm"
    assert recs["-8y1Q0rA3n8_108_115"].path == "-8y1Q0rA3n8_108_115.mov"
    assert recs["-_hbPLsZvvo_19_25"].path == "-_hbPLsZvvo_19_25.avi"
    assert recs["-4wsuPCjDBc_5_15"].source_id == "-4wsuPCjDBc_5_15"
    assert recs["-4wsuPCjDBc_5_15"].extra == {"video": "-4wsuPCjDBc", "start": 5, "end": 15}
    assert all(r.kind == "video" for r in ds.records) and ds.skipped == []


def test_msvd_standard_split_of_1970_clips(tmp_path):
    lines = ["# header"] + [f"vid{i:04d}_{i}_{i + 5} a caption {i}" for i in range(1970)]
    f = tmp_path / "AllVideoDescriptions.txt"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ds = read_dataset(cfg_for("msvd", {"all": f}))
    assert ds.counts() == {"train": 1200, "val": 100, "test": 670}
    assert ds.split("train")[-1].item_id == "vid1199_1199_1204"
    assert ds.split("val")[0].item_id == "vid1200_1200_1205"
    assert ds.split("test")[0].item_id == "vid1300_1300_1305"


def test_msvd_split_files(tmp_path):
    (tmp_path / "train.txt").write_text("-8y1Q0rA3n8_108_115\n-4wsuPCjDBc_5_15\n\n")
    (tmp_path / "val.txt").write_text("# val clips\n-_aaMGK6GGw_57_61\n")
    (tmp_path / "test.txt").write_text("-7KMZQEsJW4_205_208\n")
    ds = read_dataset(cfg_for("msvd", {"all": FIX / "AllVideoDescriptions.txt", "train": tmp_path / "train.txt",
                                       "val": tmp_path / "val.txt", "test": tmp_path / "test.txt"}))
    assert {r.item_id: r.split for r in ds.records} == {
        "-4wsuPCjDBc_5_15": "train", "-7KMZQEsJW4_205_208": "test", "-8y1Q0rA3n8_108_115": "train",
        "-_aaMGK6GGw_57_61": "val"}  # -_hbPLsZvvo_19_25 is in no split file: left out


def test_msvd_csv_english_only_and_commas(tmp_path):
    ds = read_dataset(cfg_for("msvd", {"all": FIX / "video_corpus.csv"}))
    recs = by_id(ds)
    assert list(recs) == ["mv89psg6zh4_33_46", "60x_yxy7Sfw_1_9", "6DrHA0P0A5g_10_20"]  # French-only clip gone
    assert recs["mv89psg6zh4_33_46"].captions == (
        "A bird in a sink keeps getting under the running water from a faucet and wetting its feathers.",
        "A bird is bathing in a sink.")
    assert recs["60x_yxy7Sfw_1_9"].captions == ("A man is playing a guitar, and singing.",
                                               "A man plays the guitar, sings and smiles.")
    assert recs["60x_yxy7Sfw_1_9"].path == "60x_yxy7Sfw_1_9.avi"
    assert [r.split for r in ds.records] == ["train", "val", "test"]


def test_msrvtt_merge_files_and_splits():
    ds = read_dataset(cfg_for("msrvtt", {"train": FIX / "train_val_videodatainfo.json",
                                         "test": FIX / "test_videodatainfo.json"}))
    assert [(r.item_id, r.split) for r in ds.records] == [
        ("video0", "train"), ("video1", "train"), ("video6513", "val"), ("video7010", "test")]
    r = by_id(ds)["video0"]
    assert r.source_id == "video0" and r.path == "video0.mp4" and r.kind == "video"
    assert r.captions == ("a car is shown", "a man drives a vehicle through the countryside")
    assert r.extra["category"] == 9


def test_video_files_by_id(tmp_path):
    from captioning.data.media import video_files_by_id

    for name in ("a.mp4", "b.WEBM", "c.Mkv", "d.avi", "e.mov", "f.m4v", "g.mpg", "h.mp4", "h.webm",
                 "notes.txt", "i.jpg", ".mp4", "j.mp4.part"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "k.mp4").mkdir()
    assert video_files_by_id(tmp_path) == {
        "a": ["a.mp4"], "b": ["b.WEBM"], "c": ["c.Mkv"], "d": ["d.avi"], "e": ["e.mov"], "f": ["f.m4v"],
        "g": ["g.mpg"], "h": ["h.mp4", "h.webm"]}
    assert video_files_by_id(tmp_path / "missing") == {}


@pytest.mark.parametrize("ext", [".mp4", ".webm", ".mkv", ".avi", ".mov", ".m4v", ".mpg", ".MP4", ".Mov"])
def test_msrvtt_finds_each_container(tmp_path, ext):
    media = tmp_path / "videos"
    media.mkdir()
    (media / f"video1{ext}").write_bytes(b"")
    ds = read_dataset(cfg_for("msrvtt", {"all": FIX / "train_val_videodatainfo.json"}, media_dir=media),
                      check_files=False)
    recs = by_id(ds)
    assert recs["video1"].path == f"video1{ext}"
    assert recs["video0"].path == "video0.mp4"  # no file: the MSR-VTT default, reported where it is read
    with pytest.raises(DataError, match=r"video0\.mp4 not found"):
        read_dataset(cfg_for("msrvtt", {"all": FIX / "train_val_videodatainfo.json"}, media_dir=media),
                     check_files=True)


@pytest.mark.parametrize("fmt", ["msrvtt", "msvd"])
def test_two_video_files_for_one_id_are_refused_by_name(tmp_path, caplog, fmt):
    media = tmp_path / "videos"
    media.mkdir()
    if fmt == "msrvtt":
        ann, vid, other = {"all": FIX / "train_val_videodatainfo.json"}, "video1", "video0"
        record = r"videos\[1\] \(video_id video1\)"
    else:
        ann, vid, other = {"all": FIX / "AllVideoDescriptions.txt"}, "-7KMZQEsJW4_205_208", "-4wsuPCjDBc_5_15"
        record = "clip -7KMZQEsJW4_205_208"
    for ext in (".mp4", ".webm"):
        (media / f"{vid}{ext}").write_bytes(b"")
    (media / f"{other}.mkv").write_bytes(b"")
    with pytest.raises(DataError) as e:
        read_dataset(cfg_for(fmt, ann, media_dir=media, on_error="raise"))
    msg = str(e.value)
    assert re.search(record, msg), msg
    assert f"2 video files for this id in {media}: {vid}.mp4, {vid}.webm; keep one of them" in msg
    assert Path(next(iter(ann.values()))).name in msg and "on_error=skip" in msg and "\n" not in msg
    with caplog.at_level(logging.WARNING, logger="captioning.data.annotations"):
        ds = read_dataset(cfg_for(fmt, ann, media_dir=media, on_error="skip"))
    recs = by_id(ds)
    assert vid not in recs and recs[other].path == f"{other}.mkv"
    assert len(ds.skipped) == 1 and f"{vid}.mp4, {vid}.webm" in ds.skipped[0]  # its captions: no 2nd report
    assert "2 video files for this id" in caplog.text


def test_msrvtt_single_all_file():
    ds = read_dataset(cfg_for("msrvtt", {"all": FIX / "train_val_videodatainfo.json"}))
    assert ds.counts() == {"train": 2, "val": 1, "test": 0}


# --------------------------------------------------------------------------- config problems
def test_config_problems():
    with pytest.raises(ConfigError, match="data.format='vqa'"):
        read_dataset(DataConfig(name="t", format="vqa", root=".", media_dir=".", annotations={"all": "x"}))
    with pytest.raises(ConfigError, match="data.kind='image' does not match data.format=msvd"):
        read_dataset(DataConfig(name="t", kind="image", format="msvd", root=".", media_dir=".",
                                annotations={"all": "x"}))
    with pytest.raises(ConfigError, match="on_error"):
        read_dataset(cfg_for("coco", {"train": FIX / "captions_train.json"}, on_error="ignore"))
    with pytest.raises(ConfigError, match="annotations.all"):
        read_dataset(cfg_for("karpathy", {"train": FIX / "dataset_coco.json"}))
    with pytest.raises(ConfigError, match="annotations.all is not valid for format=coco"):
        read_dataset(cfg_for("coco", {"all": FIX / "captions_train.json"}))


# --------------------------------------------------------------------------- whole-file problems (always raise)
@pytest.mark.parametrize("fmt,key", [("coco", "train"), ("karpathy", "all"), ("msvd", "all"), ("msrvtt", "all")])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_missing_file_names_the_file(tmp_path, fmt, key, on_error):
    missing = tmp_path / "nope.json"
    with pytest.raises(DataError, match=r"not found: .*nope\.json"):
        read_dataset(cfg_for(fmt, {key: missing}, on_error=on_error))


@pytest.mark.parametrize("fmt,key", [("coco", "train"), ("karpathy", "all"), ("msrvtt", "all")])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_malformed_json_names_the_file(tmp_path, fmt, key, on_error):
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [ {"id": 1,, }', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.json is malformed JSON at line 1"):
        read_dataset(cfg_for(fmt, {key: bad}, on_error=on_error))


@pytest.mark.parametrize("fmt,key", [("coco", "train"), ("karpathy", "all"), ("msrvtt", "all")])
def test_wrong_json_shape_names_the_file(tmp_path, fmt, key):
    bad = dump(tmp_path / "list.json", [1, 2, 3])
    with pytest.raises(DataError, match=r"list\.json"):
        read_dataset(cfg_for(fmt, {key: bad}))


def test_msvd_csv_without_header_columns(tmp_path):
    f = tmp_path / "corpus.csv"
    f.write_text("VideoID,Start,End,Description\nabc,1,2,a cat\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"corpus\.csv lacks column\(s\) Language"):
        read_dataset(cfg_for("msvd", {"all": f}))


def test_no_usable_records_at_all(tmp_path):
    f = dump(tmp_path / "c.json", {"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": []})
    with pytest.raises(DataError, match=r"no usable records in .*c\.json"):
        read_dataset(cfg_for("coco", {"train": f}, on_error="skip"))


# --------------------------------------------------------------------------- record problems: raise and skip
def _coco(tmp_path, mutate) -> dict:
    data = load(FIX / "captions_train.json")
    mutate(data)
    return {"train": dump(tmp_path / "captions_train.json", data)}


def _karpathy(tmp_path, mutate) -> dict:
    data = load(FIX / "dataset_coco.json")
    mutate(data)
    return {"all": dump(tmp_path / "dataset_coco.json", data)}


def _msrvtt(tmp_path, mutate) -> dict:
    data = load(FIX / "train_val_videodatainfo.json")
    mutate(data)
    return {"all": dump(tmp_path / "train_val_videodatainfo.json", data)}


def _msvd(tmp_path, text: str | bytes) -> dict:
    base = (FIX / "AllVideoDescriptions.txt").read_bytes()
    extra = text if isinstance(text, bytes) else text.encode("utf-8")
    (tmp_path / "AllVideoDescriptions.txt").write_bytes(base + extra)
    return {"all": tmp_path / "AllVideoDescriptions.txt"}


def _set(path: list, value):
    def mutate(data):
        obj = data
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return mutate


def _append(path: list, value):
    def mutate(data):
        obj = data
        for k in path:
            obj = obj[k]
        obj.append(value)
    return mutate


# (id, fmt, builder, expected record in the message, expected problem, ids that must survive in skip mode,
#  ids that must be gone, expected number of skipped entries)
BAD = [
    ("coco-empty-caption", "coco", lambda t: _coco(t, _set(["annotations", 3, "caption"], "   ")),
     r"annotations\[3\] \(image id 30\)", "caption is empty", {"9", "25"}, {"30"}, 2),
    ("coco-caption-not-string", "coco", lambda t: _coco(t, _set(["annotations", 0, "caption"], 42)),
     r"annotations\[0\] \(image id 9\)", "caption is not a string", {"9", "25", "30"}, set(), 1),
    ("coco-caption-null", "coco", lambda t: _coco(t, _set(["annotations", 2, "caption"], None)),
     r"annotations\[2\] \(image id 25\)", "caption is not a string", {"9", "25", "30"}, set(), 1),
    ("coco-image-without-entry", "coco",
     lambda t: _coco(t, _append(["annotations"], {"id": 999, "image_id": 77, "caption": "orphan caption"})),
     r"annotations\[5\] \(image id 77\)", "no entry", {"9", "25", "30"}, {"77"}, 1),
    ("coco-duplicate-image-id", "coco",
     lambda t: _coco(t, _append(["images"], {"id": 25, "file_name": "other.jpg"})),
     "image id 25", "duplicate image id", {"9", "25", "30"}, set(), 1),
    ("coco-path-dotdot", "coco", lambda t: _coco(t, _set(["images", 0, "file_name"], "../../etc/passwd")),
     "image id 9", "escapes the data root", {"25", "30"}, {"9"}, 1),
    ("coco-path-absolute", "coco", lambda t: _coco(t, _set(["images", 1, "file_name"], "/etc/passwd")),
     "image id 25", "absolute path", {"9", "30"}, {"25"}, 1),
    ("coco-no-file-name", "coco", lambda t: _coco(t, _set(["images", 2, "file_name"], "")),
     "image id 30", "file path is empty", {"9", "25"}, {"30"}, 1),
    ("coco-image-without-id", "coco", lambda t: _coco(t, _set(["images", 2], {"file_name": "x.jpg"})),
     r"images\[2\]", "without a valid 'id'", {"9", "25"}, {"30"}, 2),
    ("karpathy-empty-caption", "karpathy", lambda t: _karpathy(t, _set(["images", 2, "sentences", 0, "raw"], "")),
     r"images\[2\] \(id 184613\) sentences\[0\]", "caption is empty", {"391895", "318219"}, {"184613"}, 2),
    ("karpathy-caption-not-string", "karpathy",
     lambda t: _karpathy(t, _set(["images", 0, "sentences", 1, "raw"], ["a", "list"])),
     r"images\[0\] \(id 391895\) sentences\[1\]", "caption is not a string", {"391895"}, set(), 1),
    ("karpathy-path-escape", "karpathy", lambda t: _karpathy(t, _set(["images", 3, "filepath"], "..")),
     r"images\[3\] \(id 318219\)", "escapes the data root", {"391895"}, {"318219"}, 1),
    ("karpathy-absolute-path", "karpathy", lambda t: _karpathy(t, _set(["images", 3, "filepath"], "/data")),
     r"images\[3\] \(id 318219\)", "absolute path", {"391895"}, {"318219"}, 1),
    ("karpathy-duplicate-id", "karpathy",
     lambda t: _karpathy(t, _set(["images", 2, "cocoid"], 391895)),
     "id 391895", "duplicate id", {"391895", "318219"}, {"184613"}, 1),
    ("karpathy-unknown-split", "karpathy", lambda t: _karpathy(t, _set(["images", 1, "split"], "holdout")),
     r"images\[1\] \(id 522418\)", "unknown split 'holdout'", {"391895"}, {"522418"}, 1),
    ("msrvtt-empty-caption", "msrvtt", lambda t: _msrvtt(t, _set(["sentences", 2, "caption"], "")),
     r"sentences\[2\] \(video_id video1\)", "caption is empty", {"video0"}, {"video1"}, 2),
    ("msrvtt-caption-not-string", "msrvtt", lambda t: _msrvtt(t, _set(["sentences", 0, "caption"], 3.5)),
     r"sentences\[0\] \(video_id video0\)", "caption is not a string", {"video0", "video1"}, set(), 1),
    ("msrvtt-video-without-entry", "msrvtt",
     lambda t: _msrvtt(t, _append(["sentences"], {"caption": "a cat", "video_id": "video99", "sen_id": 9})),
     r"sentences\[5\] \(video_id video99\)", "no entry in 'videos'", {"video0"}, {"video99"}, 1),
    ("msrvtt-duplicate-id", "msrvtt",
     lambda t: _msrvtt(t, _append(["videos"], {"video_id": "video1", "split": "test", "id": 1})),
     r"videos\[3\] \(video_id video1\)", "duplicate video_id", {"video0", "video1"}, set(), 1),
    ("msrvtt-path-escape", "msrvtt", lambda t: _msrvtt(t, _set(["videos", 0, "video_id"], "../video0")),
     r"videos\[0\] \(video_id \.\./video0\)", "escapes the data root", {"video1"}, {"video0"}, 3),
    ("msrvtt-unknown-split", "msrvtt", lambda t: _msrvtt(t, _set(["videos", 1, "split"], "dev")),
     r"videos\[1\] \(video_id video1\)", "unknown split 'dev'", {"video0"}, {"video1"}, 1),
    ("msvd-empty-caption", "msvd", lambda t: _msvd(t, "zzz_1_2\n"),
     r"line 15 \(clip zzz_1_2\)", "caption is empty", {"-4wsuPCjDBc_5_15"}, {"zzz_1_2"}, 2),
    ("msvd-bad-clip-id", "msvd", lambda t: _msvd(t, "notaclip a cat sits\n"),
     "line 15", "not a clip id", {"-4wsuPCjDBc_5_15"}, set(), 1),
    ("msvd-path-escape", "msvd", lambda t: _msvd(t, "../../x_1_2 a cat sits\n"),
     r"clip \.\./\.\./x_1_2", "escapes the data root", {"-4wsuPCjDBc_5_15"}, {"../../x_1_2"}, 1),
    ("msvd-absolute-path", "msvd", lambda t: _msvd(t, "/etc/x_1_2 a cat sits\n"),
     "clip /etc/x_1_2", "absolute path", {"-4wsuPCjDBc_5_15"}, {"/etc/x_1_2"}, 1),
    ("msvd-not-utf8", "msvd", lambda t: _msvd(t, b"-4wsuPCjDBc_5_15 a squirrel \xff\xfe eats\n"),
     r"line 15 \(clip -4wsuPCjDBc_5_15\)", "not valid UTF-8", {"-4wsuPCjDBc_5_15"}, set(), 1),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_record_raises_naming_file_and_record(tmp_path, case):
    _, fmt, build, record, problem, *_ = case
    ann = build(tmp_path)
    file = Path(next(iter(ann.values()))).name
    with pytest.raises(DataError) as e:
        read_dataset(cfg_for(fmt, ann, on_error="raise"))
    msg = str(e.value)
    assert file in msg
    assert re.search(record, msg), msg
    assert problem in msg, msg
    assert "on_error=skip" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_record_skipped_with_warning(tmp_path, caplog, case):
    _, fmt, build, record, problem, keep, gone, n_skipped = case
    ann = build(tmp_path)
    file = Path(next(iter(ann.values()))).name
    with caplog.at_level(logging.WARNING, logger="captioning.data.annotations"):
        ds = read_dataset(cfg_for(fmt, ann, on_error="skip"))
    ids = set(by_id(ds))
    assert keep <= ids and not (gone & ids)
    assert len(ds.skipped) == n_skipped, ds.skipped
    assert problem in ds.skipped[0] and file in ds.skipped[0]
    assert problem in caplog.text
    assert len(ids) == len(ds.records)  # ids stay unique


def test_non_utf8_caption_in_json(tmp_path):
    raw = (FIX / "captions_train.json").read_bytes().replace(b"A giraffe eating", b"A gir\xe4ffe eating")
    (tmp_path / "c.json").write_bytes(raw)
    with pytest.raises(DataError, match=r"c\.json: annotations\[2\] \(image id 25\): caption is not valid UTF-8"):
        read_dataset(cfg_for("coco", {"train": tmp_path / "c.json"}))
    ds = read_dataset(cfg_for("coco", {"train": tmp_path / "c.json"}, on_error="skip"))
    assert by_id(ds)["25"].captions == ("A giraffe standing up nearby a tree",)
    assert len(ds.skipped) == 1


def test_non_utf8_in_msvd_csv(tmp_path):
    raw = (FIX / "video_corpus.csv").read_bytes().replace(b"Two men are fighting.", b"Two m\xe9n fight.")
    (tmp_path / "corpus.csv").write_bytes(raw)
    with pytest.raises(DataError, match=r"corpus\.csv: line 8 \(clip 6DrHA0P0A5g_10_20\): caption is not valid UTF-8"):
        read_dataset(cfg_for("msvd", {"all": tmp_path / "corpus.csv"}))
    ds = read_dataset(cfg_for("msvd", {"all": tmp_path / "corpus.csv"}, on_error="skip"))
    assert "6DrHA0P0A5g_10_20" not in by_id(ds)
    assert len(ds.skipped) == 2  # the caption, then the clip left without captions


def test_duplicate_ids_across_coco_split_files(tmp_path):
    val = load(FIX / "captions_val.json")
    val["images"][0]["id"] = 9
    for a in val["annotations"]:
        if a["image_id"] == 42:
            a["image_id"] = 9
    ann = {"train": FIX / "captions_train.json", "val": dump(tmp_path / "captions_val.json", val)}
    with pytest.raises(DataError, match=r"captions_val\.json: id 9: duplicate id \(already read from .*captions_train\.json\)"):
        read_dataset(cfg_for("coco", ann))
    ds = read_dataset(cfg_for("coco", ann, on_error="skip"))
    assert by_id(ds)["9"].split == "train" and len(ds.split("val")) == 1


def test_msvd_split_file_problems(tmp_path):
    (tmp_path / "train.txt").write_text("-4wsuPCjDBc_5_15\nnot_a_known_1_2\n")
    (tmp_path / "test.txt").write_text("-4wsuPCjDBc_5_15\n-7KMZQEsJW4_205_208\n")
    ann = {"all": FIX / "AllVideoDescriptions.txt", "train": tmp_path / "train.txt", "test": tmp_path / "test.txt"}
    with pytest.raises(DataError, match=r"train\.txt: line 2 \(clip not_a_known_1_2\): clip id has no descriptions"):
        read_dataset(cfg_for("msvd", ann))
    ds = read_dataset(cfg_for("msvd", ann, on_error="skip"))
    assert {r.item_id: r.split for r in ds.records} == {"-4wsuPCjDBc_5_15": "train", "-7KMZQEsJW4_205_208": "test"}
    assert any("duplicate clip id (already in the train split)" in s for s in ds.skipped)


def test_check_files(tmp_path):
    media = tmp_path / "images"
    media.mkdir()
    for name in ("COCO_train2014_000000000009.jpg", "COCO_train2014_000000000030.jpg"):
        (media / name).write_bytes(b"jpeg")
    ann = {"train": FIX / "captions_train.json"}
    # not checked by default
    assert len(read_dataset(cfg_for("coco", ann, media_dir=media)).records) == 3
    with pytest.raises(DataError, match=r"captions_train\.json: id 25: media file .*000000000025\.jpg not found"):
        read_dataset(cfg_for("coco", ann, media_dir=media), check_files=True)
    ds = read_dataset(cfg_for("coco", ann, media_dir=media, on_error="skip"), check_files=True)
    assert set(by_id(ds)) == {"9", "30"} and len(ds.skipped) == 1


def test_check_files_msvd_extension(tmp_path):
    media = tmp_path / "videos"
    media.mkdir()
    (media / "mv89psg6zh4_33_46.mp4").write_bytes(b"")
    ds = read_dataset(cfg_for("msvd", {"all": FIX / "video_corpus.csv"}, media_dir=media, on_error="skip"),
                      check_files=True)
    assert [r.path for r in ds.records] == ["mv89psg6zh4_33_46.mp4"]
    assert len(ds.skipped) == 2


def test_skip_mode_counts_items_without_captions(tmp_path):
    data = load(FIX / "captions_val.json")
    data["images"].append({"id": 5, "file_name": "COCO_val2014_000000000005.jpg"})  # no captions at all
    ds = read_dataset(cfg_for("coco", {"val": dump(tmp_path / "v.json", data)}, on_error="raise"))
    assert set(by_id(ds)) == {"42", "73"}
    assert ds.skipped == [f"{tmp_path / 'v.json'}: image id 5: no valid caption left, item dropped"]

