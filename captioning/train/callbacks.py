"""Training callbacks of our own: progress that suits log files, and attention images per epoch.

``progress_bar`` picks Lightning's live bar on a terminal and ``LineProgress`` elsewhere (SLURM,
CI, pipes), where a live bar writes one line per step.  ``AttentionImages`` decodes the same few
validation items after every validation and sends each one's caption and per-word attention
heatmaps, as an image, to every logger that takes images (``log_images``).  Both are built from
``conf/callbacks/*.yaml`` (``_target_`` nodes) like Lightning's own callbacks.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ProgressBar

from captioning.caption.api import Captioner
from captioning.errors import ConfigError
from captioning.features.featurize import display_crop
from captioning.viz.heatmaps import build_result_figure

__all__ = ["AttentionImages", "LineProgress", "attention_image", "log_images", "progress_bar"]

log = logging.getLogger("captioning.progress")

BARS = ("rich", "tqdm")


def progress_bar(bar: str = "rich", every_percent: float = 10.0, stream: Any = None) -> ProgressBar:
    """Lightning's live ``bar`` (rich | tqdm) when ``stream`` (default stdout) is a terminal, else
    ``LineProgress(every_percent)``: a live bar redraws per step, which in a log file is a line per step."""
    if bar not in BARS:
        raise ConfigError(f"callbacks.progress.bar={bar!r} is not one of {list(BARS)}")
    stream = sys.stdout if stream is None else stream
    if getattr(stream, "isatty", lambda: False)():
        from pytorch_lightning.callbacks import RichProgressBar, TQDMProgressBar

        return RichProgressBar() if bar == "rich" else TQDMProgressBar()
    return LineProgress(every_percent)


class LineProgress(ProgressBar):
    """Progress as log lines: one each time another ``every_percent`` of the training epoch is done
    (and at its last batch), one per validation with its scores.  An epoch of unknown length
    gets its line at the end only."""

    def __init__(self, every_percent: float = 10.0) -> None:
        super().__init__()
        if not 0 < every_percent <= 100:
            raise ConfigError(f"callbacks.progress.every_percent={every_percent} must be in (0, 100]")
        self.every = float(every_percent)
        self._enabled = True
        self._next = self.every  # percent of the epoch at which the next line is due
        self._start = self._val_start = 0.0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _epoch(self, trainer: pl.Trainer) -> str:
        last = trainer.max_epochs - 1 if trainer.max_epochs and trainer.max_epochs > 0 else "?"
        return f"epoch {trainer.current_epoch}/{last}"

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._next, self._start = self.every, time.monotonic()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        total, done = self.total_train_batches, batch_idx + 1
        if not self._enabled or not math.isfinite(total) or total <= 0:
            return
        percent = 100.0 * done / total
        if percent + 1e-9 < self._next and done < total:
            return
        self._next = (math.floor(percent / self.every + 1e-9) + 1) * self.every
        elapsed = time.monotonic() - self._start
        rate = done / max(elapsed, 1e-9)
        eta = (total - done) / rate
        metrics = {k: v for k, v in self.get_metrics(trainer, pl_module).items()  # this epoch's only
                   if k != "v_num" and not k.startswith("val/") and not k.endswith("_epoch")}
        log.info("%s %3.0f%% (%d/%d batches, %.1f batch/s, eta %s)%s", self._epoch(trainer), percent, done,
                 total, rate, _clock(eta), _format(metrics))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._enabled and not math.isfinite(self.total_train_batches):
            log.info("%s done (%s)", self._epoch(trainer), _clock(time.monotonic() - self._start))

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = time.monotonic()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._enabled or trainer.sanity_checking:
            return
        scores = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        log.info("%s validation (%s)%s", self._epoch(trainer), _clock(time.monotonic() - self._val_start),
                 _format(scores))


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _format(metrics: dict[str, Any]) -> str:
    parts = []
    for k, v in metrics.items():
        v = v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v
        parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    return ("  " + " ".join(parts)) if parts else ""


# ----------------------------------------------------------------------------------------------
# attention images
# ----------------------------------------------------------------------------------------------


def log_images(logger: Any, key: str, images: Sequence[np.ndarray], names: Sequence[str],
               captions: Sequence[str], step: int) -> bool:
    """Send ``images`` ([H, W, 3] uint8 each) to ``logger`` if it takes images: TensorBoard
    (one tag ``key/name`` each), Weights & Biases (one ``key`` panel, with ``captions``), MLflow
    (artifacts ``key/step<step>_<name>.png``).  Returns whether it did."""
    from pytorch_lightning.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

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
    from pytorch_lightning.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

    return isinstance(logger, (TensorBoardLogger, WandbLogger, MLFlowLogger))


def attention_image(result: Any, *, title: str | None = None, dpi: int = 50) -> np.ndarray:
    """The attention figure of one ``captioning.caption.api.CaptionResult`` as an [H, W, 3] uint8 array:
    an image's crop then one heatmap per word (image regions: their boxes shaded), or a video's frame
    strip above the words x frames alignment; drawn on gray where the result has no pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

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
                images=self._pixels, names=[r.item_id for r in records], decode=pl_module.decode_cfg,
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
