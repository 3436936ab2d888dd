"""The LightningModule: one training step of a caption decoder, free-running validation.

A cross-entropy step (``training_step`` then ``optimizer_step``):

    loss = decoder.compute_loss(features, mask, tokens)      teacher forcing (compiled on a GPU)
    loss.backward()                                          Lightning's closure
    update(optimizer)                                        clip, skip if not finite, AdamW (optim.py)

and nothing in it reads a device value back to the host: the caption lengths come from the loader,
a non-finite loss is caught on the device (the fused optimizer skips the update), and the values
logged stay on the device until a logging step (``trainer.log_every_n_steps``) reads them, with
the counts of skipped steps, in one transfer (``on_train_batch_end``).  Self-critical training's
step is ``captioning.train.scst.SelfCritical``.

Validation decodes captions (greedy or beam, never teacher-forced), gathers the predictions of
every rank, drops the duplicates a DistributedSampler pads with, and scores the whole split once,
so BLEU-4/CIDEr-D under DDP equal a single-process run.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist

from captioning.data.vocab import Vocabulary
from captioning.errors import CaptioningError
from captioning.metrics import compute_metrics
from captioning.models.decoders import CaptionDecoder, build_decoder
from captioning.models.positions import layout_from_meta
from captioning.models.search import DecodeConfig, Hypothesis, decode_batch
from captioning.train.compiled import compile_mode, compiled, fixed_shapes
from captioning.train.optim import NonFiniteSteps, apply_update, configure_optimization
from captioning.train.rng_state import capture_rng, restore_rng
from captioning.train.scst import SelfCritical
from captioning.train.settings import ModuleSettings

log = logging.getLogger(__name__)


class NonFiniteLossError(CaptioningError):
    """Raised with ``nonfinite=stop`` when a batch gives a NaN/inf loss."""


def gather_objects(obj: Any) -> list[Any]:
    """All ranks' ``obj`` in rank order (a one-element list without torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


