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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from captioning.errors import ConfigError

__all__ = [
    "DecodeConfig",
    "DecodeConfig",
    "Hypothesis",
    "SampleBatch",
    "beam_search",
    "decode_batch",
    "greedy_decode",
    "grouped_beam_search",
    "length_penalty",
    "sample",
]

NEG_INF = float("-inf")


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
    ``group`` (the diverse beam search group that found it; 0 otherwise)."""

    tokens: list[int]
    score: float
    attention: Tensor | None
    log_prob: float = 0.0
    finished: bool = True
    group: int = 0  # diverse beam search: the group that found it


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
    score: Tensor  # [A,K] cpu float: ranking score of each new beam (with diversity penalties)
    raw: Tensor  # [A,K] cpu float: its summed log-probs
    alpha: Tensor | None  # [A,K,N] alpha of the OLD beams at this step (device until the end)


@dataclass
class _Finished:
    """A hypothesis that emitted <eos> at ``step`` from beam ``parent`` of group ``group``."""

    rank: float  # ranking score within the group (length-normalised, diversity penalties included)
    score: float  # length-normalised summed log-probs
    raw: float  # summed log-probs incl. <eos>
    step: int
    parent: int
    group: int


@dataclass
class _Step:
    """One step's selection for ``A`` items x ``K = G * Kg`` beams (group ``g``: beams ``g*Kg ..``)."""

    scores: Tensor  # [A,K] ranking score of the new beams (-inf: dead)
    raw: Tensor  # [A,K] their summed log-probs
    beam: Tensor  # [A,K] parent beam of each new beam (0..K-1)
    token: Tensor  # [A,K] its last token
    ended: list[tuple[Tensor, Tensor, Tensor, Tensor]]  # per group: (done [A,Kg], score, raw, parent) of <eos> candidates


