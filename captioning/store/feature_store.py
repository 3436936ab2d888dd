"""FeatureStore: sharded, crash-safe, resumable storage of per-item feature grids.

Layout of a store at ``root``::

    root/meta.json                          settings + shape: kind, positions N, dim C, grid, dtype
    root/shards/r{rank:03d}-{seq:06d}.npy   float16 (or float32) array [n_items, N, C]
    root/shards/r{rank:03d}-{seq:06d}.index.json
                                            ids, valid counts and frame indices of those rows
    root/shards/r{rank:03d}-{seq:06d}.boxes.npy
                                            stores of boxed regions only (meta ``boxes``): float32
                                            [n_items, N, 4] pixel boxes (x1, y1, x2, y2) of the rows,
                                            zeros past ``valid``; the index adds each row's image size
    root/failures/r{rank:03d}.jsonl         one JSON line per item that could not be extracted

Commit protocol: a shard's data file (and boxes file) is written under a temporary name, fsynced
and renamed; only then is its index written (also temp + rename).  **A shard exists only when its index
exists**, so a job killed at any point (or a full disk) never leaves a visible partial shard;
data files without an index and temporary files are ignored by readers and deleted by the next
writer of that rank.  Every rank (DDP process) writes only its own files (``r{rank}-*``,
``failures/r{rank}.jsonl``); the store is the union over ranks.  A per-rank lock file refuses a
second live writer with the same rank.

Re-running: ``FeatureStoreWriter.done_ids()`` holds the ids committed by any rank; ``add`` of such
an id is a no-op (returns False), and shard numbers continue after the existing ones, so an
interrupted job resumes where it stopped and the result equals an uninterrupted run.  Writing to
an existing store with other settings (``meta``) is refused.

Reading: ``FeatureStore.open(root)`` merges all index files (ordered by rank, then shard number;
an id present in several shards, as can happen after DDP padding, resolves to the first and is
counted in ``duplicates``).  Shards are memory-mapped lazily (``np.load(mmap_mode="r")``), at most
``max_open_shards`` at once per process, and never loaded whole.  The store object is picklable
(DataLoader workers, spawn): open memmaps are dropped when pickled or after a fork, and reopened
on first use.  ``read(id)`` (the training and evaluation loaders) reads one item with one ``pread``
into a new array instead: no page faults, no read-around, nothing mapped.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from captioning.errors import ConfigError, DataError, StorageError
from captioning.utils.io import atomic_write, atomic_write_json, read_json
from captioning.utils.locks import ExclusiveLock

log = logging.getLogger(__name__)

STORE_FORMAT = "captioning.feature_store"
FORMAT_VERSION = 1
DTYPES: dict[str, type] = {"float16": np.float16, "float32": np.float32}
# meta keys that must agree between a store and a writer adding to it
COMPARED_KEYS = ("format_version", "kind", "positions", "dim", "grid", "dtype", "frames", "settings")

_INDEX_RE = re.compile(r"^r(\d{3,})-(\d{6,})\.index\.json$")
_DATA_RE = re.compile(r"^r(\d{3,})-(\d{6,})\.npy$")
_BOXES_RE = re.compile(r"^r(\d{3,})-(\d{6,})\.boxes\.npy$")


def store_id(meta: Mapping[str, Any]) -> str:
    """Short sha256 of the meta keys that decide what a store holds (``COMPARED_KEYS``): the
    feature store's identity in provenance records."""
    keyed = {k: meta.get(k) for k in COMPARED_KEYS}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()[:10]


def shard_name(rank: int, seq: int) -> str:
    """The stem of shard ``seq`` of ``rank``: ``r{rank:03d}-{seq:06d}``."""
    return f"r{rank:03d}-{seq:06d}"


