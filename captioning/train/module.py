"""The LightningModule: teacher-forced training, free-running validation with corpus metrics.

Validation decodes captions (greedy or beam, never teacher-forced), gathers the
predictions of every rank, drops the duplicates a DistributedSampler pads with, and
scores the whole split once, so BLEU-4/CIDEr-D under DDP equal a single-process run.
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
from captioning.metrics.cider import CiderD
from captioning.models.decoders import CaptionDecoder, build_decoder
from captioning.models.positions import layout_from_meta
from captioning.models.search import (
    DecodeConfig,
    Hypothesis,
    SampleBatch,
    decode_batch,
    greedy_decode,
    sample,
)
from captioning.train.compiled import compile_mode, fixed_shapes
from captioning.train.optim import configure_optimization
from captioning.train.rng_state import capture_rng, restore_rng
from captioning.train.scst import leave_one_out_baseline, scst_surrogate
from captioning.train.scst_sampling import greedy_fixed, greedy_words, policy
from captioning.train.settings import ModuleSettings

log = logging.getLogger(__name__)


class NonFiniteLossError(CaptioningError):
    """Raised with ``nonfinite=stop`` when a batch gives a NaN/inf loss."""


def decode(
    decoder: CaptionDecoder, features: torch.Tensor, mask: torch.Tensor, cfg: DecodeConfig, vocab: Vocabulary
) -> list[Hypothesis]:
    """Best hypothesis per item: greedy when ``beam_size == 1``, else batched beam search."""
    nbest = decode_batch(decoder, features, mask, cfg, vocab.bos, vocab.eos, vocab.unk)
    return [hyps[0] for hyps in nbest]


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
        self.optim_cfg = settings.optim
        self.run_record: dict | None = None  # fingerprint + provenance, saved in every checkpoint
        self.stage = settings.stage
        self.scst_cfg = settings.scst
        self._reward: Any = None  # stage=scst: CIDEr-D against the training references
        self.decoder: CaptionDecoder = build_decoder(
            settings.model, len(self.vocab), int(feature_meta["dim"]), layout_from_meta(feature_meta),
            pad_id=self.vocab.pad,
        )
        # compile (auto | true | false): the fixed-shape loss under torch.compile, CUDA graphs on a
        # GPU; every batch padded to one shape so that one graph serves the whole run (fixed_shapes)
        self.compile_setting = settings.compile
        if self.compile_setting == "true" and not self.decoder.compilable:
            raise CaptioningError(
                f"compile=true: model {type(self.decoder).run_tag(self.decoder.cfg)} cannot be compiled whole "
                f"(hard attention samples on the host, the BiLSTM encoder packs its sequences); train it with "
                f"compile=false or compile=auto"
            )
        self._shape = (settings.batch_size, settings.max_length + 2)  # rows, tokens
        self._compiled_loss: Any = None
        self._compiled_greedy: Any = None  # stage=scst, compiled: captioning.train.scst_sampling
        self._compiled_policy: Any = None
        self._val_outputs: list[tuple[int, str]] = []
        self._skip_step = False
        self._schedule_steps: int | None = None  # the cosine schedule's length, once resolved
        self.last_val_predictions: dict[int, str] = {}

    @classmethod
    def from_hparams(cls, config: Mapping[str, Any], vocab: dict, feature_meta: dict, **extra: Any) -> CaptioningModule:
        """The module of a checkpoint's hyper-parameters (plain data; ``ModuleSettings.from_config``)."""
        return cls(ModuleSettings.from_config(config), vocab, feature_meta, config, **extra)

    # ------------------------------------------------------------------ training
    #: torch.compile's backend (tests count compilations with a cheap one)
    compile_backend: Any = "inductor"

    def compile_mode(self) -> str | None:
        """How the training loss runs on this module's device: None (eager) or torch.compile's mode
        (``compile_mode`` of this module)."""
        return compile_mode(self.compile_setting, self.device, self.decoder.compilable)

    def compiled(self, fn: Any) -> Any:
        """``fn`` under ``torch.compile`` (one graph, static shapes; CUDA graphs on a GPU)."""
        options: dict[str, Any] = {"backend": self.compile_backend}
        if self.compile_backend == "inductor":
            options["mode"] = self.compile_mode()
        return torch.compile(fn, fullgraph=True, dynamic=False, **options)

    def _loss(self, features: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        smoothing = self.optim_cfg.label_smoothing
        if self.compile_mode() is None:
            return self.decoder.compute_loss(features, mask, tokens, label_smoothing=smoothing)
        if self._compiled_loss is None:
            self._compiled_loss = self.compiled(functools.partial(self.decoder.compute_loss, static=True))
        features, mask, tokens = fixed_shapes(features, mask, tokens, *self._shape, pad=self.vocab.pad)
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # this step's graph outputs are new tensors
        return self._compiled_loss(features, mask, tokens, label_smoothing=smoothing)

    def on_fit_start(self) -> None:
        if self.stage.loss == "scst":  # the rewards' document frequencies, once
            refs = self.trainer.datamodule.items["train"].references
            self._reward = CiderD([[r.split() for r in item] for item in refs])  # df once

    def _scst_loss(self, batch) -> dict[str, torch.Tensor]:
        """Self-critical loss of a batch of items (``captioning.train.scst``).  Compiled
        (``compile_mode``): the greedy baseline, then the sampling with the cross-entropy term, each
        one graph at fixed shapes (``captioning.train.scst_sampling``), the rewards read on the host
        in between; a padded batch's empty rows are left out of the loss."""
        cfg, v = self.scst_cfg, self.vocab
        items = batch.index.tolist()
        feats, mask, tokens = batch.features.float(), batch.mask, batch.tokens
        compiled = self.compile_mode() is not None
        if compiled:
            feats, mask, tokens = fixed_shapes(feats, mask, tokens, *self._shape, pad=v.pad)
            if self.device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()  # this step's graph outputs are new tensors
        base = None
        if cfg.baseline == "greedy":  # Rennie et al.: the reward of test-time inference
            base = self._rewards(self._greedy_words(feats, mask, compiled)[: len(items)], items)
            base = base.repeat_interleave(cfg.samples)
        drawn, xe = self._draw(feats, mask, tokens, compiled)
        real = len(items) * cfg.samples  # the rows of the batch's items
        rewards = self._rewards(drawn.words(v.eos)[:real], [i for i in items for _ in range(cfg.samples)])
        if base is None:  # Luo 2020: the mean reward of the item's other samples
            base = leave_one_out_baseline(rewards.view(-1, cfg.samples)).reshape(-1)
        sampled = drawn.mask[:real]
        loss = scst_surrogate(drawn.log_probs[:real], sampled, rewards - base)
        out = {"reward": rewards.mean(), "baseline_reward": base.mean(), "scst": loss.detach()}
        if cfg.entropy_weight > 0 and drawn.entropy is not None:
            entropy = drawn.entropy[:real].sum() / sampled.sum().clamp_min(1)
            loss = loss - cfg.entropy_weight * entropy
            out["entropy"] = entropy.detach()
        if xe is not None:
            loss = loss + cfg.xe_weight * xe
            out["xe"] = xe.detach()
        out["loss"] = loss
        return out

    def _rewards(self, words: list[list[int]], items: list[int]) -> torch.Tensor:
        """CIDEr-D of each caption (token ids) against its item's training references."""
        texts = [self.vocab.decode(w) for w in words]
        return torch.as_tensor(self._reward(texts, items), dtype=torch.float32, device=self.device)

    def _banned(self) -> list[int]:
        v = self.vocab
        return sorted({v.pad, v.bos, v.unk} - {v.eos})

    def _greedy_words(self, feats: torch.Tensor, mask: torch.Tensor, compiled: bool) -> list[list[int]]:
        """The greedy caption of every row (eval mode, no grad)."""
        cfg, v = self.scst_cfg, self.vocab
        self.decoder.eval()
        with torch.no_grad():
            if compiled:
                if self._compiled_greedy is None:
                    self._compiled_greedy = self.compiled(functools.partial(
                        greedy_fixed, self.decoder, max_length=cfg.max_length, bos=v.bos, eos=v.eos,
                        banned=self._banned()))
                words = greedy_words(self._compiled_greedy(feats, mask), v.eos)
            else:
                words = [h.tokens for h in greedy_decode(self.decoder, feats, mask, cfg.max_length, v.bos, v.eos,
                                                         unk=v.unk)]
        self.decoder.train()
        return words

    def _draw(self, feats: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor, compiled: bool
              ) -> tuple[SampleBatch, torch.Tensor | None]:
        """``scst.samples`` captions per row and, with ``scst.xe_weight``, the cross-entropy of the
        rows' reference captions."""
        cfg, v = self.scst_cfg, self.vocab
        smoothing = self.optim_cfg.label_smoothing
        options = dict(n=cfg.samples, max_length=cfg.max_length, bos=v.bos, eos=v.eos, banned=self._banned(),
                       temperature=cfg.temperature, entropy=cfg.entropy_weight > 0)
        if compiled:
            if self._compiled_policy is None:
                self._compiled_policy = self.compiled(functools.partial(
                    policy, self.decoder, xe=cfg.xe_weight > 0, label_smoothing=smoothing, **options))
            return self._compiled_policy(feats, mask, tokens)
        drawn = sample(self.decoder, feats, mask, **options)
        xe = self.decoder.compute_loss(feats, mask, tokens, smoothing)["xe"] if cfg.xe_weight > 0 else None
        return drawn, xe

    def training_step(self, batch, batch_idx: int):
        if self.stage.loss == "scst":
            losses = self._scst_loss(batch)
        else:
            losses = self._loss(batch.features.float(), batch.mask, batch.tokens)
        loss = losses["loss"]
        finite = bool(torch.isfinite(loss).item())
        finite = self.trainer.strategy.reduce_boolean_decision(finite, all=True)
        self._skip_step = not finite
        if not finite:
            where = (
                f"non-finite loss ({loss.item()}) at epoch {self.current_epoch}, batch {batch_idx} "
                f"(global step {self.global_step}), items {batch.index[:8].tolist()}"
            )
            if self.optim_cfg.nonfinite == "stop":
                raise NonFiniteLossError(
                    where + ": stopping (set optim.nonfinite=skip to skip such steps; the last checkpoint is kept)"
                )
            log.warning("%s: optimizer step skipped (optim.nonfinite=skip)", where)
            self.log("train/skipped_steps", 1.0, on_step=True, reduce_fx="sum")
            # A zero loss that still touches every parameter keeps DDP's gradient buckets in sync.
            return sum((p * 0.0).sum() for p in self.parameters() if p.requires_grad)
        bs = batch.tokens.shape[0]
        for name, value in losses.items():
            self.log(f"train/{name}", value.detach().float(), on_step=True, on_epoch=name == "loss",
                     prog_bar=name == "loss", batch_size=bs, sync_dist=False)
        return loss

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        if optimizer_closure is not None:
            optimizer_closure()
        if self._skip_step:
            optimizer.zero_grad(set_to_none=True)
            return
        optimizer.step()

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def generate(self, features: torch.Tensor, mask: torch.Tensor, cfg: DecodeConfig) -> list[Hypothesis]:
        """The best hypothesis per item, decoded as ``cfg`` says."""
        return decode(self.decoder, features.float(), mask, cfg, self.vocab)

    def caption_text(self, hyp: Hypothesis) -> str:
        return " ".join(self.vocab.decode(hyp.tokens))

    def validation_step(self, batch, batch_idx: int) -> None:
        with torch.autocast(self.device.type, enabled=False):  # fp32, as the evaluation decodes by default
            hyps = self.generate(batch.features, batch.mask, self.settings.decode)
        for i, h in zip(batch.index.tolist(), hyps, strict=True):
            self._val_outputs.append((i, self.caption_text(h)))

    def on_validation_epoch_start(self) -> None:
        self._val_outputs = []

    def on_validation_epoch_end(self) -> None:
        predictions: dict[int, str] = {}
        for part in gather_objects(self._val_outputs):
            for i, text in part:
                predictions.setdefault(i, text)  # DistributedSampler pads with repeats
        self._val_outputs = []
        self.last_val_predictions = predictions
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
        with torch.no_grad():
            nbest = decode_batch(self.decoder, batch.features.float(), batch.mask, cfg,
                                 self.vocab.bos, self.vocab.eos, self.vocab.unk)
        out = []
        for i, hyps in zip(batch.index.tolist(), nbest, strict=True):
            h = hyps[0]
            tokens = self.vocab.decode(h.tokens)
            att = None if h.attention is None else h.attention[: len(tokens)].float().cpu().numpy()
            out.append({"index": i, "tokens": tokens, "attention": att, "score": float(h.score),
                        "token_log_probs": [round(x, 4) for x in h.token_log_probs],  # words, then <eos>'s
                        "nbest": [(self.vocab.decode(x.tokens), float(x.score)) for x in hyps]})
        return out

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        return configure_optimization(params, self.optim_cfg, self.schedule_steps)

    def schedule_steps(self) -> int:
        """The cosine schedule's length in optimizer steps: ``optim.schedule_steps``, else the
        length this run resolved when it started (restored with its checkpoint), else the budget's
        (``trainer.estimated_stepping_batches``); recorded in ``run_record`` (every checkpoint)."""
        steps = self.optim_cfg.schedule_steps
        steps = self._schedule_steps if steps is None else steps
        if steps is None:
            steps = int(self.trainer.estimated_stepping_batches)
        if int(steps) < 1:
            raise CaptioningError(f"optim.schedule_steps={steps}: the schedule needs at least 1 step")
        self._schedule_steps = int(steps)
        if self.run_record is not None:
            self.run_record["schedule_steps"] = self._schedule_steps
        return self._schedule_steps

    # ------------------------------------------------------------------ checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # the run's fingerprint and provenance (captioning.train.identity, captioning.provenance)
        if getattr(self, "run_record", None):
            checkpoint["run"] = self.run_record
        # RNG states (weights_only-safe) so a resumed run repeats an uninterrupted one
        checkpoint["rng"] = capture_rng()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # a resumed run keeps the schedule it resolved at its start (never rebuilt over a new budget)
        self._schedule_steps = (checkpoint.get("run") or {}).get("schedule_steps") or self._schedule_steps
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
