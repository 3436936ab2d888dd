"""FeatureStore / FeatureStoreWriter: round trips, crash safety, resume, DDP ranks, failures, workers."""

from __future__ import annotations

import errno
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from captioning.errors import ConfigError, DataError, StorageError
from captioning.store import write_behind
from captioning.store.feature_store import FeatureItem, FeatureStore
from captioning.store.layout import DTYPES
from captioning.store.writer import FeatureStoreWriter

N, C = 6, 8
META = {"settings": {"backbone": "toy", "weights": "none", "preprocessing": {"size": 32}, "code": "0.1.0"},
        "kind": "image", "positions": N, "dim": C, "grid": [2, 3]}
VIDEO_META = {"settings": {"backbone": "toy", "video": {"frames": 4}}, "kind": "video", "positions": 4, "dim": C,
              "grid": None, "frames": 4}


def feats(i: int, n: int = N, c: int = C) -> np.ndarray:
    """Deterministic, distinct float32 features of item i: [n, c]."""
    return (np.random.default_rng(i).standard_normal((n, c)) * 3).astype(np.float32)


def write(root: Path, ids: list[str], meta: dict = META, **kw) -> FeatureStoreWriter:
    w = FeatureStoreWriter(root, meta, **kw)
    for i in ids:
        w.add(i, feats(int(i[2:])))
    w.close()
    return w


def ids_of(n: int, start: int = 0) -> list[str]:
    return [f"id{i}" for i in range(start, start + n)]


def shard_files(root: Path) -> list[str]:
    return sorted(os.listdir(root / "shards"))


# ------------------------------------------------------------------------------- round trip


def test_round_trip_float16(tmp_path: Path) -> None:
    root = tmp_path / "s"
    w = write(root, ids_of(10), shard_size=4)
    assert w.committed == 10
    assert shard_files(root) == [".r000.lock"] + [f"r000-{s:06d}.{ext}" for s in range(3) for ext in ("index.json", "npy")]
    store = FeatureStore.open(root)
    assert len(store) == 10 and store.ids == ids_of(10) and "id3" in store and "id10" not in store
    meta = store.meta
    assert meta["dtype"] == "float16" and meta["positions"] == N and meta["dim"] == C and meta["grid"] == [2, 3]
    assert meta["settings"] == META["settings"] and meta["kind"] == "image"
    for i in range(10):
        item = store[f"id{i}"]
        assert isinstance(item, FeatureItem)
        assert item.features.shape == (N, C) and item.features.dtype == np.float16
        assert isinstance(item.features, np.memmap) and not item.features.flags.writeable
        np.testing.assert_allclose(item.features.astype(np.float32), feats(i), rtol=1e-3, atol=1e-3)
        assert item.valid == N and item.grid == (2, 3) and item.frame_indices is None
        assert item.mask.all()
    with pytest.raises(KeyError, match="id99"):
        store["id99"]
    s = store.summary()
    assert s["items"] == 10 and s["shards"] == 3 and s["failures"] == 0 and s["duplicates"] == 0
    assert s["bytes"] > 10 * N * C * 2


def test_round_trip_float32_exact_and_video_fields(tmp_path: Path) -> None:
    root = tmp_path / "v"
    with FeatureStoreWriter(root, VIDEO_META, dtype="float32", shard_size=2) as w:
        w.add("a", feats(1, 4), valid=4, frame_indices=[1, 5, 9, 13])
        w.add("b", feats(2, 4), valid=2, frame_indices=np.array([0, 1, 1, 1]))
        w.add("c", feats(3, 4))
    store = FeatureStore.open(root)
    assert store.meta["dtype"] == "float32" and store.meta["frames"] == 4
    a, b, c = store["a"], store["b"], store["c"]
    assert a.features.dtype == np.float32
    np.testing.assert_array_equal(a.features, feats(1, 4))
    np.testing.assert_array_equal(c.features, feats(3, 4))
    assert a.frame_indices == (1, 5, 9, 13) and a.valid == 4 and a.grid is None
    assert b.valid == 2 and b.frame_indices == (0, 1, 1, 1) and b.mask.tolist() == [True, True, False, False]
    assert c.valid == 4 and c.frame_indices is None


