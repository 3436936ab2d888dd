"""FeatureStoreWriter: appends items to a FeatureStore as one rank's shards, crash-safe and resumable.

Commit protocol: a shard's data file (and boxes file) is written under a temporary name, fsynced
and renamed; only then is its index written (also temp + rename).  **A shard exists only when its index
exists**, so a job killed at any point (or a full disk) never leaves a visible partial shard;
data files without an index and temporary files are ignored by readers and deleted by the next
writer of that rank.

At the disk's speed: ``add`` copies an item into the shard's staging array (one pass over its bytes,
its finiteness read from the copy's exponent bits) and a thread streams the filled rows to the
shard's file in large sequential writes and commits it (``captioning.store.write_behind``): one
fsync per data file, none per item.  At most one shard is uncommitted: the first item of a shard
waits until the shard before it is committed, so a killed job loses at most its unfinished shard.  Every rank (DDP process) writes only its own files (``r{rank}-*``,
``failures/r{rank}.jsonl``); the store is the union over ranks.  A per-rank lock file refuses a
second live writer with the same rank.  The files: ``captioning.store.layout``.

Re-running: ``FeatureStoreWriter.done_ids()`` holds the ids committed by any rank; ``add`` of such
an id is a no-op (returns False), and shard numbers continue after the existing ones, so an
interrupted job resumes where it stopped and the result equals an uninterrupted run.  Writing to
an existing store with other settings (``meta``) is refused.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from captioning.errors import ConfigError, DataError, StorageError
from captioning.store.layout import (
    BOXES_RE,
    DATA_RE,
    DTYPES,
    FORMAT_VERSION,
    INDEX_RE,
    build_meta,
    check_compatible,
    list_indexes,
    read_index,
    read_meta,
    shard_name,
)
from captioning.store.write_behind import Shard, WriteBehind
from captioning.utils.io import atomic_write_json
from captioning.utils.locks import ExclusiveLock

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20  # bytes per sequential write of a shard's rows
# per store dtype: its bits as unsigned and as signed integers, and where infinity starts (sign bit
# clear: +inf; set: -inf): NaN and infinity are the values whose exponent bits are all ones
_BITS = {"float16": (np.uint16, np.int16, 0x7C00, 0xFC00), "float32": (np.uint32, np.int32, 0x7F800000, 0xFF800000)}


def all_finite(row: np.ndarray, dtype: str) -> bool:
    """Whether every value of a C-contiguous ``row`` of store ``dtype`` is finite, from its bits alone
    (two integer maxima, no temporary): as signed integers the positive values come last, and +inf
    and every NaN without a sign bit are at least +inf's bits; as unsigned integers the negative ones
    come last, and -inf and every NaN with a sign bit are at least -inf's bits."""
    unsigned, signed, positive, negative = _BITS[dtype]
    bits = row.view(unsigned)
    return bool(bits.max(initial=0) < negative and bits.view(signed).max(initial=0) < positive)


