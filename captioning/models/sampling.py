"""Left-to-right decoding, one row per caption: greedy (arg-max) or sampled, in one loop.

``sample`` is greedy decoding (``greedy=True``), sampling from the model's word distributions
(temperature, top-k, top-p; several captions per item) and self-critical training's draws alike,
under the same word constraints as beam search (``captioning.models.decoding.mask_log_probs``:
banned tokens never, <eos> not before ``min_length`` words, only <eos> after ``max_length``).
It runs with or without grad: SCST backpropagates through the drawn tokens' log-probabilities.

A draw is the Gumbel-max trick, ``argmax_w (q_w + g_w)`` with ``g_w = -log(-log u_w)`` and ``u_w ~
U(0,1)`` i.i.d., which is distributed exactly as ``softmax(q)`` (Gumbel 1954; the identity behind
Gumbel-softmax, Jang et al. 2017): elementwise random numbers and an argmax, which ``torch.compile``
traces, where ``torch.multinomial`` breaks the graph.  ``fixed_length=True`` runs every row all
``max_length + 1`` steps, a row that has ended emitting <eos> with log-probability 0: one shape and
no host read, so a compiled SCST step captures it whole; otherwise the loop stops once every row has
ended (one host read per step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captioning.models.decoding import NEG_INF, Hypothesis, mask_log_probs

__all__ = ["SampleBatch", "filter_log_probs", "gumbel_argmax", "sample"]


@dataclass
class SampleBatch:
    """``n`` captions per item; rows are item-major (row ``i*n + j`` = caption j of item i).

    ``tokens [R,T]`` (words then <eos>, <eos>'s id after the end), ``log_probs [R,T]`` (each token's
    log-probability under the distribution it was chosen from; 0 after the end; differentiable when
    drawn with grad), ``mask [R,T]`` (True = a real token incl. <eos>), ``attention [R,T,N]`` or None,
    ``finished [R]`` (ended with <eos>), ``entropy [R,T]`` (of each step's distribution, 0 after the
    end; only when asked for).
    """

    tokens: Tensor
    log_probs: Tensor
    mask: Tensor
    attention: Tensor | None
    finished: Tensor
    entropy: Tensor | None = None

    def words(self, eos: int) -> list[list[int]]:
        """Each row's words (no <eos>), as Python lists."""
        out = []
        for row, m, fin in zip(self.tokens.tolist(), self.mask.sum(1).tolist(), self.finished.tolist(),
                               strict=True):
            out.append(row[: m - 1] if fin else row[:m])
        return out

    def hypotheses(self, items: int, n: int, eos: int) -> list[list[Hypothesis]]:
        """Per item its ``n`` captions as hypotheses, the most likely first."""
        words = self.words(eos)
        lp = self.log_probs.detach().double().cpu()
        scores, lps = lp.sum(1).tolist(), lp.tolist()
        att = None if self.attention is None else self.attention.detach().float().cpu()
        fin = self.finished.cpu().tolist()
        out = []
        for i in range(items):
            hyps = []
            for r in range(i * n, (i + 1) * n):
                w = words[r]
                a = None if att is None else att[r, : len(w)].clone()
                token_lps = lps[r][: len(w) + int(fin[r])]  # the words, then <eos>'s
                hyps.append(Hypothesis(w, scores[r], a, scores[r], bool(fin[r]), token_log_probs=token_lps))
            out.append(sorted(hyps, key=lambda h: -h.score))
        return out


def filter_log_probs(lp: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """The sampling distribution from log-probs ``lp [R,V]``: ``softmax(lp / temperature)``
    restricted to the ``top_k`` most likely tokens and to the smallest set whose probability
    reaches ``top_p`` (nucleus; Holtzman et al. 2020), renormalised -> log-probs ``[R,V]``."""
    x = lp / temperature if temperature != 1.0 else lp
    if top_k and top_k < x.shape[-1]:
        kth = x.topk(top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, NEG_INF)
    if top_p < 1.0:
        probs, order = torch.softmax(x, -1).sort(dim=-1, descending=True)
        before = probs.cumsum(-1) - probs  # mass of the more likely tokens
        drop = (before >= top_p).scatter(-1, order, before >= top_p)
        x = x.masked_fill(drop, NEG_INF)
    return torch.log_softmax(x, dim=-1)


def gumbel_argmax(q: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One draw per row from ``softmax(q)`` (``q [R,V]`` log-probs, -inf = never) -> ``[R]``."""
    u = torch.rand(q.shape, generator=generator, device=q.device).clamp_(torch.finfo(torch.float32).tiny, 1.0)
    return (q.float() - torch.log(-torch.log(u))).argmax(-1)


def sample(decoder: Any, features: Tensor, mask: Tensor | None, *, n: int = 1, max_length: int, bos: int,
           eos: int, banned: list[int] | tuple[int, ...] = (), min_length: int = 1, greedy: bool = False,
           temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, block_trigrams: bool = False,
           generator: torch.Generator | None = None, entropy: bool = False, attention: bool = True,
           fixed_length: bool = False) -> SampleBatch:
    """``n`` captions per item of ``features [B,N,C]`` (an item's memory shared by its rows), each
    word the arg-max (``greedy``) or a draw from ``filter_log_probs`` of the constrained log-probs;
    ``block_trigrams``: no trigram twice in a caption.  A row with no word allowed (e.g.
    ``min_length > max_length``) ends there, unfinished."""
    state = decoder.init_state(features, mask)
    state = state.repeat_interleave(n) if n > 1 else state
    rows, device = features.shape[0] * n, features.device
    prev = torch.full((rows,), bos, dtype=torch.long, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    toks, lps, masks, atts, ents = [], [], [], [], []
    for t in range(max_length + 1):
        lp, alpha, state = decoder.step(prev, state)
        lp = mask_log_probs(lp, t, eos=eos, banned=list(banned), min_length=min_length, max_length=max_length,
                            history=torch.stack(toks, 1) if block_trigrams and toks else None,
                            block_trigrams=block_trigrams)
        q = lp if greedy else filter_log_probs(lp, temperature, top_k, top_p)
        tok = q.argmax(-1) if greedy else gumbel_argmax(q.detach(), generator)
        picked = q.gather(1, tok.unsqueeze(1)).squeeze(1)
        live = ~done & ~torch.isinf(picked)  # nothing allowed: the row ends here, unfinished
        tok = torch.where(done, torch.full_like(tok, eos), tok)
        toks.append(tok)
        lps.append(torch.where(live, picked, torch.zeros_like(picked)))
        masks.append(live)
        if entropy:  # -sum p log p over the tokens that can be drawn (0 log 0 = 0)
            h = -(q.exp() * q.masked_fill(torch.isinf(q), 0.0)).sum(-1)
            ents.append(torch.where(live, h, torch.zeros_like(h)))
        if attention and alpha is not None:
            atts.append(alpha)
        finished = finished | (live & (tok == eos))
        done = done | ~live | (tok == eos)
        prev = tok
        if not fixed_length and bool(done.all()):
            break
    return SampleBatch(tokens=torch.stack(toks, 1), log_probs=torch.stack(lps, 1), mask=torch.stack(masks, 1),
                       attention=torch.stack(atts, 1) if atts else None, finished=finished,
                       entropy=torch.stack(ents, 1) if ents else None)
