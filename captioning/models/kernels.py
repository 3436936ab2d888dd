"""Fast paths of the LSTM decoder: hand-written backward passes and fused steps.

Each piece computes exactly what the plain-autograd reference computes (the paper's equations in
``captioning.models.decoders.lstm`` and ``captioning.models.attention``) and is tested equal to
it (``tests/test_kernels.py``); ``LSTMConfig.fused_kernels`` switches them on (the default,
where they are faster: teacher forcing on a CPU, ~1.3x per training step at Show-Attend-Tell's
COCO sizes).  Why they are faster:

- ``DeferredLinear``: ``x_t W^T`` at every step with the weight gradient computed ONCE.  A
  per-step ``F.linear`` makes autograd materialise and accumulate a full ``[out, in]`` weight
  gradient at every step (2048 x 2048 per step for the LSTM's context weights); here each step's
  backward only records ``(dy_t, x_t)`` and a sink computes ``dW = [dy_1..dy_T]^T [x_1..x_T]``.
- ``FusedLSTMCells``: the word part of the layer-0 gates ``W_ih[:, :E] E y_{t-1} + b`` of ALL
  steps in one product before the loop, the per-step products through ``DeferredLinear``.
- ``additive_step_scorer``: additive scores ``e_t = w^T tanh(K + q_t)`` for teacher forcing.
  ``dL/dK`` of all steps is summed in place (``w * (sum_t de_t - sum_t de_t y_t^2)``) and handed
  to ``K`` once, and the step's ``[R,N,A]`` tanh is recomputed in backward into one scratch
  buffer instead of being stored (T times less activation memory; on a CPU a fresh tensor per
  step costs more in page faults than the recomputation).
- ``additive_scores_inference``: CPU decoding scores through one scratch buffer, in chunks that
  stay in cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "DeferredLinear",
    "FusedLSTMCells",
    "additive_scores_inference",
    "additive_step_scorer",
    "lstm_pointwise",
]

CPU_CHUNK = 1 << 19  # elements of [G,N,A] scored at once in CPU inference


# ----------------------------------------------------------------------- deferred weight grads


class _WeightGradSink(torch.autograd.Function):
    """Identity-like node on a weight: its backward computes the weight's gradient for all
    steps at once from what the per-step ``_DeferredMatmul`` nodes collected."""

    @staticmethod
    def forward(ctx, weight: Tensor, collector: DeferredLinear) -> Tensor:  # type: ignore[override]
        ctx.collector = collector
        ctx.dtype = weight.dtype
        return weight.new_zeros(())

    @staticmethod
    def backward(ctx, _grad: Tensor):  # type: ignore[override]
        col = ctx.collector
        if not col.grads:
            return None, None
        g = torch.cat(col.grads, 0)  # [sum R, out]
        x = torch.cat([xi.to(g.dtype) for xi in col.inputs], 0)  # [sum R, in]
        col.grads.clear()
        col.inputs.clear()
        return (g.t() @ x).to(ctx.dtype), None


class _DeferredMatmul(torch.autograd.Function):
    """``x @ W^T`` whose backward only returns ``dx`` and stores ``(dy, x)`` for the sink."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, token: Tensor, collector: DeferredLinear) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.collector = collector
        return F.linear(x, weight.to(x.dtype))

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        ctx.collector.grads.append(grad)
        ctx.collector.inputs.append(x)
        dx = grad @ weight.to(grad.dtype) if ctx.needs_input_grad[0] else None
        return dx, None, grad.new_zeros(()), None


class DeferredLinear:
    """``x @ W^T`` applied at every time step, with the weight gradient computed once.

    Without grad (or for a weight that needs none) it is ``F.linear``.
    """

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight
        self.grads: list[Tensor] = []
        self.inputs: list[Tensor] = []
        self.token = (
            _WeightGradSink.apply(weight, self)
            if (torch.is_grad_enabled() and weight.requires_grad)
            else None
        )

    def __call__(self, x: Tensor) -> Tensor:
        if self.token is None:
            return F.linear(x, self.weight.to(x.dtype))
        return _DeferredMatmul.apply(x, self.weight, self.token, self)


# ---------------------------------------------------------------------------------- LSTM step


