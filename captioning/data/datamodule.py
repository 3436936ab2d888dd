"""The Lightning DataModule: training and evaluation loaders over a FeatureStore.

Training batches are per image by default (``captioning.data.batches``): ``data.batch_size`` is the
number of captions a batch holds, as ``round(batch_size / k)`` items with ``k`` captions each
(``data.captions_per_image``; null: the number of references every training item has).  Two
things keep a GPU fed:

- ``data.cache`` (``auto`` | ``device`` | ``none``): the training split's features resident on the
  training device, read from the store once; a batch is then an index gather on the device, with no
  loader worker and no host copy of features.  ``auto`` caches on a GPU when they take at most half
  of its free memory, never on a CPU (the memory-mapped store already is the cache there);
- without the cache, on a GPU, the next batch is copied to the device on a side stream while the
  current one trains (``PrefetchLoader``; timm's ``PrefetchLoader``, apex's ``data_prefetcher``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from captioning.data.annotations import SPLITS
from captioning.data.batches import (
    Batch,
    CaptionEvalDataset,
    CaptionsPerItemDataset,
    CaptionTrainDataset,
    FeatureItems,
    collate,
    pad_tokens,
    read_batch,
)
from captioning.data.caption_table import CaptionTable
from captioning.data.records import CaptionRecord
from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError, DataError
from captioning.store.feature_store import FeatureStore

log = logging.getLogger(__name__)

__all__ = ["BATCHINGS", "CACHES", "Batch", "CaptionDataModule", "CaptionEvalDataset", "CaptionTrainDataset",
           "CaptionsPerItemDataset", "DeviceFeatures", "FeatureItems", "PrefetchLoader", "collate", "pad_tokens",
           "read_batch"]

BATCHINGS = ("image", "caption")
CACHES = ("auto", "device", "none")
CACHE_SHARE = 0.5  # data.cache=auto: the features may take this share of the device's free memory


class DeviceFeatures:
    """A split's features resident on one device: ``features [n,N,C]`` as stored and the real
    positions ``valid [n]``; ``fill`` turns a batch's item indices into its features and mask."""

    def __init__(self, features: torch.Tensor, valid: torch.Tensor) -> None:
        self.features, self.valid = features, valid
        self.full = bool(valid.numel()) and int(valid.min()) == features.shape[1]  # read once, here

    @classmethod
    def load(cls, items: FeatureItems, device: torch.device, chunk: int = 256) -> DeviceFeatures:
        """Read ``items`` from their store ``chunk`` at a time through one host buffer onto ``device``
        (the split is never whole in host memory)."""
        store = items.store
        dtype = torch.from_numpy(np.empty(0, dtype=store.dtype)).dtype
        out = torch.empty((len(items), store.positions, store.dim), dtype=dtype, device=device)
        valid = torch.empty(len(items), dtype=torch.long)
        for start in range(0, len(items), chunk):
            rows = list(range(start, min(len(items), start + chunk)))
            feats, mask, _ = items.batch(rows)
            out[start : start + len(rows)].copy_(feats)
            valid[start : start + len(rows)] = mask.sum(1)
        return cls(out, valid.to(device))

    @property
    def nbytes(self) -> int:
        return self.features.numel() * self.features.element_size()

    def fill(self, batch: Batch) -> Batch:
        """``batch`` with its items' features and mask gathered on the device (``batch.index`` there)."""
        index = batch.index.to(self.features.device, non_blocking=True)
        positions = torch.arange(self.features.shape[1], device=index.device)
        mask = positions[None, :] < self.valid.index_select(0, index)[:, None]
        return replace(batch, features=self.features.index_select(0, index), mask=mask, full=self.full)


def cache_on(setting: str, device: torch.device, nbytes: int) -> bool:
    """Whether the training features go to ``device`` (``data.cache``): ``device`` always, ``none``
    never, ``auto`` on a GPU when ``nbytes`` fit in ``CACHE_SHARE`` of its free memory."""
    if setting not in CACHES:
        raise ConfigError(f"data.cache={setting!r} is not one of {list(CACHES)}")
    if setting != "auto":
        return setting == "device"
    return device.type == "cuda" and nbytes <= CACHE_SHARE * torch.cuda.mem_get_info(device)[0]


