"""captioning-import: each reader on generated fixtures (a corrupt record and a count mismatch in
each), the checks, resuming, ranks, the store's boxes, and the CLI's exit statuses."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import make_tiny_image_dataset, run_cli

from captioning.caption.api import CaptionResult
from captioning.caption.callbacks import attention_image
from captioning.config import DataConfig
from captioning.errors import CheckpointError, ConfigError, DataError
from captioning.evaluation.grounding import evaluate_grounding
from captioning.evaluation.object_regions import region_box_overlap, region_centres_in_box
from captioning.features.featurize import encoder_config
from captioning.features.formats import (
    FEATURE_FORMATS,
    BadRecord,
    ImportConfig,
    Regions,
    fit_regions,
    keep_rows,
)
from captioning.features.formats.bottom_up_tsv import parse_tsv_row
from captioning.features.importing import import_features, rank_of
from captioning.models.decoders import build_decoder
from captioning.models.positions import layout_from_meta
from captioning.store.feature_store import FeatureStore
from captioning.store.streams import open_features
from captioning.store.writer import FeatureStoreWriter
from captioning.viz.gallery import captions_errors, result_entry
from captioning.viz.heatmaps import build_result_figure, plot_result
from captioning.viz.region_boxes import box_heat, scale_boxes

D = 8  # feature dim of the fixtures
N_ITEMS = 12  # annotation ids 1..12 (make_tiny_image_dataset)


def regions(i: int, n: int | None = None, d: int = D) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Item i's features [n, d] (float32), pixel boxes [n, 4] inside its (W, H) image; n = 3..8."""
    rng = np.random.default_rng(i)
    n = n if n is not None else 3 + i % 6
    w, h = 64 + i, 48 + i
    x1, y1 = rng.uniform(0, w / 2, n), rng.uniform(0, h / 2, n)
    boxes = np.stack([x1, y1, x1 + rng.uniform(2, w / 2, n), y1 + rng.uniform(2, h / 2, n)], 1)
    return rng.standard_normal((n, d)).astype(np.float32), boxes.astype(np.float32), (w, h)


def b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.float32).tobytes()).decode("ascii")


