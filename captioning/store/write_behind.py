"""Write-behind: one shard's rows streamed to its file by a thread while the writer adds the next rows.

``FeatureStoreWriter`` adds each item's row to the shard (``Shard.rows``: a copy in its staging array,
or the caller's own array) and says how many rows there are (``WriteBehind.ready``); this thread
appends them to the shard's temp file in sequential writes (a chunk of rows at a time, at the file's
end) and starts the disk's
write-back of each chunk at once (``posix_fadvise(POSIX_FADV_DONTNEED)``: the kernel queues the
chunk's dirty pages for writing), so that the shard's one ``fsync`` waits for its last chunk only.
When the writer says the shard is complete (``finish``: its row count and index), the thread
commits it by the store's protocol (``captioning.store.writer``): the .npy header is written in
front of the rows, the data file fsynced and renamed, then the boxes file, then the index.

One shard at a time: ``begin`` waits until the shard before it is committed, so that at most one
shard is uncommitted (a killed job loses at most that one) and its staging array can be reused.
A failed commit (a full disk) leaves no file under a final name; ``wait`` raises its ``OSError``
in the writer's thread, and the writer may ``begin`` the same shard again.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captioning.store.layout import DTYPES, npy_header
from captioning.utils.io import atomic_write, atomic_write_json

__all__ = ["Shard", "WriteBehind", "fsync_dir"]


def fsync_dir(path: Path) -> None:
    """``fsync`` a folder, so that the renames into it survive a power loss (best effort)."""
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


@dataclass
class Shard:
    """One shard on its way to disk: its files, its rows (each a C-contiguous [N, C] array of the store's
    ``dtype``; at most ``capacity``) and, for stores of boxed regions, their boxes ([capacity, N, 4])."""

    data_path: Path
    index_path: Path
    capacity: int
    row_shape: tuple[int, int]
    dtype: str
    boxes_path: Path | None = None
    boxes: np.ndarray | None = None
    rows: list[np.ndarray] = field(default_factory=list)
    index: dict[str, Any] = field(default_factory=dict)

    @property
    def header_length(self) -> int:
        """Bytes before the first row: the header of a full shard (any smaller count fits in it)."""
        return len(npy_header((self.capacity, *self.row_shape), self.dtype))


class _Aborted(Exception):
    """The writer dropped the shard being streamed (``WriteBehind.abort``)."""


class WriteBehind:
    """The thread that streams and commits the shards of one ``FeatureStoreWriter`` (see the module).

    ``chunk_rows``: rows per write; ``on_commit(shard)`` runs in the thread after each commit.
    """

    def __init__(self, chunk_rows: int, on_commit: Callable[[Shard], None] | None = None) -> None:
        self.chunk_rows = max(1, chunk_rows)
        self.on_commit = on_commit
        self._cond = threading.Condition()
        self._shard: Shard | None = None  # begun and not yet committed (or failed)
        self._ready = 0  # its rows so far
        self._final: int | None = None  # its row count, once finished
        self._aborted = False
        self._error: BaseException | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None

    # -- the writer's side
    def begin(self, shard: Shard) -> None:
        """Stream ``shard`` from its first row on (after the shard before it is committed)."""
        self.wait()
        with self._cond:
            self._shard, self._ready, self._final, self._aborted = shard, 0, None, False
            if self._thread is None:  # started at the first shard: DataLoader workers forked before it
                self._thread = threading.Thread(target=self._run, name="feature-store-write-behind", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def ready(self, rows: int) -> None:
        """Rows ``[0, rows)`` of the shard are there."""
        with self._cond:
            self._ready = rows
            self._cond.notify_all()

    def finish(self, rows: int, index: dict[str, Any]) -> None:
        """The shard has ``rows`` rows and this ``index``: write what is left and commit it (in the thread)."""
        with self._cond:
            assert self._shard is not None, "finish() without begin()"
            self._shard.index = index
            self._ready = self._final = rows
            self._cond.notify_all()

    def wait(self) -> None:
        """Until no shard is in flight; raises the error of a commit that failed (once)."""
        with self._cond:
            while self._shard is not None:
                self._cond.wait()
            error, self._error = self._error, None
        if error is not None:
            raise error

    def abort(self) -> None:
        """Drop the shard being streamed (its temp file deleted, nothing committed) and any error."""
        with self._cond:
            self._aborted = True
            self._cond.notify_all()
        with contextlib.suppress(BaseException):
            self.wait()

    def close(self) -> None:
        """End the thread (after ``wait`` or ``abort``)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    # -- the thread's side
    def _run(self) -> None:
        while True:
            with self._cond:
                while self._shard is None and not self._stopped:
                    self._cond.wait()
                if self._shard is None:
                    return
                shard = self._shard
            error: BaseException | None = None
            try:
                self._commit(shard)
            except _Aborted:
                pass
            except BaseException as e:  # reported to the writer by wait()
                error = e
            with self._cond:
                self._shard, self._error = None, error
                self._cond.notify_all()

    def _commit(self, shard: Shard) -> None:
        try:
            atomic_write(shard.data_path, lambda tmp: self._stream(tmp, shard))
            rows = int(shard.index["rows"])
            if shard.boxes_path is not None and shard.boxes is not None:
                atomic_write(shard.boxes_path, lambda tmp: _save(tmp, shard.boxes[:rows]))
            atomic_write_json(shard.index_path, shard.index, indent=None)  # the commit point
        except BaseException:
            shard.data_path.unlink(missing_ok=True)  # without an index it is invisible anyway
            if shard.boxes_path is not None:
                shard.boxes_path.unlink(missing_ok=True)
            raise
        fsync_dir(shard.index_path.parent)
        if self.on_commit is not None:
            self.on_commit(shard)

    def _next_rows(self, written: int) -> int | None:
        """The row count to write up to (> ``written``), or None when the shard is finished at ``written``."""
        with self._cond:
            while not self._aborted and self._ready - written < self.chunk_rows and self._final != self._ready:
                self._cond.wait()
            if self._aborted:
                raise _Aborted
            return None if self._final == written else self._ready

    def _stream(self, tmp: Path, shard: Shard) -> None:
        """Rows to ``tmp`` as they are filled, then the header in front of them."""
        start = shard.header_length
        row_bytes = int(np.prod(shard.row_shape)) * np.dtype(DTYPES[shard.dtype]).itemsize
        written = 0
        with open(tmp, "wb", buffering=0) as f:
            f.seek(start)
            while (upto := self._next_rows(written)) is not None:
                for row in shard.rows[written:upto]:
                    _write_all(f, memoryview(row).cast("B"))
                with contextlib.suppress(OSError, AttributeError):  # start the write-back (Linux)
                    os.posix_fadvise(f.fileno(), start + written * row_bytes, (upto - written) * row_bytes,
                                     os.POSIX_FADV_DONTNEED)
                written = upto
            f.seek(0)
            _write_all(f, memoryview(npy_header((written, *shard.row_shape), shard.dtype, start)))


def _save(path: Path, array: np.ndarray) -> None:
    """``np.save`` to exactly ``path`` (given a path, np.save would append ``.npy``)."""
    with open(path, "wb") as f:
        np.save(f, array)


def _write_all(f: Any, view: memoryview) -> None:
    """``f.write`` until every byte of ``view`` is written (a raw file may write fewer at once)."""
    while len(view):
        n = f.write(view)
        view = view[n:]
