"""The extraction job (``captioning-extract``): CNN feature grids of every image/video of a dataset -> a FeatureStore.

    captioning-extract data=shapes encoder=efficientnet_lite0 trainer=cpu
    captioning-extract data=moving_shapes encoder=resnet152 trainer=gpu encoder.frames=28
    captioning-extract trainer=ddp_cpu            # 2 CPU processes (gloo), each writing its own shards

Every split's items are extracted once (unique ids).  Running the same command again skips the
ids already in ``features_dir`` (a killed run resumes).  Unreadable files are recorded in the
store's failures and the exit status is 1; configuration errors exit with status 2.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from captioning.config import (
    DataConfig,
    TrainerConfig,
)
from captioning.data.annotations import read_dataset
from captioning.errors import ConfigError
from captioning.features.backbones import EncoderConfig, validate_encoder_config
from captioning.features.encoders import build_encoder, is_clip_encoder
from captioning.features.extract import run_extraction, unique_items

log = logging.getLogger("captioning.extract")


@dataclass
class ExtractConfig:
    data: DataConfig = field(default_factory=DataConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    features_dir: str = MISSING  # conf/extract.yaml: ${data.root}/features/${encoder.name}
    batch_size: int = 32
    num_workers: int | None = None  # DataLoader workers; None: one per available core (at most 16)
    jpeg_decoder: str = "auto"  # auto (nvjpeg on a GPU, else PIL) | pil | nvjpeg: where JPEGs are decoded
    jpeg_library: str = "auto"  # auto (torchcodec where it decodes on the GPU, else torchvision) | torchcodec | torchvision
    dtype: str = "float16"  # float16 | float32
    shard_size: int = 256
    limit: int | None = None  # only the first N unique items (smoke runs)
    seed: int = 0


def dataset_items(cfg: ExtractConfig) -> list[Any]:
    """Unique (item_id, media path) of every split of ``cfg.data`` as MediaItems."""

    dataset = read_dataset(cfg.data)
    for reason in dataset.skipped[:10]:
        log.warning("skipped annotation: %s", reason)
    if len(dataset.skipped) > 10:
        log.warning("... %d annotation records skipped in all", len(dataset.skipped))
    pairs = [(r.item_id, os.path.join(cfg.data.media_dir, r.path)) for r in dataset.records]
    items = unique_items(pairs)
    if cfg.limit is not None:
        items = items[: cfg.limit]
    return items


def extract(cfg: ExtractConfig) -> dict[str, Any]:
    """Run the extraction job; returns the summary dict (processed, skipped_done, failed, ...)."""
    import pytorch_lightning as pl


    validate_encoder_config(cfg.encoder, clip=is_clip_encoder(cfg.encoder.name))
    if cfg.data.kind not in ("image", "video"):
        raise ConfigError(f"data.kind={cfg.data.kind!r} is not valid: use image | video")
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    items = dataset_items(cfg)
    backbone = build_encoder(cfg.encoder)
    summary = run_extraction(
        items, cfg.data.kind, backbone, cfg.features_dir, trainer=cfg.trainer.kwargs(predict=True),
        batch_size=cfg.batch_size, num_workers=cfg.num_workers, dtype=cfg.dtype, shard_size=cfg.shard_size,
        jpeg_decoder=cfg.jpeg_decoder, jpeg_library=cfg.jpeg_library,
    )
    return summary.to_dict()