def _expand(scores: Tensor, lp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The best ``2K`` one-word extensions of ``K`` beams: ``scores [A,K]`` + ``lp [A,K,V]`` ->
    ``(score, beam, token)``, each ``[A,2K]``, best first."""
    a, k, v = lp.shape
    cand = (scores.unsqueeze(-1) + lp).view(a, k * v)
    top_s, top_i = cand.topk(min(2 * k, k * v), dim=1)
    return top_s, torch.div(top_i, v, rounding_mode="floor"), top_i % v


def _group_step(scores: Tensor, raw: Tensor, lp: Tensor, penalty: Tensor | None, eos: int
                ) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor, Tensor]]:
    """One step of one group's ``Kg`` beams: ``scores``/``raw [A,Kg]``, ``lp [A,Kg,V]``, ``penalty
    [A,V]`` (subtracted for ranking; None: none) -> the ``Kg`` new live beams' (scores, raw, parent,
    token) and the <eos> candidates ranked among the first ``Kg``, which finish."""
    k, v = lp.shape[1], lp.shape[2]
    ranked = lp if penalty is None else lp - penalty.unsqueeze(1)
    top_s, top_beam, top_tok = _expand(scores, ranked)
    if penalty is None:
        top_raw = top_s  # the same sums: ranking score == log-prob
    else:
        top_raw = raw.gather(1, top_beam) + lp.reshape(lp.shape[0], k * v).gather(1, top_beam * v + top_tok)
    is_eos = top_tok == eos
    done = is_eos[:, :k] & torch.isfinite(top_s[:, :k])
    sel_s, sel_r = top_s.masked_fill(is_eos, NEG_INF).topk(k, dim=1)
    ended = (done, top_s[:, :k], top_raw[:, :k], top_beam[:, :k])
    return sel_s, top_raw.gather(1, sel_r), top_beam.gather(1, sel_r), top_tok.gather(1, sel_r), ended


def _diverse_step(scores: Tensor, raw: Tensor, lp: Tensor, groups: int, strength: float, eos: int) -> _Step:
    """Select the next beams group after group (``scores``/``raw [A,K]``, ``lp [A,K,V]``).

    Hamming diversity (Vijayakumar et al. 2018): group ``g`` ranks its candidates by
    ``log p - strength * c``, ``c [A,V]`` = how many times the groups before it chose each word
    at this step (their continuing beams and their finished <eos>).  Group 0, and every group
    when ``strength == 0``, is a plain beam search of ``K / groups`` beams.
    """
    a, k, v = lp.shape
    kg = k // groups
    count = lp.new_zeros(a, v) if groups > 1 and strength > 0 else None
    parts, ended = [], []
    for g in range(groups):
        cols = slice(g * kg, (g + 1) * kg)
        penalty = None if count is None or g == 0 else strength * count
        s, r, b, tok, fin = _group_step(scores[:, cols], raw[:, cols], lp[:, cols], penalty, eos)
        parts.append((s, r, b + g * kg, tok))
        ended.append((fin[0], fin[1], fin[2], fin[3] + g * kg))
        if count is not None:
            count.scatter_add_(1, tok, torch.isfinite(s).to(count.dtype))
            count[:, eos] += fin[0].sum(1).to(count.dtype)
    s, r, b, tok = (torch.cat(x, 1) for x in zip(*parts, strict=True))
    return _Step(s, r, b, tok, ended)


def _collect_finished(finished: list[list[list[_Finished]]], active: list[int], step: _Step, t: int,
                      divisor: float) -> None:
    """Append the hypotheses that emitted <eos> at step ``t`` (``divisor``: the length penalty)."""
    for g, (done, top_s, top_raw, parent) in enumerate(step.ended):
        if not bool(done.any()):
            continue
        idx = done.nonzero().cpu().tolist()
        s, r, p = top_s.cpu(), top_raw.cpu(), parent.cpu()
        for a, j in idx:
            raw = float(r[a, j])
            finished[active[a]][g].append(_Finished(float(s[a, j]) / divisor, raw / divisor, raw, t, int(p[a, j]), g))


def _record(step: _Step, alpha: Tensor | None, active: list[int], items: int) -> _StepRecord:
    """What backtracking needs of a step: the choices on the CPU (one transfer), alpha as it is."""
    pos = [-1] * items
    for a, item in enumerate(active):
        pos[item] = a
    sel = torch.stack([step.token, step.beam], 0).cpu()
    scores = torch.stack([step.scores, step.raw], 0).float().cpu()
    k = step.token.shape[1]
    return _StepRecord(pos, sel[0], sel[1], scores[0], scores[1],
                       None if alpha is None else alpha.view(len(active), k, -1))


def _group_open(best_live: float, done: list[_Finished], n: int, lp_max: float, early_exit: bool) -> bool:
    """Whether a live beam of a group can still enter its ``n`` best: the live score only
    decreases, and a length penalty divides it by at most ``lp_max``."""
    bound = best_live
    if not early_exit:
        bound = float("inf") if bound > NEG_INF else bound
    if bound == NEG_INF:
        return False  # nothing alive any more
    bound = bound / lp_max if bound <= 0 else bound
    if len(done) >= n:
        nth = sorted((f.rank for f in done), reverse=True)[n - 1]
        if nth >= bound:
            return False
    return True


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


def _group_hypotheses(records: list[_StepRecord], done: list[_Finished], item: int, last_step: int,
                      group: int, kg: int, n: int, kind: str, alpha: float) -> list[Hypothesis]:
    """Group ``group``'s ``n`` best finished hypotheses of ``item``, best first; when fewer
    finished, the best unfinished beams of the last step with a live beam; never an empty list."""
    hyps: list[Hypothesis] = []
    seen: set[tuple[int, ...]] = set()
    for f in sorted(done, key=lambda x: -x.rank)[:n]:
        toks, att = _backtrack(records, item, f.step - 1, f.parent)
        hyps.append(Hypothesis(toks, f.score, att, f.raw, True, group))
        seen.add(tuple(toks))
    for s in range(last_step, -1, -1) if len(hyps) < n else ():
        rec = records[s]
        a = rec.pos[item]
        live = [j for j in range(group * kg, (group + 1) * kg) if math.isfinite(float(rec.score[a, j]))]
        for j in live:
            toks, att = _backtrack(records, item, s, j)
            if tuple(toks) not in seen:
                raw = float(rec.raw[a, j])
                hyps.append(Hypothesis(toks, raw / length_penalty(len(toks), kind, alpha), att, raw, False, group))
                seen.add(tuple(toks))
            if len(hyps) >= n:
                break
        if live:
            break
    return hyps or [Hypothesis([], NEG_INF, None, NEG_INF, False, group)]


def _merge_groups(per_group: list[list[Hypothesis]], n: int) -> list[Hypothesis]:
    """The ``n`` best of all groups' hypotheses (finished first, then by ``score``), one per caption."""
    if len(per_group) == 1:
        return per_group[0]
    out: list[Hypothesis] = []
    seen: set[tuple[int, ...]] = set()
    for h in sorted((h for hyps in per_group for h in hyps), key=lambda h: (not h.finished, -h.score)):
        if tuple(h.tokens) not in seen and len(out) < n:
            out.append(h)
            seen.add(tuple(h.tokens))
    return out


