"""The feature extraction job: media files -> backbone grids -> a FeatureStore, as Lightning ``predict``.

Pieces (each usable on its own; ``captioning-extract`` wires them together):

- ``MediaDataset`` (``captioning.features.media_dataset``): (item_id, path) pairs decoded in
  DataLoader workers (one worker per available core by default); a bad file never raises in a
  worker: it comes back as a failure value.  On a GPU the workers pass JPEGs on as their bytes and
  nvjpeg decodes and resizes them on the device, a batch ahead of the forward, on a thread and
  stream of its own (``captioning.features.decode_ahead``; ``jpeg_decoder``).
- ``FeatureExtractor(LightningModule)`` (``captioning.features.extractor``): normalises on the
  device and runs the frozen backbone in inference mode (precision from the Trainer).  Images ->
  [h*w, C]; videos -> per-frame pooled [K, C] or per-frame grids [K*h*w, C] (frame-major); clip
  encoders: one clip per sampled frame, pooled over its space-time [K, C] or over its time
  [K*h*w, C].  The features' copy to the host is not waited for.
- ``StoreWriter`` (``captioning.features.extract_callbacks``): a thread appends each batch to this
  rank's shards through ``FeatureStoreWriter(rank=global_rank)`` and records failures, while the
  next batches run; ``ItemsProgressBar`` counts items.

So the next batch is decoded while this one runs forward and the one before is written, and the
job never waits for the device (no host read of a device value per batch).

Resuming: ids already in the store (``done_ids``) are dropped before the dataset is built, so a
killed run continues where its last complete shard ended.

DDP: rank r extracts every world_size-th item of what is left, from the r-th on (no padding, no
repeats).  The writer still skips ids this rank has already written (or that were done before the
run), and the FeatureStore resolves cross-rank duplicates when it opens (one entry per id).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from captioning.data.video import resolve_backend
from captioning.errors import ConfigError, DataError
from captioning.features.backbones import Backbone, Preprocessing
from captioning.features.decode_ahead import DecodeAhead, wait_for
from captioning.features.device_decode import resolve_jpeg_decoder
from captioning.features.extract_callbacks import ItemsProgressBar, StoreWriter
from captioning.features.extractor import STORE_DTYPES, FeatureExtractor
from captioning.features.media_dataset import MediaDataset, MediaItem, VideoSampling, collate_media
from captioning.store.feature_store import FeatureStore
from captioning.store.layout import settings_diff
from captioning.utils.io import read_json

__all__ = ["ExtractSummary", "FeatureExtractor", "MediaDataset", "MediaItem", "StoreWriter", "VideoSampling",
           "collate_media", "default_workers", "run_extraction", "store_meta", "unique_items"]

log = logging.getLogger("captioning.extract")


@dataclass
class ExtractSummary:
    """What one extraction run did (summed over DDP ranks)."""

    total: int = 0  # unique ids in the dataset
    skipped_done: int = 0  # already in the store before this run
    processed: int = 0  # features written in this run
    failed: int = 0  # bad / missing files recorded in the store's failures
    seconds: float = 0.0
    features_dir: str = ""
    failures: list[str] = field(default_factory=list)  # "<id>: <path>: <error>" (first few, this rank)
    # this rank: (seconds since its first batch was handed to the writer, items) as each batch was
    # written: the job's rate at steady state without a host wait (captioning-bench extract-images)
    written: list[tuple[float, int]] = field(default_factory=list, repr=False)

    @property
    def items_per_second(self) -> float:
        return (self.processed + self.failed) / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("written")
        d["items_per_second"] = round(self.items_per_second, 2)
        return d


# -------------------------------------------------------------------------------- datamodule


class ExtractDataModule(pl.LightningDataModule):
    """The items still to do: rank 0 reads the store's ``done_ids`` and broadcasts the list; rank r
    takes every world_size-th of them from the r-th on.  ``jpeg_library``: None (the workers decode
    every file) or the library that decodes the workers' encoded JPEGs on the device, ahead."""

    def __init__(self, items: Sequence[MediaItem], kind: str, preprocessing: Preprocessing,
                 video: VideoSampling | None, features_dir: str | Path, batch_size: int = 32,
                 num_workers: int = 2, pin_memory: bool = False, jpeg_library: str | None = None) -> None:
        super().__init__()
        self.items = list(items)
        self.kind = kind
        self.pre = preprocessing
        self.video = video
        self.features_dir = Path(features_dir)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.jpeg_library = jpeg_library
        self.done: set[str] = set()
        self.todo: list[MediaItem] | None = None
        self.mine: list[MediaItem] = []

    def setup(self, stage: str) -> None:
        todo: list[MediaItem] | None = None
        done: set[str] = set()
        if self.trainer is None or self.trainer.global_rank == 0:
            done = stored_ids(self.features_dir)
            todo = [it for it in self.items if it.item_id not in done]
        if self.trainer is not None and self.trainer.world_size > 1:
            todo, done = self.trainer.strategy.broadcast((todo, done), src=0)
        self.todo, self.done = todo, done
        rank, ranks = (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)
        self.mine = list(todo or ())[rank::ranks]
        log.info("%d items: %d already in %s, %d to extract", len(self.items), len(self.items) - len(todo or ()),
                 self.features_dir, len(todo or ()))

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """The batch on ``device``: a batch decoded ahead is waited for by the device, not the host."""
        if isinstance(batch, dict):
            batch = wait_for(batch, device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def predict_dataloader(self) -> DataLoader | DecodeAhead:
        assert self.todo is not None, "setup() first"
        ds = MediaDataset(self.mine, self.kind, self.pre, self.video, encoded_jpegs=self.jpeg_library is not None)
        loader = DataLoader(
            ds, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers,
            collate_fn=collate_media, pin_memory=self.pin_memory,
            prefetch_factor=4 if self.num_workers > 0 else None,
            persistent_workers=False,
        )
        if self.jpeg_library is None:
            return loader
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        return DecodeAhead(loader, self.pre, device, library=self.jpeg_library)


def stored_ids(features_dir: str | Path) -> set[str]:
    """Ids with features already in the store at ``features_dir`` (empty when there is none yet)."""

    root = Path(features_dir)
    if not (root / "meta.json").is_file():
        return set()
    return set(FeatureStore.open(root).ids)


# ------------------------------------------------------------------------------------- the job


def store_meta(backbone: Backbone, kind: str, dtype: str) -> dict[str, Any]:
    """The FeatureStore meta of this backbone + preprocessing: settings, kind, positions N, dim C, grid.

    Clip encoders: ``settings`` also holds ``clip`` (length, stride, centre, edges) and
    ``encoder`` the ``clip_length``/``clip_stride`` keys; ``frames`` is K as for 2-D videos.
    Videos: ``video_backend`` names the decoder that reads them (``resolve_backend``); it is a
    record, not a setting that stores compare (the backends decode the same frames).
    """
    cfg = backbone.cfg
    video = kind == "video"
    if backbone.is_clip_encoder and not video:
        raise ConfigError(f"encoder.name={cfg.name} is a 3-D video encoder: it needs data.kind=video "
                          f"(for images use a 2-D encoder, e.g. encoder=efficientnet_lite0)")
    size = cfg.frame_size if video else cfg.image_size
    channels, h, w = backbone.output_shape(size)
    if not video:
        positions, grid = h * w, [h, w]
    elif cfg.video_features == "pooled":
        positions, grid = cfg.frames, None
    else:
        positions, grid = cfg.frames * h * w, [h, w]
    # "encoder": the full EncoderConfig, so captioning-caption can rebuild this exact backbone
    # and preprocessing for raw inputs from a checkpoint alone.
    meta = {"settings": backbone.settings(video=video), "kind": kind, "positions": positions,
            "dim": channels, "grid": grid, "dtype": dtype, "encoder": asdict(cfg)}
    if video:
        meta["frames"] = cfg.frames
        meta["video_backend"] = resolve_backend(cfg.video_backend)
    return meta


def unique_items(pairs: Sequence[tuple[str, str]]) -> list[MediaItem]:
    """(item_id, path) pairs -> MediaItems, first occurrence of each id kept (order preserved)."""
    seen: dict[str, MediaItem] = {}
    for item_id, path in pairs:
        if item_id not in seen:
            seen[item_id] = MediaItem(str(item_id), str(path))
    return list(seen.values())


def default_workers() -> int:
    """DataLoader workers by default: the cores this process may run on (at most 16)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(16, cores))


def run_extraction(items: Sequence[MediaItem], kind: str, backbone: Backbone, features_dir: str | Path, *,
                   trainer: dict[str, Any] | None = None, batch_size: int = 32, num_workers: int | None = None,
                   dtype: str = "float16", shard_size: int = 256, progress: bool = True,
                   callbacks: Sequence[pl.Callback] = (), jpeg_decoder: str = "auto",
                   jpeg_library: str = "auto") -> ExtractSummary:
    """Extract features for ``items`` into the FeatureStore at ``features_dir`` (resumable).

    ``trainer``: ``pytorch_lightning.Trainer`` keyword arguments (accelerator, devices, strategy,
    precision, ...); ``num_workers``: None for ``default_workers()``; ``jpeg_decoder``: ``auto``
    (nvjpeg on a CUDA device, else PIL in the workers), ``pil`` or ``nvjpeg``, with ``jpeg_library``'s
    decoder (``captioning.features.device_decode``).  Returns the summary summed over ranks (same on
    every rank; ``written``: this rank's).
    """
    num_workers = default_workers() if num_workers is None else num_workers
    if dtype not in STORE_DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not valid: use float16 | float32")
    if batch_size < 1 or shard_size < 1 or num_workers < 0:
        raise ConfigError("batch_size and shard_size must be >= 1 and num_workers >= 0")
    start = time.perf_counter()
    backbone.for_inference()  # frozen: batch norms folded into their convolutions
    cfg = backbone.cfg
    video = kind == "video"
    pre = backbone.preprocessing(video=video)
    kw = dict(trainer or {})
    progress = progress and kw.pop("enable_progress_bar", True)
    accelerator = str(kw.get("accelerator", "auto"))
    pin = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    library = resolve_jpeg_decoder(jpeg_decoder, kind, accelerator, jpeg_library)
    meta = store_meta(backbone, kind, dtype)
    if not video:  # a record (stores compare settings, not decoders)
        meta["image_decoder"] = f"nvjpeg ({library}; baseline JPEGs), PIL (other files)" if library else "PIL"
    check_existing_meta(features_dir, meta)
    dm = ExtractDataModule(items, kind, pre, VideoSampling.from_encoder(cfg) if video else None, features_dir,
                           batch_size=batch_size, num_workers=num_workers, pin_memory=pin,
                           jpeg_library=library)
    log.info("%d DataLoader workers; JPEGs decoded by %s", num_workers,
             f"nvjpeg on the device ({library})" if library else "PIL")
    writer = StoreWriter(features_dir, meta, shard_size=shard_size, dtype=dtype)
    cbs: list[pl.Callback] = [writer, *callbacks]
    if progress:
        cbs.append(ItemsProgressBar())
    module = FeatureExtractor(backbone, pre, kind=kind, video_features=cfg.video_features, dtype=dtype)
    kw["use_distributed_sampler"] = False  # each rank takes its share itself (ExtractDataModule.setup)
    pl_trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_model_summary=False,
                            enable_progress_bar=progress, callbacks=cbs, inference_mode=True, **kw)
    pl_trainer.predict(module, datamodule=dm, return_predictions=False)
    totals = writer.totals
    summary = ExtractSummary(
        total=len(dm.items), skipped_done=len(dm.items) - len(dm.todo or ()),
        processed=totals.get("processed", 0), failed=totals.get("failed", 0),
        seconds=time.perf_counter() - start, features_dir=str(features_dir), failures=list(writer.failures),
        written=list(writer.written),
    )
    if pl_trainer.is_global_zero:
        log.info("extraction done: %d processed, %d skipped as done, %d failed (of %d) in %.1fs (%.1f items/s) -> %s",
                 summary.processed, summary.skipped_done, summary.failed, summary.total, summary.seconds,
                 summary.items_per_second, features_dir)
        for line in summary.failures:
            log.error("failed: %s", line)
    return summary


def check_existing_meta(features_dir: str | Path, meta: dict[str, Any]) -> None:
    """Refuse to add to a store written with other settings (another backbone, size, layer...)."""

    path = Path(features_dir) / "meta.json"
    if not path.is_file():
        return
    try:
        old = read_json(path, "feature store meta")
    except DataError:
        return  # the store reports its own corruption when opened
    diff = settings_diff(old, meta) if isinstance(old, dict) else {}
    if diff:
        raise ConfigError(
            f"{features_dir} holds features extracted with other settings ({', '.join(diff)} differ: "
            f"{ {k: t for k, (t, _) in diff.items()} } vs { {k: m for k, (_, m) in diff.items()} }); "
            f"set features_dir=<new folder> or delete the old store"
        )