def test_writer_validates_items(tmp_path: Path) -> None:
    w = FeatureStoreWriter(tmp_path / "s", META)
    with pytest.raises(DataError, match=r"'x'.*shape \[5, 8\].*\[6, 8\]"):
        w.add("x", np.zeros((5, C)))
    with pytest.raises(DataError, match="valid"):
        w.add("x", np.zeros((N, C)), valid=N + 1)
    with pytest.raises(TypeError):
        w.add(7, np.zeros((N, C)))  # type: ignore[arg-type]
    bad = np.zeros((N, C), np.float32)
    bad[0, 0] = np.nan
    assert w.add("nan", bad) is False
    big = np.full((N, C), 1e6, np.float32)  # beyond float16
    assert w.add("big", big) is False
    assert w.add("ok", np.ones((N, C))) is True
    assert w.add("ok", np.ones((N, C))) is False  # already added: skipped
    w.close()
    store = FeatureStore.open(tmp_path / "s")
    assert store.ids == ["ok"]
    errors = {f["id"]: f["error"] for f in store.failures}
    assert "NaN" in errors["nan"] and "float32" in errors["big"]
    with pytest.raises(RuntimeError, match="closed"):
        w.add("late", np.ones((N, C)))


@pytest.mark.parametrize(("change", "match"), [
    ({"positions": 0}, "positions"), ({"kind": "audio"}, "kind"), ({"settings": None}, "settings"),
    ({"grid": [4, 4]}, "grid"), ({"dtype": "int8"}, "dtype"),
])
def test_bad_meta_is_a_config_error(tmp_path: Path, change: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        FeatureStoreWriter(tmp_path / "s", {**META, **change})


def test_dtype_argument_and_meta_must_agree(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="dtype"):
        FeatureStoreWriter(tmp_path / "s", {**META, "dtype": "float16"}, dtype="float32")
    FeatureStoreWriter(tmp_path / "t", {**META, "dtype": "float32"}).close()
    assert FeatureStore.open(tmp_path / "t").meta["dtype"] == "float32"


def test_open_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no feature store.*meta\.json"):
        FeatureStore.open(tmp_path / "nothing")
    root = tmp_path / "s"
    write(root, ids_of(4), shard_size=2)
    (root / "shards" / "r000-000001.npy").write_bytes(b"\x93NUMPY garbage")
    store = FeatureStore.open(root)  # indexes are fine: the data is read lazily
    assert store["id0"].features.shape == (N, C)
    with pytest.raises(DataError, match=r"r000-000001\.npy.*corrupt.*delete it"):
        store["id2"]
    (root / "shards" / "r000-000001.npy").unlink()
    with pytest.raises(DataError, match=r"r000-000001\.npy is missing"):
        FeatureStore.open(root)


def test_the_streamed_header_is_numpys_and_fits_any_smaller_count() -> None:
    """A shard's rows are written before its row count is known, under a header of the full shard's
    length: for a full shard it is np.save's header byte for byte, for fewer rows np.load reads it."""
    import io

    from captioning.store.layout import npy_header

    for shape, dtype in (((256, 196, 512), "float16"), ((3, 6, 8), "float32"), ((1, 1, 1), "float16")):
        buf = io.BytesIO()
        np.save(buf, np.zeros(shape, DTYPES[dtype]))
        header = npy_header(shape, dtype)
        assert buf.getvalue()[: len(header)] == header and len(header) % 64 == 0
        small = npy_header((2, *shape[1:]), dtype, len(header))
        assert len(small) == len(header)
        data = small + np.arange(2 * shape[1] * shape[2], dtype=DTYPES[dtype]).tobytes()
        assert np.load(io.BytesIO(data)).shape == (2, *shape[1:])
    with pytest.raises(ValueError, match="needs"):
        npy_header((10**30, 1, 1), "float16", 64)


def test_finiteness_is_read_from_the_exponent_bits() -> None:
    from captioning.store.writer import all_finite

    for dtype in ("float16", "float32"):
        x = np.linspace(-60000, 60000, 97, dtype=DTYPES[dtype]).reshape(1, 97)
        assert all_finite(x, dtype)
        for bad in (np.inf, -np.inf, np.nan, -np.nan):
            y = x.copy()
            y[0, 50] = bad
            assert not all_finite(y, dtype), (dtype, bad)
        tiny = np.array([[np.finfo(DTYPES[dtype]).max, -np.finfo(DTYPES[dtype]).max, np.finfo(DTYPES[dtype]).tiny]],
                        dtype=DTYPES[dtype])
        assert all_finite(tiny, dtype)


# ------------------------------------------------------------------------------- atomicity

CRASH_SCRIPT = textwrap.dedent("""
    import os, sys, json
    import numpy as np
    from captioning.store import write_behind as wb, writer as st
    root, meta = sys.argv[1], json.loads(sys.argv[2])
    real = wb.atomic_write_json
    calls = []
    def dying(path, obj, indent=1):
        if str(path).endswith(".index.json"):
            calls.append(path)
            if len(calls) == 2:
                os._exit(3)  # killed after the 2nd shard's data file, before its index
        return real(path, obj, indent=indent)
    wb.atomic_write_json = dying
    w = st.FeatureStoreWriter(root, meta, shard_size=2)
    for i in range(6):
        rng = np.random.default_rng(i)
        w.add(f"id{i}", (rng.standard_normal((meta["positions"], meta["dim"])) * 3).astype(np.float32))
    w.close()
""")


def test_killed_between_data_and_index_leaves_no_visible_shard(tmp_path: Path) -> None:
    root = tmp_path / "s"
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(root), json.dumps(META)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert (root / "shards" / "r000-000001.npy").exists()  # the orphan data file
    assert not (root / "shards" / "r000-000001.index.json").exists()
    store = FeatureStore.open(root)
    assert store.ids == ["id0", "id1"]  # only the committed shard is visible
    (root / "shards" / ".r000-000002.npy.x1y2.tmp").write_bytes(b"partial")  # a temp file of a write in flight
    w = FeatureStoreWriter(root, META, shard_size=2)
    assert w.done_ids() == {"id0", "id1"}
    files = shard_files(root)
    assert "r000-000001.npy" not in files and not [f for f in files if f.endswith(".tmp")]  # cleaned up
    for i in range(6):
        w.add(f"id{i}", feats(i))
    w.close()
    assert w.skipped == 2 and w.committed == 4
    assert [f for f in shard_files(root) if f.endswith(".npy")] == [f"r000-{s:06d}.npy" for s in range(3)]
    store = FeatureStore.open(root)
    assert sorted(store.ids) == ids_of(6)
    for i in range(6):
        np.testing.assert_allclose(store[f"id{i}"].features.astype(np.float32), feats(i), atol=1e-2)


SLOW_COMMITS_THEN_KILL = textwrap.dedent("""
    import os, signal, sys, json, time
    import numpy as np
    from captioning.store import write_behind as wb, writer as st
    root, meta, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    real = wb.atomic_write_json
    def slow(path, obj, indent=1):  # a slow disk: each shard's commit point comes late
        time.sleep(0.3)
        return real(path, obj, indent=indent)
    wb.atomic_write_json = slow
    w = st.FeatureStoreWriter(root, meta, shard_size=4)
    for i in range(n):
        w.add(f"id{i}", (np.random.default_rng(i).standard_normal((meta["positions"], meta["dim"]))).astype(np.float16),
              copy=bool(i % 2))
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("added", [5, 8, 9, 14])
def test_a_killed_writer_loses_at_most_its_unfinished_shard(tmp_path: Path, added: int) -> None:
    """SIGKILL right after ``added`` items, the shard commits slow: every shard but the last one is
    committed (the writer adds a shard's first item only after the shard before it is committed), so
    at most ``shard_size`` items are lost, and the store that is left opens and resumes."""
    root = tmp_path / "s"
    proc = subprocess.run([sys.executable, "-c", SLOW_COMMITS_THEN_KILL, str(root), json.dumps(META), str(added)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    store = FeatureStore.open(root)
    assert added - len(store) <= 4 and len(store) % 4 == 0
    assert store.ids == ids_of(len(store))
    w = FeatureStoreWriter(root, META, shard_size=4)  # resumes after the committed shards
    assert w.done_ids() == set(ids_of(len(store)))
    w.close()


def test_full_disk_keeps_previous_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard the disk has no room for: the error names it (raised by the next call, the commit runs
    on the write-behind thread), no partial file is left, and its items stay with the writer until
    ``flush`` writes them after space is freed."""
    root = tmp_path / "s"
    w = FeatureStoreWriter(root, META, shard_size=2)
    for i in range(2):
        w.add(f"id{i}", feats(i))
    w.flush()  # shard 0 committed
    before = shard_files(root)
    real = write_behind._write_all

    def no_space(f, view):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(write_behind, "_write_all", no_space)
    w.add("id2", feats(2))
    w.add("id3", feats(3))  # shard 1 complete: its commit fails on the thread
    with pytest.raises(StorageError, match=r"r000-000001\.npy.*disk is full.*2 items .* kept"):
        w.flush()
    with pytest.raises(StorageError, match="disk is full"):
        w.add("id4", feats(4))  # and every call after it, until a flush succeeds
    assert shard_files(root) == before  # no partial shard, no temp file
    assert FeatureStore.open(root).ids == ["id0", "id1"]
    monkeypatch.setattr(write_behind, "_write_all", real)  # space freed: the shard's rows are still there
    w.flush()
    w.add("id4", feats(4))
    w.close()
    assert FeatureStore.open(root).ids == ids_of(5)


def test_index_write_failure_removes_the_data_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "s"
    w = FeatureStoreWriter(root, META, shard_size=1)

    def failing(path, obj, indent=1):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(write_behind, "atomic_write_json", failing)
    w.add("id0", feats(0))
    with pytest.raises(StorageError, match="Input/output error"):
        w.add("id1", feats(1))  # waits for shard 0's commit, which failed
    assert [f for f in shard_files(root) if not f.startswith(".r000.lock")] == []
    w.abort()


def test_second_writer_with_the_same_rank_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "s"
    w0 = FeatureStoreWriter(root, META, rank=0)
    with pytest.raises(DataError, match="another writer"):
        FeatureStoreWriter(root, META, rank=0)
    FeatureStoreWriter(root, META, rank=1).close()  # other ranks are fine
    w0.close()
    FeatureStoreWriter(root, META, rank=0).close()  # released on close


# ------------------------------------------------------------------------------- resume


def test_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    all_ids = ids_of(25)
    write(tmp_path / "full", all_ids, shard_size=4)

    root = tmp_path / "resumed"
    w = FeatureStoreWriter(root, META, shard_size=4)
    for i in all_ids[:10]:
        w.add(i, feats(int(i[2:])))
    w.abort()  # killed: 8 items in 2 shards committed, 2 buffered items lost
    w = FeatureStoreWriter(root, META, shard_size=4)
    done = w.done_ids()
    assert done == set(all_ids[:8])
    for i in all_ids:
        if i not in done:
            w.add(i, feats(int(i[2:])))
    w.close()
    assert [f for f in shard_files(root) if f.endswith(".npy")] == [f"r000-{s:06d}.npy" for s in range(7)]

    full, resumed = FeatureStore.open(tmp_path / "full"), FeatureStore.open(root)
    assert full.ids == resumed.ids == all_ids
    for i in all_ids:
        np.testing.assert_array_equal(full[i].features, resumed[i].features)
        assert full[i].valid == resumed[i].valid


def test_settings_mismatch_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "s"
    write(root, ids_of(2))
    other = {**META, "settings": {**META["settings"], "backbone": "other", "preprocessing": {"size": 64}}}
    with pytest.raises(DataError, match=r"settings\.backbone, settings\.preprocessing\.size.*refuses to mix.*"
                                         r"new output dir or delete"):
        FeatureStoreWriter(root, other)
    with pytest.raises(DataError, match=r"dtype"):
        FeatureStoreWriter(root, META, dtype="float32")
    with pytest.raises(DataError, match=r"dim"):
        FeatureStoreWriter(root, {**META, "dim": C + 1})
    FeatureStoreWriter(root, json.loads(json.dumps(META))).close()  # same settings: fine
    assert len(FeatureStore.open(root)) == 2


# ------------------------------------------------------------------------------- DDP ranks


def test_two_ranks_union_covers_every_id_once(tmp_path: Path) -> None:
    root = tmp_path / "s"
    all_ids = ids_of(11)
    # DistributedSampler-style: rank r gets ids r, r+2, ...; padded to equal length with id0 again
    shares = {0: all_ids[0::2], 1: all_ids[1::2] + ["id0"]}
    writers = {r: FeatureStoreWriter(root, META, rank=r, shard_size=2) for r in (0, 1)}
    for k in range(6):  # interleaved, as concurrent processes would
        for r in (0, 1):
            writers[r].add(shares[r][k], feats(int(shares[r][k][2:])))
    for w in writers.values():
        w.close()
    assert all(f.startswith((".r00", "r000-", "r001-")) for f in shard_files(root))
    store = FeatureStore.open(root)
    assert sorted(store.ids) == sorted(all_ids) and len(store) == 11
    assert store.duplicates == 1
    assert store.ids[:6] == shares[0]  # rank 0's shards come first: the duplicate resolves to rank 0
    for i in all_ids:
        np.testing.assert_allclose(store[i].features.astype(np.float32), feats(int(i[2:])), atol=1e-2)
    # a resumed rank sees what every rank committed
    w = FeatureStoreWriter(root, META, rank=1)
    assert w.done_ids() == set(all_ids)
    w.close()


# ------------------------------------------------------------------------------- failures


def test_failures_are_deduplicated_and_cleared_by_success(tmp_path: Path) -> None:
    root = tmp_path / "s"
    w = FeatureStoreWriter(root, META, rank=0)
    w.add_failure("bad1", "img/bad1.jpg", "DataError: truncated")
    w.add_failure("bad2", "img/bad2.jpg", ValueError("boom"))
    w.add_failure("bad1", "img/bad1.jpg", "DataError: truncated again")
    w.add("good", feats(0))
    w.close()
    w1 = FeatureStoreWriter(root, META, rank=1)
    w1.add_failure("flaky", "img/flaky.jpg", "OSError: timeout")
    w1.close()
    with open(root / "failures" / "r001.jsonl", "a") as f:
        f.write('{"id": "torn", "pa')  # a line cut by a killed job
    store = FeatureStore.open(root)
    by_id = {f["id"]: f for f in store.failures}
    assert sorted(by_id) == ["bad1", "bad2", "flaky"]
    assert by_id["bad1"]["error"] == "DataError: truncated again" and by_id["bad1"]["path"] == "img/bad1.jpg"
    assert by_id["bad2"]["error"] == "ValueError: boom" and by_id["flaky"]["rank"] == 1
    # the re-run succeeds on flaky: it leaves the failure list
    w = FeatureStoreWriter(root, META, rank=0)
    w.add("flaky", feats(1))
    w.close()
    store = FeatureStore.open(root)
    assert sorted(f["id"] for f in store.failures) == ["bad1", "bad2"]
    assert store.summary()["failures"] == 2 and "flaky" in store


# ------------------------------------------------------------------------------- workers, pickle


class StoreDataset(Dataset):
    def __init__(self, store: FeatureStore) -> None:
        self.store = store
        self.ids = store.ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int):
        item = self.store[self.ids[i]]
        return torch.from_numpy(np.array(item.features)), item.valid, os.getpid()


def test_dataloader_with_two_workers(tmp_path: Path) -> None:
    root = tmp_path / "s"
    write(root, ids_of(40), shard_size=7)
    store = FeatureStore.open(root, max_open_shards=2)
    _ = store["id0"].features.sum()  # memmaps already open in the parent before the fork
    loader = DataLoader(StoreDataset(store), batch_size=5, num_workers=2, shuffle=False)
    rows, pids = [], set()
    for x, valid, pid in loader:
        rows.append(x)
        pids.update(pid.tolist())
        assert valid.tolist() == [N] * len(x)
    got = torch.cat(rows).numpy()
    direct = np.stack([np.array(store[i].features) for i in store.ids])
    np.testing.assert_array_equal(got, direct)
    assert os.getpid() not in pids and len(pids) == 2


def test_store_pickles_without_open_maps(tmp_path: Path) -> None:
    root = tmp_path / "s"
    write(root, ids_of(9), shard_size=3)
    store = FeatureStore.open(root, max_open_shards=2)
    before = {i: np.array(store[i].features) for i in store.ids}  # opens (and evicts) memmaps
    assert len(store._open) == 2
    blob = pickle.dumps(store)
    assert len(blob) < 20_000  # the index, not the features
    clone = pickle.loads(blob)
    assert clone._open == {} and clone.ids == store.ids and clone.meta == store.meta
    for i, arr in before.items():
        np.testing.assert_array_equal(clone[i].features, arr)
