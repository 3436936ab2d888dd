"""The feature extraction job's Lightning callbacks: the store writer and the items progress bar.

``StoreWriter(BasePredictionWriter)`` appends each rank's predictions to its own shards through
``FeatureStoreWriter(rank=global_rank)`` after every batch and records failures; it keeps what an
interrupted run finished.  ``ItemsProgressBar`` counts items, not batches, on global rank 0.  The job
that wires them together: ``captioning.features.extract``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter, ProgressBar

from captioning.errors import StorageError
from captioning.store.writer import FeatureStoreWriter

__all__ = ["ItemsProgressBar", "StoreWriter"]

log = logging.getLogger("captioning.extract")


# ------------------------------------------------------------------------------------ writer


class StoreWriter(BasePredictionWriter):
    """Writes every batch's features to this rank's shards (``FeatureStoreWriter(rank=global_rank)``).

    Skips ids written earlier by this rank (DistributedSampler padding) or before the run; failures
    go to the store's failure list.  ``summary`` holds this rank's counts; after ``on_predict_end``
    ``totals`` holds the counts summed over ranks.
    """

    def __init__(self, root: str | Path, meta: dict[str, Any], shard_size: int = 256,
                 dtype: str = "float16", done_ids: set[str] | None = None) -> None:
        super().__init__(write_interval="batch")
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

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:

        dm = trainer.datamodule
        if dm is not None and isinstance(getattr(dm, "done", None), set):
            self.done_ids |= dm.done  # set up before the callbacks (Lightning's hook order)
        self.writer = FeatureStoreWriter(self.root, self.meta, rank=trainer.global_rank,
                                         shard_size=self.shard_size, dtype=self.dtype)

    def write_on_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, prediction: Any,
                           batch_indices: Sequence[int] | None, batch: Any, batch_idx: int,
                           dataloader_idx: int = 0) -> None:
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
        for item_id, feats, valid, frames in zip(prediction["ids"], prediction["features"],
                                                 prediction["valid"], prediction["frame_indices"], strict=True):
            if item_id in self.seen or item_id in self.done_ids:
                self.repeats += 1
                continue
            self.seen.add(item_id)
            skipped_before = self.writer.skipped
            if self.writer.add(item_id, feats.numpy(), valid=valid, frame_indices=frames):
                self.processed += 1
            elif self.writer.skipped > skipped_before:  # committed by another rank meanwhile (padding)
                self.repeats += 1
            else:  # non-finite features: the store recorded a failure
                self.failed += 1
                if len(self.failures) < 20:
                    self.failures.append(f"{item_id}: non-finite features")

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()
        counts = torch.tensor([self.processed, self.failed, self.repeats], dtype=torch.long,
                              device=pl_module.device)
        if trainer.world_size > 1:
            counts = trainer.strategy.reduce(counts, reduce_op="sum")
        processed, failed, repeats = (int(v) for v in counts.cpu().tolist())
        self.totals = {"processed": processed, "failed": failed, "repeats": repeats}

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Keep what an interrupted run finished (Ctrl-C, an error): the buffered items are committed
        and resuming continues there, except after a shard that could not be written (a full disk):
        writing it again would fail again, so it is dropped and the re-run extracts its items."""
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        try:
            if isinstance(exception, StorageError):
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