def tsv_row(i: int, **override: str) -> str:
    f, b, (w, h) = regions(i)
    fields = {"image_id": str(i), "image_w": str(w), "image_h": str(h), "num_boxes": str(len(f)),
              "boxes": b64(b), "features": b64(f), **override}
    return "\t".join(fields[k] for k in ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features"))


@pytest.fixture
def tiny(tmp_path: Path) -> dict:
    data = make_tiny_image_dataset(tmp_path / "tiny", n=N_ITEMS)
    root = data["root"]
    cfg = DataConfig(name="tiny", kind="image", format="coco", root=str(root), media_dir=str(root / "images"),
                     annotations={s: str(root / "annotations" / f"captions_{s}.json") for s in ("train", "val", "test")})
    return {"root": root, "data": cfg, "out": tmp_path / "imported"}


def config(tiny: dict, fmt: str, source: Path, **kw) -> ImportConfig:
    return ImportConfig(data=tiny["data"], format=fmt, source=str(source), features_dir=str(tiny["out"]),
                        progress=False, **kw)


def failures(store: FeatureStore) -> dict[str, str]:
    return {f["id"]: f["error"] for f in store.failures}


def check_imported(store: FeatureStore, ids: list[int], boxes: bool = True, sizes: bool = True) -> None:
    """Every item of ``ids`` holds its fixture's rows, valid count, boxes and image size."""
    for i in ids:
        f, b, size = regions(i)
        item = store[str(i)]
        n = len(f)
        assert item.valid == n and item.features.shape == (store.positions, D)
        np.testing.assert_allclose(item.features[:n], f, atol=2e-3)  # float16 storage
        assert not np.asarray(item.features[n:]).any()  # padding rows are zeros
        if boxes:
            np.testing.assert_array_equal(item.boxes[:n], b)
            assert not np.asarray(item.boxes[n:]).any()
        else:
            assert item.boxes is None
        assert item.image_size == (size if sizes else None)


# ------------------------------------------------------------------------------------ readers


def test_bottom_up_tsv_imports_and_records_bad_rows_by_id(tiny: dict) -> None:
    src = tiny["root"] / "tsv"
    src.mkdir()
    rows = [tsv_row(i) for i in range(1, 9)]
    rows[2] = tsv_row(3, features="not*base64!")  # corrupt record
    f4, _, _ = regions(4)
    rows[3] = tsv_row(4, num_boxes=str(len(f4) + 1))  # count mismatch: num_boxes disagrees with the arrays
    rows[4] = tsv_row(5)[: tsv_row(5).rindex("\t") + 41]  # truncated line: 40 base64 chars = 30 bytes left
    rows.append(tsv_row(99))  # not an annotation id
    (src / "part.tsv.0").write_text("\n".join(rows[:5]) + "\n")
    (src / "part.tsv.1").write_text("\n".join(rows[5:]) + "\n" + tsv_row(10) + "\n")
    summary = import_features(config(tiny, "bottom_up_tsv", src, max_regions=8))
    store = FeatureStore.open(tiny["out"])
    assert sorted(store.ids, key=int) == ["1", "2", "6", "7", "8", "10"]
    check_imported(store, [1, 2, 6, 7, 8, 10])
    bad = failures(store)
    assert set(bad) == {"3", "4", "5"}
    assert "not valid base64" in bad["3"]
    assert f"num_boxes={len(f4) + 1} but the boxes field holds {len(f4)} boxes" in bad["4"]
    assert "field features holds 30 bytes, not whole float32 values" in bad["5"]
    assert (summary.imported, summary.failed, summary.unknown, summary.unknown_ids) == (6, 3, 1, ["99"])
    assert summary.missing == 3 and sorted(summary.missing_ids, key=int) == ["9", "11", "12"]
    assert store.meta["boxes"] and store.meta["regions"] and store.meta["grid"] is None
    assert store.meta["imported"]["format"] == "bottom_up_tsv" and store.meta["settings"]["boxes"] is True
    assert layout_from_meta(store.meta) is None  # regions have no order: position codes refuse them


def test_tsv_fields_are_checked_one_by_one() -> None:
    f, b, _ = regions(1, n=4)
    ok = parse_tsv_row(tsv_row(1).split("\t"))
    assert ok.features.shape == (len(regions(1)[0]), D) and ok.image_size == (65, 49)
    quoted = tsv_row(1).split("\t")
    quoted[5] = f"b'{quoted[5]}'"  # what str(bytes) in a Python-3 writer leaves behind
    np.testing.assert_array_equal(parse_tsv_row(quoted).features, ok.features)
    with pytest.raises(BadRecord, match="has 5 tab-separated fields"):
        parse_tsv_row(tsv_row(1).split("\t")[:5])
    with pytest.raises(BadRecord, match="num_boxes='x'|field num_boxes"):
        parse_tsv_row(tsv_row(1, num_boxes="x").split("\t"))
    with pytest.raises(BadRecord, match=f"num_boxes=3 but the features field holds {4 * D} values, not 3 rows"):
        parse_tsv_row(tsv_row(1, num_boxes="3", boxes=b64(b[:3]), features=b64(f)).split("\t"))
    with pytest.raises(BadRecord, match="num_boxes=0"):
        parse_tsv_row(tsv_row(1, num_boxes="0").split("\t"))


def test_npz_dir_with_box_files(tiny: dict) -> None:
    att, box = tiny["root"] / "cocobu_att", tiny["root"] / "cocobu_box"
    att.mkdir()
    box.mkdir()
    for i in range(1, N_ITEMS + 1):
        f, b, _ = regions(i)
        np.savez_compressed(att / f"{i}.npz", feat=f)
        np.save(box / f"{i}.npy", b)
    (att / "3.npz").write_bytes((att / "3.npz").read_bytes()[:40])  # corrupt record: a truncated zip
    np.save(box / "4.npy", regions(4)[1][:-1])  # count mismatch: one box fewer than feature rows
    (box / "5.npy").unlink()  # no boxes for item 5
    np.savez_compressed(att / "6.npz", features=regions(6)[0])  # wrong array name
    summary = import_features(config(tiny, "npz_dir", att, boxes_dir=str(box)))
    store = FeatureStore.open(tiny["out"])
    ok = [1, 2, *range(7, N_ITEMS + 1)]
    assert sorted(store.ids, key=int) == [str(i) for i in ok]
    check_imported(store, ok, sizes=False)  # cocobu_box holds no image size
    bad = failures(store)
    assert set(bad) == {"3", "4", "5", "6"} and summary.failed == 4
    assert "BadZipFile" in bad["3"] or "zip" in bad["3"].lower()
    n4 = len(regions(4)[0])
    assert f"has {n4 - 1} boxes but {n4} feature rows" in bad["4"]
    assert "no boxes file" in bad["5"] and "has no array 'feat' (it has features): set key=" in bad["6"]
    # max_regions=null: one pass found the largest count (3 + 5 = 8 regions)
    assert store.positions == 8 and summary.positions == 8


def test_npy_dir_without_boxes_and_dim_mismatch(tiny: dict) -> None:
    src = tiny["root"] / "npy"
    src.mkdir()
    for i in range(1, N_ITEMS + 1):
        np.save(src / f"{i}.npy", regions(i)[0])
    np.save(src / "2.npy", regions(2, d=D + 4)[0])  # another dim
    np.save(src / "3.npy", np.full((4, D), np.nan, np.float32))  # corrupt values
    np.save(src / "4.npy", regions(4)[0][0])  # 1-D: no region axis
    (src / "5.npy").write_bytes(b"\x93NUMPY garbage")  # corrupt record: a broken header
    import_features(config(tiny, "npy_dir", src, max_regions=8))
    store = FeatureStore.open(tiny["out"])
    bad = failures(store)
    assert set(bad) == {"2", "3", "4", "5"}
    assert f"has dim {D + 4} but the store's items have dim {D}" in bad["2"]
    assert "NaN/inf" in bad["3"] and "expected [regions, dim]" in bad["4"] and "ValueError" in bad["5"]
    check_imported(store, [1, *range(6, N_ITEMS + 1)], boxes=False, sizes=False)
    assert store.meta["boxes"] is False and store.meta["dim"] == D


@pytest.fixture
def h5_by_id(tiny: dict) -> Path:
    """An HDF5 file keyed by annotation id: groups with feat/boxes + image size (3: corrupt chunk, 4:
    a count mismatch) and one plain dataset (5: features only)."""
    path = tiny["root"] / "by_id.h5"
    with h5py.File(path, "w") as f:
        for i in range(1, N_ITEMS + 1):
            feats, boxes, (w, h) = regions(i)
            g = f.create_group(str(i))
            g.create_dataset("feat", data=feats, chunks=feats.shape, compression="gzip")
            g.create_dataset("boxes", data=boxes[:-1] if i == 4 else boxes)
            g.attrs["image_w"], g.attrs["image_h"] = w, h
        info = f["3/feat"].id.get_chunk_info(0)
    with open(path, "r+b") as raw:
        raw.seek(info.byte_offset)
        raw.write(b"\xff" * info.size)
    return path


def test_hdf5_reader(tiny: dict, h5_by_id: Path) -> None:
    summary = import_features(config(tiny, "hdf5", h5_by_id, boxes_key="boxes", max_regions=8))
    store = FeatureStore.open(tiny["out"])
    bad = failures(store)
    assert set(bad) == {"3", "4"} and summary.failed == 2
    assert "OSError" in bad["3"] or "RuntimeError" in bad["3"]  # HDF5 cannot inflate the chunk
    n4 = len(regions(4)[0])
    assert f"has {n4 - 1} boxes but {n4} feature rows" in bad["4"]
    check_imported(store, [1, 2, *range(5, N_ITEMS + 1)])


def test_hdf5_plain_datasets_and_id_format(tiny: dict) -> None:
    path = tiny["root"] / "videos.h5"
    with h5py.File(path, "w") as f:  # keyed 0..11 while the annotations say 1..12
        for i in range(1, N_ITEMS + 1):
            f.create_dataset(str(i - 1), data=regions(i)[0])
    cfg = config(tiny, "hdf5", path, max_regions=8, id_format="1{}")  # "0" -> "10", "1" -> "11", ...
    summary = import_features(cfg)
    assert summary.imported == 3 and summary.unknown == N_ITEMS - 3  # only 10, 11, 12 are annotation ids
    store = FeatureStore.open(tiny["out"])
    np.testing.assert_allclose(store["10"].features[: len(regions(1)[0])], regions(1)[0], atol=2e-3)


# ------------------------------------------------------------------------------------ checks


def test_every_format_is_a_registered_reader() -> None:
    assert sorted(FEATURE_FORMATS.names()) == ["bottom_up_tsv", "hdf5", "npy_dir", "npz_dir"]
    with pytest.raises(ConfigError, match="format='csv' is not a registered feature format; use "):
        FEATURE_FORMATS.get("csv")


def test_keep_rows_by_overflow_policy() -> None:
    assert keep_rows(3, 5, "fail") == [0, 1, 2]
    assert keep_rows(7, 4, "first") == [0, 1, 2, 3]
    assert keep_rows(7, 4, "uniform") == [0, 2, 4, 6]  # linspace(0, 6, 4) = 0, 2, 4, 6
    assert keep_rows(10, 3, "uniform") == [0, 4, 9]  # 0, 4.5 -> 4 (round half to even), 9
    with pytest.raises(BadRecord, match="has 7 regions, more than max_regions=4"):
        keep_rows(7, 4, "fail")


def test_fit_regions_checks() -> None:
    f, b, size = regions(1, n=4)
    fitted = fit_regions(regions_of(f, b, size), D, 4, "fail", boxes=True)
    assert fitted.rows == [0, 1, 2, 3] and fitted.image_size == size
    cut = fit_regions(regions_of(f, b, size), D, 2, "uniform", boxes=True)
    np.testing.assert_array_equal(cut.features, f[[0, 3]])
    np.testing.assert_array_equal(cut.boxes, b[[0, 3]])
    cases = [
        (regions_of(f.astype(np.int32), b, size), "dtype int32, expected a float type"),
        (regions_of(f[:0], b[:0], size), "no regions"),
        (regions_of(f, None, size), "has no boxes but the store keeps a box per region"),
        (regions_of(f, b[:, :3], size), "boxes have shape [4, 3]"),
        (regions_of(f, b[:, [2, 1, 0, 3]], size), "x2 < x1"),
        (regions_of(f, b + size[0], size), f"outside the {size[0]}x{size[1]} image"),
        (regions_of(f, np.where(b > 0, np.nan, b), size), "boxes contain NaN"),
        (regions_of(f, b, (0, 5)), "image size [0, 5] is not positive"),
    ]
    for record, message in cases:
        with pytest.raises(BadRecord, match=message.replace("[", r"\[").replace("]", r"\]")):
            fit_regions(record, D, 4, "fail", boxes=True)


def regions_of(f: np.ndarray, b: np.ndarray | None, size: tuple[int, int] | None):
    return Regions(f, b, size)


def write_tsv(path: Path, ids: range) -> Path:
    path.write_text("".join(tsv_row(i) + "\n" for i in ids))
    return path


def test_resume_skips_stored_ids_and_refuses_other_settings(tiny: dict) -> None:
    src = write_tsv(tiny["root"] / "a.tsv", range(1, 7))
    first = import_features(config(tiny, "bottom_up_tsv", src, max_regions=8, limit=3))
    assert first.imported == 3 and first.missing == 0  # a limited run does not call the rest missing
    again = import_features(config(tiny, "bottom_up_tsv", write_tsv(tiny["root"] / "b.tsv", range(1, 13)),
                                   max_regions=8))
    assert (again.skipped_done, again.imported, again.failed, again.missing) == (3, 9, 0, 0)
    store = FeatureStore.open(tiny["out"])
    assert len(store) == N_ITEMS and store.duplicates == 0
    check_imported(store, list(range(1, N_ITEMS + 1)))
    with pytest.raises(ConfigError, match="holds items of 8 positions but max_regions/grid give 10"):
        import_features(config(tiny, "bottom_up_tsv", src, max_regions=10))
    with pytest.raises(DataError, match=r"other settings \(settings.name differ\)"):
        import_features(config(tiny, "bottom_up_tsv", src, name="other_features"))


def test_ranks_import_disjoint_shares_into_one_store(tiny: dict) -> None:
    src = write_tsv(tiny["root"] / "all.tsv", range(1, 13))
    shares = [import_features(config(tiny, "bottom_up_tsv", src, max_regions=8, rank=r, world_size=3))
              for r in range(3)]
    assert sum(s.imported for s in shares) == N_ITEMS and all(s.missing == 0 for s in shares)
    for r, s in enumerate(shares):
        assert s.imported == sum(rank_of(str(i), 3) == r for i in range(1, 13))
    store = FeatureStore.open(tiny["out"])
    assert len(store) == N_ITEMS  # every rank wrote its own shards and failure list
    assert {p.name[:4] for p in (tiny["out"] / "shards").glob("r*.index.json")} == {"r000", "r001", "r002"}
    check_imported(store, list(range(1, N_ITEMS + 1)))


def test_config_errors_are_one_line(tiny: dict) -> None:
    src = write_tsv(tiny["root"] / "a.tsv", range(1, 4))
    video = DataConfig(**{**tiny["data"].__dict__, "kind": "video"})
    bad = [
        (dict(overflow="drop"), "overflow='drop' is not valid: use fail | first | uniform"),
        (dict(rank=2, world_size=2), "need 0 <= rank < world_size"),
        (dict(grid=[2, 2]), "grid=[2, 2]: an image grid is [h, w] (positive), for image features without boxes"),
        (dict(dtype="bfloat16"), "dtype='bfloat16' is not valid"),
    ]
    for kw, message in bad:
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                           .replace(")", r"\)")):
            import_features(config(tiny, "bottom_up_tsv", src, **kw))
    with pytest.raises(ConfigError, match="format=bottom_up_tsv holds image features but data=tiny is a 'video'"):
        import_features(ImportConfig(data=video, format="bottom_up_tsv", source=str(src), features_dir="x"))
    with pytest.raises(DataError, match="no TSV file there"):
        import_features(config(tiny, "bottom_up_tsv", tiny["root"] / "nothing*.tsv"))
    with pytest.raises(DataError, match="holds no readable item of data=tiny"):
        import_features(config(tiny, "bottom_up_tsv", write_tsv(tiny["root"] / "other.tsv", range(50, 53))))


