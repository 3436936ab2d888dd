"""The feature extraction job's Lightning callbacks: the store writer and the items progress bar.

``StoreWriter`` hands each batch's features to a thread that writes them to this rank's shards
through ``FeatureStoreWriter(rank=global_rank)`` and records failures, so that writing overlaps
the forward of the next batches: on a GPU the thread, not the job, waits for a batch's copy to the
host (its ``ready`` event), and the job waits for the thread only when ``queue_batches`` batches
are waiting already.  It keeps what an interrupted run finished.  ``ItemsProgressBar`` counts
items, not batches, on global rank 0.  The job that wires them together: ``captioning.features.extract``.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ProgressBar

from captioning.errors import StorageError
from captioning.store.writer import FeatureStoreWriter

__all__ = ["ItemsProgressBar", "StoreWriter"]

log = logging.getLogger("captioning.extract")


# ------------------------------------------------------------------------------------ writer


class StoreWriter(pl.Callback):
    """Writes every batch's features to this rank's shards (``FeatureStoreWriter(rank=global_rank)``)
    on a thread of its own (see the module docstring).

    Skips ids written earlier by this rank or before the run; failures go to the store's failure
    list.  ``written`` holds (seconds since the first batch was handed over, items) when each batch
    was in the store's writer; after ``on_predict_end`` ``totals`` holds the counts summed over ranks.
    A killed job loses at most the writer's unfinished shard and the ``queue_batches`` batches
    waiting for it.
    """

    def __init__(self, root: str | Path, meta: dict[str, Any], shard_size: int = 256,
                 dtype: str = "float16", done_ids: set[str] | None = None, queue_batches: int = 2) -> None:
        super().__init__()
        self.root = str(root)
        self.meta = meta
        self.shard_size = shard_size
        self.dtype = dtype
        self.done_ids = set(done_ids or ())
        self.writer: Any = None
        self.seen: set[str] = set()
        self.processed = 0
        self.failed = 0
        self.repeats = 0
        self.failures: list[str] = []
        self.totals: dict[str, int] = {}
        self.written: list[tuple[float, int]] = []
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, queue_batches))
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._start = 0.0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        dm = trainer.datamodule
        if dm is not None and isinstance(getattr(dm, "done", None), set):
            self.done_ids |= dm.done  # set up before the callbacks (Lightning's hook order)
        self.writer = FeatureStoreWriter(self.root, self.meta, rank=trainer.global_rank,
                                         shard_size=self.shard_size, dtype=self.dtype)

    def on_predict_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                             batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._thread is None:  # after the DataLoader's workers are forked
            self._start = time.perf_counter()
            self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
            self._thread.start()
        while True:  # hand the batch over; the thread's error, if it stopped, instead
            self._raise()
            try:
                self._queue.put(outputs, timeout=0.1)
                return
            except queue.Full:
                continue

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (prediction := self._queue.get()) is not None:
            try:
                self._write(prediction)
            except BaseException as e:  # raised in the job by the next hand-over, or at the end
                self._error = e
                return

    def _write(self, prediction: dict[str, Any]) -> None:
        """One batch into the store (on the thread): its failures, then its features, as rows [N, C]."""
        if prediction.get("ready") is not None:
            prediction["ready"].synchronize()  # its copy to the host is complete
        for item_id, path, error in prediction["failures"]:
            if item_id in self.seen or item_id in self.done_ids:
                self.repeats += 1
                continue
            self.seen.add(item_id)
            self.writer.add_failure(item_id, path, error)
            self.failed += 1
            if len(self.failures) < 20:
                self.failures.append(f"{item_id}: {path}: {error}")
            log.warning("failed %s (%s): %s", item_id, path, error)
        feats = prediction["features"]
        for i, (item_id, valid, frames) in enumerate(zip(prediction["ids"], prediction["valid"],
                                                         prediction["frame_indices"], strict=True)):
            if item_id in self.seen or item_id in self.done_ids:
                self.repeats += 1
                continue
            self.seen.add(item_id)
            skipped_before = self.writer.skipped
            if self.writer.add(item_id, feats[i].numpy(), valid=valid, frame_indices=frames, copy=False):
                self.processed += 1
            elif self.writer.skipped > skipped_before:  # committed by another rank meanwhile
                self.repeats += 1
            else:  # non-finite features: the store recorded a failure
                self.failed += 1
                if len(self.failures) < 20:
                    self.failures.append(f"{item_id}: non-finite features")
        self.written.append((time.perf_counter() - self._start, len(prediction["ids"])))

    def _join(self) -> None:
        """Let the thread write what it was handed and end."""
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._queue.put(None, timeout=0.1)
                    break
                except queue.Full:
                    continue
            self._thread.join()
            self._thread = None

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._join()
        self._raise()
        self._close()
        counts = torch.tensor([self.processed, self.failed, self.repeats], dtype=torch.long,
                              device=pl_module.device)
        if trainer.world_size > 1:
            counts = trainer.strategy.reduce(counts, reduce_op="sum")
        processed, failed, repeats = (int(v) for v in counts.cpu().tolist())
        self.totals = {"processed": processed, "failed": failed, "repeats": repeats}

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Keep what an interrupted run finished (Ctrl-C, an error): the batches handed over are written
        and the unfinished shard committed, so resuming continues there, except after a shard that
        could not be written (a full disk): writing it again would fail again, so it is dropped and
        the re-run extracts its items."""
        storage = isinstance(exception, StorageError) or isinstance(self._error, StorageError)
        if not storage:
            self._join()
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        try:
            if storage:
                writer.abort()
            else:
                writer.close()
        except StorageError as e:  # e.g. Ctrl-C on a full disk: one line, the original error matters more
            writer.abort()
            log.warning("%s", e)
        except Exception:  # pragma: no cover - the original exception matters more
            log.exception("closing the feature store after an error failed")


# ------------------------------------------------------------------------------ progress bar


class ItemsProgressBar(ProgressBar):
    """A tqdm bar on global rank 0 counting items (not batches), showing items/s."""

    def __init__(self, total_items: int | None = None) -> None:
        super().__init__()
        self._enabled = True
        self.total_items = total_items
        self.bar: Any = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not (self._enabled and trainer.is_global_zero):
            return
        from tqdm.auto import tqdm

        total = self.total_items
        dm = trainer.datamodule
        if dm is not None and getattr(dm, "todo", None) is not None:
            total = math.ceil(len(dm.todo) / max(trainer.world_size, 1))
        desc = "extract" if trainer.world_size == 1 else f"extract (rank 0 of {trainer.world_size})"
        self.bar = tqdm(total=total, desc=desc, unit="item", dynamic_ncols=True, smoothing=0.1)

    def on_predict_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                             batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.bar is not None:
            self.bar.update(int(batch["num_items"]))

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
