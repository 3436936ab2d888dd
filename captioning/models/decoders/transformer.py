"""Transformer caption decoder: masked self-attention over the words, cross-attention over the
N annotation vectors (Vaswani et al. 2017; the decoder half of the captioning Transformers of
Herdade et al. 2019 / Cornia et al. 2020, reading the CNN grid or the frames directly).

``model.name=transformer``.  Layer ``l`` (pre-norm), for words ``x [B,T,d]``:

    x = x + SelfAttention(LN(x))                  causal: word t sees words <= t
    x = x + CrossAttention(LN(x), m, mask)        m = W_m a  (annotation vectors, projected)
    x = x + FeedForward(LN(x))
    p(y_t) = softmax(W_o LN(x_t))                 W_o tied to the word embedding

Word positions get Vaswani's sinusoids; the annotation vectors get the same position/time code
as the LSTM decoders (``captioning.models.positions``) when ``position_code`` is set, so the
cross-attention knows where (grid) and when (frames) each vector is.

Per-word attention (heatmaps, grounding): the LAST layer's cross-attention, averaged over heads.
The last layer is the one whose context feeds the output distribution directly (earlier layers'
contexts are mixed again by the layers above), and the head average is a distribution over the
N vectors like the LSTM's ``alpha_t`` (each head's softmax sums to 1 over the real positions, so
their mean does too, and padded positions get exactly zero).

Decoding caches what does not change: the cross-attention keys/values of every layer are
computed once per item (``init_state``), and each step appends its self-attention key/value to
a per-row cache, so step ``t`` costs one query over ``t`` cached keys, not a re-run of the prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.errors import ConfigError
from captioning.models.attention import masked_softmax
from captioning.models.decoders import register_decoder
from captioning.models.decoders.base import (
    CaptionDecoder,
    DecoderState,
    check_right_padded,
    teacher_forcing_targets,
    token_cross_entropy,
)
from captioning.models.positions import CODES, MODES, build_position_code, sinusoid

__all__ = ["TransformerConfig", "TransformerDecoder"]


@dataclass
class TransformerConfig:
    """Hyper-parameters of the Transformer decoder (``conf/model/transformer.yaml``)."""

    name: str = "transformer"
    d_model: int = 256
    num_heads: int = 4
    num_layers: int = 2
    ff_dim: int = 1024
    dropout: float = 0.1
    position_code: str = "sinusoidal"  # none | sinusoidal | learned: where/when code of each a_i
    position_mode: str = "concat"  # concat [a_i; p_i] | add a_i + p_i
    position_dim: int = 64
    tie_embeddings: bool = True  # output layer = word embedding (Press & Wolf 2017)

    def validate(self) -> TransformerConfig:
        for key in ("d_model", "num_heads", "num_layers", "ff_dim", "position_dim"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"model.{key} must be >= 1 (got {getattr(self, key)})")
        if self.d_model % self.num_heads:
            raise ConfigError(f"model.d_model={self.d_model} must be a multiple of model.num_heads={self.num_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1) (got {self.dropout})")
        if self.position_code not in CODES or self.position_mode not in MODES:
            raise ConfigError(f"model.position_code must be one of {list(CODES)} and model.position_mode one of "
                              f"{list(MODES)} (got {self.position_code!r}, {self.position_mode!r})")
        return self


def _heads(x: Tensor, h: int) -> Tensor:
    """``[B,T,d]`` -> ``[B,h,T,d/h]``."""
    b, t, d = x.shape
    return x.reshape(b, t, h, d // h).transpose(1, 2)


class DecoderLayer(nn.Module):
    """One pre-norm layer: causal self-attention, cross-attention over the memory, feed-forward."""

    def __init__(self, d: int, heads: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm_self, self.norm_cross, self.norm_ff = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.self_qkv = nn.Linear(d, 3 * d)
        self.self_out = nn.Linear(d, d)
        self.cross_q = nn.Linear(d, d)
        self.cross_kv = nn.Linear(d, 2 * d)
        self.cross_out = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ff, d))
        self.dropout = nn.Dropout(dropout)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys/values of the memory ``[M,N,d]`` -> 2 x ``[M,h,N,d/h]`` (once)."""
        k, v = self.cross_kv(memory).chunk(2, dim=-1)
        return _heads(k, self.heads), _heads(v, self.heads)

    def forward(self, x: Tensor, cross_k: Tensor, cross_v: Tensor, mask: Tensor | None,
                past: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
        """``x [R,T,d]`` (T new words; with ``past`` the cached self keys/values ``[R,h,t,d/h]`` of
        the words before) -> ``(x, cross-attention weights [R,h,T,N], (keys, values) incl. x)``.

        ``cross_k``/``cross_v`` have ``M`` items with ``R = M * G`` rows (beams share an item).
        """
        r, t, d = x.shape
        q, k, v = (_heads(z, self.heads) for z in self.self_qkv(self.norm_self(x)).chunk(3, dim=-1))
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        causal = past is None and t > 1  # one new word attends every cached word
        drop = self.dropout.p if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=causal)
        x = x + self.dropout(self.self_out(a.transpose(1, 2).reshape(r, t, d)))

        m, h, n, dh = cross_k.shape
        g = r // m
        q = _heads(self.cross_q(self.norm_cross(x)), h).reshape(m, g, h, t, dh)
        scores = torch.einsum("mghtd,mhnd->mghtn", q, cross_k) / math.sqrt(dh)
        weights = masked_softmax(scores, None if mask is None else mask[:, None, None, None, :].expand_as(scores))
        ctx = torch.einsum("mghtn,mhnd->mghtd", weights.to(cross_v.dtype), cross_v).reshape(r, h, t, dh)
        x = x + self.dropout(self.cross_out(ctx.transpose(1, 2).reshape(r, t, d)))
        x = x + self.dropout(self.ff(self.norm_ff(x)))
        return x, weights.reshape(r, h, t, n), (k, v)