def test_grid_features_keep_their_layout(tiny: dict) -> None:
    src = tiny["root"] / "grids"
    src.mkdir()
    for i in range(1, N_ITEMS + 1):
        np.save(src / f"{i}.npy", regions(i, n=6)[0])
    import_features(config(tiny, "npy_dir", src, grid=[2, 3]))
    store = FeatureStore.open(tiny["out"])
    assert store.grid == (2, 3) and store.meta["regions"] is False and layout_from_meta(store.meta) == (2, 3)
    assert store["1"].valid == 6


def test_video_frames_record_their_rows(tmp_path: Path) -> None:
    """An imported video store: N = max_regions frames, the kept rows as frame indices."""
    root = tmp_path / "vids"
    (root / "videos").mkdir(parents=True)
    ann = {"videos": [{"video_id": f"video{i}", "id": i, "split": ["train", "validate", "test"][i % 3]}
                      for i in range(6)],
           "sentences": [{"video_id": f"video{i}", "caption": f"a clip number {i}", "sen_id": i} for i in range(6)]}
    (root / "videodatainfo.json").write_text(json.dumps(ann))
    data = DataConfig(name="vids", kind="video", format="msrvtt", root=str(root), media_dir=str(root / "videos"),
                      annotations={"all": str(root / "videodatainfo.json")})
    path = root / "frames.h5"
    with h5py.File(path, "w") as f:
        for i in range(6):
            f.create_dataset(str(i), data=regions(i, n=4 + i)[0])  # 4..9 frames
    cfg = ImportConfig(data=data, format="hdf5", source=str(path), features_dir=str(root / "store"),
                       id_format="video{}", max_regions=6, overflow="uniform", progress=False)
    assert import_features(cfg).imported == 6
    store = FeatureStore.open(root / "store")
    assert store.meta["kind"] == "video" and store.meta["frames"] == 6 and store.meta["regions"] is False
    assert layout_from_meta(store.meta) == (6,)  # frames are ordered: position codes apply
    short, long = store["video0"], store["video5"]  # 4 frames (padded), 9 frames (6 of them kept)
    assert short.valid == 4 and short.frame_indices == (0, 1, 2, 3, 3, 3)
    assert long.valid == 6 and long.frame_indices == (0, 2, 3, 5, 6, 8)  # round(linspace(0, 8, 6))
    np.testing.assert_allclose(long.features, regions(5, n=9)[0][[0, 2, 3, 5, 6, 8]], atol=2e-3)