@torch.no_grad()
def beam_search(
    decoder: Any,
    features: Tensor,
    mask: Tensor | None,
    cfg: DecodeConfig,
    bos: int,
    eos: int,
    unk: int | None = None,
    *,
    early_exit: bool = True,
) -> list[list[Hypothesis]]:
    """Batched beam search: ``features [B,N,C]`` -> for each item its ``n_best`` hypotheses, best first.

    With ``cfg.groups > 1`` (diverse beam search) the groups' hypotheses are merged: finished
    first, by ``score`` (the length-normalised log-prob, without diversity penalties), one per
    distinct caption; ``Hypothesis.group`` says which group found it.  See ``grouped_beam_search``.
    """
    per_item = grouped_beam_search(decoder, features, mask, cfg, bos, eos, unk, early_exit=early_exit)
    return [_merge_groups(groups, cfg.n_best) for groups in per_item]


@torch.no_grad()
def grouped_beam_search(
    decoder: Any,
    features: Tensor,
    mask: Tensor | None,
    cfg: DecodeConfig,
    bos: int,
    eos: int,
    unk: int | None = None,
    *,
    early_exit: bool = True,
) -> list[list[list[Hypothesis]]]:
    """(Diverse) beam search -> per item, per group, the group's ``min(n_best, K / groups)`` best.

    All items x beams run as ``B*K`` rows through one ``decoder.step`` per time step (the K
    beams of an item share the item's keys/values).  At each step every group takes the best
    ``2Kg`` candidates of its ``Kg = K / groups`` beams (ranked with the diversity penalty of
    ``_diverse_step``); <eos> candidates ranked within the first ``Kg`` are finished, the best
    ``Kg`` others continue.  An item stops when each group has its hypotheses and no live beam
    of the group can beat them (for ``none`` the live score only decreases; for ``gnmt``/``avg``
    the bound divides it by the penalty at ``max_length``); finished items leave the batch.
    ``early_exit=False`` runs every item to ``max_length`` (same results, for testing).
    """
    cfg.validate()
    bsz, k, groups = features.shape[0], cfg.beam_size, cfg.groups
    kg, n_group = k // groups, min(cfg.n_best, k // groups)
    v = int(decoder.vocab_size)
    device = features.device
    banned = _banned_tokens(decoder, bos, eos, unk if cfg.block_unk else None)
    kind, la = cfg.length_penalty, cfg.alpha
    lp_max = length_penalty(cfg.max_length + 1, kind, la)

    state = decoder.init_state(features, mask).repeat_interleave(k)
    active: list[int] = list(range(bsz))
    scores = torch.full((bsz, k), NEG_INF, device=device)
    scores[:, ::kg] = 0.0  # every group starts from one <bos> beam
    raw = scores.clone()
    prev = torch.full((bsz * k,), bos, dtype=torch.long, device=device)
    history = torch.zeros(bsz * k, 0, dtype=torch.long, device=device)
    records: list[_StepRecord] = []
    finished: list[list[list[_Finished]]] = [[[] for _ in range(groups)] for _ in range(bsz)]
    last_step = [-1] * bsz  # last step each item took part in

    for t in range(cfg.max_length + 1):
        n_act = len(active)
        lp, alpha, state = decoder.step(prev, state)
        lp = _mask_log_probs(lp, t, eos=eos, banned=banned, min_length=cfg.min_length,
                             max_length=cfg.max_length, history=history, block_trigrams=cfg.block_trigrams)
        step = _diverse_step(scores, raw, lp.view(n_act, k, v), groups, cfg.diversity_strength, eos)
        _collect_finished(finished, active, step, t, length_penalty(t + 1, kind, la))
        scores, raw = step.scores, step.raw
        records.append(_record(step, alpha, active, bsz))
        for item in active:
            last_step[item] = t
        if t == cfg.max_length:
            break

        rows = (torch.arange(n_act, device=device).unsqueeze(1) * k + step.beam).view(-1)
        state = state.index_select(rows, within_groups=True)
        history = torch.cat([history.index_select(0, rows), step.token.view(-1, 1)], 1)
        prev = step.token.view(-1)

        best_live = records[-1].score[:, ::kg].tolist()  # each group's best live beam
        keep = [a for a, item in enumerate(active)
                if any(_group_open(best_live[a][g], finished[item][g], n_group, lp_max, early_exit)
                       for g in range(groups))]
        if not keep:
            break
        if len(keep) < n_act:
            keep_t = torch.tensor(keep, device=device)
            rows_keep = (keep_t.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
            state = state.select_groups(keep_t)
            scores, raw = scores.index_select(0, keep_t), raw.index_select(0, keep_t)
            history = history.index_select(0, rows_keep)
            prev = prev.index_select(0, rows_keep)
            active = [active[a] for a in keep]

    for rec in records:  # one transfer per step
        if rec.alpha is not None:
            rec.alpha = rec.alpha.float().cpu()
    return [[_group_hypotheses(records, finished[item][g], item, last_step[item], g, kg, n_group, kind, la)
             for g in range(groups)] for item in range(bsz)]


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
