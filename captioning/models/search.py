"""Greedy decoding, batched (diverse) beam search and sampling over any caption decoder.

They use only the decoder protocol (``captioning.models.decoders.base``):
``init_state(features, mask) -> state``,
``step(prev_tokens [R], state) -> (log_probs [R,V], alpha [R,N] | None, state)``,
``vocab_size`` and optionally ``pad_id``; the state's ``repeat_interleave(k)``,
``index_select(idx, within_groups=True)`` and ``select_groups(groups)``.

Length convention: ``max_length`` is the maximum number of WORDS (tokens without <bos>/<eos>).
The search runs at most ``max_length + 1`` decoder steps; at the last step only <eos> is
allowed, so every surviving hypothesis ends properly.  If no hypothesis can finish (e.g.
``min_length > max_length``) the best unfinished one is returned, never an empty result.
``min_length`` words are required before <eos>.  <bos> and <pad> are never generated.

The functions do not change the decoder's train/eval mode; call ``decoder.eval()`` first.
This module is the entry point (``decode_batch``) and greedy decoding; beam search lives in
``captioning.models.beam``, sampling in ``captioning.models.sampling``, what they share
(``DecodeConfig``, ``Hypothesis``, the constraints) in ``captioning.models.decoding``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from captioning.models.beam import beam_search, grouped_beam_search
from captioning.models.decoding import (
    DecodeConfig,
    Hypothesis,
    banned_tokens,
    length_penalty,
    mask_log_probs,
)
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
    """Arg-max decoding of a batch ``features [B,N,C]`` -> one ``Hypothesis`` per item.

    ``unk``: token id to block (None = allowed).  ``score`` = ``log_prob`` = sum of log-probs.
    """
    b = features.shape[0]
    device = features.device
    banned = banned_tokens(decoder, bos, eos, unk)
    state = decoder.init_state(features, mask)
    prev = torch.full((b,), bos, dtype=torch.long, device=device)
    score = torch.zeros(b, dtype=torch.float64, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    finished = torch.zeros(b, dtype=torch.bool, device=device)
    n_words = torch.full((b,), max_length, dtype=torch.long, device=device)
    toks: list[Tensor] = []
    lps: list[Tensor] = []
    atts: list[Tensor | None] = []
    history = torch.zeros(b, 0, dtype=torch.long, device=device)
    for t in range(max_length + 1):
        lp, alpha, state = decoder.step(prev, state)
        lp = mask_log_probs(lp, t, eos=eos, banned=banned, min_length=min_length, max_length=max_length,
                            history=history, block_trigrams=block_trigrams)
        s, tok = lp.max(-1)
        dead = ~done & torch.isinf(s)  # nothing allowed: stop unfinished
        is_eos = ~done & ~dead & (tok == eos)
        score = score + torch.where(done | dead, 0.0, s.double())
        n_words = torch.where(is_eos | dead, torch.full_like(n_words, t), n_words)
        finished |= is_eos
        done = done | is_eos | dead
        toks.append(tok)
        lps.append(s)
        atts.append(alpha)
        history = torch.cat([history, tok.unsqueeze(1)], 1)
        if bool(done.all()):
            break
        prev = tok
    tok_mat = torch.stack(toks, 1).cpu()
    lp_l = torch.stack(lps, 1).double().cpu().tolist()
    att_mat = torch.stack(atts, 1).float().cpu() if atts[0] is not None else None  # type: ignore[arg-type]
    n_words_l = n_words.cpu().tolist()
    score_l = score.cpu().tolist()
    fin_l = finished.cpu().tolist()
    out = []
    for i in range(b):
        n = min(n_words_l[i], tok_mat.shape[1])
        out.append(Hypothesis(tokens=tok_mat[i, :n].tolist(), score=score_l[i],
                              attention=None if att_mat is None else att_mat[i, :n].clone(),
                              log_prob=score_l[i], finished=bool(fin_l[i]),
                              token_log_probs=lp_l[i][: n + int(fin_l[i])]))  # the words, then <eos>'s
    return out


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