# ---------------------------------------------------------------------------- the store's boxes

BOX_META = {"settings": {"backbone": "imported", "name": "t", "boxes": True}, "kind": "image", "positions": 5,
            "dim": D, "grid": None, "boxes": True, "regions": True}


def test_store_keeps_boxes_beside_features(tmp_path: Path) -> None:
    f, b, size = regions(1, n=3)
    with FeatureStoreWriter(tmp_path / "s", BOX_META, shard_size=2) as w:
        w.add("a", np.pad(f, ((0, 2), (0, 0))), valid=3, boxes=b, image_size=size)
        w.add("b", np.pad(f, ((0, 2), (0, 0))), valid=3, boxes=np.pad(b, ((0, 2), (0, 0))), image_size=None)
        w.add("c", np.pad(f, ((0, 2), (0, 0))), valid=3, boxes=b, image_size=size)
        with pytest.raises(DataError, match="keeps a box per region; pass boxes="):
            w.add("d", np.zeros((5, D)), valid=3)
        with pytest.raises(DataError, match=r"boxes have shape \[2, 4\], expected \[3, 4\]"):
            w.add("d", np.zeros((5, D)), valid=3, boxes=b[:2])
    names = sorted(p.name for p in (tmp_path / "s" / "shards").iterdir() if not p.name.startswith("."))
    assert names == [f"r000-00000{s}.{ext}" for s in (0, 1) for ext in ("boxes.npy", "index.json", "npy")]
    store = FeatureStore.open(tmp_path / "s")
    assert store.boxes and store.summary()["boxes"] is True
    for item_id, expected_size in (("a", size), ("b", None), ("c", size)):
        item = store[item_id]
        np.testing.assert_array_equal(item.boxes[:3], b)
        assert not item.boxes[3:].any() and item.image_size == expected_size and item.boxes.dtype == np.float32
    with pytest.raises(DataError, match="boxes given but the store at .* keeps none"):
        with FeatureStoreWriter(tmp_path / "plain", {**BOX_META, "boxes": False}) as w:
            w.add("a", np.zeros((5, D)), valid=3, boxes=b)
    with pytest.raises(DataError, match=r"other settings \(boxes differ\)"):  # a store of boxes stays one
        FeatureStoreWriter(tmp_path / "s", {**BOX_META, "boxes": False})