@dataclass(frozen=True)
class FeatureItem:
    """One stored item.

    features:      [N, C] read-only (memmap) view, store dtype (float16 by default).
    valid:         number of real positions (video frames padded at the end have index >= valid).
    grid:          (H, W) of the spatial grid, or None (e.g. pooled video frames, image regions).
    frame_indices: original frame indices of the sampled video frames, or None.
    boxes:         [N, 4] float32 (x1, y1, x2, y2) pixel box of each region (rows >= valid are
                   zeros), for stores of boxed regions (meta ``boxes``); else None.
    image_size:    (W, H) in pixels of the image the boxes lie in, when known; else None.
    """

    features: np.ndarray
    valid: int
    grid: tuple[int, int] | None
    frame_indices: tuple[int, ...] | None
    boxes: np.ndarray | None = None
    image_size: tuple[int, int] | None = None

    @property
    def mask(self) -> np.ndarray:
        """[N] bool: True for the ``valid`` real positions."""
        return np.arange(self.features.shape[0]) < self.valid


# ------------------------------------------------------------------------------------ meta


def _normalize(obj: Any) -> Any:
    """JSON round trip: tuples -> lists, numpy scalars refused early with a clear error."""
    try:
        return json.loads(json.dumps(obj))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"feature store meta must be plain JSON data (str/int/float/bool/list/dict): {e}") from e


def _diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the keys whose values differ between two JSON-like values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            path = f"{prefix}.{k}" if prefix else str(k)
            if k not in a or k not in b:
                out.append(path)
            else:
                out.extend(_diff_keys(a[k], b[k], path))
        return out
    return [] if a == b else [prefix or "<root>"]


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def settings_diff(theirs: Mapping[str, Any], mine: Mapping[str, Any],
                  keys: Sequence[str] = COMPARED_KEYS) -> dict[str, tuple[Any, Any]]:
    """How two feature metas differ: ``{dotted key: (theirs, mine)}``, empty when they agree.

    The one "same feature settings?" check (store writers, extraction, checkpoints, the caption
    job's rebuilt backbone).  Only ``keys`` are compared, as plain JSON (a tuple equals a list);
    a missing ``format_version`` or ``dtype`` counts as its default (1, float16).
    """
    defaults = {"format_version": 1, "dtype": "float16"}  # what a meta without them was written as
    a = json.loads(json.dumps({k: theirs.get(k, defaults.get(k)) for k in keys}, default=str))
    b = json.loads(json.dumps({k: mine.get(k, defaults.get(k)) for k in keys}, default=str))
    return {path: (_at(a, path), _at(b, path)) for path in _diff_keys(a, b)}


def describe_diff(diff: Mapping[str, Any], limit: int = 8) -> str:
    """``"settings.weights, dim"`` (at most ``limit`` keys, then ``(+n more)``)."""
    keys = list(diff)
    return ", ".join(keys[:limit]) + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def build_meta(meta: Mapping[str, Any], dtype: str | None = None) -> dict[str, Any]:
    """Validate a writer's meta and complete it (dtype, format); returns a plain JSON dict."""
    if not isinstance(meta, Mapping):
        raise ConfigError(f"feature store meta must be a dict, got {type(meta).__name__}")
    m = _normalize(dict(meta))
    if dtype is not None and m.get("dtype") not in (None, dtype):
        raise ConfigError(f"feature store dtype={dtype!r} but meta says dtype={m['dtype']!r}: pass one of them")
    m["dtype"] = dtype or m.get("dtype") or "float16"
    if m["dtype"] not in DTYPES:
        raise ConfigError(f"feature store dtype={m['dtype']!r} is not valid: use float16 | float32")
    if not isinstance(m.get("settings"), dict):
        raise ConfigError("feature store meta needs 'settings': a dict (backbone, weights, preprocessing, ...)")
    if m.get("kind") not in ("image", "video"):
        raise ConfigError(f"feature store meta 'kind'={m.get('kind')!r} is not valid: use image | video")
    for key in ("positions", "dim"):
        v = m.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"feature store meta '{key}' must be a positive int, got {v!r}")
    grid = m.get("grid")
    if grid is not None:
        if (not isinstance(grid, list) or len(grid) != 2
                or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in grid)):
            raise ConfigError(f"feature store meta 'grid' must be [H, W] (positive ints) or null, got {grid!r}")
        cells = grid[0] * grid[1]
        if m["kind"] == "image" and cells != m["positions"]:
            raise ConfigError(f"feature store meta: grid {grid} has {cells} cells but positions={m['positions']}")
        if m["kind"] == "video" and m["positions"] % cells:
            raise ConfigError(f"feature store meta: positions={m['positions']} is not a multiple of grid {grid}")
    frames = m.get("frames")
    if frames is not None and (not isinstance(frames, int) or frames < 1):
        raise ConfigError(f"feature store meta 'frames' must be a positive int or null, got {frames!r}")
    m["boxes"] = m.get("boxes", False)
    if not isinstance(m["boxes"], bool):
        raise ConfigError(f"feature store meta 'boxes' must be true or false, got {m['boxes']!r}")
    if m["boxes"] and (m["kind"] != "image" or grid is not None):
        raise ConfigError("feature store meta 'boxes': boxes belong to image regions (kind image, grid null)")
    m["format"] = STORE_FORMAT
    m["format_version"] = FORMAT_VERSION
    return m


