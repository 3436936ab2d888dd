"""Teacher forcing of the LSTM decoders: a batch's schedule, the unrolled steps, the loss of eq. 14.

Two schedules with the same loss and gradients (tested):

- packed (the default): the batch sorted by caption length, so the captions still running at step
  ``t`` are a prefix and step ``t`` works on rows ``[:active[t]]`` (what ``pack_padded_sequence``
  does); the outputs of the real steps are gathered time-major by indices made on the host;
- static (``static=True``): every row at every step, the loss masking what lies after each
  <eos>: all shapes follow from ``tokens.shape`` and nothing is read back to the host (one graph
  for ``torch.compile``).

Loss, per caption: ``-sum_t log p(y_t) + lambda sum_i (1 - sum_t alpha_ti)^2``; the batch loss is
the sum over captions divided by the number of tokens (see ``captioning.models.decoders.lstm``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from captioning.models.attention import (
    attention_entropy,
    coverage_penalty,
    reinforce_surrogate,
    update_baseline,
)
from captioning.models.decoders.base import (
    check_right_padded,
    teacher_forcing_targets,
    token_cross_entropy,
)
from captioning.models.decoders.lstm_step import LSTMStep

__all__ = ["Schedule", "losses", "no_autocast", "schedule", "unroll"]


@dataclass
class Schedule:
    """Teacher forcing's inputs/targets ``[B,T]`` and real-token mask; packed: sorted longest first,
    with ``lengths`` [B] and ``active[t]`` the rows still running at step t (None: every row, every step)."""

    features: Tensor
    mask: Tensor | None
    inputs: Tensor
    targets: Tensor
    step_mask: Tensor
    lengths: Tensor | None = None
    active: list[int] | None = None


def no_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off on ``device`` while the step loop runs on explicitly typed tensors (a no-op
    context when it is off already)."""
    if device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def schedule(features: Tensor, mask: Tensor | None, tokens: Tensor, pad_id: int, static: bool) -> Schedule:
    """Inputs/targets of teacher forcing; packed (not ``static``): the batch sorted longest first,
    the steps cut to the longest caption."""
    inputs, targets, step_mask = teacher_forcing_targets(tokens, pad_id)
    if static:
        return Schedule(features, mask, inputs, targets, step_mask)
    lengths = check_right_padded(step_mask, pad_id)
    t_max = max(int(lengths.max().item()) if lengths.numel() else 0, 1)
    inputs, targets, step_mask = inputs[:, :t_max], targets[:, :t_max], step_mask[:, :t_max]
    order = torch.argsort(lengths, descending=True, stable=True)
    if not torch.equal(order, torch.arange(tokens.shape[0], device=order.device)):
        features, inputs, targets = features[order], inputs[order], targets[order]
        step_mask, lengths = step_mask[order], lengths[order]
        mask = mask[order] if mask is not None else None
    steps = torch.arange(t_max, device=lengths.device)
    active = (lengths.unsqueeze(0) > steps.unsqueeze(1)).sum(1).tolist()
    return Schedule(features, mask, inputs, targets, step_mask, lengths, active)


def unroll(step: LSTMStep, x_steps: tuple[Tensor, ...], memory: dict[str, Tensor | None], h: list[Tensor],
           c: list[Tensor], mode: str, active: list[int] | None) -> dict[str, list[Tensor]]:
    """The decoder over the caption's steps (word gates ``x_steps[t] [B,4H]``): per step the top
    hidden state, the context, the attention and (sampled hard attention) the log-probability of
    the chosen location; packed (``active``): on the captions still running."""
    out: dict[str, list[Tensor]] = {"h": [], "z": [], "alpha": [], "logp": []}
    rows = h[0].shape[0]
    for t, x in enumerate(x_steps):
        if active is not None and active[t] < rows:  # captions that ended drop out
            rows = active[t]
            h, c = [v[:rows] for v in h], [v[:rows] for v in c]
            memory = {k: (None if v is None else v[:rows]) for k, v in memory.items()}
        h, c, z, alpha, logp = step(x if x.shape[0] == rows else x[:rows], h, c, memory, mode)
        out["h"].append(h[-1])
        for key, value in (("z", z), ("alpha", alpha), ("logp", logp)):
            if value is not None:
                out[key].append(value)
    return out