def test_stores_without_the_boxes_key_still_open(tmp_path: Path) -> None:
    """A store written before boxes existed (no ``boxes`` in meta.json, no image sizes in its index)."""
    meta = {"settings": {"backbone": "toy"}, "kind": "image", "positions": 4, "dim": D, "grid": [2, 2]}
    with FeatureStoreWriter(tmp_path / "old", meta) as w:
        w.add("x", np.ones((4, D)))
    meta_path = tmp_path / "old" / "meta.json"
    old = json.loads(meta_path.read_text())
    del old["boxes"]
    meta_path.write_text(json.dumps(old))
    for index in (tmp_path / "old" / "shards").glob("*.index.json"):
        assert "image_size" not in json.loads(index.read_text())
    store = FeatureStore.open(tmp_path / "old")
    assert store.boxes is False and store["x"].boxes is None and store["x"].image_size is None
    with FeatureStoreWriter(tmp_path / "old", meta) as w:  # and take more items
        assert w.add("y", np.ones((4, D)))


# ------------------------------------------------------------------------------------- the CLI


@pytest.mark.slow  # four CLI processes
def test_cli_exit_status_1_with_failed_records_and_2_for_config_errors(tiny: dict) -> None:
    src = tiny["root"] / "tsv"
    src.mkdir()
    (src / "x.tsv").write_text(tsv_row(1) + "\n" + tsv_row(2, boxes="???") + "\n" + tsv_row(3) + "\n")
    args = ["data=shapes", "data.name=tiny", f"data.root={tiny['root']}", "data.synthetic=null",
            "format=bottom_up_tsv", f"source={src}", f"features_dir={tiny['out']}", "max_regions=8",
            f"hydra.run.dir={tiny['root'] / 'run'}", "progress=false"]
    proc = run_cli("import_features", *args, check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "imported 2, 0 already stored, 1 failed" in proc.stdout
    assert "import finished with 1 failed item(s)" in proc.stderr
    again = run_cli("import_features", *args, check=False)  # resumes: the failed id is tried again
    assert again.returncode == 1 and "imported 0, 2 already stored, 1 failed" in again.stdout
    bad = run_cli("import_features", *args, "format=csv", check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: format='csv' is not a registered feature format")
    typo = run_cli("import_features", *args, "max_region=8", check=False)
    assert typo.returncode != 0 and "max_region" in typo.stderr


# ------------------------------------------------------------------- what region stores feed


def test_box_heat_sums_the_weights_of_covering_boxes() -> None:
    # pixel (r, c) is in a box when its centre (c + .5, r + .5) is: box 1 covers columns 1-2, rows
    # 0-1; box 2 (x from 2.2) covers columns 2-5, rows 1-3
    heat = box_heat(np.array([0.5, 0.25]), np.array([[1, 0, 3, 2], [2.2, 1, 6, 4]]), (4, 6))
    expected = np.array([[0, .5, .5, 0, 0, 0],
                         [0, .5, .75, .25, .25, .25],
                         [0, 0, .25, .25, .25, .25],
                         [0, 0, .25, .25, .25, .25]])
    np.testing.assert_allclose(heat, expected)
    np.testing.assert_allclose(scale_boxes(np.array([[10, 20, 30, 40]]), (100, 200), (50, 50)),
                               [[5, 5, 15, 10]])


def test_grounding_over_region_boxes() -> None:
    regions_px = np.array([[0, 0, 10, 10], [5, 5, 15, 15], [20, 20, 30, 30]], dtype=float)
    obj = [0, 0, 10, 10]
    np.testing.assert_allclose(region_box_overlap(regions_px, obj), [1.0, 0.25, 0.0])  # 25 of 100 px
    assert region_centres_in_box(regions_px, obj).tolist() == [True, False, False]  # (10, 10) is outside
    gfile = {"kind": "image", "word_classes": {"colour": ["red"]},
             "items": {"1": {"size": [40, 40], "objects": [{"box": obj, "words": ["red"]}]}}}
    attention = np.array([[1 / 3] * 3, [0.2, 0.5, 0.3], [1 / 3] * 3])  # "red" looks mostly at region 1
    got = evaluate_grounding({"1": (["a", "red", "ball"], attention)}, gfile, kind="image",
                             boxes={"1": regions_px}, valid={"1": 3})
    assert got["words_evaluated"] == 1
    assert got["attention_in_object"] == pytest.approx(0.2 * 1 + 0.5 * 0.25)
    assert got["pointing_accuracy"] == 0.0  # region 1's centre (10, 10) is outside [0, 10)
    assert got["chance_attention_in_object"] == pytest.approx(1.25 / 3)
    assert got["chance_pointing_accuracy"] == pytest.approx(1 / 3)
    # boxes recorded in an 80 x 80 version of the 40 x 40 image are scaled into it first
    scaled = evaluate_grounding({"1": (["a", "red", "ball"], attention)}, gfile, kind="image",
                                boxes={"1": regions_px * 2}, image_sizes={"1": (80, 80)}, valid={"1": 3})
    assert scaled["attention_in_object"] == pytest.approx(got["attention_in_object"])


def region_result(boxes: bool = True, image: bool = False):
    f, b, (w, h) = regions(1, n=4)
    att = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]])
    pixels = np.full((h, w, 3), 200, np.uint8) if image else None
    return CaptionResult("1.jpg", "image", caption="red ball", tokens=["red", "ball"], attention=att,
                         attention_shape=[4], boxes=b if boxes else None, image_size=[w, h] if boxes else None,
                         image=pixels, score=-1.0)


