"""One step of the LSTM decoders (Xu et al. 2015, eqs. 1-7), its weights prepared once.

Step ``t`` reads ``E y_{t-1}`` and the top layer's ``h_{t-1}``; everything that reads ``h_{t-1}``
is ONE product:

    [q_t ; g_t ; r_t] = [W_a ; W_beta ; W_hh] h_{t-1} + [b_a ; b_beta ; b]   query, gate, recurrent gates
    e_ti    = w^T tanh(U_a a_i + q_t)          additive (dot/general: h_{t-1}^T k_i)
    alpha_t = softmax(e_t + m)                 m_i = 0 at real positions, -inf at padding
    z_t     = sigmoid(g_t) sum_i alpha_ti a_i
    h_t,c_t = LSTM(x_t + W_z z_t, r_t, c_{t-1})    x_t = W_x E y_{t-1} + b (teacher forcing: all steps at once)

``LSTMStep`` is built once per teacher-forced batch and once per decoding (``init_state`` keeps it
in the state's ``shared``): there the weights are concatenated and cast to the compute dtype
(autocast's when it is on, else the weights'), and the step runs with autocast off on tensors of
that dtype (the attention's softmax in float32), so bf16 autocast casts no weight per time step.
A step dispatches ~25 operations forward (the tutorial decoder's ~40); on CUDA, outside
``torch.compile``, the LSTM's pointwise update is one fused kernel (``_thnn_fused_lstm_cell``,
what ``nn.LSTMCell`` runs there).  With ``fused_kernels=true`` teacher forcing's products and
scores go through ``captioning.models.kernels`` (``deferred``, ``keys``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from captioning.models import kernels
from captioning.models.attention import (
    AdditiveAttention,
    argmax_location,
    expand_groups,
    hard_context,
    location_log_prob,
    sample_location,
    soft_context,
)

__all__ = ["LSTMStep", "compute_dtype", "native_autocast", "precision", "score_mask"]

def native_autocast(device: torch.device) -> bool:
    """Whether autocast's low-precision products run natively on ``device``: on CUDA yes; on a CPU
    only with bf16/fp16 instructions (AVX512-BF16, AMX: what oneDNN reports).  Elsewhere a bf16
    product is emulated: 8-10x slower than float32 at the decoder's sizes (docs/benchmarks.md)."""
    if device.type != "cpu":
        return True
    check = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}.get(
        torch.get_autocast_dtype("cpu"))
    try:
        return bool(check and getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):
        return False


def precision(device: torch.device) -> contextlib.AbstractContextManager:
    """The LSTM decoder's precision on ``device``: autocast as the caller set it, except on a CPU
    without native low-precision products (``native_autocast``), where the decoder computes in
    float32 (autocast off: faster there, and exact)."""
    if device.type == "cpu" and torch.is_autocast_enabled("cpu") and not native_autocast(device):
        return torch.autocast("cpu", enabled=False)
    return contextlib.nullcontext()


def compute_dtype(weight: Tensor) -> torch.dtype:
    """The dtype of the step's products: autocast's on the weight's device when autocast is on,
    else the weight's own."""
    kind = weight.device.type
    if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def score_mask(mask: Tensor | None, static: bool) -> tuple[Tensor | None, Tensor | None]:
    """``(bias [B,N] float32, keep [B,1] | None)`` of a position mask ``[B,N]`` (True = real):
    scores + bias is -inf at padding, so softmax gives it exactly zero weight; a row without any
    real position gets bias 0 and ``keep`` 0 (all-zero attention, as ``masked_softmax``).  Eager
    (not ``static``): ``(None, None)`` when every position is real (one host read per batch)."""
    if mask is None:
        return None, None
    counts = mask.sum(1, keepdim=True)
    empty = None
    if not static:
        low, high = (int(x) for x in torch.stack([counts.min(), counts.max()]).tolist())
        if low == mask.shape[1]:
            return None, None
        empty = low == 0
    any_real = counts > 0
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    bias = bias.masked_fill(~mask & any_real, float("-inf"))
    keep = any_real.to(torch.float32) if (static or empty) else None
    return bias, keep