@register_decoder("transformer")
class TransformerDecoder(CaptionDecoder):
    """See the module docstring; ``features [B,N,C]``, ``mask [B,N]`` bool | None."""

    Config = TransformerConfig

    def __init__(self, cfg: TransformerConfig, vocab_size: int, feature_dim: int,
                 layout: tuple[int, ...] | None = None, pad_id: int = 0) -> None:
        super().__init__(cfg, vocab_size, feature_dim, layout, pad_id)
        d = cfg.d_model
        self.position = build_position_code(self.layout, feature_dim, cfg.position_code, cfg.position_mode,
                                            cfg.position_dim)
        in_dim = self.position.out_dim if self.position is not None else feature_dim
        self.memory_proj = nn.Sequential(nn.Linear(in_dim, d), nn.LayerNorm(d))  # m = W_m a
        self.embedding = nn.Embedding(self.vocab_size, d, padding_idx=self.pad_id)
        nn.init.normal_(self.embedding.weight, std=d**-0.5)
        with torch.no_grad():
            self.embedding.weight[self.pad_id].zero_()
        self.layers = nn.ModuleList([DecoderLayer(d, cfg.num_heads, cfg.ff_dim, cfg.dropout)
                                     for _ in range(cfg.num_layers)])
        self.norm = nn.LayerNorm(d)
        self.dropout = nn.Dropout(cfg.dropout)
        self.out_vocab = nn.Linear(d, self.vocab_size)
        if cfg.tie_embeddings:
            self.out_vocab.weight = self.embedding.weight

    @classmethod
    def examples(cls) -> list[dict[str, Any]]:
        small = {"name": "transformer", "d_model": 16, "num_heads": 2, "num_layers": 2, "ff_dim": 32,
                 "dropout": 0.0, "position_dim": 8}
        return [small, {**small, "num_layers": 1, "position_code": "none", "tie_embeddings": False},
                {**small, "position_code": "learned", "position_mode": "add"}]

    def _words(self, tokens: Tensor, start: int) -> Tensor:
        """``E y * sqrt(d) + sinusoid(position)`` for words at positions ``start, start+1, ...``."""
        d = self.cfg.d_model
        pos = sinusoid(torch.arange(start, start + tokens.shape[1], device=tokens.device), d)
        return self.dropout(self.embedding(tokens) * math.sqrt(d) + pos.to(self.embedding.weight.dtype))

    def _memory(self, features: Tensor, mask: Tensor | None) -> dict[str, Tensor | None]:
        """Per item, once: every layer's cross-attention keys/values of ``W_m a`` and the mask."""
        a = features.to(self.embedding.weight.dtype)
        if self.position is not None:
            a = self.position(a)
        m = self.memory_proj(a)
        memory: dict[str, Tensor | None] = {"mask": None if mask is None else mask.to(torch.bool)}
        for i, layer in enumerate(self.layers):
            memory[f"k{i}"], memory[f"v{i}"] = layer.memory_kv(m)
        return memory

    def _run(self, x: Tensor, memory: dict[str, Tensor | None], past: dict[str, Tensor] | None
             ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """All layers on ``x [R,T,d]`` -> ``(log-probs [R,T,V], last layer's attention [R,T,N], cache)``."""
        cache: dict[str, Tensor] = {}
        weights = None
        for i, layer in enumerate(self.layers):
            prev = None if past is None else (past[f"self_k{i}"], past[f"self_v{i}"])
            k_i, v_i = memory[f"k{i}"], memory[f"v{i}"]
            assert k_i is not None and v_i is not None
            x, weights, (k, v) = layer(x, k_i, v_i, memory["mask"], prev)
            cache[f"self_k{i}"], cache[f"self_v{i}"] = k, v
        assert weights is not None
        logits = self.out_vocab(self.norm(x)).float()
        return torch.log_softmax(logits, -1), weights.mean(1), cache

    # ------------------------------------------------------------------ inference

    def init_state(self, features: Tensor, mask: Tensor | None) -> DecoderState:
        memory = self._memory(features, mask)
        b, h, dh = features.shape[0], self.cfg.num_heads, self.cfg.d_model // self.cfg.num_heads
        empty = features.new_zeros(b, h, 0, dh, dtype=self.embedding.weight.dtype)
        rows = {f"self_{kv}{i}": empty for i in range(len(self.layers)) for kv in "kv"}
        return DecoderState(rows, memory)

    def step(self, prev_tokens: Tensor, state: DecoderState) -> tuple[Tensor, Tensor, DecoderState]:
        """``prev_tokens [R]`` -> ``(log_probs [R,V], alpha [R,N], state)`` (one new word per row)."""
        t = state.rows["self_k0"].shape[2]
        x = self._words(prev_tokens.unsqueeze(1), t)
        log_probs, alpha, cache = self._run(x, state.memory, state.rows)
        return log_probs[:, 0], alpha[:, 0], state.with_rows(**cache)

    # ------------------------------------------------------------------ training

    def compute_loss(self, features: Tensor, mask: Tensor | None, tokens: Tensor, label_smoothing: float = 0.0,
                     static: bool = False, lengths: list[int] | None = None) -> dict[str, Tensor]:
        """Teacher-forced loss: every word position at once under the causal mask.

        ``tokens [R,T+1]`` = ``<bos> w1..wT <eos>`` right-padded, ``R`` a multiple of the ``M`` items
        of ``features [M,N,C]`` (rows ``g*G ..`` are item ``g``'s captions: its memory made once);
        returns ``loss`` = ``xe`` (token cross-entropy incl. <eos>, mean over real tokens).  The
        computation has fixed shapes either way; without ``static`` or the host's ``lengths`` it
        also checks the padding layout (one host sync).
        """
        inputs, targets, step_mask = teacher_forcing_targets(tokens, self.pad_id)
        if not static and lengths is None:
            check_right_padded(step_mask, self.pad_id)
        log_probs, _, _ = self._run(self._words(inputs, 0), self._memory(features, mask), None)
        n_tok = step_mask.sum().clamp_min(1)
        nll = token_cross_entropy(log_probs.flatten(0, 1), targets.flatten(), label_smoothing,
                                  ignore_index=self.pad_id)
        xe = nll / n_tok
        return {"loss": xe, "xe": xe}
