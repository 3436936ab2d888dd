"""End-to-end fine-tuning: the CNN encoder trained with the caption decoder, from raw images.

Show-Attend-Tell trains its decoder on the annotation vectors of a frozen CNN; sgrvinod's
tutorial then fine-tunes the CNN's last blocks together with the decoder at a lower learning
rate (its ``fine_tune_encoder``).  Here that is a second training stage:

    captioning-train data=coco model=soft_attention                  # 1. stored features, frozen CNN
    captioning-train data=coco model=soft_attention stage=finetune \\
        init_from=outputs/train/<stage 1 run>/checkpoints/best.ckpt   # 2. the CNN's last blocks too

Stage 2 reads the images again (the extraction job's decoding and resize/crop,
``MediaDataset``), runs the backbone the FeatureStore was extracted with (rebuilt from the
store's meta, same weights, checked) and turns its grid into the [h*w, C] annotation vectors the
store would hold; the parent ``CaptioningModule`` takes it from there (loss, validation by
decoding, checkpoints, AMP and DDP as Lightning gives them).  Of the encoder, only the last
``finetune.blocks`` stages (``captioning.features.backbones.stages``: EfficientNet blocks,
ResNet layers, VGG conv blocks, timm models' feature stages, a ViT's transformer blocks and final
norm) train, with their own learning rate ``finetune.encoder_lr`` on the
decoder's schedule; BatchNorm layers keep their ImageNet statistics and affine parameters
(eval mode, frozen: caption batches are small and their statistics noisy).

The checkpoint holds the encoder's weights (``encoder.*``) and a feature meta whose settings
record the fine-tuning (``settings["finetune"]``), so the stored features, computed before
fine-tuning, no longer match it: ``captioning-caption`` / ``captioning.Captioner`` featurize raw
inputs with the checkpoint's own encoder, and jobs that read the store refuse it by name.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

from captioning.data.datamodule import Batch, CaptionDataModule, FeatureItems
from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError, DataError
from captioning.features.backbones import Backbone, Preprocessing, stages
from captioning.features.encoders import build_encoder
from captioning.features.extract import MediaDataset, MediaItem
from captioning.features.featurize import encoder_config, rebuild_backbone, stored_preprocessing
from captioning.models.search import DecodeConfig
from captioning.train.module import CaptioningModule
from captioning.train.settings import ModuleSettings
from captioning.train.stage import stage_named

log = logging.getLogger("captioning.train.finetune")


@dataclass
class FinetuneConfig:
    """``stage=finetune``: train the encoder's last ``blocks`` stages with the decoder, from raw images."""

    blocks: int = 3  # the last k stages of the encoder (backbones.stages) train; the rest stay frozen
    encoder_lr: float = 1.0e-4  # their learning rate (the decoder keeps optim.lr); the same schedule

    def validate(self) -> FinetuneConfig:
        if self.blocks < 1:
            raise ConfigError(f"finetune.blocks={self.blocks}: train at least 1 stage of the encoder")
        if not self.encoder_lr > 0:
            raise ConfigError(f"finetune.encoder_lr={self.encoder_lr} must be > 0")
        return self


# ------------------------------------------------------------------------------- the encoder


def finetuned_meta(store_meta: Mapping[str, Any], cfg: FinetuneConfig) -> dict[str, Any]:
    """The feature meta of a fine-tuned model: the store's, with ``settings["finetune"]`` recording
    the fine-tuning (so the store's features are refused for it) and ``dtype`` float32 (the
    encoder's output goes to the decoder as it is, not through a float16 store)."""
    if store_meta.get("streams"):
        raise ConfigError("stage=finetune needs one feature store (a 2-D image encoder), not several "
                          "feature streams: set features_dir=<one folder>")
    if store_meta.get("kind", "image") != "image":
        raise ConfigError("stage=finetune trains an image encoder from raw images: it needs data.kind=image "
                          "(video features cannot be fine-tuned here)")
    if not isinstance(store_meta.get("encoder"), dict):
        raise ConfigError("stage=finetune needs a feature store that records its encoder (written by "
                          "captioning-extract): re-extract the features")
    settings = {**store_meta["settings"], "finetune": {"blocks": int(cfg.blocks)}}
    return {**store_meta, "settings": settings, "dtype": "float32"}


def base_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The store meta a fine-tuned model started from (``finetuned_meta`` undone; others: as is)."""
    settings = {k: v for k, v in dict(meta.get("settings") or {}).items() if k != "finetune"}
    return {**meta, "settings": settings}


def unfreeze_last(backbone: Backbone, blocks: int) -> list[str]:
    """Let the parameters of the last ``blocks`` stages of ``backbone`` train, BatchNorm excepted;
    -> those stages' names.  The ``Backbone`` stays in eval mode whatever ``train()`` asks."""
    found = stages(backbone)
    if blocks > len(found):
        raise ConfigError(f"finetune.blocks={blocks} but encoder {backbone.cfg.name} (layer {backbone.layer}) has "
                          f"{len(found)} stages: {', '.join(n for n, _ in found)}")
    for _, stage in found[-blocks:]:
        for m in stage.modules():
            if not isinstance(m, nn.modules.batchnorm._BatchNorm):
                for p in m.parameters(recurse=False):
                    p.requires_grad_(True)
    return [n for n, _ in found[-blocks:]]