class PrefetchLoader(DataLoader):
    """A DataLoader whose batches arrive on ``device`` (CUDA), copied from page-locked memory on a
    side stream as the loop fetches them, one batch ahead (Lightning's fetcher); each carries the
    event that ends its copy (``Batch.ready``), which the compute stream waits for only when the
    batch is used (``CaptionDataModule.on_after_batch_transfer``), so the copy of the next batch
    overlaps the current step.  Elsewhere it is the DataLoader it wraps.  A subclass, so that
    Lightning can still give it a DistributedSampler under DDP."""

    def __init__(self, *args, device: torch.device | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.device = device

    def __iter__(self) -> Iterator:
        batches = super().__iter__()
        if self.device is None or self.device.type != "cuda":
            yield from batches
            return
        stream = torch.cuda.Stream(self.device)
        for batch in batches:
            with torch.cuda.stream(stream):
                moved = batch.to(self.device)
                ready = torch.cuda.Event()
                ready.record(stream)
            yield replace(moved, ready=ready)


def when_ready(batch: Batch) -> Batch:
    """``batch`` made safe to read on the current stream: it waits for the batch's copy
    (``Batch.ready``), and the copy's memory is not reused before this stream is done with it."""
    if batch.ready is None:
        return batch
    stream = torch.cuda.current_stream()  # the training device's (Lightning makes it the current one)
    stream.wait_event(batch.ready)
    for t in (batch.features, batch.mask, batch.tokens, batch.index):
        if t is not None:
            t.record_stream(stream)
    return replace(batch, ready=None)


class CaptionDataModule(pl.LightningDataModule):
    """Train/val/test loaders over a FeatureStore.  ``splits``: a ``CaptionTable`` (its train, val
    and test rows), or each split's list of CaptionRecord.  ``per_item``: self-critical training, one
    item with one reference per sample; else ``batching`` (``image`` | ``caption``), with
    ``captions_per_image`` (None: every training item's number of references) and ``cache``."""

    def __init__(
        self,
        splits: CaptionTable | dict[str, list[CaptionRecord]],
        store: FeatureStore,
        vocab: Vocabulary,
        *,
        max_length: int = 20,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        num_workers: int = 2,
        per_item: bool = False,
        batching: str = "image",
        captions_per_image: int | None = None,
        cache: str = "none",
        seed: int = 0,
    ) -> None:
        super().__init__()
        if batching not in BATCHINGS:
            raise ConfigError(f"data.batching={batching!r} is not one of {list(BATCHINGS)}")
        if captions_per_image is not None and captions_per_image < 1:
            raise ConfigError(f"data.captions_per_image={captions_per_image} must be >= 1 (or null: all references)")
        self.seed = seed  # the loaders' own generators and the per-epoch caption draws
        self.store, self.vocab, self.max_length = store, vocab, max_length
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size or batch_size
        self.num_workers, self.cache_setting = num_workers, cache
        self.items = ({name: FeatureItems(splits, store, name) for name in SPLITS} if isinstance(splits, CaptionTable)
                      else {name: FeatureItems(recs, store) for name, recs in splits.items()})
        for name, items in self.items.items():
            if len(items) == 0 and name in ("train", "val"):
                raise DataError(f"split '{name}' has no items with features in {store.root}: "
                                "run captioning-extract for this dataset first")
        train = self.items["train"]
        if per_item:
            self.group: int | None = 1  # SCST: an item and the reference of its cross-entropy term
        elif batching == "image":
            self.group = captions_per_image or int(train.n_captions.min())
        else:
            self.group = None  # one caption per sample
        self.items_per_batch = batch_size if self.group is None else max(1, round(batch_size / self.group))
        self.cache: DeviceFeatures | None = None

    def train_batches(self, processes: int = 1) -> int:
        """Training batches per epoch on each of ``processes`` (a DistributedSampler's share)."""
        train = self.items["train"]
        samples = len(train) if self.group is not None else int(train.n_captions.sum())
        return math.ceil(math.ceil(samples / max(processes, 1)) / self.items_per_batch)

    @property
    def batch_shape(self) -> tuple[int, int]:
        """``(items, captions)`` of a full training batch: what a compiled run pads every batch to."""
        return self.items_per_batch, self.items_per_batch * (self.group or 1)

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool, workers: int | None = None,
                device: torch.device | None = None) -> DataLoader:
        # The shuffle takes its seed from the process's random stream once per epoch, whatever the
        # number of workers (a resumed run draws what an uninterrupted one would); the seed a
        # DataLoader draws for its workers comes from a generator of its own (drawn from the
        # process's stream it would shift dropout by one draw per epoch without workers only).
        workers = self.num_workers if workers is None else workers
        return PrefetchLoader(
            dataset, batch_size=batch_size, sampler=RandomSampler(dataset) if shuffle else None,
            generator=torch.Generator().manual_seed(self.seed), num_workers=workers, collate_fn=collate,
            pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0, drop_last=False, device=device)

    def _device(self) -> torch.device:
        trainer = self.trainer
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")

    def train_dataloader(self) -> DataLoader:
        device, train = self._device(), self.items["train"]
        store = train.store
        nbytes = len(train) * store.positions * store.dim * store.dtype.itemsize
        if self.cache is None and cache_on(self.cache_setting, device, nbytes):
            self.cache = DeviceFeatures.load(train, device)
            log.info("data.cache=%s: %d training items (%.2f GB) resident on %s", self.cache_setting, len(train),
                     self.cache.nbytes / 1e9, device)
        features = self.cache is None  # cached: the loader reads captions only, the device gathers
        if self.group is None:
            ds: Dataset = CaptionTrainDataset(train, self.vocab, self.max_length, features=features)
        else:
            ds = CaptionsPerItemDataset(train, self.vocab, self.max_length, self.group, seed=self.seed,
                                        features=features)
            ds.set_epoch(self.trainer.current_epoch if self.trainer is not None else 0)
        return self._loader(ds, self.items_per_batch, shuffle=True, workers=None if features else 0,
                            device=device if features else None)

    def on_after_batch_transfer(self, batch: Batch, dataloader_idx: int) -> Batch:
        if isinstance(batch, Batch):
            batch = when_ready(batch)  # a batch copied ahead on a side stream
        if self.cache is not None and batch.features is None:  # a training batch of a cached split
            return self.cache.fill(batch)
        return batch

    def val_dataloader(self) -> DataLoader:
        return self._loader(CaptionEvalDataset(self.items["val"]), self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(CaptionEvalDataset(self.items["test"]), self.eval_batch_size, shuffle=False)

    def loader(self, split: str) -> DataLoader:
        return self._loader(CaptionEvalDataset(self.items[split]), self.eval_batch_size, shuffle=False)
