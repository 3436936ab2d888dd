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

import torch
from torch import Tensor, nn

from captioning.errors import ConfigError

__all__ = [
    "AdditiveAttention",
    "AttentionScorer",
    "DotAttention",
    "GeneralAttention",
    "SelectorGate",
    "argmax_location",
    "attention_entropy",
    "build_attention",
    "coverage_penalty",
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
        return self.scores_from_query(self.query_proj(h), keys)

    def scores_from_query(self, q: Tensor, keys: Tensor, w: Tensor | None = None) -> Tensor:
        """``e = w^T tanh(K + q)`` from the query ``q = W_a h + b_a [R,A]`` (the LSTM step computes
        it in one product with the other uses of ``h``); ``w [A]``: ``score_proj``'s weight, in the
        keys' dtype (None: read here)."""
        m, n, a = keys.shape
        r = q.shape[0]
        w = self.score_proj.weight.reshape(a).to(keys.dtype) if w is None else w
        if keys.device.type == "cpu" and not torch.is_grad_enabled():
            return _chunked_scores(keys, q.reshape(m, r // m, 1, a).to(keys.dtype), w)
        if r == m:  # one row per item (teacher forcing, greedy decoding)
            return torch.matmul(torch.tanh(keys + q.unsqueeze(1)), w)
        x = (keys.unsqueeze(1) + q.reshape(m, r // m, 1, a)).tanh_()  # [M,G,N,A], a fresh tensor: tanh in place
        return torch.matmul(x, w).reshape(r, n)


#: elements of ``[G,N,A]`` scored at once in CPU decoding (a few MB: they stay in cache)
CPU_CHUNK = 1 << 19


def _chunked_scores(keys: Tensor, q: Tensor, w: Tensor) -> Tensor:
    """CPU decoding's ``w^T tanh(K + q)``: ``keys [M,N,A]``, ``q [M,G,1,A]``, ``w [A]`` -> ``[M*G,N]``,
    items in chunks that stay in cache, all through ONE scratch buffer: a fresh ``[M,G,N,A]`` tensor
    per step costs more in page faults than the tanh."""
    m, g, _, a = q.shape
    chunk = min(m, max(1, CPU_CHUNK // max(1, g * keys.shape[1] * a)))
    scratch = keys.new_empty(chunk, g, keys.shape[1], a)
    e = keys.new_empty(m, g, keys.shape[1])
    for i in range(0, m, chunk):
        j = min(m, i + chunk)
        torch.matmul(torch.add(keys[i:j].unsqueeze(1), q[i:j], out=scratch[: j - i]).tanh_(), w, out=e[i:j])
    return e.reshape(m * g, keys.shape[1])


class DotAttention(AttentionScorer):
    """Dot-product scoring ``e_i = h^T v_i`` (Luong et al. 2015): no parameters, ``keys = values``.

    Needs ``value_dim == query_dim``; for annotation vectors of another size use ``general``
    (``h^T W v_i``, a learned ``W``) or ``additive``.  ``scale=True`` divides by ``sqrt(dim)``.
    """

    def __init__(self, query_dim: int, value_dim: int, scale: bool = False) -> None:
        super().__init__()
        if value_dim != query_dim:
            raise ConfigError(
                f"dot attention scores h.v and needs annotation vectors of the decoder's size "
                f"({value_dim} != {query_dim}); use scoring=general (h^T W v, learned W) or additive"
            )
        self.scale = query_dim**-0.5 if scale else 1.0

    def precompute(self, values: Tensor) -> Tensor:
        return values

    def scores(self, h: Tensor, keys: Tensor) -> Tensor:
        m, n, d = keys.shape
        r = h.shape[0]
        q = h.to(keys.dtype).reshape(m, r // m, d).transpose(1, 2)  # [M,D,G]
        e = torch.bmm(keys, q).transpose(1, 2).reshape(r, n)  # [M,N,G] -> [R,N]
        return e * self.scale if self.scale != 1.0 else e


class GeneralAttention(DotAttention):
    """Luong "general" (bilinear) scoring ``e_i = h^T W v_i``; ``keys = W v`` precomputed once."""

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
    raise ConfigError(f"unknown attention scoring {scoring!r}; use additive, dot or general")


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
    """Xu et al.'s doubly stochastic regulariser per caption: ``sum_i (target - sum_t alpha_ti)^2``.

    ``alphas [B,T,N]``; ``step_mask [B,T]`` (True = real decoding step, padded steps do not
    count towards ``sum_t``); ``position_mask [B,N]`` (True = real position; padded positions
    are left out of ``sum_i``).  Returns ``[B]``: one penalty per caption.  In Xu et al.'s
    eq. 14 (and arctic-captions) it is added to the caption's SUMMED negative log-likelihood,
    so a per-token loss must divide it by the number of tokens, not by the number of captions
    (see ``captioning.models.decoders.lstm``).
    """
    a = alphas.float()
    if step_mask is not None:
        a = a * step_mask.unsqueeze(-1).to(a.dtype)
    return coverage_penalty(a.sum(dim=1), position_mask, target)


def coverage_penalty(coverage: Tensor, position_mask: Tensor | None = None, target: float = 1.0) -> Tensor:
    """``sum_i (target - c_i)^2`` per caption from its coverage ``c_i = sum_t alpha_ti`` ``[B,N]``
    (padded positions left out): the doubly stochastic regulariser once the steps are summed."""
    per_pos = (target - coverage.float()) ** 2  # [B,N]
    if position_mask is not None:
        per_pos = per_pos * position_mask.to(per_pos.dtype)
    return per_pos.sum(dim=1)