# ------------------------------------------------------------------------------------ model


class FinetuneModule(CaptioningModule):
    """``CaptioningModule`` + the CNN encoder, trained together from raw images.

    ``encoder``: the backbone of the features' meta (``base_meta``), its last ``finetune.blocks``
    stages trainable (``trained_stages``).  Batches are ``ImageBatch`` (uint8 crops); ``encode``
    turns them into the annotation vectors a FeatureStore holds, and the parent's steps go on.
    ``initial_weights``: build the encoder with the weights the store records and check it (a new
    run); otherwise with random weights, which a checkpoint's state dict replaces (loading a
    checkpoint needs no weights file or download).
    """

    def __init__(self, settings: ModuleSettings, vocab: dict, feature_meta: dict, config: Mapping[str, Any], *,
                 finetune: FinetuneConfig, source: str, initial_weights: bool = False) -> None:
        super().__init__(settings, vocab, feature_meta, config)
        self.finetune_cfg = finetune.validate()
        base = base_meta(feature_meta)
        if initial_weights:
            encoder = rebuild_backbone(base, source)
        else:
            encoder = build_encoder(dataclasses.replace(encoder_config(base, source), weights="none"))
        if encoder.is_clip_encoder or base.get("kind", "image") != "image":
            raise ConfigError("stage=finetune fine-tunes a 2-D image encoder: it needs data.kind=image")
        self.encoder = encoder
        self.preprocessing: Preprocessing = encoder.preprocessing()
        self.trained_stages = unfreeze_last(encoder, self.finetune_cfg.blocks)

    @classmethod
    def from_hparams(cls, config: Mapping[str, Any], vocab: dict, feature_meta: dict, **extra: Any) -> FinetuneModule:
        """As ``CaptioningModule.from_hparams``, with the checkpoint's ``finetune`` settings."""
        finetune = FinetuneConfig(**(config.get("finetune") or {}))
        return cls(ModuleSettings.from_config(config), vocab, feature_meta, config, finetune=finetune,
                   source=f"features_dir={config.get('features_dir')}", **extra)

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 crops [B, 3, S, S] -> annotation vectors [B, h*w, C] (row-major grid, as stored)."""
        grid = self.encoder(self.preprocessing.normalize(pixels))  # [B, C, h, w]
        return grid.flatten(2).transpose(1, 2)

    def _features(self, batch: ImageBatch) -> Batch:
        feats = self.encode(batch.pixels)
        mask = torch.ones(feats.shape[:2], dtype=torch.bool, device=feats.device)
        return Batch(feats, mask, batch.tokens, batch.index, batch.lengths, full=True)

    def training_step(self, batch: ImageBatch, batch_idx: int):
        return super().training_step(self._features(batch), batch_idx)

    def validation_step(self, batch: ImageBatch, batch_idx: int) -> None:
        return super().validation_step(self._features(batch), batch_idx)

    def describe(self, batch: ImageBatch, cfg: DecodeConfig) -> list[dict]:
        return super().describe(self._features(batch), cfg)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False):
        """As ``nn.Module``'s; weights without any ``encoder.*`` tensor (a run on the stored
        features: ``init_from`` a stage-1 checkpoint) leave the encoder as it is."""
        if not any(k.startswith("encoder.") for k in state_dict):
            own = {f"encoder.{k}": v for k, v in self.encoder.state_dict().items()}
            state_dict = {**own, **state_dict}
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def parameter_groups(self) -> list[dict[str, Any]]:
        """The decoder's group at ``optim.lr`` and the encoder's trained stages at
        ``finetune.encoder_lr``, on the same schedule; the frozen stages are in no group."""
        tuned = [p for p in self.encoder.parameters() if p.requires_grad]
        log.info("fine-tuning encoder stages %s (%d tensors) at lr %g", self.trained_stages, len(tuned),
                 self.finetune_cfg.encoder_lr)
        return [*super().parameter_groups(), {"params": tuned, "lr": self.finetune_cfg.encoder_lr}]


# ------------------------------------------------------------------------------------- data


@dataclass
class ImageBatch:
    """pixels: uint8 [B, 3, S, S] (resized and cropped, not normalised); tokens: [B, T+2] long
    sorted longest first, or None at evaluation; index: [B] the items' indices in the split;
    lengths: [B] each caption's real steps, on the host."""

    pixels: torch.Tensor
    tokens: torch.Tensor | None
    index: torch.Tensor
    lengths: torch.Tensor | None = None

    def to(self, device: torch.device | str, **kwargs: Any) -> ImageBatch:
        return ImageBatch(self.pixels.to(device, non_blocking=True),
                          None if self.tokens is None else self.tokens.to(device, non_blocking=True),
                          self.index.to(device, non_blocking=True), self.lengths)


