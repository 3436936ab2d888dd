"""Caption search over any caption decoder: ``decode_batch`` picks greedy decoding, sampling or
batched (diverse) beam search as a ``DecodeConfig`` says.

They use only the decoder protocol (``captioning.models.decoders.base``):
``init_state(features, mask) -> state``,
``step(prev_tokens [R], state) -> (log_probs [R,V], alpha [R,N] | None, state)``,
``vocab_size`` and optionally ``pad_id``; the state's ``repeat_interleave(k)``,
``index_select(idx, within_groups=True)`` and ``select_groups(groups)``.

Length convention: ``max_length`` is the maximum number of WORDS (tokens without <bos>/<eos>).
A search runs at most ``max_length + 1`` decoder steps; at the last step only <eos> is allowed,
so every surviving hypothesis ends properly.  If no hypothesis can finish (e.g.
``min_length > max_length``) the best unfinished one is returned, never an empty result.
``min_length`` words are required before <eos>.  <bos> and <pad> are never generated.

The functions do not change the decoder's train/eval mode; call ``decoder.eval()`` first.
Greedy decoding and sampling are one loop (``captioning.models.sampling.sample``), beam search is
``captioning.models.beam``, what they share (``DecodeConfig``, ``Hypothesis``, the word
constraints) is ``captioning.models.decoding``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from captioning.models.beam import beam_search, grouped_beam_search
from captioning.models.decoding import DecodeConfig, Hypothesis, banned_tokens, length_penalty
from captioning.models.sampling import SampleBatch, filter_log_probs, sample

__all__ = [
    "DecodeConfig",
    "Hypothesis",
    "SampleBatch",
    "beam_search",
    "decode_batch",
    "filter_log_probs",
    "greedy_decode",
    "grouped_beam_search",
    "length_penalty",
    "sample",
]


@torch.no_grad()
def greedy_decode(
    decoder: Any,
    features: Tensor,
    mask: Tensor | None,
    max_length: int,
    bos: int,
    eos: int,
    *,
    unk: int | None = None,
    min_length: int = 0,
    block_trigrams: bool = False,
) -> list[Hypothesis]:
    """Arg-max decoding of a batch ``features [B,N,C]`` -> one ``Hypothesis`` per item
    (``sample(greedy=True)``).  ``unk``: token id to block (None = allowed).  ``score`` = ``log_prob``
    = sum of log-probs."""
    drawn = sample(decoder, features, mask, max_length=max_length, bos=bos, eos=eos, greedy=True,
                   banned=banned_tokens(decoder, bos, eos, unk), min_length=min_length, block_trigrams=block_trigrams)
    return [hyps[0] for hyps in drawn.hypotheses(features.shape[0], 1, eos)]


def decode_batch(
    decoder: Any,
    features: Tensor,
    mask: Tensor | None,
    cfg: DecodeConfig,
    bos: int,
    eos: int,
    unk: int | None = None,
) -> list[list[Hypothesis]]:
    """``cfg.per_item`` hypotheses per item, best first: sampling, greedy (``beam_size == 1``)
    or beam search."""
    cfg.validate()
    if cfg.strategy == "sample":
        generator = torch.Generator(device=features.device).manual_seed(cfg.seed)
        with torch.no_grad():
            batch = sample(decoder, features, mask, n=cfg.num_samples, max_length=cfg.max_length,
                           bos=bos, eos=eos, banned=banned_tokens(decoder, bos, eos, unk if cfg.block_unk else None),
                           min_length=cfg.min_length, temperature=cfg.temperature, top_k=cfg.top_k,
                           top_p=cfg.top_p, generator=generator)
        return batch.hypotheses(features.shape[0], cfg.num_samples, eos)
    if cfg.beam_size == 1:
        hyps = greedy_decode(decoder, features, mask, cfg.max_length, bos, eos, unk=unk if cfg.block_unk else None,
                             min_length=cfg.min_length, block_trigrams=cfg.block_trigrams)
        return [[h] for h in hyps]
    return beam_search(decoder, features, mask, cfg, bos, eos, unk)
