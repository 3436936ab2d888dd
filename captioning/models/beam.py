"""Batched (diverse) beam search over any caption decoder (the protocol of ``captioning.models.search``).

All items x beams run as ``B*K`` rows through one ``decoder.step`` per time step, the K beams of
an item sharing the item's keys/values; the first step runs one row per item, since every beam of
an item starts from the same <bos> state.  Each step's choices come to the host in one transfer;
the attention rows stay where they were computed until the search ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from captioning.models.decoding import (
    NEG_INF,
    DecodeConfig,
    Hypothesis,
    banned_tokens,
    length_penalty,
    mask_log_probs,
)

__all__ = ["beam_search", "grouped_beam_search"]


@dataclass
class _StepRecord:
    """A step's choices as Python lists ``[A][K]`` (backtracking reads them one by one, which lists
    do ~30x faster than tensors) and its attention rows (on the device until the search ends, then
    a CPU array)."""

    pos: list[int]  # global item -> row in this step's arrays (-1: inactive)
    tok: list[list[int]]  # token chosen by each new beam
    par: list[list[int]]  # its parent beam (index into the previous step's beams)
    score: list[list[float]]  # ranking score of each new beam (with diversity penalties)
    raw: list[list[float]]  # its summed log-probs
    lp: list[list[float]]  # the log-prob of its last token
    alpha: Any  # [A,K,N] (or [A,1,N]) alpha of the OLD beams at this step: a Tensor, then a numpy array; None


@dataclass
class _Finished:
    """A hypothesis that emitted <eos> at ``step`` from beam ``parent`` of group ``group``."""

    rank: float  # ranking score within the group (length-normalised, diversity penalties included)
    score: float  # length-normalised summed log-probs
    raw: float  # summed log-probs incl. <eos>
    step: int
    parent: int
    group: int
    eos_lp: float  # the log-prob of its <eos>


@dataclass
class _Step:
    """One step's selection for ``A`` items x ``K = G * Kg`` beams (group ``g``: beams ``g*Kg ..``)."""

    scores: Tensor  # [A,K] ranking score of the new beams (-inf: dead)
    raw: Tensor  # [A,K] their summed log-probs
    beam: Tensor  # [A,K] parent beam of each new beam (0..K-1)
    token: Tensor  # [A,K] its last token
    lp: Tensor  # [A,K] that token's log-prob
    # per group: (done [A,Kg], score, raw, parent, eos log-prob) of the <eos> candidates
    ended: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor]]