def _read_meta(root: Path) -> dict[str, Any]:
    path = root / "meta.json"
    if not path.is_file():
        raise DataError(f"no feature store at {root} ({path.name} missing): run captioning-extract first "
                        f"or fix features_dir")
    meta = read_json(path, "feature store meta")
    if not isinstance(meta, dict) or not all(k in meta for k in ("kind", "positions", "dim")):
        raise DataError(f"feature store meta {path} lacks kind/positions/dim; it was not written by this "
                        f"code: delete {root} and re-extract")
    if int(meta.get("format_version", 1)) > FORMAT_VERSION:
        raise DataError(f"feature store {root} has format version {meta['format_version']}, newer than this "
                        f"code reads ({FORMAT_VERSION}): update the captioning package")
    meta.setdefault("dtype", "float16")
    meta.setdefault("grid", None)
    meta.setdefault("boxes", False)
    return meta


def _check_compatible(root: Path, stored: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    diff = settings_diff(stored, mine, (*COMPARED_KEYS, "boxes"))
    if diff:
        raise DataError(
            f"feature store {root} was written with other settings ({describe_diff(diff)} differ); it refuses "
            f"to mix features from different settings: use a new output dir or delete {root}"
        )


# ------------------------------------------------------------------------------- scanning


def _list_indexes(shards_dir: Path) -> list[tuple[int, int, Path]]:
    """(rank, seq, index path) of every committed shard, sorted by rank then seq."""
    out = []
    try:
        names = os.listdir(shards_dir)
    except FileNotFoundError:
        return []
    for name in names:
        m = _INDEX_RE.match(name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), shards_dir / name))
    out.sort(key=lambda t: (t[0], t[1]))
    return out


def _read_index(path: Path) -> dict[str, Any]:
    idx = read_json(path, "feature shard index")
    try:
        rows = int(idx["rows"])
        ids, valid, frames = idx["ids"], idx["valid"], idx["frame_indices"]
        ok = isinstance(ids, list) and len(ids) == rows and len(valid) == rows and len(frames) == rows
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise DataError(f"feature shard index {path} is inconsistent (ids/valid/frame_indices/rows); delete it "
                        f"and its .npy file and re-run extraction to redo those items")
    return idx


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------- writer


