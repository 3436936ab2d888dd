"""Self-critical training's decoding at fixed shapes: one graph for ``torch.compile`` and CUDA graphs.

``captioning.models.search.sample`` and ``greedy_decode`` stop as soon as every row has ended (a
read of the device's ``done`` flags at every step).  Here every row runs all ``max_length + 1``
steps and a row that has ended emits <eos> with log-probability 0 (mask False), so the decoding
has one shape and no host read: the compiled SCST step (``compile`` on a GPU) traces it whole and
replays it.  The samples follow the same distribution under the same constraints (banned tokens,
no <eos> before ``min_length`` words, only <eos> after ``max_length``), and greedy decoding gives
the same captions (``tests/test_scst_sampling.py``).

A sample is drawn with the Gumbel-max trick, ``argmax_w (q_w + g_w)`` with ``g_w = -log(-log u_w)``
and ``u_w ~ U(0,1)`` i.i.d., which is distributed exactly as ``softmax(q)`` (Gumbel 1954; the
standard identity behind Gumbel-softmax, Jang et al. 2017): elementwise random numbers and an
argmax compile into the graph, ``torch.multinomial`` does not.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from captioning.models.search import SampleBatch, filter_log_probs

NEG_INF = float("-inf")

__all__ = ["greedy_fixed", "greedy_words", "gumbel_argmax", "policy", "sample_fixed"]


def gumbel_argmax(q: Tensor) -> Tensor:
    """One draw per row from ``softmax(q)`` (``q [R,V]`` log-probs, -inf = never) -> ``[R]``."""
    u = torch.rand_like(q, dtype=torch.float32).clamp_(torch.finfo(torch.float32).tiny, 1.0)
    return (q.float() - torch.log(-torch.log(u))).argmax(-1)


def _blocked(vocab: int, t: int, *, eos: int, banned: list[int] | tuple[int, ...], min_length: int,
             max_length: int, device: torch.device) -> Tensor:
    """``[V]`` bool: the tokens that cannot come at step ``t`` (as ``models.search.sample``)."""
    block = torch.zeros(vocab, dtype=torch.bool, device=device)
    if t >= max_length:
        return torch.ones_like(block).index_fill_(0, torch.tensor([eos], device=device), False)
    if banned:
        block[list(banned)] = True
    if t < min_length:
        block[eos] = True
    return block


def sample_fixed(decoder: Any, features: Tensor, mask: Tensor | None, *, n: int, max_length: int, bos: int,
                 eos: int, banned: list[int] | tuple[int, ...] = (), min_length: int = 1, temperature: float = 1.0,
                 entropy: bool = False) -> SampleBatch:
    """``n`` captions per item of ``features [B,N,C]``, every row ``max_length + 1`` steps: a
    ``SampleBatch`` as ``models.search.sample`` returns (its ``attention`` None), differentiable
    through ``log_probs`` when run with grad."""
    rows = features.shape[0] * n
    device = features.device
    state = decoder.init_state(features, mask).repeat_interleave(n)
    prev = torch.full((rows,), bos, dtype=torch.long, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    toks, lps, masks, ents = [], [], [], []
    for t in range(max_length + 1):
        lp, _, state = decoder.step(prev, state)
        block = _blocked(lp.shape[-1], t, eos=eos, banned=banned, min_length=min_length, max_length=max_length,
                         device=device)
        q = filter_log_probs(lp.masked_fill(block, NEG_INF), temperature)
        tok = torch.where(done, torch.full_like(prev, eos), gumbel_argmax(q.detach()))
        live = ~done
        picked = q.gather(1, tok.unsqueeze(1)).squeeze(1)
        toks.append(tok)
        lps.append(torch.where(live, picked, torch.zeros_like(picked)))
        masks.append(live)
        if entropy:  # -sum p log p over the tokens that can be drawn (0 log 0 = 0)
            h = -(q.exp() * q.masked_fill(torch.isinf(q), 0.0)).sum(-1)
            ents.append(torch.where(live, h, torch.zeros_like(h)))
        finished = finished | (live & (tok == eos))
        done = done | (tok == eos)
        prev = tok
    return SampleBatch(tokens=torch.stack(toks, 1), log_probs=torch.stack(lps, 1), mask=torch.stack(masks, 1),
                       attention=None, finished=finished, entropy=torch.stack(ents, 1) if ents else None)


def greedy_fixed(decoder: Any, features: Tensor, mask: Tensor | None, *, max_length: int, bos: int, eos: int,
                 banned: list[int] | tuple[int, ...] = ()) -> Tensor:
    """Arg-max tokens ``[B, max_length + 1]`` of every item (<eos> repeated after the end): the
    captions of ``models.search.greedy_decode`` without ``min_length``/trigram blocking (its words
    are each row's tokens before the first <eos>, ``greedy_words``)."""
    b = features.shape[0]
    state = decoder.init_state(features, mask)
    prev = torch.full((b,), bos, dtype=torch.long, device=features.device)
    done = torch.zeros(b, dtype=torch.bool, device=features.device)
    toks = []
    for t in range(max_length + 1):
        lp, _, state = decoder.step(prev, state)
        block = _blocked(lp.shape[-1], t, eos=eos, banned=banned, min_length=0, max_length=max_length,
                         device=features.device)
        tok = lp.masked_fill(block, NEG_INF).max(-1).indices
        tok = torch.where(done, torch.full_like(tok, eos), tok)
        toks.append(tok)
        done = done | (tok == eos)
        prev = tok
    return torch.stack(toks, 1)


def greedy_words(tokens: Tensor, eos: int) -> list[list[int]]:
    """Each row of ``greedy_fixed``'s tokens cut before its first <eos>, as Python lists."""
    out = []
    for row in tokens.tolist():
        out.append(row[: row.index(eos)] if eos in row else row)
    return out


def policy(decoder: Any, features: Tensor, mask: Tensor | None, tokens: Tensor, *, xe: bool, label_smoothing: float,
           **sampling: Any) -> tuple[SampleBatch, Tensor | None]:
    """The compiled SCST forward: ``sample_fixed`` and, with ``xe``, the cross-entropy of the
    reference captions ``tokens`` (the static schedule)."""
    drawn = sample_fixed(decoder, features, mask, **sampling)
    ce = decoder.compute_loss(features, mask, tokens, label_smoothing, static=True)["xe"] if xe else None
    return drawn, ce