def _time_major(active: list[int], b: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Where the packed steps' rows come from: ``(flat [M], row [M])``, ``flat = t * B + row`` in
    the order the loop made them (step by step, the running rows of each)."""
    host = torch.device("cpu")
    real = torch.arange(b, device=host) < torch.tensor(active, device=host).unsqueeze(1)  # [T,B]
    flat = real.flatten().nonzero().squeeze(1)
    return flat.to(device, non_blocking=True), (flat % b).to(device, non_blocking=True)


def losses(dec: Any, words: Tensor, steps: dict[str, list[Tensor]], sched: Schedule, position_mask: Tensor | None,
           label_smoothing: float) -> dict[str, Tensor]:
    """Token cross-entropy over the real tokens, eq. 14's regulariser and, for hard attention, the
    REINFORCE and entropy terms (see ``LSTMDecoder.compute_loss``)."""
    zs, alphas = steps["z"], steps["alpha"]
    b = sched.inputs.shape[0]
    row = None
    if sched.active is not None:  # real tokens only, time-major (the order the loop made them)
        flat, row = _time_major(sched.active, b, words.device)
        words_tm = words.transpose(0, 1).reshape(-1, words.shape[-1]).index_select(0, flat)
        logits = dec._logits(words_tm, torch.cat(steps["h"], 0), torch.cat(zs, 0) if zs else None)  # [M,V]
        tgt = sched.targets.t().reshape(-1).index_select(0, flat)
        n_tok: Tensor | int = max(tgt.numel(), 1)
        alpha_all = torch.cat(alphas, 0) if alphas else None  # [M,N]
        coverage = None if alpha_all is None else alpha_all.new_zeros(b, alpha_all.shape[1]).index_add(
            0, row, alpha_all)
    else:
        z_all = torch.stack(zs, 1) if zs else None
        logits = dec._logits(words, torch.stack(steps["h"], 1), z_all).flatten(0, 1)  # [B*T,V]
        tgt = sched.targets.flatten()
        n_tok = sched.step_mask.sum().clamp_min(1)
        alpha_all = torch.stack(alphas, 1) if alphas else None  # [B,T,N]
        coverage = None if alpha_all is None else (alpha_all * sched.step_mask.unsqueeze(-1).to(alpha_all.dtype)).sum(1)
    ignore = dec.pad_id if sched.active is None else -100
    nll_sum = token_cross_entropy(logits, tgt, label_smoothing, ignore_index=ignore)
    out: dict[str, Tensor] = {"xe": nll_sum / n_tok}
    total = nll_sum
    if coverage is not None:
        penalty = coverage_penalty(coverage, position_mask)  # [B]
        captions = b if sched.active is not None else sched.step_mask.any(1).sum().clamp_min(1)  # rows of padding: none
        out["ds"] = penalty.sum() / captions
        total = total + dec.cfg.doubly_stochastic * penalty.sum()
    else:
        out["ds"] = nll_sum.new_zeros(())
    out["loss"] = total / n_tok
    if dec.hard:
        assert alpha_all is not None and row is not None and isinstance(n_tok, int)
        entropy = attention_entropy(alpha_all).sum() / n_tok
        reinforce = nll_sum.new_zeros(())
        if steps["logp"]:
            logp = torch.cat(steps["logp"], 0).new_zeros(b).index_add(0, row, torch.cat(steps["logp"], 0))
            reinforce = _reinforce(dec, logits, tgt, row, sched.lengths, logp, n_tok)
        cfg = dec.cfg
        out["loss"] = out["loss"] + cfg.reinforce_weight * reinforce - cfg.entropy_weight * entropy
        out.update(reinforce=reinforce, entropy=entropy.detach(), baseline=dec.reinforce_baseline.detach().clone().float())
    return out


def _reinforce(dec: Any, logits: Tensor, tgt: Tensor, row: Tensor, lengths: Tensor | None, logp: Tensor,
               n_tok: int) -> Tensor:
    """REINFORCE surrogate of the sampled locations (``logp [B]``: each caption's summed log-probability).

    Reward of caption b: its mean token log-likelihood (detached); baseline: the moving average of
    the batch mean reward (bias-corrected start: the first batch's mean).
    """
    assert lengths is not None
    with torch.no_grad():
        nll = F.cross_entropy(logits.float(), tgt, reduction="none")  # [M], time-major
        reward = -nll.new_zeros(logp.shape[0]).index_add(0, row, nll) / lengths.clamp_min(1).to(nll.dtype)  # [B]
        first = int(dec.reinforce_updates) == 0
        baseline = reward.mean() if first else dec.reinforce_baseline.float()
    surrogate = reinforce_surrogate(logp, reward, baseline, n_tok)
    with torch.no_grad():
        dec.reinforce_baseline.copy_(update_baseline(baseline, reward, dec.cfg.baseline_decay))
        dec.reinforce_updates += 1
    return surrogate
