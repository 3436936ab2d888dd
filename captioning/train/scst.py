"""Self-critical sequence training (Rennie et al. 2017): REINFORCE on CIDEr-D with a baseline.

The second training stage of nearly every captioning result since 2017: start from a model
trained with cross-entropy, draw ``n`` captions ``w^1..w^n`` per item from it, reward each with
its CIDEr-D ``r_j`` against the item's references (document frequencies from the TRAINING
references, computed once: ``captioning.metrics.cider.CiderD``), and follow

    grad E[r] ~= sum_j (r_j - b_j) grad log p(w^j)

with a baseline ``b_j`` that does not depend on ``w^j``:

- ``greedy`` (Rennie et al.): the reward of the model's own greedy caption (test-time inference);
- ``mean`` (Luo 2020, "A better variant of self-critical sequence training"): the mean reward of
  the item's OTHER ``n - 1`` samples (no extra decoding, lower variance; needs ``n >= 2``).

The loss minimised is the surrogate ``-sum_j (r_j - b_j) sum_t log p(w^j_t) / (sampled tokens)``
(ruotianluo's normalisation: a mean over the sampled tokens incl. <eos>), optionally minus an
entropy bonus and plus a cross-entropy term on a reference caption.

``SelfCritical.loss`` is the step: the greedy baseline and the draws come from the one sampler
(``captioning.models.sampling.sample``); compiled (``compile`` on a GPU) each is one graph at fixed
shapes (``fixed_length``: no early stop, no host read), and the rewards are read on the host in
between (CIDEr-D is computed there).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError
from captioning.metrics.cider import CiderD
from captioning.models.decoding import banned_tokens
from captioning.models.sampling import SampleBatch, sample
from captioning.train.compiled import compiled, fixed_shapes

__all__ = ["ScstConfig", "SelfCritical", "leave_one_out_baseline", "scst_surrogate"]


@dataclass
class ScstConfig:
    """The self-critical stage (``stage=scst``; presets ``experiment=rennie2017_scst|luo2020_scst``)."""

    baseline: str = "greedy"  # greedy (Rennie et al. 2017) | mean of the other samples (Luo 2020)
    samples: int = 5  # captions drawn per item
    max_length: int = 16  # words per sampled caption
    temperature: float = 1.0
    entropy_weight: float = 0.0  # bonus on the entropy of the sampling distribution (per token)
    xe_weight: float = 0.0  # + xe_weight * cross-entropy of one reference caption per item

    def validate(self) -> ScstConfig:
        if self.baseline not in ("greedy", "mean"):
            raise ConfigError(f"scst.baseline={self.baseline!r}: use greedy or mean")
        if self.samples < 1 or (self.baseline == "mean" and self.samples < 2):
            raise ConfigError(f"scst.samples={self.samples}: need >= 1 (>= 2 with scst.baseline=mean)")
        if self.max_length < 1 or self.temperature <= 0:
            raise ConfigError("scst.max_length must be >= 1 and scst.temperature > 0")
        return self


def leave_one_out_baseline(rewards: Tensor) -> Tensor:
    """``rewards [B,n]`` -> ``[B,n]``: for sample j, the mean reward of the item's other samples."""
    n = rewards.shape[1]
    return (rewards.sum(1, keepdim=True) - rewards) / (n - 1)


def scst_surrogate(log_probs: Tensor, mask: Tensor, advantage: Tensor) -> Tensor:
    """``-sum_r adv_r sum_t log p(w_rt) / sum(mask)``: ``log_probs [R,T]`` of the sampled tokens
    (0 where ``mask [R,T]`` is False), ``advantage [R]`` = reward - baseline (detached here).
    Minimising it raises the log-probability of captions that beat their baseline."""
    adv = advantage.detach().to(log_probs.dtype).unsqueeze(1)
    return -(adv * log_probs * mask.to(log_probs.dtype)).sum() / mask.sum().clamp_min(1)


