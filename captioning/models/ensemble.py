"""Test-time ensembles: M trained decoders that decode as one.

``EnsembleDecoder`` follows the decoder protocol (``captioning.models.decoders.base``), so greedy
decoding, batched beam search, diverse beam search and n-best lists run over it unchanged.  At
each step every member reads its own state and the ensemble emits the log of the members' mean
word distribution,

    log p(w) = log (1/M) sum_m p_m(w) = logsumexp_m(log p_m(w)) - log M,

the average of probabilities (not of log-probabilities) used for caption ensembles since
Vinyals et al. 2015.  The attention it returns, which heatmaps and grounding show, is the
**mean of the members' attention rows** (over the members that have attention; None when none
has).  An ensemble of one decoder gives that decoder's log-probs and attention exactly
(``logsumexp`` of one value is the value, ``log 1 = 0``).

Members must share the vocabulary and read the same features: ``captioning.train.checkpoint.
load_ensemble`` checks both before building one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["EnsembleDecoder", "EnsembleState"]


@dataclass
class EnsembleState:
    """The members' decoding states, reindexed together (beam search's reorderings)."""

    members: tuple[Any, ...]

    @property
    def num_rows(self) -> int:
        return self.members[0].num_rows

    def repeat_interleave(self, k: int) -> EnsembleState:
        return EnsembleState(tuple(s.repeat_interleave(k) for s in self.members))

    def index_select(self, idx: Tensor, within_groups: bool = False) -> EnsembleState:
        return EnsembleState(tuple(s.index_select(idx, within_groups=within_groups) for s in self.members))

    def select_groups(self, groups: Tensor) -> EnsembleState:
        return EnsembleState(tuple(s.select_groups(groups) for s in self.members))


class EnsembleDecoder(nn.Module):
    """M caption decoders over one vocabulary, averaged in probability at every step (test time only)."""

    #: the ensemble is for decoding; it has no training loss and is never compiled
    compilable = False

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one decoder")
        sizes = {int(m.vocab_size) for m in members}
        if len(sizes) != 1:
            raise ValueError(f"ensemble members have different vocabulary sizes {sorted(sizes)}")
        self.members = nn.ModuleList(members)
        self.vocab_size = int(members[0].vocab_size)
        self.pad_id = getattr(members[0], "pad_id", None)
        self.has_attention = any(getattr(m, "has_attention", True) for m in members)
        # a mean of several one-position (argmax) attentions is no longer one position
        self.hard_attention = len(members) == 1 and bool(getattr(members[0], "hard_attention", False))

    def init_state(self, features: Tensor, mask: Tensor | None) -> EnsembleState:
        """Each member encodes ``features [B,N,C]`` once (its own keys/values)."""
        return EnsembleState(tuple(m.init_state(features, mask) for m in self.members))

    def step(self, prev_tokens: Tensor, state: EnsembleState) -> tuple[Tensor, Tensor | None, EnsembleState]:
        """``prev_tokens [R]`` -> (log of the mean word distribution ``[R,V]``, mean attention
        ``[R,N]`` or None, the members' next states)."""
        outs = [m.step(prev_tokens, s) for m, s in zip(self.members, state.members, strict=True)]
        log_probs = torch.logsumexp(torch.stack([o[0].float() for o in outs]), dim=0) - math.log(len(outs))
        alphas = [o[1] for o in outs if o[1] is not None]
        alpha = torch.stack(alphas).mean(0) if alphas else None
        return log_probs, alpha, EnsembleState(tuple(o[2] for o in outs))

    def compute_loss(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        raise TypeError("an EnsembleDecoder decodes trained members; train each member on its own")