class FeatureStoreWriter:
    """Appends items to the store at ``root`` as rank ``rank``'s shards of ``shard_size`` items.

    ``meta``: ``settings`` (dict: backbone, weights, preprocessing, code version...), ``kind``
    (image|video), ``positions`` N, ``dim`` C, ``grid`` [H, W] or None, optional ``frames`` K,
    ``boxes`` (true: every item comes with the pixel box of each region) and ``dtype`` (float16
    default | float32; or pass ``dtype=``).  Use as a context manager or call
    ``close()``: rows still buffered are lost if the process dies before the next shard commit.
    """

    def __init__(self, root: str | Path, meta: Mapping[str, Any], *, rank: int = 0, shard_size: int = 256,
                 dtype: str | None = None) -> None:
        if not isinstance(rank, int) or rank < 0:
            raise ConfigError(f"FeatureStoreWriter rank must be an int >= 0, got {rank!r}")
        if not isinstance(shard_size, int) or shard_size < 1:
            raise ConfigError(f"FeatureStoreWriter shard_size must be an int >= 1, got {shard_size!r}")
        self.root = Path(root)
        self.rank = rank
        self.shard_size = shard_size
        self.meta = build_meta(meta, dtype)
        self.dtype = self.meta["dtype"]
        self._np_dtype = DTYPES[self.dtype]
        self.positions, self.dim = self.meta["positions"], self.meta["dim"]
        self.boxes = bool(self.meta["boxes"])
        self.shards_dir = self.root / "shards"
        self.failures_dir = self.root / "failures"
        try:
            self.shards_dir.mkdir(parents=True, exist_ok=True)
            self.failures_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DataError(f"cannot create the feature store at {self.root}: {e}") from e
        self._lock = ExclusiveLock(self.shards_dir / f".r{rank:03d}.lock")
        if not self._lock.acquire():
            raise DataError(f"another writer is already writing rank {rank} of {self.root} (lock {self._lock.path}); "
                            f"give every process its own rank, or wait for the other job to finish")
        try:
            self._init_meta()
            self._next_seq = self._clean_own_rank()
            self._index_cache: dict[str, list[str]] = {}
            self._done_at_start = self._committed_ids()
        except BaseException:
            self._lock.release()
            raise
        self._added: set[str] = set()
        # (id, features [N, C], valid, frame indices, boxes [N, 4] | None, image size (W, H) | None)
        self._buffer: list[tuple[str, np.ndarray, int, list[int] | None, np.ndarray | None, list[int] | None]] = []
        self._failure_file: IO[str] | None = None
        self.committed = 0  # items this writer committed to shards
        self.skipped = 0  # add() calls ignored because the id was already stored/added
        self.closed = False

    # -- setup
    def _init_meta(self) -> None:
        path = self.root / "meta.json"
        if not path.is_file():
            try:
                atomic_write_json(path, self.meta)
            except OSError as e:
                raise DataError(f"cannot write {path}: {e}") from e
        # re-read even after writing: another rank may have created it first
        _check_compatible(self.root, _read_meta(self.root), self.meta)

    def _clean_own_rank(self) -> int:
        """Delete this rank's orphan data/temp files; return the next free shard number."""
        prefix = f"r{self.rank:03d}-"
        seqs, orphans = set(), []
        for name in os.listdir(self.shards_dir):
            m = _INDEX_RE.match(name)
            if m and int(m.group(1)) == self.rank:
                seqs.add(int(m.group(2)))
        for name in os.listdir(self.shards_dir):
            m = _DATA_RE.match(name) or _BOXES_RE.match(name)
            if m and int(m.group(1)) == self.rank and int(m.group(2)) not in seqs:
                orphans.append(name)
            elif name.startswith("." + prefix) and name.endswith(".tmp"):
                orphans.append(name)
        for name in orphans:
            log.info("removing %s left by an interrupted writer", self.shards_dir / name)
            (self.shards_dir / name).unlink(missing_ok=True)
        return max(seqs) + 1 if seqs else 0

    def _committed_ids(self) -> set[str]:
        ids: set[str] = set()
        for _, _, path in _list_indexes(self.shards_dir):
            cached = self._index_cache.get(path.name)
            if cached is None:  # indexes never change once written
                cached = [str(i) for i in _read_index(path)["ids"]]
                self._index_cache[path.name] = cached
            ids.update(cached)
        return ids

    # -- public API
    def done_ids(self) -> set[str]:
        """Ids committed by any rank (read now from the index files) plus those added to this writer."""
        return self._committed_ids() | self._added

    def add(self, item_id: str, features: Any, valid: int | None = None,
            frame_indices: Sequence[int] | None = None, boxes: Any = None,
            image_size: Sequence[int] | None = None) -> bool:
        """Buffer one item's features [N, C]; a full buffer is committed as a shard.

        ``boxes`` (stores with meta ``boxes`` only, and required there): [valid, 4] (or [N, 4])
        pixel boxes (x1, y1, x2, y2) of the real positions; ``image_size``: (W, H) of their image.
        Returns False (and stores nothing) when ``item_id`` was already committed before this
        writer started or already added to it, or when its features are not finite (recorded as
        a failure).  Raises DataError for a wrong shape/valid count/boxes and when a shard cannot
        be written (the items already committed stay intact).
        """
        self._check_open()
        if not isinstance(item_id, str):
            raise TypeError(f"item_id must be a str, got {type(item_id).__name__} {item_id!r}")
        if item_id in self._added or item_id in self._done_at_start:
            self.skipped += 1
            return False
        arr = np.asarray(features)
        if arr.shape != (self.positions, self.dim):
            raise DataError(f"features of item {item_id!r} have shape {list(arr.shape)} but the store at "
                            f"{self.root} holds [{self.positions}, {self.dim}] (positions, dim) per item")
        with np.errstate(over="ignore", invalid="ignore"):
            row = np.array(arr, dtype=self._np_dtype, order="C", copy=True)
        if not np.isfinite(row).all():
            why = ("NaN/inf values" if not np.isfinite(arr).all()
                   else f"values beyond the {self.dtype} range (use dtype=float32)")
            self.add_failure(item_id, "", f"features contain {why}")
            log.warning("item %s: features contain %s; recorded as a failure", item_id, why)
            return False
        v = self.positions if valid is None else valid
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= int(v) <= self.positions:
            raise DataError(f"item {item_id!r}: valid={valid!r} must be an int in [1, {self.positions}]")
        frames = None if frame_indices is None else [int(f) for f in frame_indices]
        box_rows = self._box_rows(item_id, boxes, int(v))
        size = None
        if image_size is not None:
            size = [int(x) for x in image_size]
            if len(size) != 2 or min(size) < 1:
                raise DataError(f"item {item_id!r}: image_size={list(image_size)} must be (W, H) in pixels, both >= 1")
        self._buffer.append((item_id, row, int(v), frames, box_rows, size))
        self._added.add(item_id)
        if len(self._buffer) >= self.shard_size:
            self.flush()
        return True

    def _box_rows(self, item_id: str, boxes: Any, valid: int) -> np.ndarray | None:
        """``boxes`` as float32 [N, 4] (zeros past ``valid``), checked against the store's meta."""
        if boxes is None:
            if self.boxes:
                raise DataError(f"item {item_id!r}: the store at {self.root} keeps a box per region; pass boxes=")
            return None
        if not self.boxes:
            raise DataError(f"item {item_id!r}: boxes given but the store at {self.root} keeps none (meta boxes=false)")
        b = np.asarray(boxes, dtype=np.float32)
        if b.ndim != 2 or b.shape[1] != 4 or b.shape[0] not in (valid, self.positions):
            raise DataError(f"item {item_id!r}: boxes have shape {list(b.shape)}, expected [{valid}, 4] "
                            f"(one x1, y1, x2, y2 box per real position)")
        if not np.isfinite(b[:valid]).all():
            raise DataError(f"item {item_id!r}: boxes contain NaN/inf values")
        out = np.zeros((self.positions, 4), dtype=np.float32)
        out[:valid] = b[:valid]
        return out

    def add_failure(self, item_id: str, path: str | os.PathLike | None, error: str | BaseException) -> None:
        """Append a failure record (id, path, error) to this rank's failures file, fsynced."""
        self._check_open()
        record = {"id": str(item_id), "path": "" if path is None else str(path),
                  "error": str(error) if not isinstance(error, BaseException) else f"{type(error).__name__}: {error}",
                  "rank": self.rank, "time": round(time.time(), 3)}
        path_ = self.failures_dir / f"r{self.rank:03d}.jsonl"
        try:
            if self._failure_file is None:
                self._failure_file = open(path_, "a", encoding="utf-8")
            self._failure_file.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._failure_file.flush()
            os.fsync(self._failure_file.fileno())
        except OSError as e:
            raise DataError(f"cannot append to the failure list {path_}: {e}") from e

    def flush(self) -> None:
        """Commit the buffered items as one shard now (data file first, then its index)."""
        self._check_open()
        if not self._buffer:
            return
        name = shard_name(self.rank, self._next_seq)
        data_path = self.shards_dir / f"{name}.npy"
        index_path = self.shards_dir / f"{name}.index.json"
        data = np.stack([b[1] for b in self._buffer])  # [n, N, C]
        index = {
            "format_version": FORMAT_VERSION, "shard": data_path.name, "rank": self.rank, "seq": self._next_seq,
            "rows": len(self._buffer), "shape": list(data.shape), "dtype": self.dtype,
            "ids": [b[0] for b in self._buffer], "valid": [b[2] for b in self._buffer],
            "frame_indices": [b[3] for b in self._buffer],
        }
        boxes_path = self.shards_dir / f"{name}.boxes.npy"
        if self.boxes:
            index["boxes"] = boxes_path.name
            index["image_size"] = [b[5] for b in self._buffer]

        def saver(array: np.ndarray) -> Any:
            def save(tmp: Path) -> None:
                with open(tmp, "wb") as f:
                    np.save(f, array)
            return save

        try:
            atomic_write(data_path, saver(data))
            if self.boxes:
                atomic_write(boxes_path, saver(np.stack([b[4] for b in self._buffer])))  # [n, N, 4]
            atomic_write_json(index_path, index, indent=None)  # the commit point
        except OSError as e:
            data_path.unlink(missing_ok=True)  # without an index it is invisible anyway
            boxes_path.unlink(missing_ok=True)
            reason = "the disk is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
            raise StorageError(
                f"cannot write feature shard {data_path}: {reason}; free space or fix the folder and re-run: "
                f"the {self.committed} items this writer committed before are kept and the re-run skips them"
            ) from e
        _fsync_dir(self.shards_dir)
        self._index_cache[index_path.name] = list(index["ids"])
        self._next_seq += 1
        self.committed += len(self._buffer)
        self._buffer = []

    def close(self) -> None:
        """Commit the buffered items, close the failure file and release the rank lock (idempotent)."""
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.closed = True
            if self._failure_file is not None:
                with contextlib.suppress(OSError):
                    self._failure_file.close()
                self._failure_file = None
            self._lock.release()

    def abort(self) -> None:
        """Drop the buffered (uncommitted) items and release the lock, as if the process had died."""
        self._buffer = []
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"FeatureStoreWriter for {self.root} (rank {self.rank}) is closed")

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def __enter__(self) -> FeatureStoreWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is None:
            self.close()
            return
        try:  # keep the complete items of an interrupted run; the original error matters more
            self.close()
        except Exception:
            log.exception("closing the feature store writer for %s after an error failed", self.root)