class ImageCaptions(Dataset):
    """A split's images, decoded and cropped as the extraction job does (``MediaDataset``): one
    sample per (item, reference caption) with its tokens when ``vocab`` is given (training), else
    one per item.  -> (pixels uint8 [3, S, S], tokens [T+2] | None, item index)."""

    def __init__(self, items: FeatureItems, media_dir: str, preprocessing: Preprocessing,
                 vocab: Vocabulary | None = None, max_length: int = 20) -> None:

        self.media = MediaDataset([MediaItem(r.item_id, os.path.join(media_dir, r.path)) for r in items.records],
                                  "image", preprocessing)
        if vocab is None:
            self.samples: list[tuple[int, list[int] | None]] = [(i, None) for i in range(len(items))]
        else:
            self.samples = [(i, [vocab.bos, *vocab.encode(ref.split(), max_length), vocab.eos])
                            for i, refs in enumerate(items.references) for ref in refs]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        i, tokens = self.samples[k]
        got = self.media[i]
        if got["error"] is not None:
            raise DataError(f"cannot read image {got['path']} (item {got['id']}): {got['error']}; it was read when "
                            f"the features were extracted: restore the file (or re-extract without it)")
        return got["pixels"], None if tokens is None else torch.tensor(tokens), i


def collate_images(samples: list[tuple[torch.Tensor, torch.Tensor | None, int]], pad: int = 0) -> ImageBatch:
    """Stack the crops; right-pad the token ids, longest caption first (as ``datamodule.collate``)."""
    if samples[0][1] is not None:
        samples = sorted(samples, key=lambda s: -len(s[1]))  # type: ignore[arg-type]
    pixels = torch.stack([s[0] for s in samples])
    index = torch.tensor([s[2] for s in samples])
    if samples[0][1] is None:
        return ImageBatch(pixels, None, index)
    tokens = torch.full((len(samples), max(len(s[1]) for s in samples)), pad, dtype=torch.long)  # type: ignore[arg-type]
    for b, s in enumerate(samples):
        tokens[b, : len(s[1])] = s[1]  # type: ignore[arg-type]
    return ImageBatch(pixels, tokens, index, torch.tensor([len(s[1]) - 1 for s in samples]))  # type: ignore[arg-type]


class ImageCaptionDataModule(CaptionDataModule):
    """``CaptionDataModule`` over the raw images of the items that have features in ``store``
    (those the extraction job could read), cropped with ``preprocessing``."""

    def __init__(self, splits: dict, store: Any, vocab: Vocabulary, *, media_dir: str,
                 preprocessing: Preprocessing, **kwargs: Any) -> None:
        super().__init__(splits, store, vocab, **kwargs)
        self.media_dir = media_dir
        self.preprocessing = preprocessing

    def _loader(self, dataset: Dataset, batch_size: int, shuffle: bool) -> DataLoader:
        # seeded as CaptionDataModule's loaders: the number of workers changes nothing
        return DataLoader(dataset, batch_size=batch_size, sampler=RandomSampler(dataset) if shuffle else None,
                          generator=torch.Generator().manual_seed(self.seed), num_workers=self.num_workers,
                          collate_fn=functools.partial(collate_images, pad=self.vocab.pad),
                          pin_memory=torch.cuda.is_available(), persistent_workers=self.num_workers > 0)

    def _images(self, split: str, training: bool = False) -> ImageCaptions:
        return ImageCaptions(self.items[split], self.media_dir, self.preprocessing,
                             self.vocab if training else None, self.max_length)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self._images("train", training=True), self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self._images("val"), self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self._images("test"), self.eval_batch_size, shuffle=False)

    def loader(self, split: str) -> DataLoader:
        return self._loader(self._images(split), self.eval_batch_size, shuffle=False)


def finetune_data(cfg: Any, splits: dict, store: Any, vocab: Vocabulary) -> tuple[ImageCaptionDataModule, dict]:
    """The training job's fine-tuning inputs (``cfg``: its ``TrainConfig``): the raw-image data
    module and the model's feature meta (``finetuned_meta`` of the store's)."""

    cfg.finetune.validate()
    if cfg.data.kind != "image":
        raise ConfigError(f"stage=finetune needs an image dataset; data={cfg.data.name} is '{cfg.data.kind}'")
    if store.meta.get("imported"):
        raise ConfigError(f"stage=finetune needs the encoder of the features, but {store.root} holds imported "
                          f"features (captioning-import): fine-tune on features from captioning-extract")
    meta = finetuned_meta(store.meta, cfg.finetune)
    dm = ImageCaptionDataModule(
        splits, store, vocab, media_dir=cfg.data.media_dir, preprocessing=stored_preprocessing(store.meta),
        max_length=cfg.data.max_length, batch_size=cfg.data.batch_size, eval_batch_size=cfg.eval_batch_size,
        num_workers=cfg.data.num_workers, batching="caption", seed=cfg.seed,  # raw images: one per caption
    )
    return dm, meta


def captioner_class(config: Mapping[str, Any]) -> type[CaptioningModule]:
    """The LightningModule class of a checkpoint's ``config``: ``FinetuneModule`` when it was trained
    end to end (its encoder weights are in the checkpoint), else ``CaptioningModule``."""
    return FinetuneModule if stage_named(config.get("stage", "xe")).from_images else CaptioningModule