class SelfCritical:
    """Self-critical training's step over a batch of items (one reference each, for the optional
    cross-entropy term); ``set_references`` gives the rewards their training references."""

    def __init__(self, cfg: ScstConfig, vocab: Vocabulary) -> None:
        self.cfg, self.vocab = cfg, vocab
        self.reward: CiderD | None = None  # CIDEr-D against the training references (df once)
        self._greedy: Any = None  # compiled, once per run
        self._policy: Any = None

    def set_references(self, references: Sequence[Sequence[str]]) -> None:
        self.reward = CiderD([[r.split() for r in item] for item in references])

    def loss(self, module: Any, batch: Any) -> dict[str, Tensor]:
        """The surrogate (+ entropy bonus, + cross-entropy term) of ``batch`` for ``module`` (a
        ``CaptioningModule``: its decoder, device and compile mode); a padded batch's empty rows
        are left out."""
        cfg, items = self.cfg, batch.index.tolist()
        feats, mask, tokens = batch.features, batch.mask, batch.tokens
        fixed = module.compile_mode() is not None  # one graph per shape: the batch padded to the run's shape
        if fixed:
            feats, mask, tokens = fixed_shapes(feats, mask, tokens, *module.batch_shape(), module.settings.max_length + 2,
                                               pad=self.vocab.pad)
            if module.device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()  # this step's graph outputs are new tensors
        base = None
        if cfg.baseline == "greedy":  # Rennie et al.: the reward of test-time inference
            base = self.rewards(self.greedy_words(module, feats, mask, fixed)[: len(items)], items, module.device)
            base = base.repeat_interleave(cfg.samples)
        drawn, xe = self.draw(module, feats, mask, tokens, fixed)
        real = len(items) * cfg.samples  # the rows of the batch's items
        rewards = self.rewards(drawn.words(self.vocab.eos)[:real], [i for i in items for _ in range(cfg.samples)],
                               module.device)
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

    def rewards(self, words: list[list[int]], items: list[int], device: torch.device) -> Tensor:
        """CIDEr-D of each caption (token ids) against its item's training references."""
        assert self.reward is not None, "SelfCritical.set_references first"
        texts = [self.vocab.decode(w) for w in words]
        return torch.as_tensor(self.reward(texts, items), dtype=torch.float32, device=device)

    def _options(self, decoder: Any) -> dict[str, Any]:
        v = self.vocab
        return dict(max_length=self.cfg.max_length, bos=v.bos, eos=v.eos, banned=banned_tokens(decoder, v.bos, v.eos,
                                                                                               v.unk), attention=False)

    def greedy_words(self, module: Any, feats: Tensor, mask: Tensor | None, fixed: bool) -> list[list[int]]:
        """The greedy caption of every row (eval mode, no grad; compiled when ``fixed``)."""
        decoder = module.decoder
        greedy = functools.partial(sample, decoder, greedy=True, min_length=0, fixed_length=fixed,
                                   **self._options(decoder))
        if fixed:
            self._greedy = self._greedy or compiled(greedy, module.compile_mode())
            greedy = self._greedy
        decoder.eval()
        with torch.no_grad():
            words = greedy(feats, mask).words(self.vocab.eos)
        decoder.train()
        return words

    def draw(self, module: Any, feats: Tensor, mask: Tensor | None, tokens: Tensor, fixed: bool
             ) -> tuple[SampleBatch, Tensor | None]:
        """``scst.samples`` captions per row and, with ``scst.xe_weight``, the cross-entropy of the
        rows' reference captions (compiled when ``fixed``)."""
        if fixed:
            self._policy = self._policy or compiled(functools.partial(self._forward, module, True),
                                                    module.compile_mode())
            return self._policy(feats, mask, tokens)
        return self._forward(module, False, feats, mask, tokens)

    def _forward(self, module: Any, fixed: bool, feats: Tensor, mask: Tensor | None, tokens: Tensor
                 ) -> tuple[SampleBatch, Tensor | None]:
        cfg, decoder = self.cfg, module.decoder
        drawn = sample(decoder, feats, mask, n=cfg.samples, temperature=cfg.temperature, entropy=cfg.entropy_weight > 0,
                       fixed_length=fixed, **self._options(decoder))
        xe = None
        if cfg.xe_weight > 0:
            xe = decoder.compute_loss(feats, mask, tokens, module.settings.optim.label_smoothing, static=fixed)["xe"]
        return drawn, xe