def test_region_figures_and_captions_json(tmp_path: Path) -> None:
    for image in (False, True):  # a gray canvas of the image's size without the file, else the image
        fig = build_result_figure(region_result(image=image))
        assert len([ax for ax in fig.axes if ax.get_visible()]) == 3  # the input and one panel per word
        word = fig.axes[1]
        assert len(word.patches) >= 1 and word.patches[-1].get_edgecolor()[:3] == (0.0, 229 / 255, 1.0)
    matrix = build_result_figure(region_result(boxes=False))  # regions without boxes: words x regions
    assert matrix.axes[0].get_images()[0].get_array().shape == (2, 4)
    assert attention_image(region_result(), dpi=30).ndim == 3
    path = plot_result(region_result(), tmp_path / "fig.png")
    assert path.stat().st_size > 1000
    entry = result_entry(region_result(), "figures/0000_1.png")
    assert entry["attention_shape"] == [4] and len(entry["boxes"]) == 4 and entry["image_size"] == [65, 49]
    assert captions_errors([entry]) == [] and captions_errors([entry], use_jsonschema=False) == []
    for broken, message in (({"boxes": entry["boxes"][:3]}, "3 boxes but attention_shape [4]"),
                            ({"attention_shape": [2, 2]}, None), ({"kind": "video", "frame_indices": [0] * 4}, None)):
        for schema in (True, False):
            errs = captions_errors([{**entry, **broken}], use_jsonschema=schema)
            assert errs and (message is None or any(message in e for e in errs)), (broken, schema, errs)


