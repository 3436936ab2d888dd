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
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from captioning.errors import ConfigError

__all__ = ["ScstConfig", "leave_one_out_baseline", "scst_surrogate"]


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
