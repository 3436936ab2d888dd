"""Fast paths of the LSTM decoder's teacher forcing on a CPU: hand-written backward passes.

Each piece computes exactly what the plain-autograd reference computes (the paper's equations in
``captioning.models.decoders.lstm_step`` and ``captioning.models.attention``) and is tested equal
to it (``tests/test_kernels.py``).  They trade Python work per step (each is a Python autograd
Function: ~50-250 us of CPU per step and call, and on a GPU ~550 us, more than the GPU work they
save) for less arithmetic, memory traffic and activation memory.  With the decoder's step as it is
now they make no step faster (``use_kernels``, measured in ``docs/benchmarks.md``), so they run
only when ``model.fused_kernels=true`` asks for them: the scorer's memory saving on a CPU.

- ``DeferredLinear``: ``x_t W^T`` at every step with the weight gradient computed ONCE.  A
  per-step ``F.linear`` makes autograd materialise and accumulate a full ``[out, in]`` weight
  gradient at every step (2048 x 2048 per step for the LSTM's context weights); here each step's
  backward only records ``(dy_t, x_t)`` and a sink computes ``dW = [dy_1..dy_T]^T [x_1..x_T]``.
- ``additive_step_scorer``: additive scores ``e_t = w^T tanh(K + q_t)`` for teacher forcing.
  ``dL/dK`` of all steps is summed in place (``w * (sum_t de_t - sum_t de_t y_t^2)``) and handed
  to ``K`` once, and the step's ``[R,N,A]`` tanh is recomputed in backward into one scratch
  buffer instead of being stored (T times less activation memory; on a CPU a fresh tensor per
  step costs more in page faults than the recomputation).
- ``additive_scores_inference``: CPU decoding scores through one scratch buffer, in chunks that
  stay in cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "DeferredLinear",
    "additive_scores_inference",
    "additive_step_scorer",
    "use_kernels",
]

CPU_CHUNK = 1 << 19  # elements of [G,N,A] scored at once in CPU inference


def use_kernels(setting: str | bool) -> bool:
    """Whether teacher forcing runs through these kernels (``model.fused_kernels``): ``true``
    forces them (with grad, outside ``torch.compile``), ``auto`` (the default) and ``false`` do
    not.  With the step's one product of ``h_{t-1}`` and its weights cast once
    (``captioning.models.decoders.lstm_step``) they no longer make a step faster: at COCO size on
    a CPU the four combinations of deferred weight gradients and the summed-key scorer are within
    1% of plain autograd, at 14x14x512 the scorer costs 6%, at the tiny sizes where a step is
    bound by issuing operations they cost ~20% (docs/benchmarks.md), and on a GPU their Python
    backward costs more CPU time (~550 us a call) than the work they save.  What remains is memory:
    the scorer stores no ``[B,N,A]`` tanh per step (T x 25 MB at COCO size)."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    return str(setting).lower() == "true"  # a bool set on a config object in code: True | False


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
    """``x @ W^T (+ b)`` whose backward returns ``dx`` (and ``db``) and stores ``(dy, x)`` for the sink."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, token: Tensor,  # type: ignore[override]
                collector: DeferredLinear) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.collector = collector
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        ctx.collector.grads.append(grad)
        ctx.collector.inputs.append(x)
        dx = grad @ weight.to(grad.dtype) if ctx.needs_input_grad[0] else None
        db = grad.sum(0) if ctx.needs_input_grad[2] else None
        return dx, None, db, grad.new_zeros(()), None


class DeferredLinear:
    """``x @ W^T + b`` applied at every time step, with the weight gradient computed once.

    ``weight [out, in]`` and ``bias [out] | None`` in the dtype of the inputs (cast once by the
    caller).  Without grad (or for a weight that needs none) it is ``F.linear``.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias
        self.grads: list[Tensor] = []
        self.inputs: list[Tensor] = []
        self.token = (
            _WeightGradSink.apply(weight, self)
            if (torch.is_grad_enabled() and weight.requires_grad)
            else None
        )

    def __call__(self, x: Tensor) -> Tensor:
        if self.token is None:
            return F.linear(x, self.weight, self.bias)
        return _DeferredMatmul.apply(x, self.weight, self.bias, self.token, self)

    def add_to(self, acc: Tensor, x: Tensor) -> Tensor:
        """``acc + x W^T (+ b)``."""
        return acc + self(x)


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


def additive_step_scorer(keys: Tensor, w: Tensor) -> Callable[[Tensor], Tensor]:
    """Teacher-forcing scores of additive attention from the step's query: ``q [R,A] -> e [R,N]``
    against ``keys[:R]`` (the captions still running are the first ``R`` rows) and the score
    weights ``w [A]``, with the summed key gradient and the recomputed tanh described in the
    module docstring."""
    if not torch.is_grad_enabled():
        return lambda q: torch.matmul(torch.tanh(keys[: q.shape[0]] + q.unsqueeze(1)), w)
    grads = _AdditiveKeyGradients(keys)
    token = _KeyGradSink.apply(keys, w, grads)
    return lambda q: _AdditiveScoresStep.apply(q, w, token, grads)


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