def test_position_codes_refuse_regions_and_imported_features_refuse_what_needs_their_network(
        tmp_path: Path) -> None:
    meta = {**BOX_META, "imported": {"format": "bottom_up_tsv"}}
    with pytest.raises(ConfigError, match="which region features have not; set model.position_code=none"):
        build_decoder({"name": "lstm", "variant": "soft_attention", "position_code": "sinusoidal"}, 10, D,
                      layout_from_meta(meta))
    build_decoder({"name": "lstm", "variant": "soft_attention", "position_code": "none"}, 10, D,
                  layout_from_meta(meta))
    with pytest.raises(CheckpointError, match="features were imported .* caption the stored features"):
        encoder_config(meta, "run.ckpt")


def test_streams_of_region_stores_keep_the_first_streams_boxes(tmp_path: Path) -> None:
    f, b, size = regions(1, n=3)
    with FeatureStoreWriter(tmp_path / "boxed", BOX_META) as w:
        w.add("a", np.pad(f, ((0, 2), (0, 0))), valid=3, boxes=b, image_size=size)
    plain = {**BOX_META, "boxes": False, "settings": {"backbone": "imported", "name": "other", "boxes": False}}
    with FeatureStoreWriter(tmp_path / "plain", plain) as w:
        w.add("a", np.pad(2 * f, ((0, 2), (0, 0))), valid=3)
    both = open_features([tmp_path / "boxed", tmp_path / "plain"])
    item = both["a"]
    assert item.features.shape == (5, 2 * D) and item.valid == 3 and item.image_size == size
    np.testing.assert_array_equal(item.boxes[:3], b)
    assert both.meta["boxes"] and both.meta["regions"] and layout_from_meta(both.meta) is None