def _expand(scores: Tensor, lp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The best ``2K`` one-word extensions of ``K`` beams: ``scores [A,K]`` + ``lp [A,K,V]`` ->
    ``(score, beam, token)``, each ``[A,2K]``, best first."""
    a, k, v = lp.shape
    cand = (scores.unsqueeze(-1) + lp).view(a, k * v)
    top_s, top_i = cand.topk(min(2 * k, k * v), dim=1)
    return top_s, torch.div(top_i, v, rounding_mode="floor"), top_i % v


def _group_step(scores: Tensor, raw: Tensor, lp: Tensor, penalty: Tensor | None, eos: int
                ) -> tuple[tuple[Tensor, ...], tuple[Tensor, Tensor, Tensor, Tensor, Tensor]]:
    """One step of one group's ``Kg`` beams: ``scores``/``raw [A,Kg]``, ``lp [A,Kg,V]``, ``penalty
    [A,V]`` (subtracted for ranking; None: none) -> the ``Kg`` new live beams' (scores, raw, parent,
    token, token log-prob) and the <eos> candidates ranked among the first ``Kg``, which finish."""
    a, k, v = lp.shape
    ranked = lp if penalty is None else lp - penalty.unsqueeze(1)
    top_s, top_beam, top_tok = _expand(scores, ranked)
    top_lp = lp.reshape(a, k * v).gather(1, top_beam * v + top_tok)
    top_raw = top_s if penalty is None else raw.gather(1, top_beam) + top_lp  # no penalty: the same sums
    is_eos = top_tok == eos
    done = is_eos[:, :k] & torch.isfinite(top_s[:, :k])
    sel_s, sel_r = top_s.masked_fill(is_eos, NEG_INF).topk(k, dim=1)
    ended = (done, top_s[:, :k], top_raw[:, :k], top_beam[:, :k], top_lp[:, :k])
    return (sel_s, *(x.gather(1, sel_r) for x in (top_raw, top_beam, top_tok, top_lp))), ended


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
        (s, r, b, tok, tlp), fin = _group_step(scores[:, cols], raw[:, cols], lp[:, cols], penalty, eos)
        parts.append((s, r, b + g * kg, tok, tlp))
        ended.append((fin[0], fin[1], fin[2], fin[3] + g * kg, fin[4]))
        if count is not None:
            count.scatter_add_(1, tok, torch.isfinite(s).to(count.dtype))
            count[:, eos] += fin[0].sum(1).to(count.dtype)
    s, r, b, tok, tlp = (torch.cat(x, 1) for x in zip(*parts, strict=True))
    return _Step(s, r, b, tok, tlp, ended)


def _collect_finished(finished: list[list[list[_Finished]]], active: list[int], step: _Step, t: int,
                      divisor: float) -> None:
    """Append the hypotheses that emitted <eos> at step ``t`` (``divisor``: the length penalty)."""
    for g, (done, top_s, top_raw, parent, eos_lp) in enumerate(step.ended):
        if not bool(done.any()):
            continue
        idx = done.nonzero().cpu().tolist()
        s, r, p, e = torch.stack([top_s, top_raw, parent.to(top_s.dtype), eos_lp.to(top_s.dtype)]).cpu().tolist()
        for a, j in idx:
            raw = r[a][j]
            finished[active[a]][g].append(_Finished(s[a][j] / divisor, raw / divisor, raw, t, int(p[a][j]), g, e[a][j]))


def _record(step: _Step, alpha: Tensor | None, active: list[int], items: int) -> _StepRecord:
    """What backtracking needs of a step: the choices on the CPU (one transfer), alpha as it is
    (``[A,K,N]``, or ``[A,1,N]`` when every beam of an item read the same row)."""
    pos = [-1] * items
    for a, item in enumerate(active):
        pos[item] = a
    tok, par = torch.stack([step.token, step.beam], 0).cpu().tolist()
    score, raw, lp = torch.stack([step.scores, step.raw, step.lp.to(step.raw.dtype)], 0).float().cpu().tolist()
    if alpha is not None:
        alpha = alpha.view(len(active), -1, alpha.shape[-1])
    return _StepRecord(pos, tok, par, score, raw, lp, alpha)


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


def _backtrack(records: list[_StepRecord], item: int, last_step: int, beam: int
               ) -> tuple[list[int], Tensor | None, list[float]]:
    """Words, attention rows and word log-probs of the beam ``beam`` alive after step ``last_step``."""
    toks: list[int] = []
    atts: list[Any] = []
    lps: list[float] = []
    j = beam
    for s in range(last_step, -1, -1):
        rec = records[s]
        a = rec.pos[item]
        toks.append(rec.tok[a][j])
        lps.append(rec.lp[a][j])
        parent = rec.par[a][j]
        if rec.alpha is not None:
            atts.append(rec.alpha[a, min(parent, rec.alpha.shape[1] - 1)])
        j = parent
    toks.reverse()
    lps.reverse()
    if not records or records[0].alpha is None:
        return toks, None, lps
    rows = np.stack(atts[::-1]) if atts else np.zeros((0, records[0].alpha.shape[-1]), np.float32)
    return toks, torch.from_numpy(rows), lps


def _group_hypotheses(records: list[_StepRecord], done: list[_Finished], item: int, last_step: int,
                      group: int, kg: int, n: int, kind: str, alpha: float) -> list[Hypothesis]:
    """Group ``group``'s ``n`` best finished hypotheses of ``item``, best first; when fewer
    finished, the best unfinished beams of the last step with a live beam; never an empty list."""
    hyps: list[Hypothesis] = []
    seen: set[tuple[int, ...]] = set()
    for f in sorted(done, key=lambda x: -x.rank)[:n]:
        toks, att, lps = _backtrack(records, item, f.step - 1, f.parent)
        hyps.append(Hypothesis(toks, f.score, att, f.raw, True, group, [*lps, f.eos_lp]))
        seen.add(tuple(toks))
    for s in range(last_step, -1, -1) if len(hyps) < n else ():
        rec = records[s]
        a = rec.pos[item]
        live = [j for j in range(group * kg, (group + 1) * kg) if math.isfinite(rec.score[a][j])]
        for j in live:
            toks, att, lps = _backtrack(records, item, s, j)
            if tuple(toks) not in seen:
                raw = rec.raw[a][j]
                hyps.append(Hypothesis(toks, raw / length_penalty(len(toks), kind, alpha), att, raw, False, group,
                                       lps))
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


@dataclass
class _Beams:
    """The live beams of the ``active`` items: the decoder state (one row per item before the first
    step, ``K`` per item after it), their scores/raw sums ``[A,K]``, last tokens ``[A*K]`` and words."""

    state: Any
    scores: Tensor
    raw: Tensor
    prev: Tensor
    history: Tensor
    active: list[int]

    def advance(self, step: _Step, k: int, first: bool) -> None:
        """Each new beam continues its parent (after the first step: the item's one row, K times)."""
        a = len(self.active)
        if first:  # every beam of an item has the item's one state
            self.state = self.state.repeat_interleave(k)
            history = self.history.repeat_interleave(k, 0)
        else:
            rows = (torch.arange(a, device=step.beam.device).unsqueeze(1) * k + step.beam).view(-1)
            self.state = self.state.index_select(rows, within_groups=True)
            history = self.history.index_select(0, rows)
        self.history = torch.cat([history, step.token.view(-1, 1)], 1)
        self.prev = step.token.view(-1)
        self.scores, self.raw = step.scores, step.raw

    def keep(self, keep: list[int], k: int) -> None:
        """Drop the items not in ``keep`` (indices into ``active``)."""
        device = self.scores.device
        keep_t = torch.tensor(keep, device=device)
        rows = (keep_t.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
        self.state = self.state.select_groups(keep_t)
        self.scores, self.raw = self.scores.index_select(0, keep_t), self.raw.index_select(0, keep_t)
        self.history, self.prev = self.history.index_select(0, rows), self.prev.index_select(0, rows)
        self.active = [self.active[a] for a in keep]


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
    beams of an item share the item's keys/values; the first step runs one row per item).  At
    each step every group takes the best ``2Kg`` candidates of its ``Kg = K / groups`` beams
    (ranked with the diversity penalty of ``_diverse_step``); <eos> candidates ranked within the
    first ``Kg`` are finished, the best ``Kg`` others continue.  An item stops when each group has
    its hypotheses and no live beam of the group can beat them (for ``none`` the live score only
    decreases; for ``gnmt``/``avg`` the bound divides it by the penalty at ``max_length``);
    finished items leave the batch.  ``early_exit=False`` runs every item to ``max_length`` (same
    results, for testing).
    """
    cfg.validate()
    bsz, k, groups = features.shape[0], cfg.beam_size, cfg.groups
    kg, n_group = k // groups, min(cfg.n_best, k // groups)
    v = int(decoder.vocab_size)
    device = features.device
    banned = banned_tokens(decoder, bos, eos, unk if cfg.block_unk else None)
    kind, la = cfg.length_penalty, cfg.alpha
    lp_max = length_penalty(cfg.max_length + 1, kind, la)

    scores = torch.full((bsz, k), NEG_INF, device=device)
    scores[:, ::kg] = 0.0  # every group starts from one <bos> beam
    beams = _Beams(decoder.init_state(features, mask), scores, scores.clone(),
                   torch.full((bsz,), bos, dtype=torch.long, device=device),
                   torch.zeros(bsz, 0, dtype=torch.long, device=device), list(range(bsz)))
    records: list[_StepRecord] = []
    finished: list[list[list[_Finished]]] = [[[] for _ in range(groups)] for _ in range(bsz)]
    last_step = [-1] * bsz  # last step each item took part in

    for t in range(cfg.max_length + 1):
        n_act = len(beams.active)
        lp, alpha, beams.state = decoder.step(beams.prev, beams.state)
        lp = mask_log_probs(lp, t, eos=eos, banned=banned, min_length=cfg.min_length, max_length=cfg.max_length,
                            history=beams.history, block_trigrams=cfg.block_trigrams)
        lp = lp.view(n_act, -1, v).expand(n_act, k, v)  # the first step: one row per item
        step = _diverse_step(beams.scores, beams.raw, lp, groups, cfg.diversity_strength, eos)
        _collect_finished(finished, beams.active, step, t, length_penalty(t + 1, kind, la))
        records.append(_record(step, alpha, beams.active, bsz))
        for item in beams.active:
            last_step[item] = t
        if t == cfg.max_length:
            break
        beams.advance(step, k, first=t == 0)
        best_live = [row[::kg] for row in records[-1].score]  # each group's best live beam
        keep = [a for a, item in enumerate(beams.active)
                if any(_group_open(best_live[a][g], finished[item][g], n_group, lp_max, early_exit)
                       for g in range(groups))]
        if not keep:
            break
        if len(keep) < n_act:
            beams.keep(keep, k)

    for rec in records:  # one transfer per step
        if rec.alpha is not None:
            rec.alpha = rec.alpha.float().cpu().numpy()
    return [[_group_hypotheses(records, finished[item][g], item, last_step[item], g, kg, n_group, kind, la)
             for g in range(groups)] for item in range(bsz)]