class FeatureStoreWriter:
    """Appends items to the store at ``root`` as rank ``rank``'s shards of ``shard_size`` items.

    ``meta``: ``settings`` (dict: backbone, weights, preprocessing, code version...), ``kind``
    (image|video), ``positions`` N, ``dim`` C, ``grid`` [H, W] or None, optional ``frames`` K,
    ``boxes`` (true: every item comes with the pixel box of each region) and ``dtype`` (float16
    default | float32; or pass ``dtype=``).  Use as a context manager or call
    ``close()``: the items of the unfinished shard are lost if the process dies before it is committed.
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
        self._staging: np.ndarray | None = None  # [shard_size, N, C] copies of the shard's rows, reused
        self._box_staging: np.ndarray | None = None  # [shard_size, N, 4] float32 (boxed stores)
        # per row of the shard being filled: id, valid, frame indices, image size (W, H) | None
        self._rows: list[tuple[str, int, list[int] | None, list[int] | None]] = []
        self._io = WriteBehind(max(1, CHUNK_BYTES // (self.positions * self.dim * np.dtype(self._np_dtype).itemsize)))
        self._shard: Shard | None = None  # the shard being filled (begun on the thread), or None
        self._failed: StorageError | None = None  # a shard that could not be written, until flush() succeeds
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
        check_compatible(self.root, read_meta(self.root), self.meta)

    def _clean_own_rank(self) -> int:
        """Delete this rank's orphan data/temp files; return the next free shard number."""
        prefix = f"r{self.rank:03d}-"
        seqs, orphans = set(), []
        for name in os.listdir(self.shards_dir):
            m = INDEX_RE.match(name)
            if m and int(m.group(1)) == self.rank:
                seqs.add(int(m.group(2)))
        for name in os.listdir(self.shards_dir):
            m = DATA_RE.match(name) or BOXES_RE.match(name)
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
        for _, _, path in list_indexes(self.shards_dir):
            cached = self._index_cache.get(path.name)
            if cached is None:  # indexes never change once written
                cached = [str(i) for i in read_index(path)["ids"]]
                self._index_cache[path.name] = cached
            ids.update(cached)
        return ids

    # -- public API
    def done_ids(self) -> set[str]:
        """Ids committed by any rank (read now from the index files) plus those added to this writer."""
        return self._committed_ids() | self._added

    def add(self, item_id: str, features: Any, valid: int | None = None,
            frame_indices: Sequence[int] | None = None, boxes: Any = None,
            image_size: Sequence[int] | None = None, copy: bool = True) -> bool:
        """Add one item's features [N, C] to the shard being filled; a full shard is committed (by the
        write-behind thread) and the next item waits until it is.

        ``copy=False``: keep ``features`` itself when it is a C-contiguous array of the store's dtype,
        not a copy of it (one pass less over its bytes); the caller must not change it until its
        shard is committed (``committed`` counts it, or ``flush``/``close`` returned).

        ``boxes`` (stores with meta ``boxes`` only, and required there): [valid, 4] (or [N, 4])
        pixel boxes (x1, y1, x2, y2) of the real positions; ``image_size``: (W, H) of their image.
        Returns False (and stores nothing) when ``item_id`` was already committed before this
        writer started or already added to it, or when its features are not finite (recorded as
        a failure).  Raises DataError for a wrong shape/valid count/boxes, and StorageError when a
        shard could not be written (the items already committed stay intact; ``flush`` tries again).
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
        self._raise_failed()
        row = self._stage_row(arr, copy)
        if not all_finite(row, self.dtype):
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
        if box_rows is not None:
            assert self._box_staging is not None
            self._box_staging[len(self._rows)] = box_rows
        assert self._shard is not None
        self._shard.rows.append(row)
        self._rows.append((item_id, int(v), frames, size))
        self._added.add(item_id)
        n = len(self._rows)
        if n == self.shard_size:
            self._finish()
        elif n % self._io.chunk_rows == 0:
            self._io.ready(n)
        return True

    def _stage_row(self, arr: np.ndarray, copy: bool) -> np.ndarray:
        """The next row of the shard being filled (begun here when it is the shard's first row: after
        the shard before it is committed): ``arr`` [N, C] itself (``copy=False``, when it is laid out
        as the store's rows are) or its copy in the staging array."""
        if self._shard is None or self._shard.index:  # none yet, or the last one is complete
            self._begin()
        if not copy and arr.dtype == self._np_dtype and arr.flags.c_contiguous:
            return arr
        if self._staging is None:
            self._staging = np.empty((self.shard_size, self.positions, self.dim), dtype=self._np_dtype)
        row = self._staging[len(self._rows)]
        with np.errstate(over="ignore", invalid="ignore"):
            np.copyto(row, arr, casting="unsafe")
        return row

    def _begin(self) -> None:
        """Start a shard on the write-behind thread; the staging arrays are made at the first."""
        self._raise_failed()
        self._await_commit()
        if self.boxes and self._box_staging is None:
            self._box_staging = np.zeros((self.shard_size, self.positions, 4), dtype=np.float32)
        name = shard_name(self.rank, self._next_seq)
        self._shard = Shard(self.shards_dir / f"{name}.npy", self.shards_dir / f"{name}.index.json", self.shard_size,
                            (self.positions, self.dim), self.dtype,
                            self.shards_dir / f"{name}.boxes.npy" if self.boxes else None, self._box_staging)
        self._io.begin(self._shard)

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

    def _index(self) -> dict[str, Any]:
        """The index of the shard being filled, as its rows are now."""
        assert self._shard is not None
        index = {
            "format_version": FORMAT_VERSION, "shard": self._shard.data_path.name, "rank": self.rank,
            "seq": self._next_seq, "rows": len(self._rows), "shape": [len(self._rows), self.positions, self.dim],
            "dtype": self.dtype, "ids": [r[0] for r in self._rows], "valid": [r[1] for r in self._rows],
            "frame_indices": [r[2] for r in self._rows],
        }
        if self.boxes:
            assert self._shard.boxes_path is not None
            index["boxes"] = self._shard.boxes_path.name
            index["image_size"] = [r[3] for r in self._rows]
        return index

    def _finish(self) -> None:
        """The shard being filled is complete: the thread commits it (``_await_commit`` learns how it went)."""
        self._io.finish(len(self._rows), self._index())

    def _await_commit(self) -> None:
        """Wait for the shard on the thread; a committed one is counted and its rows let go, a failed one
        kept (``flush`` writes it again) and raised as a StorageError naming its file."""
        if self._shard is None:
            return
        shard = self._shard
        try:
            self._io.wait()
        except OSError as e:
            reason = "the disk is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
            self._failed = StorageError(
                f"cannot write feature shard {shard.data_path}: {reason}; free space or fix the folder and re-run: "
                f"the {self.committed} items this writer committed before are kept and the re-run skips them")
            self._failed.__cause__ = e
            raise self._failed from e
        self._index_cache[shard.index_path.name] = list(shard.index["ids"])
        self._next_seq += 1
        self.committed += len(self._rows)
        self._rows = []
        self._shard = None

    def _raise_failed(self) -> None:
        if self._failed is not None:
            raise self._failed

    def flush(self) -> None:
        """Commit the buffered items as one shard now and wait until it is committed (data file first,
        then its index); a shard that failed before is written again."""
        self._check_open()
        if self._shard is None:
            return
        if self._failed is not None:  # written again, from its first row
            self._failed = None
            self._io.begin(self._shard)
            self._finish()
        elif not self._rows:  # begun for an item that was then refused: nothing to commit
            self._io.abort()
            self._shard = None
            return
        elif not self._shard.index:
            self._finish()
        self._await_commit()

    def close(self) -> None:
        """Commit the buffered items, close the failure file and release the rank lock (idempotent)."""
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.closed = True
            self._io.abort()  # nothing in flight after a flush; after a failed one, its temp file goes
            self._io.close()
            if self._failure_file is not None:
                with contextlib.suppress(OSError):
                    self._failure_file.close()
                self._failure_file = None
            self._lock.release()

    def abort(self) -> None:
        """Drop the buffered (uncommitted) items and release the lock, as if the process had died."""
        self._io.abort()
        self._rows, self._shard, self._failed = [], None, None
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"FeatureStoreWriter for {self.root} (rank {self.rank}) is closed")

    @property
    def buffered(self) -> int:
        """Items added and not yet committed (at most ``shard_size``)."""
        return len(self._rows)

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
