"""captioning.models.kernels: every fast path equals the plain autograd reference it replaces."""

from __future__ import annotations

import pytest
import torch

from captioning.models import kernels
from captioning.models.attention import AdditiveAttention, build_attention
from captioning.models.decoders import build_decoder

V, C, N = 12, 6, 4


def _toy_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(6, N, C, generator=g, requires_grad=True)
    mask = torch.ones(6, N, dtype=torch.bool)
    mask[1, 2:] = False
    mask[4, 3:] = False
    tokens = torch.tensor([[1, 4, 5, 6, 2, 0], [1, 7, 8, 2, 0, 0], [1, 9, 10, 11, 4, 2],
                           [1, 5, 5, 2, 0, 0], [1, 6, 2, 0, 0, 0], [1, 11, 10, 9, 2, 0]])
    return feats, mask, tokens


def _loss_and_grads(dec, feats, mask, tokens, seed: int) -> tuple[dict, dict]:
    dec.zero_grad(set_to_none=True)
    feats.grad = None
    torch.manual_seed(seed)  # hard attention samples: the same draws on both paths
    out = dec.compute_loss(feats, mask, tokens, label_smoothing=0.1)
    out["loss"].backward()
    grads = {n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}
    grads["<features>"] = feats.grad.clone()
    return {k: v.detach() for k, v in out.items()}, grads


@pytest.mark.parametrize("extra", [
    {"variant": "show_tell", "num_layers": 2},
    {"variant": "mean_pool"},
    {"variant": "soft_attention", "num_layers": 2},
    {"variant": "soft_attention", "scoring": "general", "position_code": "sinusoidal"},
    {"variant": "soft_attention", "bidirectional_encoder": True, "gate": False},
    {"variant": "hard_attention", "soft_fraction": 0.0},
])
def test_fused_teacher_forcing_equals_the_reference_lstm(extra: dict) -> None:
    """fused_kernels (precomputed word gates, deferred weight gradients, summed additive key
    gradients) == nn.LSTMCell + plain autograd: same loss parts, same gradient everywhere."""
    torch.manual_seed(0)
    base = {"embed_dim": 16, "hidden_dim": 24, "attention_dim": 8, "dropout": 0.0, **extra}
    dec = build_decoder({**base, "fused_kernels": "true"}, V, C, layout=(2, 2)).train()
    feats, mask, tokens = _toy_batch(1)
    fused, g_fused = _loss_and_grads(dec, feats, mask, tokens, seed=5)
    dec.cfg.fused_kernels = "false"
    dec.reinforce_updates.zero_()
    dec.reinforce_baseline.zero_()
    plain, g_plain = _loss_and_grads(dec, feats, mask, tokens, seed=5)
    assert fused.keys() == plain.keys()
    for key in fused:
        torch.testing.assert_close(fused[key], plain[key], msg=key)
    assert g_fused.keys() == g_plain.keys()
    for name in g_plain:
        torch.testing.assert_close(g_fused[name], g_plain[name], atol=1e-6, rtol=1e-4, msg=name)


def test_deferred_linear_weight_gradient_is_the_sum_over_steps() -> None:
    torch.manual_seed(1)
    w = torch.randn(3, 4, requires_grad=True)
    xs = [torch.randn(r, 4) for r in (5, 3, 2)]
    lin = kernels.DeferredLinear(w)
    loss = sum((lin(x) * (i + 1)).sum() for i, x in enumerate(xs))
    (dw,) = torch.autograd.grad(loss, w)
    expected = sum((i + 1) * torch.ones(x.shape[0], 3).t() @ x for i, x in enumerate(xs))
    torch.testing.assert_close(dw, expected)


@pytest.mark.parametrize("rows", [(5, 5, 3, 1), (2,)])
def test_additive_step_scorer_gradients_equal_plain_autograd(rows: tuple[int, ...]) -> None:
    """Rows shrinking over steps; dL/dK summed in place and applied once == autograd of
    scoring keys[:R_t] directly (also for the query and score weights)."""
    torch.manual_seed(3)
    att = AdditiveAttention(4, 6, 5)
    values = torch.randn(5, 3, 6, requires_grad=True)
    hs = [torch.randn(r, 4) for r in rows]
    weights = [torch.randn(r, 3) for r in rows]

    def loss(score_fn) -> torch.Tensor:
        return sum((score_fn(h) * w).sum() for h, w in zip(hs, weights, strict=True))

    params = [values, *att.parameters()]
    w = att.score_proj.weight.reshape(-1)
    fused_scorer = kernels.additive_step_scorer(att.precompute(values), w)
    fused = torch.autograd.grad(loss(lambda h: fused_scorer(att.query_proj(h))), params)
    keys = att.precompute(values)
    plain = torch.autograd.grad(loss(lambda h: att.scores(h, keys[: h.shape[0]])), params)
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_additive_step_scorer_supports_retain_graph() -> None:
    torch.manual_seed(4)
    att = AdditiveAttention(4, 6, 5)
    values = torch.randn(2, 3, 6, requires_grad=True)
    scorer = kernels.additive_step_scorer(att.precompute(values), att.score_proj.weight.reshape(-1))
    e = scorer(att.query_proj(torch.randn(2, 4)))
    (once,) = torch.autograd.grad(e.sum(), values, retain_graph=True)
    (twice,) = torch.autograd.grad(e.sum(), values)
    torch.testing.assert_close(once, twice)


def test_additive_cpu_inference_chunks_equal_the_plain_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(1)
    att = build_attention("additive", 4, 6, 5)
    keys = att.precompute(torch.randn(7, 3, 6))
    h = torch.randn(14, 4)  # 2 rows per item
    q = att.query_proj(h).reshape(7, 2, 1, 5)
    plain = att.score_proj(torch.tanh(keys.unsqueeze(1) + q)).reshape(14, 3)
    with torch.no_grad():
        full = att.scores(h, keys)
        monkeypatch.setattr(kernels, "CPU_CHUNK", 2 * 3 * 5 * 2)  # 2 items per chunk
        chunked = att.scores(h, keys)
    torch.testing.assert_close(full, plain.detach())
    torch.testing.assert_close(chunked, plain.detach())
