"""Two-stream feature stores: several FeatureStores of the same items read as one (captioning.store.streams)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.errors import ConfigError, DataError
from captioning.store.feature_store import FeatureStore
from captioning.store.streams import FeatureStreams, open_features
from captioning.store.writer import FeatureStoreWriter


def write_store(root: Path, items: dict[str, tuple[np.ndarray, int, tuple[int, ...] | None]], *, kind: str = "video",
                frames: int | None = 3, grid: list[int] | None = None, dtype: str = "float16",
                name: str = "enc") -> Path:
    """A store of the given items: id -> (features [N, C], valid, frame indices)."""
    n, c = next(iter(items.values()))[0].shape
    meta = {"settings": {"name": name}, "kind": kind, "positions": n, "dim": c, "grid": grid, "dtype": dtype}
    if frames is not None:
        meta["frames"] = frames
    with FeatureStoreWriter(root, meta, shard_size=2) as w:
        for item_id, (feats, valid, indices) in items.items():
            w.add(item_id, feats, valid=valid, frame_indices=indices)
    return root


def rows(n: int, c: int, start: float) -> np.ndarray:
    return (start + np.arange(n * c, dtype=np.float32).reshape(n, c) / 8).astype(np.float32)


FI = (0, 4, 8)  # frame indices shared by both streams


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path]:
    app = write_store(tmp_path / "app", {"a": (rows(3, 4, 0), 3, FI), "b": (rows(3, 4, 1), 3, FI),
                                         "c": (rows(3, 4, 2), 2, (0, 5, 5))}, name="lite0")
    mot = write_store(tmp_path / "mot", {"d": (rows(3, 2, 9), 3, FI), "c": (rows(3, 2, 7), 2, (0, 5, 5)),
                                         "b": (rows(3, 2, 6), 3, FI)}, dtype="float32", name="r2plus1d_18")
    return app, mot


def test_features_are_concatenated_per_position(two) -> None:
    app, mot = two
    s = open_features([app, mot])
    assert isinstance(s, FeatureStreams)
    assert s.ids == ["b", "c"] and len(s) == 2 and "b" in s and "a" not in s and "d" not in s  # only common ids
    m = s.meta
    assert (m["kind"], m["positions"], m["frames"], m["grid"], m["dim"], m["dtype"]) == ("video", 3, 3, None, 6, "float32")
    assert m["settings"] == {"streams": [{"name": "lite0"}, {"name": "r2plus1d_18"}]}
    assert [st["offset"] for st in m["streams"]] == [0, 4] and m["streams"][1]["root"] == str(mot)
    item = s["c"]
    expected = np.concatenate([rows(3, 4, 2).astype(np.float16).astype(np.float32), rows(3, 2, 7)], axis=1)
    assert item.features.dtype == np.float32 and item.features.shape == (3, 6)
    np.testing.assert_array_equal(item.features, expected)
    assert item.valid == 2 and item.frame_indices == (0, 5, 5) and item.grid is None
    with pytest.raises(KeyError, match="'a'"):
        s["a"]
    again = pickle.loads(pickle.dumps(s))  # DataLoader workers
    np.testing.assert_array_equal(again["b"].features, s["b"].features)


def test_the_data_module_reads_streams_like_a_store(two) -> None:
    from captioning.data.datamodule import CaptionEvalDataset, FeatureItems, collate
    from captioning.data.records import CaptionRecord

    recs = [CaptionRecord(i, i, f"{i}.mp4", ("a clip",), "test", "video") for i in ("a", "b", "c")]
    items = FeatureItems(recs, open_features(list(two)))
    assert items.missing == 1 and [r.item_id for r in items.records] == ["b", "c"]
    batch = collate([CaptionEvalDataset(items)[i] for i in range(2)])
    assert batch.features.shape == (2, 3, 6)
    assert batch.mask.tolist() == [[True, True, True], [True, True, False]]
    assert torch.equal(batch.features[1, :, 4:], torch.from_numpy(rows(3, 2, 7)))


def test_one_folder_is_a_plain_store(two) -> None:
    app, _ = two
    for arg in (app, str(app), [str(app)]):
        assert isinstance(open_features(arg), FeatureStore)
    with pytest.raises(ConfigError, match="empty list"):
        open_features([])


@pytest.mark.parametrize(("change", "what"), [
    ({"kind": "image", "frames": None}, "kind"),
    ({"frames": 4}, "frames"),
])
def test_streams_that_disagree_are_refused_naming_both(two, tmp_path: Path, change: dict, what: str) -> None:
    app, _ = two
    other = write_store(tmp_path / "other", {"b": (rows(3, 2, 0), 3, FI)}, **change)
    with pytest.raises(DataError) as e:
        open_features([app, other])
    msg = str(e.value)
    assert "\n" not in msg and f"disagree on {what}" in msg and str(app) in msg and str(other) in msg


def test_positions_must_agree(two, tmp_path: Path) -> None:
    app, _ = two
    grid = write_store(tmp_path / "grid", {"b": (rows(12, 2, 0), 12, FI)}, grid=[2, 2])  # K=3 frames x 2x2
    with pytest.raises(DataError, match="disagree on positions"):
        open_features([app, grid])


@pytest.mark.parametrize(("item", "what"), [(((0, 4, 9), 3), "frame indices"), (((0, 4, 8), 2), "valid counts")])
def test_an_item_on_other_frames_is_refused(two, tmp_path: Path, item: tuple, what: str) -> None:
    app, _ = two
    indices, valid = item
    other = write_store(tmp_path / "other", {"a": (rows(3, 2, 0), 3, FI), "b": (rows(3, 2, 0), valid, indices)})
    with pytest.raises(DataError) as e:
        open_features([app, other])
    msg = str(e.value)
    assert f"disagree on the {what} of item 'b'" in msg and str(app) in msg and str(other) in msg and "\n" not in msg
