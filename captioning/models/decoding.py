"""What every caption search shares: the decoding config, the hypothesis it returns, the length
penalty, the word constraints applied to each step's log-probabilities (one place: ``mask_log_probs``)
and the tokens never generated (``banned_tokens``).

The searches: greedy decoding and sampling in one loop (``captioning.models.sampling``), (diverse)
beam search (``captioning.models.beam``); ``captioning.models.search.decode_batch`` picks one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from captioning.errors import ConfigError

__all__ = ["NEG_INF", "PRECISIONS", "DecodeConfig", "Hypothesis", "banned_tokens", "decoding_autocast",
           "length_penalty", "mask_log_probs"]

NEG_INF = float("-inf")
#: the arithmetic of decoding: fp32 (what reported numbers use), or autocast to bf16 / fp16 (faster on
#: a GPU; captions can differ)
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class DecodeConfig:
    """How captions are decoded (OmegaConf structured-config compatible; ``conf/decode/*.yaml``).

    ``strategy=beam``: batched beam search (greedy when ``beam_size == 1``); ``n_best`` best
    hypotheses per item.  ``groups > 1``: diverse beam search (Vijayakumar et al. 2018), the
    beam split into ``groups`` groups of ``beam_size / groups`` beams, each group's log-probs
    penalised by ``diversity_strength`` per earlier group that chose the same word at the same
    step (Hamming diversity).  ``strategy=sample``: ``num_samples`` captions per item drawn from the
    model's distribution with ``temperature``, ``top_k`` (0: off) and ``top_p`` (1: off),
    seeded by ``seed``; the most likely sample first.
    """

    strategy: str = "beam"  # beam | sample
    beam_size: int = 3
    max_length: int = 20  # max words (without <bos>/<eos>)
    min_length: int = 1  # min words before <eos>
    length_penalty: str = "none"  # none | gnmt | avg
    alpha: float = 0.6  # GNMT: score / ((5 + len) / 6) ** alpha
    block_unk: bool = True
    block_trigrams: bool = False
    n_best: int = 1
    groups: int = 1  # diverse beam search: beam_size / groups beams per group (1: plain beam search)
    diversity_strength: float = 0.5  # lambda of the Hamming diversity penalty (groups > 1)
    num_samples: int = 1  # sample: captions per item
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def validate(self) -> DecodeConfig:
        if self.strategy not in ("beam", "sample"):
            raise ConfigError(f"decode.strategy={self.strategy!r}; use beam or sample")
        if self.beam_size < 1:
            raise ConfigError(f"decode.beam_size must be >= 1 (got {self.beam_size})")
        if self.max_length < 1:
            raise ConfigError(f"decode.max_length must be >= 1 (got {self.max_length})")
        if self.length_penalty not in ("none", "gnmt", "avg"):
            raise ConfigError(
                f"decode.length_penalty={self.length_penalty!r}; use none, gnmt or avg"
            )
        if not 1 <= self.n_best <= self.beam_size:
            raise ConfigError(
                f"decode.n_best={self.n_best} must be between 1 and beam_size={self.beam_size}"
            )
        if self.groups < 1 or self.beam_size % self.groups:
            raise ConfigError(
                f"decode.beam_size={self.beam_size} is not a multiple of decode.groups={self.groups}: "
                f"use groups >= 1 that divides beam_size (e.g. beam_size={max(1, self.groups) * 2})"
            )
        if self.diversity_strength < 0:
            raise ConfigError(f"decode.diversity_strength must be >= 0 (got {self.diversity_strength})")
        if self.groups > 1 and self.strategy != "beam":
            raise ConfigError(f"decode.groups={self.groups} is a beam search option: use strategy=beam")
        if self.num_samples < 1 or self.temperature <= 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ConfigError(
                f"decode.num_samples >= 1, temperature > 0, top_k >= 0 and 0 < top_p <= 1 "
                f"(got {self.num_samples}, {self.temperature}, {self.top_k}, {self.top_p})"
            )
        return self

    @property
    def per_item(self) -> int:
        """Hypotheses per item this config returns."""
        return self.num_samples if self.strategy == "sample" else self.n_best


@dataclass
class Hypothesis:
    """A decoded caption: ``tokens`` (no <bos>/<eos>), ``score`` (the ranking score:
    length-normalised for beam search with a length penalty, else the sum of log-probs),
    ``attention [len(tokens), N]`` (CPU float32; None for models without attention),
    ``log_prob`` (sum of token log-probs incl. <eos>), ``finished`` (ended with <eos>),
    ``group`` (the diverse beam search group that found it; 0 otherwise) and
    ``token_log_probs``: the log-probability the search scored each word with, one per word of
    ``tokens``, then <eos>'s when ``finished`` (so they sum to ``log_prob``).  Beam search and
    greedy decoding score with the model's distribution (under the length and <unk>/trigram
    constraints, which never lower a chosen word's log-probability; diversity penalties are not
    included); sampling with the distribution it drew from (temperature, top-k, top-p)."""

    tokens: list[int]
    score: float
    attention: Tensor | None
    log_prob: float = 0.0
    finished: bool = True
    group: int = 0  # diverse beam search: the group that found it
    token_log_probs: list[float] = field(default_factory=list)


def length_penalty(length: int, kind: str, alpha: float = 0.6) -> float:
    """Divisor of the summed log-prob: 1 (none), ``((5+len)/6)^alpha`` (gnmt), ``len`` (avg)."""
    if kind == "none":
        return 1.0
    if kind == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if kind == "avg":
        return float(max(length, 1))
    raise ConfigError(f"unknown length_penalty {kind!r}; use none, gnmt or avg")


def mask_log_probs(
    lp: Tensor,
    t: int,
    *,
    eos: int,
    banned: list[int],
    min_length: int,
    max_length: int,
    history: Tensor | None,
    block_trigrams: bool,
) -> Tensor:
    """The word constraints of every search at step ``t`` (= words emitted so far), applied to
    ``lp [R,V]`` (a new tensor: ``lp`` may be needed for backward): ``banned`` tokens never, <eos>
    not before ``min_length`` words, only <eos> after ``max_length``, and with ``block_trigrams`` no
    trigram of ``history [R,t]`` twice.  No host read: a compiled decoding traces it."""
    block = torch.zeros(lp.shape[-1], dtype=torch.bool, device=lp.device)
    if t >= max_length:  # <eos> only (none before min_length: the caption ends unfinished)
        block = ~block
        block[eos] = t < min_length
        return lp.masked_fill(block, NEG_INF)
    if banned:
        block[banned] = True
    if t < min_length:
        block[eos] = True
    lp = lp.masked_fill(block, NEG_INF)
    if block_trigrams and history is not None and t >= 3:
        # (w_i, w_{i+1}) == (w_{t-2}, w_{t-1}) blocks w_{i+2}
        match = (history[:, : t - 2] == history[:, t - 2 : t - 1]) & (
            history[:, 1 : t - 1] == history[:, t - 1 : t]
        )
        pen = torch.where(match, NEG_INF, 0.0).to(lp.dtype)
        lp = lp + torch.zeros_like(lp).scatter_reduce_(1, history[:, 2:t], pen, reduce="amin", include_self=True)
    return lp


def banned_tokens(decoder: Any, bos: int, eos: int, unk: int | None) -> list[int]:
    """Tokens never generated: <bos>, the decoder's <pad> and ``unk`` (None: <unk> allowed)."""
    banned = {bos}
    pad = getattr(decoder, "pad_id", None)
    if pad is not None:
        banned.add(int(pad))
    if unk is not None:
        banned.add(int(unk))
    banned.discard(eos)
    return sorted(banned)


def decoding_autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """The context to decode in at ``precision`` (``PRECISIONS``): autocast off for fp32 (also inside
    a mixed-precision region), on to bf16 / fp16 otherwise."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision={precision!r}: use fp32 (the default), bf16 or fp16")
    dtype = PRECISIONS[precision]
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
