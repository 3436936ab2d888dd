"""The decoder protocol: what beam search, sampling, the LightningModule and the caption job use.

A caption decoder reads a set of ``N`` annotation vectors ``features [B,N,C]`` (grid regions or
frames; ``mask [B,N]`` bool, True = real position) and emits words.  It provides:

- ``init_state(features, mask) -> DecoderState``: encode the annotation vectors ONCE (keys and
  values of attention cached in the state's memory) and the state before the first word;
- ``step(prev_tokens [R], state) -> (log_probs [R,V] float32, alpha [R,N] | None, state)``: one
  word for each of ``R`` decoding rows, with the attention over the N annotation vectors that
  emitted it (None for decoders without attention);
- ``compute_loss(features, mask, tokens, label_smoothing, static, lengths) -> {"loss", "xe", ...}``:
  the teacher-forced loss of ``tokens [R,T+1]`` over ``features [M,N,C]``, ``R`` a multiple of ``M``
  (rows ``g*G .. g*G+G-1`` are item ``g``'s captions: per-image batches encode each item once);
  ``static=True``: fixed shapes, no host syncs, for ``torch.compile``; ``lengths``: each caption's
  real steps when the caller knows them on the host (nothing is then read back);
- the state's ``repeat_interleave(k)``, ``index_select(idx, within_groups)`` and
  ``select_groups(groups)``: reindexing for beams.

Decoders register with ``@register_decoder`` (``captioning.models.decoders``) and carry their own
typed config dataclass (``Config``), checked at start.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CaptionDecoder",
    "DecoderState",
    "check_right_padded",
    "teacher_forcing_targets",
    "token_cross_entropy",
]


@dataclass
class DecoderState:
    """The decoding state of ``R`` rows plus the per-item memory they read.

    ``rows``: tensors with the decoding rows on dim 0 (e.g. LSTM ``h``, ``c`` ``[R,L,H]``; a
    Transformer's self-attention cache ``[R,t,d]``).  ``memory``: tensors with ``M = R / group``
    items on dim 0 (annotation vectors, cached attention keys, the mask); row ``r`` reads memory
    item ``r // group``.  Beam search keeps ``group = K`` so the K beams of an item share one copy
    of the memory.  ``shared``: what every row reads and no reindexing touches (e.g. the LSTM
    step's weights, concatenated and cast once per decoding).
    """

    rows: dict[str, Tensor]
    memory: dict[str, Tensor | None] = field(default_factory=dict)
    group: int = 1
    shared: dict[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return next(iter(self.rows.values())).shape[0]

    def with_rows(self, **rows: Tensor) -> DecoderState:
        return replace(self, rows={**self.rows, **rows})

    def index_select(self, idx: Tensor, within_groups: bool = False) -> DecoderState:
        """New row ``j`` is old row ``idx[j]`` (beam reordering).

        ``within_groups=True`` promises ``idx[j] // group == j // group`` (each row keeps its
        memory item, as in beam search): then only the rows are gathered.  Otherwise the memory
        is gathered too and ``group`` becomes 1.
        """
        rows = {k: v.index_select(0, idx) for k, v in self.rows.items()}
        if within_groups:
            return replace(self, rows=rows)
        items = torch.div(idx, self.group, rounding_mode="floor")
        memory = {k: (None if v is None else v.index_select(0, items)) for k, v in self.memory.items()}
        return DecoderState(rows, memory, 1, self.shared)

    def repeat_interleave(self, k: int) -> DecoderState:
        """Each row repeated ``k`` times consecutively; the memory is shared (``group *= k``)."""
        rows = {key: v.repeat_interleave(k, dim=0) for key, v in self.rows.items()}
        return DecoderState(rows, dict(self.memory), self.group * k, self.shared)

    def select_groups(self, groups: Tensor) -> DecoderState:
        """Keep memory items ``groups [M']`` and all their rows (drops finished items)."""
        g = self.group
        idx = (groups.unsqueeze(1) * g + torch.arange(g, device=groups.device)).reshape(-1)
        rows = {k: v.index_select(0, idx) for k, v in self.rows.items()}
        memory = {k: (None if v is None else v.index_select(0, groups)) for k, v in self.memory.items()}
        return DecoderState(rows, memory, g, self.shared)


def teacher_forcing_targets(tokens: Tensor, pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """``tokens [B,T+1]`` = ``<bos> w1..wT <eos>`` right-padded -> ``(inputs [B,T], targets [B,T],
    step_mask [B,T])``; padding inside a caption is refused (it would be silently mis-masked)."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    step_mask = targets != pad_id
    return inputs, targets, step_mask


def check_right_padded(step_mask: Tensor, pad_id: int) -> Tensor:
    """Real steps per caption ``[B]``; a ValueError when padding sits inside a caption."""
    lengths = step_mask.sum(1)
    steps = torch.arange(step_mask.shape[1], device=step_mask.device)
    if not torch.equal(step_mask, steps < lengths.unsqueeze(1)):
        raise ValueError(
            "compute_loss: tokens must be <bos> words <eos> followed only by padding "
            f"(pad_id={pad_id}); found padding inside a caption"
        )
    return lengths


def token_cross_entropy(logits: Tensor, targets: Tensor, label_smoothing: float = 0.0,
                        ignore_index: int = -100) -> Tensor:
    """SUMMED token cross-entropy (negative log-likelihood with optional label smoothing) of
    ``logits [M,V]`` against ``targets [M]``; entries equal to ``ignore_index`` do not count."""
    return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction="sum",
                           label_smoothing=label_smoothing)


class CaptionDecoder(nn.Module):
    """Base class of registered decoders (see the module docstring for the protocol).

    Subclasses set ``name`` and ``Config`` (a dataclass with a ``name`` field), build themselves
    from ``(cfg, vocab_size, feature_dim, layout, pad_id)`` and implement ``init_state``,
    ``step`` and ``compute_loss``.  ``layout``: the axes of the N positions (``(h, w)`` grid,
    ``(K,)`` frames, ``(K, h, w)``), for position/time codes; None when unknown.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = object
    #: the decoder returns an attention row per word (heatmaps, grounding)
    has_attention: bool = True
    #: at test time the context is ONE position (hard attention): figures mark it
    hard_attention: bool = False
    #: ``compute_loss(static=True)`` compiles as one graph (``compile=true``)
    compilable: bool = True

    def __init__(self, cfg: Any, vocab_size: int, feature_dim: int,
                 layout: tuple[int, ...] | None = None, pad_id: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = int(vocab_size)
        self.feature_dim = int(feature_dim)
        self.layout = tuple(layout) if layout else None
        self.pad_id = int(pad_id)

    def init_state(self, features: Tensor, mask: Tensor | None) -> DecoderState:
        raise NotImplementedError

    def step(self, prev_tokens: Tensor, state: DecoderState) -> tuple[Tensor, Tensor | None, DecoderState]:
        raise NotImplementedError

    def compute_loss(self, features: Tensor, mask: Tensor | None, tokens: Tensor, label_smoothing: float = 0.0,
                     static: bool = False, lengths: list[int] | None = None) -> dict[str, Tensor]:
        raise NotImplementedError

    @classmethod
    def run_tag(cls, cfg: Any) -> str:
        """A short name for run folders (``<data>-<tag>-s<seed>``)."""
        return cls.name

    @classmethod
    def examples(cls) -> list[dict[str, Any]]:
        """Small configs covering the decoder's variants (registry-wide tests build each)."""
        return [{"name": cls.name}]
