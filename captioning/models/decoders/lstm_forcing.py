"""How ``LSTMDecoder`` runs (``captioning.models.decoders.lstm``): its precision rule, its two step
implementations, teacher forcing over a batch and the loss of eq. 14.

Teacher forcing has two schedules with the same loss and gradients (tested): packed (the default:
the captions sorted by length, so step ``t`` runs only the ``active[t]`` still running, as
``pack_padded_sequence`` does) and static (``static=True``: every row at every step, the loss masking
what lies after each <eos>; all shapes follow from ``tokens.shape`` and nothing is read back: one
graph for ``torch.compile``).  A batch holds ``M`` items and ``R = M * G`` captions, rows
``g*G .. g*G+G-1`` being item ``g``'s (per-image batches: an image read and projected once for all
its captions): the static schedule reads the memory grouped, as beam search does; the packed one
gathers each caption's item after its sort, made on the host from the lengths the loader knows.

Loss, per caption: ``-sum_t log p(y_t) + lambda sum_i (1 - sum_t alpha_ti)^2``; the batch loss is the
sum over captions divided by the number of tokens, so it reads per token (like ``xe``) while lambda
weighs the regulariser against the caption's summed log-likelihood as in the paper and in
arctic-captions; ``ds`` is logged per caption.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from captioning.models.attention import (
    AdditiveAttention,
    argmax_location,
    attention_entropy,
    coverage_penalty,
    expand_groups,
    hard_context,
    location_log_prob,
    reinforce_surrogate,
    sample_location,
    soft_context,
    update_baseline,
)
from captioning.models.decoders.base import (
    check_right_padded,
    teacher_forcing_targets,
    token_cross_entropy,
)

__all__ = ["FastStep", "PlainStep", "Schedule", "autocast_off", "compute_dtype", "native_low_precision", "precision",
           "schedule", "teacher_forcing"]


# ----------------------------------------------------------------------------- precision, one rule


def native_low_precision(device: torch.device) -> bool:
    """Whether autocast's low-precision products run natively on ``device``: on CUDA yes; on a CPU only
    with bf16/fp16 instructions (AVX512-BF16, AMX: what oneDNN reports)."""
    check = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}.get(
        torch.get_autocast_dtype("cpu"))
    return device.type != "cpu" or bool(check and getattr(torch.ops.mkldnn, check, lambda: False)())


def precision(device: torch.device) -> contextlib.AbstractContextManager:
    """The decoder's precision on ``device``: autocast as the caller set it, off on a CPU without
    native low-precision products (faster there, and exact)."""
    if device.type == "cpu" and torch.is_autocast_enabled("cpu") and not native_low_precision(device):
        return torch.autocast("cpu", enabled=False)
    return contextlib.nullcontext()


def compute_dtype(weight: Tensor) -> torch.dtype:
    """The dtype of the step loop: autocast's on the weight's device when it is on, else the weight's."""
    kind = weight.device.type
    if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def autocast_off(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off while the step loop runs on tensors already cast to ``compute_dtype``."""
    if device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------- the step, two implementations


class PlainStep:
    """``LSTMDecoder.plain_step`` (the modules as written, in their own dtype) behind ``FastStep``'s
    interface: ``model.fast_step=false``."""

    def __init__(self, dec: Any) -> None:
        self.dec, self.dtype = dec, dec.cells[0].weight_ih.dtype

    def prepare(self, memory: dict[str, Tensor | None], static: bool) -> dict[str, Tensor | None]:
        return memory

    def word_gates(self, words: Tensor) -> Tensor:
        return words

    def __call__(self, x: Tensor, h: list[Tensor], c: list[Tensor], memory: dict[str, Tensor | None], mode: str):
        return self.dec.plain_step(x, h, c, memory, mode)


class FastStep:
    """``LSTMDecoder``'s step with every use of ``h_{t-1}`` in ONE product, its weights cast once:

        [q_t ; g_t ; r_t] = [W_a ; W_beta ; W_hh] h_{t-1} + [b_a ; b_beta ; b]   query, gate, recurrent gates
        e_ti    = w^T tanh(U_a a_i + q_t)          additive (dot/general: h_{t-1}^T k_i)
        alpha_t = softmax(e_t + m)                 m_i = 0 at real positions, -inf at padding
        z_t     = sigmoid(g_t) sum_i alpha_ti a_i
        h_t,c_t = LSTM(x_t + W_z z_t, r_t, c_{t-1})    x_t = W_x E y_{t-1} + b, all steps at once

    Built once per batch and per decoding (the state's ``shared``) in ``dtype`` (``compute_dtype``): no
    weight cast per step.  ~25 operations a step forward (the tutorial decoder's ~40)."""

    def __init__(self, dec: Any, dtype: torch.dtype) -> None:
        cells, attention = dec.cells, dec.attention
        self.dec, self.dtype, self.layers = dec, dtype, len(cells)
        self.additive = isinstance(attention, AdditiveAttention)
        e, h, top = dec.cfg.embed_dim, dec.cfg.hidden_dim, cells[-1]
        rows, biases, self.split = [], [], []
        if self.additive:
            rows.append(attention.query_proj.weight)
            biases.append(attention.query_proj.bias)
            self.split.append(attention.query_proj.out_features)
        if dec.gate is not None:
            rows.append(dec.gate.proj.weight)
            biases.append(dec.gate.proj.bias)
            self.split.append(1)
        rows.append(top.weight_hh)  # layer 0's biases ride on the word gates
        biases.append(top.bias_ih + top.bias_hh if self.layers > 1 else torch.zeros_like(top.bias_hh))
        self.split.append(4 * h)
        self.h_t, self.h_b = torch.cat(rows).to(dtype).t(), torch.cat(biases).to(dtype)
        cell0 = cells[0]
        self.w_x, self.b_x = cell0.weight_ih[:, :e].to(dtype), (cell0.bias_ih + cell0.bias_hh).to(dtype)
        self.w_z = cell0.weight_ih[:, e:].to(dtype).t() if cell0.weight_ih.shape[1] > e else None
        # layers below the top: recurrent products (layer i reads h_i); layers above 0: input products
        self.hh = [c.weight_hh.to(dtype).t() for c in cells[:-1]]
        self.ih = [None] + [(c.weight_ih.to(dtype).t(), (c.bias_ih + c.bias_hh).to(dtype) if i < self.layers - 1
                             else None) for i, c in enumerate(cells[1:], 1)]
        self.w_score = attention.score_proj.weight.reshape(-1).to(dtype) if self.additive else None

    def prepare(self, memory: dict[str, Tensor | None], static: bool) -> dict[str, Tensor | None]:
        """The memory in the step's dtype with the attention mask as a score bias (``score_mask``;
        ``static``: read nothing back to the host)."""
        memory = {k: v if k == "mask" or v is None else v.to(self.dtype) for k, v in memory.items()}
        if self.dec.attention is not None:
            memory["bias"], memory["keep"] = score_mask(memory["mask"], read_host=not static)
        return memory

    def word_gates(self, words: Tensor) -> Tensor:
        """``W_x E y + b`` of layer 0 for embedded words ``[..., E]`` -> ``[..., 4H]``."""
        return F.linear(words.to(self.dtype), self.w_x, self.b_x)

    def __call__(self, x: Tensor, h: list[Tensor], c: list[Tensor], memory: dict[str, Tensor | None], mode: str
                 ) -> tuple[list[Tensor], list[Tensor], Tensor | None, Tensor | None, Tensor | None]:
        """``plain_step`` on word gates ``x [R,4H]`` (``word_gates``)."""
        parts = torch.addmm(self.h_b, h[-1], self.h_t).split(self.split, 1)
        z, alpha, logp = self._attend(parts, h[-1], memory, mode)
        if z is not None and self.w_z is not None:
            x = torch.addmm(x, z, self.w_z)
        recurrent = parts[-1] if self.layers == 1 else torch.mm(h[0], self.hh[0])
        new_h, new_c = [], []
        hi, ci = _lstm_update(x, recurrent, c[0])
        new_h.append(hi)
        new_c.append(ci)
        for i in range(1, self.layers):
            w, b = self.ih[i]  # type: ignore[misc]
            inp = self.dec.dropout(hi)
            inp = torch.mm(inp, w) if b is None else torch.addmm(b, inp, w)
            recurrent = parts[-1] if i == self.layers - 1 else torch.mm(h[i], self.hh[i])
            hi, ci = _lstm_update(inp, recurrent, c[i])
            new_h.append(hi)
            new_c.append(ci)
        return new_h, new_c, z, alpha, logp

    def _attend(self, parts: tuple[Tensor, ...], h_top: Tensor, memory: dict[str, Tensor | None], mode: str
                ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """``(z_t, alpha_t, log p(s_t))`` (Nones where absent) from this step's product ``parts``."""
        dec = self.dec
        if not dec.uses_context:
            return None, None, None
        if dec.attention is None:  # mean_pool: the fixed context
            return expand_groups(memory["context"], h_top.shape[0]), None, None
        keys, values = memory["keys"], memory["values"]
        assert keys is not None and values is not None
        if self.additive:
            e = dec.attention.scores_from_query(parts[0], keys, self.w_score)
        else:
            e = dec.attention.scores(h_top, keys)
        bias, keep = memory.get("bias"), memory.get("keep")
        if bias is None:
            alpha = torch.softmax(e, -1, dtype=torch.float32)
        else:
            alpha = torch.softmax(e + expand_groups(bias, e.shape[0]), -1)
            alpha = alpha if keep is None else alpha * expand_groups(keep, e.shape[0])
        logp = None
        if mode == "soft":
            z = soft_context(alpha.to(values.dtype), values)
        else:
            loc = sample_location(alpha) if mode == "sample" else argmax_location(alpha)
            z = hard_context(values, loc)
            logp = location_log_prob(alpha, loc) if mode == "sample" else None
        if dec.gate is not None:
            z = z * torch.sigmoid(parts[1 if self.additive else 0])
        return z, alpha, logp


def score_mask(mask: Tensor | None, read_host: bool) -> tuple[Tensor | None, Tensor | None]:
    """``(bias [M,N] float32, keep [M,1] | None)`` of a position mask ``[M,N]`` (True = real): scores +
    bias is -inf at padding, so softmax gives it exactly zero weight; a row without any real position
    gets bias 0 and ``keep`` 0 (all-zero attention, as ``masked_softmax``).  ``read_host`` (decoding):
    one read of the counts, ``(None, None)`` when every position is real, no ``keep`` unless a row is
    empty; else both, nothing read back (a caller that knows all positions are real passes None)."""
    if mask is None:
        return None, None
    counts = mask.sum(1, keepdim=True)
    empty = True
    if read_host:
        low = int(counts.min())
        if low == mask.shape[1]:
            return None, None
        empty = low == 0
    any_real = counts > 0
    bias = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask & any_real, float("-inf"))
    return bias, any_real.to(torch.float32) if empty else None


def _lstm_update(inputs: Tensor, recurrent: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """The LSTM update from input and recurrent pre-activations ``[R,4H]`` (gate order i, f, g, o);
    on CUDA outside ``torch.compile`` one fused kernel."""
    if inputs.is_cuda and not torch.compiler.is_compiling():  # one fused kernel, what nn.LSTMCell runs there
        h, c, _ = torch.ops.aten._thnn_fused_lstm_cell(inputs, recurrent, c)
        return h, c
    i, f, g, o = (inputs + recurrent).chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


# ----------------------------------------------------------------------------- teacher forcing


@dataclass
class Schedule:
    """Teacher forcing's inputs/targets ``[R,T]`` and real-token mask of a batch's captions.  Packed:
    sorted longest first, ``lengths`` (host) and ``active[t]`` the rows still running at step t;
    ``items [R]``: the memory item of each row after the sort (None: grouped as the batch came)."""

    inputs: Tensor
    targets: Tensor
    step_mask: Tensor
    lengths: list[int] | None = None
    active: list[int] | None = None
    items: Tensor | None = None


def schedule(tokens: Tensor, pad_id: int, items: int, static: bool, lengths: list[int] | None) -> Schedule:
    """Inputs/targets of ``tokens [R,T+1]`` over ``items`` memory items; packed (not ``static``): sorted
    longest first (``lengths`` known on the host, else read and checked), cut to the longest caption."""
    inputs, targets, step_mask = teacher_forcing_targets(tokens, pad_id)
    if static:
        return Schedule(inputs, targets, step_mask)
    if lengths is None:
        lengths = check_right_padded(step_mask, pad_id).tolist()
    rows, group = tokens.shape[0], tokens.shape[0] // max(items, 1)
    t_max = max(max(lengths, default=0), 1)
    order = sorted(range(rows), key=lambda r: -lengths[r])  # stable: ties keep their order
    index = None
    if order != list(range(rows)) or group > 1:
        index = torch.tensor(order, device="cpu").to(tokens.device, non_blocking=True)
        inputs, targets, step_mask = inputs[index], targets[index], step_mask[index]
    lengths = [lengths[r] for r in order]
    inputs, targets, step_mask = inputs[:, :t_max], targets[:, :t_max], step_mask[:, :t_max]
    active = [sum(1 for n in lengths if n > t) for t in range(t_max)]
    rows_item = None if index is None else torch.div(index, group, rounding_mode="floor")
    return Schedule(inputs, targets, step_mask, lengths, active, rows_item)


def teacher_forcing(dec: Any, features: Tensor, mask: Tensor | None, tokens: Tensor, label_smoothing: float,
                    static: bool, lengths: list[int] | None) -> dict[str, Tensor]:
    """``LSTMDecoder.compute_loss``: the memory and ``h_0, c_0`` once per item, the steps over the
    schedule's rows, then the loss (``losses``)."""
    memory, mean = dec.memory(features, mask)
    step = dec.step_function(compute_dtype(dec.cells[0].weight_ih))
    memory = step.prepare(memory, static=static or lengths is not None)  # a caller with lengths: no read
    h, c = dec.initial_state(mean, step)
    sched = schedule(tokens, dec.pad_id, features.shape[0], static, lengths)
    rows = tokens.shape[0]
    if sched.items is not None:  # each caption's item, in the schedule's order
        memory = {k: None if v is None else v.index_select(0, sched.items) for k, v in memory.items()}
        h, c = [x.index_select(0, sched.items) for x in h], [x.index_select(0, sched.items) for x in c]
    elif rows != features.shape[0]:  # static, grouped: the states per caption, the memory per item
        h, c = [expand_groups(x, rows) for x in h], [expand_groups(x, rows) for x in c]
    if dec.hard and dec.training:
        mode = "soft" if float(torch.rand((), device="cpu")) < dec.cfg.soft_fraction else "sample"
    else:
        mode = dec.test_mode()
    words = dec.embedding(sched.inputs)  # [R,T,E], all steps at once
    with autocast_off(words.device):
        x_steps = step.word_gates(words.transpose(0, 1)).unbind(0)  # T x [R,4H]
        steps = unroll(step, x_steps, memory, h, c, mode, sched.active)
    position_mask = None if memory["mask"] is None else expand_groups(memory["mask"], rows)  # per caption
    return losses(dec, words, steps, sched, position_mask, label_smoothing)


def unroll(step: Any, x_steps: tuple[Tensor, ...], memory: dict[str, Tensor | None], h: list[Tensor],
           c: list[Tensor], mode: str, active: list[int] | None) -> dict[str, list[Tensor]]:
    """The steps over word gates ``x_steps[t] [R,4H]``: per step the top hidden state, the context,
    the attention and (sampled hard attention) log p(s_t); packed (``active``): the running captions."""
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
    """Where the packed steps' rows come from: ``(flat [K], row [K])``, ``flat = t * B + row`` in the
    order the loop made them (step by step, the running rows of each)."""
    real = torch.arange(b, device="cpu") < torch.tensor(active, device="cpu").unsqueeze(1)  # [T,B], on the host
    flat = real.flatten().nonzero().squeeze(1)
    return flat.to(device, non_blocking=True), (flat % b).to(device, non_blocking=True)


def losses(dec: Any, words: Tensor, steps: dict[str, list[Tensor]], sched: Schedule, position_mask: Tensor | None,
           label_smoothing: float) -> dict[str, Tensor]:
    """Token cross-entropy over the real tokens, eq. 14's regulariser and, for hard attention, the
    REINFORCE and entropy terms (``LSTMDecoder.compute_loss``)."""
    zs, alphas = steps["z"], steps["alpha"]
    b = sched.inputs.shape[0]
    row = None
    if sched.active is not None:  # real tokens only, time-major (the order the loop made them)
        flat, row = _time_major(sched.active, b, words.device)
        words_tm = words.transpose(0, 1).reshape(-1, words.shape[-1]).index_select(0, flat)
        logits = dec.logits(words_tm, torch.cat(steps["h"], 0), torch.cat(zs, 0) if zs else None)  # [K,V]
        tgt = sched.targets.t().reshape(-1).index_select(0, flat)
        n_tok: Tensor | int = max(tgt.numel(), 1)
        alpha_all = torch.cat(alphas, 0) if alphas else None  # [K,N]
        coverage = None if alpha_all is None else alpha_all.new_zeros(b, alpha_all.shape[1]).index_add(
            0, row, alpha_all)
    else:
        z_all = torch.stack(zs, 1) if zs else None
        logits = dec.logits(words, torch.stack(steps["h"], 1), z_all).flatten(0, 1)  # [R*T,V]
        tgt = sched.targets.flatten()
        n_tok = sched.step_mask.sum().clamp_min(1)
        alpha_all = torch.stack(alphas, 1) if alphas else None  # [R,T,N]
        coverage = None if alpha_all is None else (alpha_all * sched.step_mask.unsqueeze(-1).to(alpha_all.dtype)).sum(1)
    ignore = dec.pad_id if sched.active is None else -100
    nll_sum = token_cross_entropy(logits, tgt, label_smoothing, ignore_index=ignore)
    out: dict[str, Tensor] = {"xe": nll_sum / n_tok}
    total = nll_sum
    if coverage is not None:
        penalty = coverage_penalty(coverage, position_mask)  # [R]
        captions = b if sched.active is not None else sched.step_mask.any(1).sum().clamp_min(1)  # padding rows: none
        out["ds"] = penalty.sum() / captions
        total = total + dec.cfg.doubly_stochastic * penalty.sum()
    else:
        out["ds"] = nll_sum.new_zeros(())
    out["loss"] = total / n_tok
    if dec.hard:
        assert alpha_all is not None and row is not None and isinstance(n_tok, int) and sched.lengths is not None
        entropy = attention_entropy(alpha_all).sum() / n_tok
        reinforce = nll_sum.new_zeros(())
        if steps["logp"]:
            logp = torch.cat(steps["logp"], 0).new_zeros(b).index_add(0, row, torch.cat(steps["logp"], 0))
            lengths = torch.tensor(sched.lengths, device="cpu").to(logits.device, non_blocking=True)
            reinforce = _reinforce(dec, logits, tgt, row, lengths, logp, n_tok)
        cfg = dec.cfg
        out["loss"] = out["loss"] + cfg.reinforce_weight * reinforce - cfg.entropy_weight * entropy
        out.update(reinforce=reinforce, entropy=entropy.detach(), baseline=dec.reinforce_baseline.detach().clone().float())
    return out


def _reinforce(dec: Any, logits: Tensor, tgt: Tensor, row: Tensor, lengths: Tensor, logp: Tensor,
               n_tok: int) -> Tensor:
    """REINFORCE surrogate of the sampled locations (``logp [R]``: each caption's summed log-probability).

    Reward of caption r: its mean token log-likelihood (detached); baseline: the moving average of
    the batch mean reward (bias-corrected start: the first batch's mean).
    """
    with torch.no_grad():
        nll = F.cross_entropy(logits.float(), tgt, reduction="none")  # [K], time-major
        reward = -nll.new_zeros(logp.shape[0]).index_add(0, row, nll) / lengths.clamp_min(1).to(nll.dtype)  # [R]
        first = int(dec.reinforce_updates) == 0
        baseline = reward.mean() if first else dec.reinforce_baseline.float()
    surrogate = reinforce_surrogate(logp, reward, baseline, n_tok)
    with torch.no_grad():
        dec.reinforce_baseline.copy_(update_baseline(baseline, reward, dec.cfg.baseline_decay))
        dec.reinforce_updates += 1
    return surrogate