class Product:
    """``x -> x W^T + b`` for ``weight [out,in]``: ``torch.addmm`` on the transposed view made once."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        self.wt, self.bias = weight.t(), bias

    def __call__(self, x: Tensor) -> Tensor:
        return torch.mm(x, self.wt) if self.bias is None else torch.addmm(self.bias, x, self.wt)

    def add_to(self, acc: Tensor, x: Tensor) -> Tensor:
        """``acc + x W^T`` in one product."""
        return torch.addmm(acc, x, self.wt)


def _linear(weight: Tensor, bias: Tensor | None, deferred: bool) -> Product | kernels.DeferredLinear:
    """A ``Product``, or ``kernels.DeferredLinear`` (weight gradient once for all steps)."""
    return kernels.DeferredLinear(weight, bias) if deferred else Product(weight, bias)


class LSTMStep:
    """The step of ``LSTMDecoder`` ``dec`` with its weights concatenated and cast once.

    ``deferred``: products through ``kernels.DeferredLinear``; ``scorer``: teacher forcing's
    additive scores through ``kernels.additive_step_scorer`` over these full ``keys`` (both: the
    CPU kernels; see ``kernels.use_kernels``).
    """

    def __init__(self, dec: Any, *, deferred: bool = False, keys: Tensor | None = None) -> None:
        cells, attention = dec.cells, dec.attention
        dt = self.dtype = compute_dtype(cells[0].weight_ih)
        e, h, layers = dec.cfg.embed_dim, dec.cfg.hidden_dim, len(cells)
        self.dec, self.layers, self.fused_cell = dec, layers, False
        self.additive = isinstance(attention, AdditiveAttention)
        self.hard_mode = dec.hard
        top = cells[-1]
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
        biases.append(top.bias_ih + top.bias_hh if layers > 1 else torch.zeros_like(top.bias_hh))
        self.split.append(4 * h)
        self.h_product = _linear(torch.cat(rows).to(dt), torch.cat(biases).to(dt), deferred)
        cell0 = cells[0]
        self.w_x = cell0.weight_ih[:, :e].to(dt)
        self.b_x = (cell0.bias_ih + cell0.bias_hh).to(dt)
        self.z_product = (_linear(cell0.weight_ih[:, e:].to(dt), None, deferred)
                          if cell0.weight_ih.shape[1] > e else None)
        # layers below the top: recurrent products (layer i reads h_i); layers above 0: input products
        self.hh = [_linear(c.weight_hh.to(dt), None, deferred) for c in cells[:-1]]
        self.ih = [None] + [_linear(c.weight_ih.to(dt), (c.bias_ih + c.bias_hh).to(dt) if i < layers - 1 else None,
                                    deferred) for i, c in enumerate(cells[1:], 1)]
        self.w_score = attention.score_proj.weight.reshape(-1).to(dt) if self.additive else None
        self.kernel_scorer = (kernels.additive_step_scorer(keys.to(dt), self.w_score)
                              if keys is not None and self.additive else None)

    def word_gates(self, words: Tensor) -> Tensor:
        """``W_x E y + b`` of layer 0 for embedded words ``[..., E]`` -> ``[..., 4H]``."""
        return F.linear(words.to(self.dtype), self.w_x, self.b_x)

    def cast(self, x: Tensor | None) -> Tensor | None:
        return None if x is None else x.to(self.dtype)

    def __call__(self, x: Tensor, h: list[Tensor], c: list[Tensor], memory: dict[str, Tensor | None], mode: str
                 ) -> tuple[list[Tensor], list[Tensor], Tensor | None, Tensor | None, Tensor | None]:
        """Step on word gates ``x [R,4H]``, states ``h, c`` (per layer ``[R,H]``) and ``memory``
        (``M`` items, ``R`` a multiple of ``M``) -> ``(h, c, z [R,C] | None, alpha [R,N] float32 |
        None, log p(s_t) [R] | None)``.  ``mode``: ``soft``, or hard attention's ``sample`` | ``argmax``."""
        parts = self.h_product(h[-1]).split(self.split, 1)
        z, alpha, logp = self._attend(parts, h[-1], memory, mode)
        recurrent = parts[-1] if self.layers == 1 else self.hh[0](h[0])
        if z is not None and self.z_product is not None:
            x = self.z_product.add_to(x, z)
        new_h, new_c = [], []
        hi, ci = self._cell(x, recurrent, c[0])
        new_h.append(hi)
        new_c.append(ci)
        for i in range(1, self.layers):
            inp = self.ih[i](self.dec.dropout(hi))  # type: ignore[misc]
            recurrent = parts[-1] if i == self.layers - 1 else self.hh[i](h[i])
            hi, ci = self._cell(inp, recurrent, c[i])
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
        if self.kernel_scorer is not None:
            e = self.kernel_scorer(parts[0])
        elif self.additive:
            e = dec.attention.scores_from_query(parts[0], keys, self.w_score)
        else:
            e = dec.attention.scores(h_top, keys)
        alpha = self._softmax(e, memory)
        logp = None
        if mode == "soft":
            z = soft_context(alpha.to(values.dtype), values)
        else:
            loc = sample_location(alpha) if mode == "sample" else argmax_location(alpha)
            z = hard_context(values, loc)
            if mode == "sample":
                logp = location_log_prob(alpha, loc)
        if dec.gate is not None:
            z = z * torch.sigmoid(parts[1 if self.additive else 0])
        return z, alpha, logp

    @staticmethod
    def _softmax(e: Tensor, memory: dict[str, Tensor | None]) -> Tensor:
        """``alpha [R,N]`` float32: the softmax over the real positions (``score_mask``'s bias)."""
        bias, keep = memory.get("bias"), memory.get("keep")
        if bias is None:
            return torch.softmax(e, -1, dtype=torch.float32)
        alpha = torch.softmax(e + expand_groups(bias, e.shape[0]), -1)
        return alpha if keep is None else alpha * expand_groups(keep, e.shape[0])

    def _cell(self, inputs: Tensor, recurrent: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        """The LSTM update from input and recurrent pre-activations ``[R,4H]`` (order i, f, g, o)."""
        if inputs.is_cuda and not torch.compiler.is_compiling():
            h, c, _ = torch.ops.aten._thnn_fused_lstm_cell(inputs, recurrent, c)
            return h, c
        i, f, g, o = (inputs + recurrent).chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
