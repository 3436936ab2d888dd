"""FeatureStore: read access to a store of per-item feature grids (the union of every rank's shards).

``FeatureStore.open(root)`` merges all index files (ordered by rank, then shard number;
an id present in several shards, as can happen after DDP padding, resolves to the first and is
counted in ``duplicates``).  Shards are memory-mapped lazily (``np.load(mmap_mode="r")``), at most
``max_open_shards`` at once per process, and never loaded whole.  The store object is picklable
(DataLoader workers, spawn): open memmaps are dropped when pickled or after a fork, and reopened
on first use.  ``read(id)`` (the training and evaluation loaders) reads one item with one ``pread``
into a new array instead: no page faults, no read-around, nothing mapped.

The files and the meta: ``captioning.store.layout``; writing: ``captioning.store.writer``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captioning.errors import DataError
from captioning.store.layout import DTYPES, list_indexes, read_index, read_meta

log = logging.getLogger(__name__)


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
        meta = read_meta(root)
        shards: list[str] = []
        rows: list[int] = []
        index: dict[str, tuple[int, int, int, tuple[int, ...] | None, tuple[int, int] | None]] = {}
        duplicates = 0
        shards_dir = root / "shards"
        for _, _, ipath in list_indexes(shards_dir):
            idx = read_index(ipath)
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
