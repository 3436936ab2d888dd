"""Training callbacks of our own: progress that suits log files, and the two the job always adds.

``progress_bar`` picks Lightning's live bar on a terminal and ``LineProgress`` elsewhere (SLURM,
CI, pipes), where a live bar writes one line per step.  Built from ``conf/callbacks/progress.yaml``
(a ``_target_`` node) like Lightning's own callbacks; the attention images of each validation are
``captioning.caption.callbacks.AttentionImages`` (they draw with the caption API).

Every bar shows the training losses of the last logging step (``CaptioningModule.progress_metrics``,
read on the host there): a value logged with ``prog_bar=True`` would be read back from the device at
every step (Lightning converts the progress bar's metrics after each batch).

``DataEpoch`` tells the training data which epoch it is serving (the per-epoch caption draws are
seeded by it); ``captioning.train.job`` adds it.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ProgressBar

from captioning.errors import ConfigError

__all__ = ["DataEpoch", "LineProgress", "progress_bar"]

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

        base = RichProgressBar if bar == "rich" else TQDMProgressBar
        return type(base.__name__, (LoggedLosses, base), {})()
    return LineProgress(every_percent)


class LoggedLosses:
    """A progress bar mixin: the metrics Lightning gives a bar, and the training losses of the last
    logging step (``progress_metrics`` of the module)."""

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)  # type: ignore[misc]
        return {**metrics, **getattr(pl_module, "progress_metrics", {})}


class LineProgress(LoggedLosses, ProgressBar):
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


class DataEpoch(pl.Callback):
    """Each training epoch's number to a training dataset that draws per epoch (``set_epoch``) as
    the epoch starts (Lightning sets only the sampler's; the data module sets the first epoch's
    when it makes the loader, whose first batch is read before this hook)."""

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        set_epoch = getattr(getattr(trainer.train_dataloader, "dataset", None), "set_epoch", None)
        if callable(set_epoch):
            set_epoch(trainer.current_epoch)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _format(metrics: dict[str, Any]) -> str:
    parts = []
    for k, v in metrics.items():
        v = v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v
        parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    return ("  " + " ".join(parts)) if parts else ""
