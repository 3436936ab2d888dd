"""Attention over a set of N annotation vectors (grid regions or frames).

Shapes: ``B`` sequences, ``N`` annotation vectors of size ``C``, decoder state ``h`` of size
``H``.  Masks are boolean ``[B, N]`` with ``True`` for real positions.

Scoring modules (``AdditiveAttention``, ``DotAttention``, ``GeneralAttention``) split the work
in two: ``precompute(values [B,N,C]) -> keys`` runs ONCE per sequence (e.g. ``U_a v``), and
``scores(h, keys) -> e [B,N]`` runs every decoding step.  ``scores`` also accepts ``h`` with
``G`` times more rows than ``keys`` (rows ``g*G .. g*G+G-1`` attend ``keys[g]``): beam search
uses this so that the K beams of an item share one copy of the keys.

Hard (stochastic) attention follows Xu et al. 2015 Sec. 4.1: sample a location
``s ~ Categorical(alpha)``, use ``z = v_s`` and train the attention with REINFORCE
(moving-average baseline + entropy bonus).  The helpers below are pure functions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

__all__ = [
    "AdditiveAttention",
    "AttentionScorer",
    "DotAttention",
    "GeneralAttention",
    "SelectorGate",
    "argmax_location",
    "attention_entropy",
    "build_attention",
    "doubly_stochastic_penalty",
    "expand_groups",
    "hard_context",
    "location_log_prob",
    "masked_mean",
    "masked_softmax",
    "reinforce_surrogate",
    "sample_location",
    "soft_context",
    "update_baseline",
]


# ----------------------------------------------------------------------------- helpers

_CPU_CHUNK = 1 << 19  # elements of [G,N,A] scored at once in CPU inference


def expand_groups(x: Tensor | None, rows: int) -> Tensor | None:
    """Repeat each row of ``x [M, ...]`` ``rows // M`` times (consecutively) -> ``[rows, ...]``.

    A view (no copy) when possible; returns ``x`` itself when ``rows == M``.
    """
    if x is None or x.shape[0] == rows:
        return x
    m = x.shape[0]
    if rows % m != 0:
        raise ValueError(f"{rows} query rows cannot be grouped over {m} memory rows")
    g = rows // m
    return x.unsqueeze(1).expand(m, g, *x.shape[1:]).reshape(rows, *x.shape[1:])


def masked_softmax(e: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
    """Softmax of scores ``e [..., N]`` over real positions only.

    Padded positions (``mask == False``) get EXACTLY zero weight; a row whose positions are
    all padded gets all-zero weights (no NaN).  ``mask`` may have fewer leading rows than
    ``e`` (grouped rows, see module doc).  Computed in float32.
    """
    e = e.float()
    if mask is None:
        return torch.softmax(e, dim=dim)
    if mask.shape != e.shape:
        mask = expand_groups(mask, e.shape[0])
    e = e.masked_fill(~mask, float("-inf"))
    any_real = mask.any(dim=dim, keepdim=True)
    # all-padded rows: softmax of zeros (finite), then zeroed by the mask below
    e = torch.where(any_real, e, torch.zeros_like(e))
    return torch.softmax(e, dim=dim) * mask


def soft_context(alpha: Tensor, values: Tensor) -> Tensor:
    """Expected annotation ``z = sum_i alpha_i v_i``: ``alpha [R,N]``, ``values [M,N,C]`` -> ``[R,C]``.

    ``R`` must be a multiple of ``M`` (grouped rows); one batched matmul.
    """
    m, n, c = values.shape
    r = alpha.shape[0]
    a = alpha.to(values.dtype).reshape(m, r // m, n)
    return torch.bmm(a, values).reshape(r, c)


def masked_mean(values: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of ``values [B,N,C]`` over real positions -> ``[B,C]`` (zeros for empty rows)."""
    if mask is None:
        return values.mean(dim=1)
    w = mask.to(values.dtype)
    total = torch.bmm(w.unsqueeze(1), values).squeeze(1)
    return total / w.sum(1, keepdim=True).clamp_min(1.0)


