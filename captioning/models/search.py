"""Greedy decoding and batched beam search over any registered caption decoder.

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captioning.errors import ConfigError

__all__ = [
    "BeamConfig",
    "DecodeConfig",
    "Hypothesis",
    "SampleBatch",
    "beam_search",
    "decode_batch",
    "greedy_decode",
    "length_penalty",
    "sample",
]

NEG_INF = float("-inf")


@dataclass
class DecodeConfig:
    """How captions are decoded (OmegaConf structured-config compatible; ``conf/decode/*.yaml``).

    ``strategy=beam``: batched beam search (greedy when ``beam_size == 1``); ``n_best`` best
    hypotheses per item.  ``strategy=sample``: ``num_samples`` captions per item drawn from the
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


BeamConfig = DecodeConfig  # the name most call sites know it by


@dataclass
class Hypothesis:
    """A decoded caption: ``tokens`` (no <bos>/<eos>), ``score`` (the ranking score:
    length-normalised for beam search with a length penalty, else the sum of log-probs),
    ``attention [len(tokens), N]`` (CPU float32; None for models without attention),
    ``log_prob`` (sum of token log-probs incl. <eos>), ``finished`` (ended with <eos>)."""

    tokens: list[int]
    score: float
    attention: Tensor | None
    log_prob: float = 0.0
    finished: bool = True


def length_penalty(length: int, kind: str, alpha: float = 0.6) -> float:
    """Divisor of the summed log-prob: 1 (none), ``((5+len)/6)^alpha`` (gnmt), ``len`` (avg)."""
    if kind == "none":
        return 1.0
    if kind == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if kind == "avg":
        return float(max(length, 1))
    raise ConfigError(f"unknown length_penalty {kind!r}; use none, gnmt or avg")


def _mask_log_probs(
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
    """Apply the constraints at step ``t`` (= words emitted so far) to ``lp [R,V]`` (in place)."""
    if banned:
        lp[:, banned] = NEG_INF
    if t < min_length:
        lp[:, eos] = NEG_INF
    if t >= max_length:
        keep = lp[:, eos].clone()
        lp.fill_(NEG_INF)
        lp[:, eos] = keep
        return lp
    if block_trigrams and history is not None and t >= 3:
        # (w_i, w_{i+1}) == (w_{t-2}, w_{t-1}) blocks w_{i+2}
        match = (history[:, : t - 2] == history[:, t - 2 : t - 1]) & (
            history[:, 1 : t - 1] == history[:, t - 1 : t]
        )
        if bool(match.any()):
            pen = torch.where(match, NEG_INF, 0.0).to(lp.dtype)
            blocked = torch.zeros_like(lp).scatter_reduce_(
                1, history[:, 2:t], pen, reduce="amin", include_self=True
            )
            lp = lp + blocked
    return lp


def _banned_tokens(decoder: Any, bos: int, eos: int, unk: int | None) -> list[int]:
    banned = {bos}
    pad = getattr(decoder, "pad_id", None)
    if pad is not None:
        banned.add(int(pad))
    if unk is not None:
        banned.add(int(unk))
    banned.discard(eos)
    return sorted(banned)


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
    banned = _banned_tokens(decoder, bos, eos, unk)
    state = decoder.init_state(features, mask)
    prev = torch.full((b,), bos, dtype=torch.long, device=device)
    score = torch.zeros(b, dtype=torch.float64, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    finished = torch.zeros(b, dtype=torch.bool, device=device)
    n_words = torch.full((b,), max_length, dtype=torch.long, device=device)
    toks: list[Tensor] = []
    atts: list[Tensor | None] = []
    history = torch.zeros(b, 0, dtype=torch.long, device=device)
    for t in range(max_length + 1):
        lp, alpha, state = decoder.step(prev, state)
        lp = _mask_log_probs(
            lp,
            t,
            eos=eos,
            banned=banned,
            min_length=min_length,
            max_length=max_length,
            history=history,
            block_trigrams=block_trigrams,
        )
        s, tok = lp.max(-1)
        dead = ~done & torch.isinf(s)  # nothing allowed: stop unfinished
        is_eos = ~done & ~dead & (tok == eos)
        score = score + torch.where(done | dead, 0.0, s.double())
        n_words = torch.where(is_eos | dead, torch.full_like(n_words, t), n_words)
        finished |= is_eos
        done = done | is_eos | dead
        toks.append(tok)
        atts.append(alpha)
        history = torch.cat([history, tok.unsqueeze(1)], 1)
        if bool(done.all()):
            break
        prev = tok
    tok_mat = torch.stack(toks, 1).cpu()
    att_mat = torch.stack(atts, 1).float().cpu() if atts[0] is not None else None  # type: ignore[arg-type]
    n_words_l = n_words.cpu().tolist()
    score_l = score.cpu().tolist()
    fin_l = finished.cpu().tolist()
    out = []
    for i in range(b):
        n = min(n_words_l[i], tok_mat.shape[1])
        out.append(
            Hypothesis(
                tokens=tok_mat[i, :n].tolist(),
                score=score_l[i],
                attention=None if att_mat is None else att_mat[i, :n].clone(),
                log_prob=score_l[i],
                finished=bool(fin_l[i]),
            )
        )
    return out


@dataclass
class _StepRecord:
    pos: list[int]  # global item -> row in this step's arrays (-1: inactive)
    tok: Tensor  # [A,K] cpu: token chosen by each new beam
    par: Tensor  # [A,K] cpu: parent beam (index into the previous step's beams)
    score: Tensor  # [A,K] cpu float: raw score of each new beam
    alpha: Tensor | None  # [A,K,N] alpha of the OLD beams at this step (device until the end)


def _backtrack(
    records: list[_StepRecord], item: int, last_step: int, beam: int
) -> tuple[list[int], Tensor | None]:
    """Words and attention rows of the beam ``beam`` alive after step ``last_step``."""
    toks: list[int] = []
    atts: list[Tensor] = []
    j = beam
    for s in range(last_step, -1, -1):
        rec = records[s]
        a = rec.pos[item]
        toks.append(int(rec.tok[a, j]))
        parent = int(rec.par[a, j])
        if rec.alpha is not None:
            atts.append(rec.alpha[a, parent])
        j = parent
    toks.reverse()
    atts.reverse()
    att = torch.stack(atts, 0) if atts else None
    if att is None and records and records[0].alpha is not None:
        att = records[0].alpha.new_zeros(0, records[0].alpha.shape[-1])
    return toks, att


@torch.no_grad()
def beam_search(
    decoder: Any,
    features: Tensor,
    mask: Tensor | None,
    cfg: BeamConfig,
    bos: int,
    eos: int,
    unk: int | None = None,
    *,
    early_exit: bool = True,
) -> list[list[Hypothesis]]:
    """Batched beam search: ``features [B,N,C]`` -> for each item its ``n_best`` hypotheses, best first.

    All items x beams run as ``B*K`` rows through one ``decoder.step`` per time step (the K
    beams of an item share the item's keys/values).  At each step the best ``2K`` candidates
    of an item are taken; <eos> candidates ranked within the first K are finished, the best
    K others continue.  An item stops when it has ``n_best`` finished hypotheses that no live
    beam can beat (for ``none`` the live score only decreases; for ``gnmt``/``avg`` the bound
    divides it by the penalty at ``max_length``); finished items leave the batch.
    ``early_exit=False`` runs every item to ``max_length`` (same results, for testing).
    """
    cfg.validate()
    bsz = features.shape[0]
    k = cfg.beam_size
    v = int(decoder.vocab_size)
    device = features.device
    banned = _banned_tokens(decoder, bos, eos, unk if cfg.block_unk else None)
    kind, la = cfg.length_penalty, cfg.alpha
    lp_max = length_penalty(cfg.max_length + 1, kind, la)

    state = decoder.init_state(features, mask).repeat_interleave(k)
    active: list[int] = list(range(bsz))
    scores = torch.full((bsz, k), NEG_INF, device=device)
    scores[:, 0] = 0.0
    prev = torch.full((bsz * k,), bos, dtype=torch.long, device=device)
    history = torch.zeros(bsz * k, 0, dtype=torch.long, device=device)
    records: list[_StepRecord] = []
    # per item: (normalised score, raw score, step of <eos>, parent beam)
    finished: list[list[tuple[float, float, int, int]]] = [[] for _ in range(bsz)]
    last_step = [-1] * bsz  # last step each item took part in

    for t in range(cfg.max_length + 1):
        n_act = len(active)
        lp, alpha, state = decoder.step(prev, state)
        lp = _mask_log_probs(
            lp,
            t,
            eos=eos,
            banned=banned,
            min_length=cfg.min_length,
            max_length=cfg.max_length,
            history=history,
            block_trigrams=cfg.block_trigrams,
        )
        cand = (scores.unsqueeze(-1) + lp.view(n_act, k, v)).view(n_act, k * v)
        top_s, top_i = cand.topk(min(2 * k, k * v), dim=1)
        top_beam = torch.div(top_i, v, rounding_mode="floor")
        top_tok = top_i % v
        is_eos = top_tok == eos

        # finished candidates: <eos> among the first K ranks
        fin = is_eos[:, :k] & torch.isfinite(top_s[:, :k])
        if bool(fin.any()):
            idx = fin.nonzero().cpu().tolist()
            fs = top_s[:, :k].cpu()
            fb = top_beam[:, :k].cpu()
            norm = length_penalty(t + 1, kind, la)
            for a, r in idx:
                raw = float(fs[a, r])
                finished[active[a]].append((raw / norm, raw, t, int(fb[a, r])))

        # live beams: the best K non-<eos> candidates
        alive_s = top_s.masked_fill(is_eos, NEG_INF)
        sel_s, sel_r = alive_s.topk(k, dim=1)
        new_beam = top_beam.gather(1, sel_r)
        new_tok = top_tok.gather(1, sel_r)
        scores = sel_s

        pos = [-1] * bsz
        for a, item in enumerate(active):
            pos[item] = a
            last_step[item] = t
        sel_cpu = torch.stack([new_tok, new_beam], 0).cpu()
        scores_cpu = scores.float().cpu()
        records.append(
            _StepRecord(
                pos=pos,
                tok=sel_cpu[0],
                par=sel_cpu[1],
                score=scores_cpu,
                alpha=None if alpha is None else alpha.view(n_act, k, -1),
            )
        )
        if t == cfg.max_length:
            break

        rows = (torch.arange(n_act, device=device).unsqueeze(1) * k + new_beam).view(-1)
        state = state.index_select(rows, within_groups=True)
        history = torch.cat([history.index_select(0, rows), new_tok.view(-1, 1)], 1)
        prev = new_tok.view(-1)

        # early exit: n_best finished that no live beam can beat
        best_live = scores_cpu[:, 0].tolist()
        keep: list[int] = []
        for a, item in enumerate(active):
            bound = best_live[a]
            if not early_exit:
                bound = float("inf") if bound > NEG_INF else bound
            if bound == NEG_INF:
                continue  # nothing alive any more
            bound = bound / lp_max if bound <= 0 else bound
            f = finished[item]
            if len(f) >= cfg.n_best:
                nth = sorted((x[0] for x in f), reverse=True)[cfg.n_best - 1]
                if nth >= bound:
                    continue
            keep.append(a)
        if not keep:
            break
        if len(keep) < n_act:
            keep_t = torch.tensor(keep, device=device)
            rows_keep = (keep_t.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
            state = state.select_groups(keep_t)
            scores = scores.index_select(0, keep_t)
            history = history.index_select(0, rows_keep)
            prev = prev.index_select(0, rows_keep)
            active = [active[a] for a in keep]

    for rec in records:  # one transfer per step
        if rec.alpha is not None:
            rec.alpha = rec.alpha.float().cpu()

    results: list[list[Hypothesis]] = []
    for item in range(bsz):
        hyps: list[Hypothesis] = []
        seen: set[tuple[int, ...]] = set()
        for norm, raw, step, parent in sorted(finished[item], key=lambda x: -x[0]):
            if len(hyps) >= cfg.n_best:
                break
            toks, att = _backtrack(records, item, step - 1, parent)
            hyps.append(Hypothesis(toks, norm, att, raw, True))
            seen.add(tuple(toks))
        if len(hyps) < cfg.n_best:
            # fall back to the best unfinished beams of the last step with a live beam
            for s in range(last_step[item], -1, -1):
                rec = records[s]
                a = rec.pos[item]
                live = [j for j in range(k) if math.isfinite(float(rec.score[a, j]))]
                if not live:
                    continue
                for j in live:
                    if len(hyps) >= cfg.n_best:
                        break
                    toks, att = _backtrack(records, item, s, j)
                    if tuple(toks) in seen:
                        continue
                    raw = float(rec.score[a, j])
                    norm = raw / length_penalty(len(toks), kind, la)
                    hyps.append(Hypothesis(toks, norm, att, raw, False))
                    seen.add(tuple(toks))
                break
        if not hyps:  # nothing finite at all: empty caption rather than no result
            hyps.append(Hypothesis([], NEG_INF, None, NEG_INF, False))
        results.append(hyps)
    return results


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
                           bos=bos, eos=eos, banned=_banned_tokens(decoder, bos, eos, unk if cfg.block_unk else None),
                           min_length=cfg.min_length, temperature=cfg.temperature, top_k=cfg.top_k,
                           top_p=cfg.top_p, generator=generator)
        return batch.hypotheses(features.shape[0], cfg.num_samples, eos)
    if cfg.beam_size == 1:
        hyps = greedy_decode(
            decoder,
            features,
            mask,
            cfg.max_length,
            bos,
            eos,
            unk=unk if cfg.block_unk else None,
            min_length=cfg.min_length,
            block_trigrams=cfg.block_trigrams,
        )
        return [[h] for h in hyps]
    return beam_search(decoder, features, mask, cfg, bos, eos, unk)


# ----------------------------------------------------------------------------------- sampling


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
        scores = self.log_probs.detach().double().sum(1).cpu().tolist()
        att = None if self.attention is None else self.attention.detach().float().cpu()
        fin = self.finished.cpu().tolist()
        out = []
        for i in range(items):
            hyps = []
            for r in range(i * n, (i + 1) * n):
                w = words[r]
                a = None if att is None else att[r, : len(w)].clone()
                hyps.append(Hypothesis(w, scores[r], a, scores[r], bool(fin[r])))
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