def lstm_pointwise(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """LSTM update from pre-activations ``gates [R,4H]`` (PyTorch's order i, f, g, o)."""
    i, f, g, o = gates.chunk(4, dim=1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


class FusedLSTMCells:
    """The stacked ``nn.LSTMCell`` step ``h_t = LSTM([E y_{t-1}; z_t], h_{t-1})`` of teacher forcing.

    ``cells``: the decoder's cells (layer 0 takes ``[word (E); context (C)]``), ``words [B,T,E]``
    the embedded inputs of all steps.  ``step(t, z [R,C] | None, h, c)`` runs step ``t`` on the
    first ``R`` rows (the captions still running) and equals the cells applied one by one.
    """

    def __init__(self, cells: Sequence[nn.LSTMCell], words: Tensor, dropout: nn.Module) -> None:
        e = words.shape[-1]
        cell0 = cells[0]
        self.cells = cells
        self.dropout = dropout
        # the word part of the layer-0 gates of every step, one product: [B,T,4H]
        x_gates = F.linear(words, cell0.weight_ih[:, :e], cell0.bias_ih + cell0.bias_hh)
        self.x_steps = x_gates.unbind(1)  # views; backward is one stack, not T zero-filled copies
        has_context = cell0.weight_ih.shape[1] > e
        self.w_z = DeferredLinear(cell0.weight_ih[:, e:]) if has_context else None
        self.w_hh = [DeferredLinear(cell.weight_hh) for cell in cells]
        self.w_ih = [None] + [DeferredLinear(cell.weight_ih) for cell in cells[1:]]

    def step(
        self, t: int, z: Tensor | None, h: list[Tensor], c: list[Tensor]
    ) -> tuple[list[Tensor], list[Tensor]]:
        rows = h[0].shape[0]
        gates = self.x_steps[t][:rows] + self.w_hh[0](h[0])
        if z is not None and self.w_z is not None:
            gates = gates + self.w_z(z)
        hi, ci = lstm_pointwise(gates, c[0])
        new_h, new_c = [hi], [ci]
        for i in range(1, len(self.cells)):
            cell = self.cells[i]
            w_ih = self.w_ih[i]
            assert w_ih is not None
            gates = w_ih(self.dropout(hi)) + self.w_hh[i](h[i]) + cell.bias_ih + cell.bias_hh
            hi, ci = lstm_pointwise(gates, c[i])
            new_h.append(hi)
            new_c.append(ci)
        return new_h, new_c


# ------------------------------------------------------------------------ additive attention


class _AdditiveKeyGradients:
    """``dL/dK`` of additive scores ``e_t = w^T tanh(K + q_t)`` summed over all steps.

    ``dL/dK = w * sum_t de_t (1 - y_t^2)`` with ``y_t = tanh(K + q_t)`` (w broadcast over the
    attention axis), kept as ``d = sum_t de_t [M,N]`` and ``p = sum_t de_t y_t^2 [M,N,A]``: one
    in-place update per step, ``w * (d - p)`` once at the end.  Also owns the one scratch buffer
    all steps compute ``y_t`` in (forward, and again in backward).
    """

    def __init__(self, keys: Tensor) -> None:
        self.keys = keys.detach()
        self.d: Tensor | None = None
        self.p: Tensor | None = None
        self._scratch: Tensor | None = None

    def tanh(self, q: Tensor) -> Tensor:
        """``tanh(K[:R] + q)`` for ``q [R,A]`` into the scratch buffer -> ``[R,N,A]``."""
        r = q.shape[0]
        if self._scratch is None:
            self._scratch = torch.empty_like(self.keys)
        y = self._scratch[:r]
        return torch.add(self.keys[:r], q.to(self.keys.dtype).unsqueeze(1), out=y).tanh_()

    def add(self, rows: int, de: Tensor, y2: Tensor) -> None:
        if self.d is None or self.p is None:
            self.d = torch.zeros(self.keys.shape[:2], dtype=de.dtype, device=de.device)
            self.p = torch.zeros(self.keys.shape, dtype=y2.dtype, device=y2.device)
        self.d[:rows] += de
        self.p[:rows].addcmul_(de.unsqueeze(-1), y2)


class _KeyGradSink(torch.autograd.Function):
    """Hands the accumulated ``dL/dK`` to ``K`` after every step's backward has run (each step
    takes this node's output as an input, so autograd orders it last)."""

    @staticmethod
    def forward(ctx, keys: Tensor, w: Tensor, grads: _AdditiveKeyGradients) -> Tensor:  # type: ignore[override]
        ctx.grads = grads
        ctx.w = w.detach()
        ctx.dtype = keys.dtype
        return keys.new_zeros(())

    @staticmethod
    def backward(ctx, _grad: Tensor):  # type: ignore[override]
        g = ctx.grads
        if g.d is None or g.p is None or not ctx.needs_input_grad[0]:
            return None, None, None
        dk = torch.sub(g.d.unsqueeze(-1), g.p, out=g.p).mul_(ctx.w.to(g.p.dtype))
        g.d = g.p = None
        return dk.to(ctx.dtype), None, None


class _AdditiveScoresStep(torch.autograd.Function):
    """``e = tanh(K[:R] + q) w`` for one step: ``q [R,A]``, ``w [A]`` -> ``e [R,N]``.

    Only ``q`` is saved: backward recomputes the tanh into the scratch buffer, returns ``dq``
    and ``dw``, and adds ``dK`` into ``_AdditiveKeyGradients``.
    """

    @staticmethod
    def forward(ctx, q: Tensor, w: Tensor, token: Tensor, grads: _AdditiveKeyGradients) -> Tensor:  # type: ignore[override]
        y = grads.tanh(q)  # [R,N,A] in the scratch buffer, not saved
        ctx.save_for_backward(q, w)
        ctx.grads = grads
        ctx.q_dtype = q.dtype
        return torch.matmul(y, w.to(y.dtype))

    @staticmethod
    def backward(ctx, de: Tensor):  # type: ignore[override]
        q, w = ctx.saved_tensors
        y = ctx.grads.tanh(q)  # recomputed into the scratch buffer
        r, n, a = y.shape
        de = de.to(y.dtype).contiguous()
        dw = (de.reshape(1, r * n) @ y.reshape(r * n, a)).reshape(a).to(w.dtype)
        y2 = y.mul_(y)  # [R,N,A] tanh^2, in place (y is not needed any more)
        ctx.grads.add(r, de, y2)
        # dq = w * sum_n de_n (1 - y_n^2)
        dq = (de.sum(1, keepdim=True) - torch.bmm(de.unsqueeze(1), y2).squeeze(1)) * w.to(y.dtype)
        return dq.to(ctx.q_dtype), dw, torch.zeros_like(ctx.grads.keys[0, 0, 0]), None


def additive_step_scorer(attention: nn.Module, keys: Tensor) -> Callable[[Tensor], Tensor]:
    """Teacher-forcing scores of an ``AdditiveAttention``: ``h [R,H] -> e [R,N]`` against
    ``keys[:R]`` (the captions still running are the first ``R`` rows), with the summed key
    gradient and the recomputed tanh described in the module docstring."""
    if not torch.is_grad_enabled():
        return lambda h: attention.scores(h, keys[: h.shape[0]])
    grads = _AdditiveKeyGradients(keys)
    w = attention.score_proj.weight.reshape(-1)
    token = _KeyGradSink.apply(keys, w, grads)

    def scorer(h: Tensor) -> Tensor:
        return _AdditiveScoresStep.apply(attention.query_proj(h), w, token, grads)

    return scorer


def additive_scores_inference(keys: Tensor, q: Tensor, weight: Tensor) -> Tensor:
    """CPU decoding scores ``w^T tanh(K + q)``: ``keys [M,N,A]``, ``q [M,G,1,A]``, ``weight [1,A]``
    -> ``e [M*G, N]``.  Items in chunks small enough for the cache, all through ONE scratch
    buffer (a fresh ``[M,G,N,A]`` tensor per step costs more in page faults than the tanh)."""
    m, g, _, a = q.shape
    n = keys.shape[1]
    step = min(m, max(1, CPU_CHUNK // max(1, g * n * a)))
    scratch = keys.new_empty(step, g, n, a)
    w = weight.reshape(a).to(keys.dtype)
    e = keys.new_empty(m, g, n)
    for i in range(0, m, step):
        j = min(m, i + step)
        x = torch.add(keys[i:j].unsqueeze(1), q[i:j], out=scratch[: j - i]).tanh_()
        torch.matmul(x, w, out=e[i:j])
    return e.reshape(m * g, n)
