"""Sampling captions from a decoder's word distributions (temperature, top-k, top-p).

Used by ``decode_batch`` (``strategy=sample``: several captions per item, the most likely first)
and by self-critical training (``captioning.train.scst``), which backpropagates through the
sampled tokens' log-probabilities.  The decoder protocol is ``captioning.models.search``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captioning.models.decoding import NEG_INF, Hypothesis

__all__ = ["SampleBatch", "filter_log_probs", "sample"]


@dataclass
class SampleBatch:
    """``n`` sampled captions per item; rows are item-major (row ``i*n + j`` = sample j of item i).

    ``tokens [R,T]`` (words then <eos>, padded with <eos>'s id after the end), ``log_probs [R,T]``
    (log-probability of each sampled token under the distribution it was drawn from; 0 after the
    end; differentiable when sampled with grad), ``mask [R,T]`` (True = a real token incl. <eos>),
    ``attention [R,T,N]`` or None, ``finished [R]`` (ended with <eos>), ``entropy [R,T]`` (of
    each step's sampling distribution, 0 after the end; only when asked for).
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
        """Per item its ``n`` samples as hypotheses, the most likely first."""
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


def sample(
    decoder: Any,
    features: Tensor,
    mask: Tensor | None,
    *,
    n: int,
    max_length: int,
    bos: int,
    eos: int,
    banned: list[int] | tuple[int, ...] = (),
    min_length: int = 1,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    entropy: bool = False,
) -> SampleBatch:
    """Draw ``n`` captions per item of ``features [B,N,C]`` (the item's memory is shared by its
    rows).  Runs with or without grad: SCST backpropagates through ``log_probs``.  The same
    constraints as beam search: ``banned`` tokens never, <eos> not before ``min_length`` words,
    only <eos> after ``max_length`` words."""
    b = features.shape[0]
    device = features.device
    state = decoder.init_state(features, mask).repeat_interleave(n)
    rows = b * n
    prev = torch.full((rows,), bos, dtype=torch.long, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    toks, lps, masks, atts, ents = [], [], [], [], []
    ban = torch.zeros(int(decoder.vocab_size), dtype=torch.bool, device=device)
    ban[list(banned)] = True
    for t in range(max_length + 1):
        lp, alpha, state = decoder.step(prev, state)
        block = ban.clone()
        if t < min_length:
            block[eos] = True
        if t >= max_length:
            block = torch.ones_like(ban)
            block[eos] = False
        q = filter_log_probs(lp.masked_fill(block, NEG_INF), temperature, top_k, top_p)
        tok = torch.multinomial(q.detach().exp(), 1, generator=generator).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, eos), tok)
        live = ~done
        toks.append(tok)
        picked = q.gather(1, tok.unsqueeze(1)).squeeze(1)
        lps.append(torch.where(live, picked, torch.zeros_like(picked)))
        if entropy:  # -sum p log p over the tokens that can be drawn (0 log 0 = 0)
            h = -(q.exp() * q.masked_fill(torch.isinf(q), 0.0)).sum(-1)
            ents.append(torch.where(live, h, torch.zeros_like(h)))
        masks.append(live)
        if alpha is not None:
            atts.append(alpha)
        finished = finished | (live & (tok == eos))
        done = done | (tok == eos)
        prev = tok
        if bool(done.all()):
            break
    return SampleBatch(
        tokens=torch.stack(toks, 1),
        log_probs=torch.stack(lps, 1),
        mask=torch.stack(masks, 1),
        attention=torch.stack(atts, 1) if atts else None,
        finished=finished,
        entropy=torch.stack(ents, 1) if ents else None,
    )