# ----------------------------------------------------------------------------- scoring


class AttentionScorer(nn.Module):
    """Base class: ``precompute(values) -> keys`` once, ``scores(h, keys) -> e`` per step."""

    def precompute(self, values: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def scores(self, h: Tensor, keys: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def forward(
        self, h: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Soft attention step: ``(z [R,C], alpha [R,N])``."""
        alpha = masked_softmax(self.scores(h, keys), mask)
        return soft_context(alpha, values), alpha

    def step_scorer(self, keys: Tensor) -> Callable[[Tensor], Tensor]:
        """Scores for teacher forcing: ``h [R,H] -> e [R,N]`` against ``keys[:R]``.

        The caller drops finished sequences from the end of a length-sorted batch, so step
        ``t`` scores the first ``R_t`` rows.  Subclasses may accumulate ``dL/dkeys`` over the
        steps instead of letting autograd zero-pad and add one ``[M,N,A]`` gradient per step.
        """
        return lambda h: self.scores(h, keys[: h.shape[0]])


class AdditiveAttention(AttentionScorer):
    """Bahdanau / Xu scoring ``e_i = w^T tanh(W_a h + U_a v_i + b_a)``.

    ``keys = U_a v [M,N,A]`` (precomputed); ``b_a`` is the bias of ``W_a``.
    """

    def __init__(self, query_dim: int, value_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.query_proj = nn.Linear(query_dim, attention_dim, bias=True)  # W_a, b_a
        self.key_proj = nn.Linear(value_dim, attention_dim, bias=False)  # U_a
        self.score_proj = nn.Linear(attention_dim, 1, bias=False)  # w

    def precompute(self, values: Tensor) -> Tensor:
        return self.key_proj(values)

    def scores(self, h: Tensor, keys: Tensor) -> Tensor:
        m, n, a = keys.shape
        r = h.shape[0]
        g = r // m
        q = self.query_proj(h).reshape(m, g, 1, a)  # [M,G,1,A]
        if keys.device.type == "cpu" and not torch.is_grad_enabled():
            return self._scores_in_chunks(keys, q.to(keys.dtype)).reshape(r, n)
        return self._scores(keys, q).reshape(r, n)

    def _scores_in_chunks(self, keys: Tensor, q: Tensor) -> Tensor:
        """CPU inference: items in chunks small enough for the cache, all through ONE scratch
        buffer (a fresh ``[M,G,N,A]`` tensor per step costs more in page faults than the
        tanh itself).  ``keys [M,N,A]``, ``q [M,G,1,A]`` -> ``e [M,G,N]``."""
        m, g, _, a = q.shape
        n = keys.shape[1]
        step = min(m, max(1, _CPU_CHUNK // max(1, g * n * a)))
        scratch = keys.new_empty(step, g, n, a)
        w = self.score_proj.weight.reshape(a).to(keys.dtype)
        e = keys.new_empty(m, g, n)
        for i in range(0, m, step):
            j = min(m, i + step)
            x = torch.add(keys[i:j].unsqueeze(1), q[i:j], out=scratch[: j - i]).tanh_()
            torch.matmul(x, w, out=e[i:j])
        return e

    def _scores(self, keys: Tensor, q: Tensor) -> Tensor:
        x = keys.unsqueeze(1) + q  # [M,G,N,A], a fresh tensor: tanh in place
        return self.score_proj(x.tanh_())  # [M,G,N,1]

    def step_scorer(self, keys: Tensor) -> Callable[[Tensor], Tensor]:
        if not torch.is_grad_enabled():
            return super().step_scorer(keys)
        grads = _AdditiveKeyGradients(keys)
        w = self.score_proj.weight.reshape(-1)
        token = _KeyGradSink.apply(keys, w, grads)

        def scorer(h: Tensor) -> Tensor:
            return _AdditiveScoresStep.apply(self.query_proj(h), w, token, grads)

        return scorer


class _AdditiveKeyGradients:
    """``dL/dK`` of additive scores ``e_t = w^T tanh(K + q_t)`` summed over all steps.

    ``dL/dK = w * sum_t de_t (1 - y_t^2)`` with ``y_t = tanh(K + q_t)`` (w broadcast over
    the attention axis), kept as ``d = sum_t de_t [M,N]`` and ``p = sum_t de_t y_t^2``
    ``[M,N,A]``: one in-place update per step, ``w * (d - p)`` once at the end.  Also owns
    the one scratch buffer all steps compute ``y_t`` in (forward, and again in backward).
    """

    def __init__(self, keys: Tensor) -> None:
        self.keys = keys.detach()
        self.d: Tensor | None = None
        self.p: Tensor | None = None
        self._scratch: Tensor | None = None

    def tanh(self, q: Tensor) -> Tensor:
        """``tanh(K[:R] + q)`` for ``q [R,A]`` into one reused scratch buffer -> ``[R,N,A]``."""
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
    """Hands the accumulated ``dL/dK`` to ``K`` after every step's backward has run (each
    step takes this node's output as an input, so autograd orders it last)."""

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

    Only ``q`` is saved: backward recomputes the ``[R,N,A]`` tanh into the scratch buffer
    (one add + tanh, cheaper on CPU than page-faulting a fresh tensor per step, and ``T``
    times less activation memory), returns ``dq`` and ``dw``, and adds ``dK`` into
    ``_AdditiveKeyGradients``.
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


class DotAttention(AttentionScorer):
    """Dot-product scoring ``e_i = h^T v_i``.

    When ``value_dim != query_dim`` the values are first projected to the query size
    (a learned ``P v_i``, precomputed once); otherwise ``keys = values`` (no parameters).
    ``scale=True`` divides by ``sqrt(query_dim)``.
    """

    def __init__(self, query_dim: int, value_dim: int, scale: bool = False) -> None:
        super().__init__()
        self.key_proj = (
            nn.Linear(value_dim, query_dim, bias=False) if value_dim != query_dim else None
        )
        self.scale = query_dim**-0.5 if scale else 1.0

    def precompute(self, values: Tensor) -> Tensor:
        return values if self.key_proj is None else self.key_proj(values)

    def _query(self, h: Tensor) -> Tensor:
        return h

    def scores(self, h: Tensor, keys: Tensor) -> Tensor:
        m, n, d = keys.shape
        r = h.shape[0]
        q = self._query(h).to(keys.dtype).reshape(m, r // m, d).transpose(1, 2)  # [M,D,G]
        e = torch.bmm(keys, q)  # [M,N,G]
        e = e.transpose(1, 2).reshape(r, n)
        return e * self.scale if self.scale != 1.0 else e


class GeneralAttention(DotAttention):
    """Luong "general" (bilinear) scoring ``e_i = h^T W v_i``; ``keys = W v`` precomputed."""

    def __init__(self, query_dim: int, value_dim: int) -> None:
        nn.Module.__init__(self)
        self.key_proj = nn.Linear(value_dim, query_dim, bias=False)  # W
        self.scale = 1.0

    def precompute(self, values: Tensor) -> Tensor:
        return self.key_proj(values)


def build_attention(
    scoring: str, query_dim: int, value_dim: int, attention_dim: int
) -> AttentionScorer:
    """Scoring module by name: ``additive`` | ``dot`` | ``general``."""
    if scoring == "additive":
        return AdditiveAttention(query_dim, value_dim, attention_dim)
    if scoring == "dot":
        return DotAttention(query_dim, value_dim)
    if scoring == "general":
        return GeneralAttention(query_dim, value_dim)
    raise ValueError(f"unknown attention scoring {scoring!r}; use additive, dot or general")


class SelectorGate(nn.Module):
    """Xu et al.'s scalar gate ``beta = sigmoid(W_beta h + b_beta)``: ``h [R,H]`` -> ``[R,1]``."""

    def __init__(self, hidden_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_dim, 1)

    def forward(self, h: Tensor) -> Tensor:
        return torch.sigmoid(self.proj(h))


# ----------------------------------------------------------------------------- hard attention


def sample_location(alpha: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Sample one location per row from ``alpha [R,N]`` (categorical) -> ``[R]`` long.

    Padded positions have zero weight and are never drawn.  All-zero rows (fully padded)
    return location 0.
    """
    p = alpha.float()
    empty = p.sum(-1, keepdim=True) <= 0
    first = torch.zeros_like(p)
    first[..., 0] = 1.0
    p = torch.where(empty, first, p)
    return torch.multinomial(p, 1, generator=generator).squeeze(-1)


def argmax_location(alpha: Tensor) -> Tensor:
    """Most likely location per row: ``alpha [R,N]`` -> ``[R]``."""
    return alpha.argmax(dim=-1)


def hard_context(values: Tensor, loc: Tensor) -> Tensor:
    """``z = v_s``: ``values [M,N,C]``, ``loc [R]`` (R a multiple of M, grouped) -> ``[R,C]``."""
    m, n, c = values.shape
    r = loc.shape[0]
    base = torch.arange(m, device=loc.device).repeat_interleave(r // m) * n
    return values.reshape(m * n, c).index_select(0, base + loc)


def location_log_prob(alpha: Tensor, loc: Tensor, eps: float = 1e-12) -> Tensor:
    """``log alpha[s]`` per row: ``alpha [R,N]``, ``loc [R]`` -> ``[R]``."""
    return torch.log(alpha.gather(-1, loc.unsqueeze(-1)).squeeze(-1).clamp_min(eps))


def attention_entropy(alpha: Tensor) -> Tensor:
    """Entropy ``-sum_i alpha_i log alpha_i`` of each row (``0 log 0 = 0``): ``[..., N]`` -> ``[...]``."""
    a = alpha.float()
    return -(a * torch.log(a.clamp_min(1e-12))).sum(-1)


def reinforce_surrogate(
    log_prob_samples: Tensor,
    reward: Tensor,
    baseline: Tensor | float,
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """REINFORCE surrogate loss ``-sum_b (r_b - b) * log p(s_b) / normalizer``.

    ``log_prob_samples [B]``: log-probability of each sequence's sampled locations (summed over
    its steps); ``reward [B]``; ``baseline`` scalar.  The advantage is detached, so minimising
    this loss raises the log-probability of samples whose reward beats the baseline and lowers
    it otherwise.  ``normalizer`` defaults to ``B`` (mean over sequences).
    """
    adv = (reward - baseline).detach().to(log_prob_samples.dtype)
    n = log_prob_samples.shape[0] if normalizer is None else normalizer
    return -(adv * log_prob_samples).sum() / n


def update_baseline(baseline: Tensor, reward: Tensor, decay: float) -> Tensor:
    """Moving average ``b <- decay * b + (1 - decay) * mean(reward)`` (returns the new value)."""
    return decay * baseline + (1.0 - decay) * reward.detach().float().mean()


# ----------------------------------------------------------------------------- regulariser


def doubly_stochastic_penalty(
    alphas: Tensor,
    step_mask: Tensor | None = None,
    position_mask: Tensor | None = None,
    target: float = 1.0,
) -> Tensor:
    """Xu et al.'s doubly stochastic regulariser ``sum_i (target - sum_t alpha_ti)^2``.

    ``alphas [B,T,N]``; ``step_mask [B,T]`` (True = real decoding step, padded steps do not
    count towards ``sum_t``); ``position_mask [B,N]`` (True = real position; padded positions
    are left out of ``sum_i``).  Normalisation: summed over positions, AVERAGED over the
    ``B`` sequences (not over steps or positions), as in the paper's eq. 14.
    """
    a = alphas.float()
    if step_mask is not None:
        a = a * step_mask.unsqueeze(-1).to(a.dtype)
    per_pos = (target - a.sum(dim=1)) ** 2  # [B,N]
    if position_mask is not None:
        per_pos = per_pos * position_mask.to(per_pos.dtype)
    return per_pos.sum(dim=1).mean()