# --------------------------------------------------------------------------------- reader


class FeatureStore:
    """Read access to a store (union of every rank's committed shards). See the module docstring."""

    def __init__(self, root: Path, meta: dict[str, Any], shards: list[str], rows: list[int],
                 index: dict[str, tuple[int, int, int, tuple[int, ...] | None, tuple[int, int] | None]],
                 failures: list[dict[str, Any]], duplicates: int, max_open_shards: int = 64) -> None:
        self.root = root
        self.meta = meta
        self._shards = shards  # data file names, in shard order
        self._rows = rows  # rows per shard
        self._index = index  # id -> (shard, row, valid, frame_indices, image size)
        self.boxes = bool(meta.get("boxes"))  # every shard has a .boxes.npy beside its data file
        self.failures = failures
        self.duplicates = duplicates
        self.max_open_shards = max(1, int(max_open_shards))
        grid = meta.get("grid")
        self.grid: tuple[int, int] | None = (int(grid[0]), int(grid[1])) if grid else None
        self.positions, self.dim = int(meta["positions"]), int(meta["dim"])
        self.dtype = np.dtype(DTYPES.get(meta.get("dtype", "float16"), np.float16))
        self._reset_cache()

    @classmethod
    def open(cls, root: str | Path, max_open_shards: int = 64) -> FeatureStore:
        """Read ``meta.json``, every shard index and the failure lists (no feature data is read)."""
        root = Path(root)
        meta = _read_meta(root)
        shards: list[str] = []
        rows: list[int] = []
        index: dict[str, tuple[int, int, int, tuple[int, ...] | None, tuple[int, int] | None]] = {}
        duplicates = 0
        shards_dir = root / "shards"
        for _, _, ipath in _list_indexes(shards_dir):
            idx = _read_index(ipath)
            data_name = ipath.name[: -len(".index.json")] + ".npy"
            if not (shards_dir / data_name).is_file():
                raise DataError(f"feature shard {shards_dir / data_name} is missing but its index {ipath} exists; "
                                f"delete the index and re-run extraction to redo its {idx['rows']} items")
            sizes = idx.get("image_size") or [None] * len(idx["ids"])
            if meta.get("boxes") and (idx.get("boxes") is None or len(sizes) != len(idx["ids"])
                                      or not (shards_dir / str(idx["boxes"])).is_file()):
                raise DataError(f"feature shard index {ipath} names no boxes file (or it is missing) in a store of "
                                f"boxed regions; delete the index and its .npy files and re-run the import")
            s = len(shards)
            shards.append(data_name)
            rows.append(int(idx["rows"]))
            rows_meta = zip(idx["ids"], idx["valid"], idx["frame_indices"], sizes, strict=True)
            for r, (item_id, valid, frames, size) in enumerate(rows_meta):
                item_id = str(item_id)
                if item_id in index:
                    duplicates += 1
                    continue
                index[item_id] = (s, r, int(valid), None if frames is None else tuple(int(f) for f in frames),
                                  None if size is None else (int(size[0]), int(size[1])))
        failures = _read_failures(root / "failures", exclude=index)
        if duplicates:
            log.info("feature store %s: %d duplicate item(s) across shards; the first copy is used",
                     root, duplicates)
        return cls(root, meta, shards, rows, index, failures, duplicates, max_open_shards)

    # -- mapping-like access
    @property
    def ids(self) -> list[str]:
        """Stored ids in shard order (rank, shard number, row)."""
        return list(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __getitem__(self, item_id: str) -> FeatureItem:
        try:
            s, r, valid, frames, size = self._index[item_id]
        except KeyError:
            raise KeyError(f"item {item_id!r} is not in the feature store {self.root}") from None
        boxes = self._array(s, "boxes")[r] if self.boxes else None
        return FeatureItem(self._array(s)[r], valid, self.grid, frames, boxes, size)

    def get(self, item_id: str, default: Any = None) -> FeatureItem | Any:
        return self[item_id] if item_id in self._index else default

    def read(self, item_id: str, out: np.ndarray | None = None) -> FeatureItem:
        """``self[item_id]`` with its features read now by one ``pread`` into a new [N, C] array, or
        into ``out`` (C-contiguous [N, C] of the store's dtype, e.g. a row of a batch).

        The loaders' path.  Through a memory map the first touch of each page is a fault that the
        kernel serves with read-around (up to ``read_ahead_kb`` about it): a shuffled epoch read
        3.5x each item's bytes from the disk, and the touched pages stay in the reader's RSS while
        its shard is mapped (``captioning-bench scale``, docs/at_scale.md).  ``pread`` reads the
        item's bytes alone, maps nothing, and the page cache it fills is shared by all processes.
        """
        try:
            s, r, valid, frames, size = self._index[item_id]
        except KeyError:
            raise KeyError(f"item {item_id!r} is not in the feature store {self.root}") from None
        offset = self._offsets.get(s)
        if offset is None:  # this shard's first read here: its header is checked once
            offset = self._offsets[s] = int(self._load(s).offset)
        if out is None:
            out = np.empty((self.positions, self.dim), dtype=self.dtype)
        elif out.shape != (self.positions, self.dim) or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"read(out=): need a C-contiguous {self.dtype} [{self.positions}, {self.dim}] array, "
                             f"got {out.dtype} {list(out.shape)}")
        path = self.root / "shards" / self._shards[s]
        fd = os.open(path, os.O_RDONLY)
        try:
            n = os.preadv(fd, [out], offset + r * out.nbytes)
        finally:
            os.close(fd)
        if n != out.nbytes:
            raise DataError(f"feature shard {path} is truncated (item {item_id!r}: {n} of {out.nbytes} bytes); "
                            f"delete it and {path.name[: -len('.npy')]}.index.json and re-run extraction")
        boxes = np.array(self._array(s, "boxes")[r]) if self.boxes else None
        return FeatureItem(out, valid, self.grid, frames, boxes, size)

    # -- lazily opened memory maps
    def _reset_cache(self) -> None:
        self._offsets: dict[int, int] = {}  # shard -> byte offset of its first row (read())
        self._open: OrderedDict[tuple[int, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _array(self, s: int, part: str = "features") -> np.ndarray:
        """Shard ``s``'s memory-mapped ``features`` [rows, N, C] or ``boxes`` [rows, N, 4]."""
        if self._pid != os.getpid():  # forked: do not share the parent's maps
            self._reset_cache()
        key = (s, part)
        with self._lock:
            arr = self._open.get(key)
            if arr is not None:
                self._open.move_to_end(key)
                return arr
            arr = self._load(s, part)
            self._open[key] = arr
            while len(self._open) > self.max_open_shards:
                self._open.popitem(last=False)  # views handed out keep their map alive
            return arr

    def _load(self, s: int, part: str = "features") -> np.ndarray:
        stem = self._shards[s][: -len(".npy")]
        path = self.root / "shards" / (f"{stem}.boxes.npy" if part == "boxes" else self._shards[s])
        fix = f"delete it and {stem}.index.json and re-run extraction to redo its items"
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"feature shard {path} is unreadable, truncated or corrupt ({e}); {fix}") from e
        expected = (self._rows[s], self.positions, 4 if part == "boxes" else self.dim)
        dtype = np.dtype(np.float32) if part == "boxes" else self.dtype
        if arr.shape != expected or arr.dtype != dtype:
            raise DataError(f"feature shard {path} holds {arr.dtype} {list(arr.shape)}, expected {dtype} "
                            f"{list(expected)}; {fix}")
        return arr

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_open", "_lock", "_pid", "_offsets"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_cache()

    # -- reporting
    @property
    def num_shards(self) -> int:
        return len(self._shards)

    def summary(self) -> dict[str, Any]:
        """Counts for logs/reports: items, shards, duplicates, failures, shape, dtype, bytes on disk."""
        nbytes = 0
        for name in self._shards:
            with contextlib.suppress(OSError):
                nbytes += (self.root / "shards" / name).stat().st_size
                if self.boxes:
                    nbytes += (self.root / "shards" / f"{name[: -len('.npy')]}.boxes.npy").stat().st_size
        return {
            "root": str(self.root), "kind": self.meta.get("kind"), "items": len(self._index),
            "shards": len(self._shards), "duplicates": self.duplicates, "failures": len(self.failures),
            "positions": self.positions, "dim": self.dim, "grid": list(self.grid) if self.grid else None,
            "dtype": str(self.dtype), "boxes": self.boxes, "bytes": nbytes,
        }

    def __repr__(self) -> str:
        return (f"FeatureStore({str(self.root)!r}, items={len(self)}, shards={self.num_shards}, "
                f"failures={len(self.failures)}, [N, C]=[{self.positions}, {self.dim}], dtype={self.dtype})")


def _read_failures(failures_dir: Path, exclude: Mapping[str, Any] | set[str]) -> list[dict[str, Any]]:
    """Failure records of every rank, one per id (the last one wins), minus ids in ``exclude``."""
    by_id: dict[str, dict[str, Any]] = {}
    try:
        names = sorted(n for n in os.listdir(failures_dir) if n.endswith(".jsonl"))
    except FileNotFoundError:
        return []
    for name in names:
        try:
            text = (failures_dir / name).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            log.warning("cannot read the failure list %s: %s", failures_dir / name, e)
            continue
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                item_id = str(rec["id"])
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a killed job
            by_id.pop(item_id, None)
            by_id[item_id] = rec
    return [rec for item_id, rec in by_id.items() if item_id not in exclude]