class CaptioningModule(pl.LightningModule):
    """A registered caption decoder (``settings.model``) + vocabulary + optimisation.

    ``settings``: the typed pieces of the training config it reads (``ModuleSettings``);
    ``config``: the run's resolved config as plain data, recorded (never read) in the
    hyper-parameters with the vocabulary and the feature-store meta, so checkpoints load with
    ``torch.load(weights_only=True)``; ``from_hparams`` rebuilds the module from them.
    """

    def __init__(self, settings: ModuleSettings, vocab: dict, feature_meta: dict, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.save_hyperparameters({"config": dict(config), "vocab": vocab, "feature_meta": feature_meta})
        self.settings = settings
        self.vocab = Vocabulary.from_dict(vocab)
        self.decoder: CaptionDecoder = build_decoder(
            settings.model, len(self.vocab), int(feature_meta["dim"]), layout_from_meta(feature_meta),
            pad_id=self.vocab.pad,
        )
        if settings.compile == "true" and not self.decoder.compilable:
            raise CaptioningError(
                f"compile=true: model {type(self.decoder).run_tag(self.decoder.cfg)} cannot be compiled whole "
                f"(hard attention samples on the host, the BiLSTM encoder packs its sequences); train it with "
                f"compile=false or compile=auto"
            )
        self.run_record: dict | None = None  # fingerprint + provenance, saved in every checkpoint
        self.scst = SelfCritical(settings.scst, self.vocab) if settings.stage.loss == "scst" else None
        self.nonfinite = NonFiniteSteps()  # the updates' verdicts, read at logging steps
        self.progress_metrics: dict[str, float] = {}  # the last logging step's values, for progress bars
        self._compiled_loss: Any = None
        self._finite: torch.Tensor | None = None  # this update's losses were all finite (device)
        self._last: tuple = ()  # the last batch's loss, epoch, batch, global step, items
        self._report_due = False  # the update just taken was a logging step's: report at the batch's end
        self._epoch_loss: torch.Tensor | None = None  # this epoch's sum of loss x rows (device)
        self._epoch_rows = 0
        self._val_outputs: list[tuple[int, str]] = []

    @classmethod
    def from_hparams(cls, config: Mapping[str, Any], vocab: dict, feature_meta: dict, **extra: Any) -> CaptioningModule:
        """The module of a checkpoint's hyper-parameters (plain data; ``ModuleSettings.from_config``)."""
        return cls(ModuleSettings.from_config(config), vocab, feature_meta, config, **extra)

    # ------------------------------------------------------------------ training

    def compile_mode(self) -> str | None:
        """None (eager) or torch.compile's mode for this module's device (``compiled.compile_mode``)."""
        return compile_mode(self.settings.compile, self.device, self.decoder.compilable)

    def xe_loss(self, batch) -> dict[str, torch.Tensor]:
        """Teacher-forced loss of a batch: eager with the loader's caption lengths, or compiled at the
        run's one batch shape (``fixed_shapes``: one graph, CUDA graphs on a GPU)."""
        smoothing, mask = self.settings.optim.label_smoothing, None if batch.full else batch.mask
        mode = self.compile_mode()
        if mode is None:
            return self.decoder.compute_loss(batch.features, mask, batch.tokens, smoothing,
                                             lengths=batch.host_lengths())
        if self._compiled_loss is None:
            self._compiled_loss = compiled(functools.partial(self.decoder.compute_loss, static=True), mode)
        features, mask, tokens = fixed_shapes(batch.features, batch.mask, batch.tokens, *self.batch_shape(),
                                              self.settings.max_length + 2, pad=self.vocab.pad)
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # this step's graph outputs are new tensors
        return self._compiled_loss(features, mask, tokens, smoothing)

    def batch_shape(self) -> tuple[int, int]:
        """``(items, captions)`` of a full training batch, what a compiled run pads every batch to:
        the data module's (``CaptionDataModule.batch_shape``), else ``data.batch_size`` of each."""
        datamodule = getattr(self._trainer, "datamodule", None)
        if hasattr(datamodule, "batch_shape"):
            return datamodule.batch_shape
        return self.settings.batch_size, self.settings.batch_size

    def training_step(self, batch, batch_idx: int):
        losses = self.scst.loss(self, batch) if self.scst is not None else self.xe_loss(batch)
        loss = losses["loss"]
        finite = torch.isfinite(loss.detach())
        self._finite = finite if self._finite is None else self._finite & finite  # accumulated batches too
        self._last = (loss.detach().clone(), self.current_epoch, batch_idx, self.global_step, batch.index)
        rows = batch.tokens.shape[0] if batch.tokens is not None else batch.index.shape[0]
        weighted = loss.detach().float() * rows
        self._epoch_loss = weighted if self._epoch_loss is None else self._epoch_loss + weighted
        self._epoch_rows += rows
        if self.logging_step():  # Lightning's log() costs ~1 ms of host time a call: only where it is written
            for name, value in losses.items():
                self.log(f"train/{name}_step" if name == "loss" else f"train/{name}", value.detach().float(),
                         on_step=True, on_epoch=False, batch_size=rows, sync_dist=False)
        return loss

    def logging_step(self) -> bool:
        """Whether Lightning writes this batch's values to the loggers: every ``trainer.log_every_n_steps``
        optimizer steps, and when the run stops (its ``should_update_logs``, asked during the step)."""
        every = self.trainer.log_every_n_steps
        return every > 0 and ((self.global_step + 1) % every == 0 or self.trainer.should_stop)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        """The closure (``training_step``, backward), then ``optim.apply_update``: gradients clipped
        as ``trainer.gradient_clip_val`` says and the update skipped on the device when a loss or a
        gradient is not finite.  A GradScaler run (``precision=16-mixed``) keeps Lightning's step."""
        self._report_due = self.logging_step()  # asked before Lightning counts this update
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        if optimizer_closure is not None:
            optimizer_closure()
        finite, self._finite = self._finite, None
        found = apply_update(optimizer.optimizer, finite, self.trainer.gradient_clip_val,
                             self.trainer.gradient_clip_algorithm)
        self.nonfinite.add(found, *self._last)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._report_due:  # only after an update (not after an accumulated batch), at a logging step
            self._report_due = False
            self.report(log_count=True)

    def on_train_epoch_start(self) -> None:
        self._epoch_loss, self._epoch_rows = None, 0

    def on_train_epoch_end(self) -> None:
        if self._epoch_loss is not None:  # the epoch's mean loss per caption (Lightning's on_epoch mean)
            self.log("train/loss_epoch", self._epoch_loss / max(1, self._epoch_rows), on_step=False, on_epoch=True,
                     sync_dist=False)
        self.report()

    def report(self, log_count: bool = False) -> None:
        """A logging step: the values logged since the last one and the updates' verdicts read, a
        warning per skipped update (``optim.nonfinite=stop``: the error), the progress bars' values."""
        metrics = {k.split("/", 1)[1].removesuffix("_step"): v for k, v in self.trainer.callback_metrics.items()
                   if k.startswith("train/") and not k.endswith("_epoch") and v.numel() == 1}
        if metrics:
            values = torch.stack([v.detach().float().to(self.device) for v in metrics.values()]).tolist()
            self.progress_metrics = {k: round(v, 4) for k, v in zip(metrics, values, strict=True)}
        skipped = self.nonfinite.read()
        if log_count and skipped:
            self.log("train/skipped_steps", float(self.nonfinite.total))
        for where in skipped:
            if self.settings.optim.nonfinite == "stop":
                raise NonFiniteLossError(where + ": stopping (set optim.nonfinite=skip to skip such steps; the last "
                                                 "checkpoint is kept)")
            log.warning("%s: optimizer step skipped (optim.nonfinite=skip)", where)

    # ------------------------------------------------------------------ validation and decoding

    @torch.no_grad()
    def decode(self, features: torch.Tensor, mask: torch.Tensor | None, cfg: DecodeConfig) -> list[list[Hypothesis]]:
        """``cfg.per_item`` hypotheses per item, best first (``models.search.decode_batch``)."""
        return decode_batch(self.decoder, features.float(), mask, cfg, self.vocab.bos, self.vocab.eos, self.vocab.unk)

    def validation_step(self, batch, batch_idx: int) -> None:
        with torch.autocast(self.device.type, enabled=False):  # fp32, as the evaluation decodes by default
            nbest = self.decode(batch.features, batch.mask, self.settings.decode)
        for i, hyps in zip(batch.index.tolist(), nbest, strict=True):
            self._val_outputs.append((i, " ".join(self.vocab.decode(hyps[0].tokens))))

    def on_validation_epoch_start(self) -> None:
        self._val_outputs = []

    def on_validation_epoch_end(self) -> None:
        predictions: dict[int, str] = {}
        for part in gather_objects(self._val_outputs):
            for i, text in part:
                predictions.setdefault(i, text)  # DistributedSampler pads with repeats
        self._val_outputs = []
        if self.trainer.sanity_checking or not predictions:
            return
        refs = self.trainer.datamodule.items["val"].references
        result = compute_metrics(
            {i: refs[i] for i in predictions}, predictions, metrics=("bleu", "cider"), tokenize=False
        )
        # Every rank computed the same numbers from the same gathered predictions.
        self.log("val/BLEU_4", result.scores["Bleu_4"], prog_bar=True, sync_dist=False, rank_zero_only=False)
        self.log("val/CIDEr", result.scores["CIDEr"], prog_bar=True, sync_dist=False, rank_zero_only=False)
        self.log("val/BLEU_1", result.scores["Bleu_1"], sync_dist=False, rank_zero_only=False)
        self.log("val/items", float(len(predictions)), sync_dist=False, rank_zero_only=False)

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> list[dict]:
        """``describe`` with the run's own decoding (``settings.decode``); an evaluation passes its
        own to ``describe`` (``Decoding``)."""
        return self.describe(batch, self.settings.decode)

    def describe(self, batch, cfg: DecodeConfig) -> list[dict]:
        """Decode a batch as ``cfg`` says: per item its index, the best hypothesis's tokens, the
        attention that emitted each token, its score and each word's log-prob (then <eos>'s), and
        ``nbest``: every hypothesis (tokens, score), best first (beam search's n-best or the samples)."""
        out = []
        for i, hyps in zip(batch.index.tolist(), self.decode(batch.features, batch.mask, cfg), strict=True):
            h = hyps[0]
            tokens = self.vocab.decode(h.tokens)
            att = None if h.attention is None else h.attention[: len(tokens)].float().cpu().numpy()
            out.append({"index": i, "tokens": tokens, "attention": att, "score": float(h.score),
                        "token_log_probs": [round(x, 4) for x in h.token_log_probs],  # words, then <eos>'s
                        "nbest": [(self.vocab.decode(x.tokens), float(x.score)) for x in hyps]})
        return out

    # ------------------------------------------------------------------ optimisation and checkpoints

    def parameter_groups(self) -> list[dict[str, Any]]:
        """What the optimizer trains: the decoder at ``optim.lr`` (a subclass adds groups of its own)."""
        return [{"params": list(self.decoder.parameters()), "lr": self.settings.optim.lr}]

    def configure_optimizers(self):
        return configure_optimization(self.parameter_groups(), self.settings.optim, self.settings.schedule_steps)

    def on_fit_start(self) -> None:
        if self.scst is not None:  # the rewards' document frequencies, once
            self.scst.set_references(self.trainer.datamodule.items["train"].references)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.run_record:  # the run's fingerprint and provenance (captioning.train.identity, captioning.provenance)
            checkpoint["run"] = self.run_record
        checkpoint["rng"] = capture_rng()  # weights_only-safe, so a resumed run repeats an uninterrupted one

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if checkpoint.get("rng"):
            restore_rng(checkpoint["rng"])


def config_dict(cfg: Any) -> dict:
    """A dataclass config as a plain dict (for hyper-parameters)."""
    return asdict(cfg)


class Decoding(pl.LightningModule):
    """Lightning's ``predict`` over a trained ``CaptioningModule``, decoding as ``cfg`` says
    (``CaptioningModule.describe``): how an evaluation passes its decoding to the decode call."""

    def __init__(self, captioner: CaptioningModule, cfg: DecodeConfig) -> None:
        super().__init__()
        self.captioner = captioner
        self.cfg = cfg

    def predict_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> list[dict]:
        return self.captioner.describe(batch, self.cfg)
