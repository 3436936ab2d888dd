"""Attention images during training: the caption API's figures of a few validation items, per epoch.

``AttentionImages`` is a Lightning callback (``conf/callbacks/attention_images.yaml``): after each
validation it decodes the same few validation items as validation decodes them (``Captioner``),
draws each one's caption and per-word attention (``attention_image``) and sends the images to
every logger that takes images (``log_images``).  It lives with the caption API it draws with.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from pytorch_lightning.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

from captioning.caption.api import Captioner
from captioning.errors import ConfigError
from captioning.features.featurize import display_crop
from captioning.viz.heatmaps import build_result_figure

__all__ = ["AttentionImages", "attention_image", "log_images", "takes_images"]


def log_images(logger: Any, key: str, images: Sequence[np.ndarray], names: Sequence[str],
               captions: Sequence[str], step: int) -> bool:
    """Send ``images`` ([H, W, 3] uint8 each) to ``logger`` if it takes images: TensorBoard
    (one tag ``key/name`` each), Weights & Biases (one ``key`` panel, with ``captions``), MLflow
    (artifacts ``key/step<step>_<name>.png``).  Returns whether it did."""
    if isinstance(logger, TensorBoardLogger):
        for name, image in zip(names, images, strict=True):
            logger.experiment.add_image(f"{key}/{name}", image, step, dataformats="HWC")
    elif isinstance(logger, WandbLogger):
        logger.log_image(key=key, images=list(images), step=step, caption=list(captions))
    elif isinstance(logger, MLFlowLogger):
        for name, image in zip(names, images, strict=True):
            logger.experiment.log_image(logger.run_id, image, artifact_file=f"{key}/step{step:07d}_{name}.png")
    else:
        return False
    return True


def takes_images(logger: Any) -> bool:
    return isinstance(logger, (TensorBoardLogger, WandbLogger, MLFlowLogger))


def attention_image(result: Any, *, title: str | None = None, dpi: int = 50) -> np.ndarray:
    """The attention figure of one ``captioning.caption.api.CaptionResult`` as an [H, W, 3] uint8 array:
    an image's crop then one heatmap per word (image regions: their boxes shaded), or a video's frame
    strip above the words x frames alignment; drawn on gray where the result has no pixels."""
    fig = build_result_figure(result, title=result.caption if title is None else title)
    fig.set_dpi(dpi)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


class AttentionImages(pl.Callback):
    """After each validation, the first ``items`` validation items (the same ones every epoch)
    are decoded as validation decodes them, and each one's caption (with its first reference)
    and per-word attention are drawn (``attention_image``) and sent to every logger that takes
    images (``log_images``); nothing is drawn when none does.  ``media_dir``: the dataset's media
    folder, for the crop behind the heatmaps (gray when a file cannot be read).  Rank zero only;
    the random state of training is left as it was (sampling decoders draw from a forked RNG)."""

    def __init__(self, items: int = 4, media_dir: str | None = None, dpi: int = 50, key: str = "val/attention") -> None:
        if items < 0:
            raise ConfigError(f"callbacks.attention_images.items={items} must be >= 0")
        self.items, self.media_dir, self.dpi, self.key = int(items), media_dir, int(dpi), key
        self._pixels: list[np.ndarray | None] | None = None  # the fixed items' crops, read once

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero or self.items == 0:
            return
        loggers = [lg for lg in trainer.loggers if takes_images(lg)]
        dm = getattr(trainer, "datamodule", None)
        if not loggers or dm is None or "val" not in getattr(dm, "items", {}):
            return
        names, images, captions = self.render(pl_module, dm)
        for lg in loggers:
            log_images(lg, self.key, images, names, captions, trainer.global_step)

    def render(self, pl_module: pl.LightningModule, dm: Any) -> tuple[list[str], list[np.ndarray], list[str]]:
        """(item ids, images, captions) of the fixed validation items under the current weights."""

        val = dm.items["val"]
        records = val.records[: self.items]
        stored = [val.store[r.item_id] for r in records]
        if self._pixels is None:
            self._pixels = [self._crop(dict(dm.store.meta), r.path, s.frame_indices) for r, s in zip(records, stored, strict=True)]
        device = pl_module.device
        with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
            results = Captioner(pl_module, device=device).caption_features(
                [np.array(s.features) for s in stored], [s.valid for s in stored], frame_indices=[s.frame_indices for s in stored],
                images=self._pixels, names=[r.item_id for r in records], decode=pl_module.settings.decode,
                boxes=[s.boxes for s in stored], image_sizes=[s.image_size for s in stored],
            )
        captions = [f"{r.caption}  (reference: {val.references[i][0]})" for i, r in enumerate(results)]
        images = [attention_image(r, title=c, dpi=self.dpi) for r, c in zip(results, captions, strict=True)]
        return [r.item_id for r in records], images, captions

    def _crop(self, meta: dict, path: str, frame_indices: Sequence[int] | None) -> np.ndarray | None:
        """The crop the features were computed from ([S,S,3] or [K,S,S,3] uint8), or None."""

        if not self.media_dir:
            return None
        try:
            pixels = display_crop(meta, os.path.join(self.media_dir, path), frame_indices)
        except Exception:  # no media at hand (features only) or no preprocessing recorded: gray
            return None
        x = pixels.permute(1, 2, 0) if pixels.ndim == 3 else pixels.permute(0, 2, 3, 1)
        return np.ascontiguousarray(x.numpy().astype(np.uint8))
