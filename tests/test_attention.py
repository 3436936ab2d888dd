"""Attention math against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from captioning.errors import ConfigError
from captioning.models.attention import (
    AdditiveAttention,
    DotAttention,
    GeneralAttention,
    SelectorGate,
    attention_entropy,
    build_attention,
    doubly_stochastic_penalty,
    hard_context,
    location_log_prob,
    masked_mean,
    masked_softmax,
    reinforce_surrogate,
    sample_location,
    soft_context,
    update_baseline,
)

TANH_05 = 0.46211716
TANH_1 = 0.76159416
TANH_15 = 0.90514825


def _additive() -> AdditiveAttention:
    att = AdditiveAttention(query_dim=2, value_dim=2, attention_dim=2)
    with torch.no_grad():
        att.query_proj.weight.copy_(torch.eye(2))  # W_a = I
        att.query_proj.bias.zero_()  # b_a = 0
        att.key_proj.weight.copy_(torch.eye(2))  # U_a = I
        att.score_proj.weight.copy_(torch.tensor([[1.0, 1.0]]))  # w = [1, 1]
    return att


def test_additive_scores_hand_computed() -> None:
    att = _additive()
    h = torch.tensor([[0.5, 0.0]])
    v = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    # e_i = tanh(0.5 + v_i1) + tanh(0 + v_i2)
    expected = torch.tensor([[TANH_05, TANH_15, TANH_05 + TANH_1]])
    e = att.scores(h, att.precompute(v))
    torch.testing.assert_close(e, expected, atol=1e-6, rtol=0)


def test_additive_bias_enters_inside_tanh() -> None:
    att = _additive()
    with torch.no_grad():
        att.query_proj.bias.copy_(torch.tensor([0.5, 1.0]))
    h = torch.zeros(1, 2)
    v = torch.tensor([[[1.0, 0.0]]])
    # tanh(0 + 1 + 0.5) + tanh(0 + 0 + 1)
    e = att.scores(h, att.precompute(v))
    assert e.item() == pytest.approx(TANH_15 + TANH_1, abs=1e-6)


def test_dot_scores_and_softmax_hand_computed() -> None:
    att = DotAttention(query_dim=2, value_dim=2)
    assert list(att.parameters()) == []  # no parameters
    h = torch.tensor([[1.0, 2.0]])
    v = torch.tensor([[[3.0, 0.0], [0.0, 1.0], [-1.0, 1.0]]])
    e = att.scores(h, att.precompute(v))
    torch.testing.assert_close(e, torch.tensor([[3.0, 2.0, 1.0]]))
    z = 1 + math.exp(-1) + math.exp(-2)
    alpha = masked_softmax(e, None)
    torch.testing.assert_close(
        alpha, torch.tensor([[1 / z, math.exp(-1) / z, math.exp(-2) / z]]), atol=1e-6, rtol=0
    )
    # mask out the third position: softmax over [3, 2] only
    alpha = masked_softmax(e, torch.tensor([[True, True, False]]))
    s = 1 + math.exp(-1)
    assert alpha[0, 2].item() == 0.0
    torch.testing.assert_close(alpha[0, :2], torch.tensor([1 / s, math.exp(-1) / s]))


def test_dot_is_h_dot_v_and_refuses_other_sizes_naming_general() -> None:
    att = DotAttention(query_dim=3, value_dim=3)
    assert list(att.parameters()) == []  # no learned projection: that would be "general"
    h = torch.tensor([[1.0, 1.0, 0.5]])
    v = torch.tensor([[[1.0, 2.0, 4.0]]])  # h.v = 1 + 2 + 2 = 5
    assert att.scores(h, att.precompute(v)).item() == pytest.approx(5.0)
    with pytest.raises(ConfigError, match="scoring=general"):
        DotAttention(query_dim=2, value_dim=3)
    with pytest.raises(ConfigError, match="scoring=general"):
        build_attention("dot", 2, 3, 4)


def test_general_bilinear_hand_computed() -> None:
    att = GeneralAttention(query_dim=2, value_dim=2)
    with torch.no_grad():
        att.key_proj.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))  # W
    h = torch.tensor([[1.0, 1.0]])
    v = torch.tensor([[[1.0, 1.0], [2.0, -1.0]]])
    # h^T W v: [1*1 + 2*1, 1*2 + 2*(-1)] = [3, 0]
    torch.testing.assert_close(att.scores(h, att.precompute(v)), torch.tensor([[3.0, 0.0]]))


@pytest.mark.parametrize("scoring", ["additive", "dot", "general"])
def test_grouped_rows_equal_expanded_keys(scoring: str) -> None:
    torch.manual_seed(0)
    value_dim = 4 if scoring == "dot" else 6
    att = build_attention(scoring, 4, value_dim, 5)
    v = torch.randn(2, 3, value_dim)
    keys = att.precompute(v)
    h = torch.randn(6, 4)  # 3 rows per memory item
    grouped = att.scores(h, keys)
    expanded = att.scores(h, keys.repeat_interleave(3, 0))
    torch.testing.assert_close(grouped, expanded)
    alpha = masked_softmax(grouped, torch.tensor([[True, True, False], [True, True, True]]))
    assert torch.all(alpha[:3, 2] == 0)
    torch.testing.assert_close(
        soft_context(alpha, v), soft_context(alpha, v.repeat_interleave(3, 0))
    )


def test_masked_softmax_exact_zero_sum_one_and_all_masked_rows() -> None:
    torch.manual_seed(0)
    e = torch.randn(3, 5, requires_grad=True)
    mask = torch.tensor([[True, True, True, False, False], [True] * 5, [False] * 5])
    alpha = masked_softmax(e * 100, mask)  # large scores: still exact
    assert torch.all(alpha[~mask] == 0)
    torch.testing.assert_close(alpha.sum(-1), torch.tensor([1.0, 1.0, 0.0]))
    alpha.sum().backward()
    assert torch.isfinite(e.grad).all()
    assert torch.all(e.grad[~mask] == 0)


def test_soft_context_and_masked_mean() -> None:
    v = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]]])
    alpha = torch.tensor([[0.25, 0.75, 0.0]])
    torch.testing.assert_close(soft_context(alpha, v), torch.tensor([[0.25, 1.5]]))
    torch.testing.assert_close(
        masked_mean(v, torch.tensor([[True, True, False]])), torch.tensor([[0.5, 1.0]])
    )


def test_doubly_stochastic_hand_computed_per_caption() -> None:
    alphas = torch.tensor(
        [
            [[0.2, 0.8], [1.0, 0.0]],  # sum_t = [1.2, 0.8] -> 0.04 + 0.04 = 0.08
            [[0.0, 1.0], [0.0, 1.0]],  # sum_t = [0, 2]     -> 1 + 1 = 2
        ]
    )
    full = torch.ones(2, 2, dtype=torch.bool)
    torch.testing.assert_close(doubly_stochastic_penalty(alphas, full), torch.tensor([0.08, 2.0]))
    # second step of sequence 0 is padding: sum_t = [0.2, 0.8] -> 0.64 + 0.04
    steps = torch.tensor([[True, False], [True, True]])
    torch.testing.assert_close(doubly_stochastic_penalty(alphas, steps), torch.tensor([0.68, 2.0]))
    # second position of sequence 0 is padding: only (1 - 1.2)^2 counts
    pos = torch.tensor([[True, False], [True, True]])
    torch.testing.assert_close(doubly_stochastic_penalty(alphas, full, pos), torch.tensor([0.04, 2.0]))


def test_reinforce_gradient_sign_and_value() -> None:
    for reward, sign in ((2.0, -1.0), (0.0, 1.0)):
        theta = torch.zeros(2, requires_grad=True)
        alpha = torch.softmax(theta, -1).unsqueeze(0)  # [0.5, 0.5]
        logp = location_log_prob(alpha, torch.tensor([1]))
        loss = reinforce_surrogate(logp, torch.tensor([reward]), baseline=1.0)
        loss.backward()
        # d/dtheta_j = -(r - b) * (1[j = s] - alpha_j)
        torch.testing.assert_close(theta.grad, torch.tensor([-0.5 * sign, 0.5 * sign]))
        # one gradient step: the sampled location's probability goes up iff r > b
        new_alpha = torch.softmax(theta.detach() - 0.1 * theta.grad, -1)
        assert (new_alpha[1].item() > 0.5) == (reward > 1.0)


def test_reinforce_normalizer_and_detached_advantage() -> None:
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    reward = torch.tensor([3.0, 1.0], requires_grad=True)
    loss = reinforce_surrogate(logp, reward, torch.tensor(2.0), normalizer=4)
    # -( (3-2)*(-1) + (1-2)*(-2) ) / 4 = -(-1 + 2) / 4
    assert loss.item() == pytest.approx(-0.25)
    loss.backward()
    assert reward.grad is None


def test_update_baseline() -> None:
    b = update_baseline(torch.tensor(1.0), torch.tensor([2.0, 4.0]), decay=0.9)
    assert b.item() == pytest.approx(0.9 * 1.0 + 0.1 * 3.0)


def test_selector_gate_value() -> None:
    gate = SelectorGate(2)
    with torch.no_grad():
        gate.proj.weight.copy_(torch.tensor([[1.0, 2.0]]))
        gate.proj.bias.fill_(0.5)
    beta = gate(torch.tensor([[1.0, 1.0]]))
    assert beta.shape == (1, 1)
    assert beta.item() == pytest.approx(1 / (1 + math.exp(-3.5)))


def test_entropy_hard_context_and_sampling_respects_mask() -> None:
    assert attention_entropy(torch.tensor([0.5, 0.5, 0.0])).item() == pytest.approx(math.log(2))
    v = torch.arange(12.0).reshape(2, 3, 2)
    z = hard_context(v, torch.tensor([0, 2, 1, 1]))  # rows 0,1 -> item 0; rows 2,3 -> item 1
    torch.testing.assert_close(z, torch.tensor([[0.0, 1.0], [4.0, 5.0], [8.0, 9.0], [8.0, 9.0]]))
    torch.manual_seed(0)
    alpha = masked_softmax(torch.zeros(500, 4), torch.tensor([[True, False, True, False]] * 500))
    loc = sample_location(alpha)
    assert set(loc.tolist()) == {0, 2}
    empty = sample_location(torch.zeros(2, 3))
    assert empty.tolist() == [0, 0]


def test_key_projection_runs_once_per_sequence() -> None:
    """``U_a v`` once per batch (training) and once per decoding, with either step; ``W_a h`` is no
    module call of its own in the fast step, which computes it in its one product of ``h_{t-1}``
    (test_lstm_step), and one call per step in the plain one."""
    from captioning.models.decoders import build_decoder

    torch.manual_seed(0)
    for fast in (True, False):
        dec = build_decoder({"embed_dim": 8, "hidden_dim": 8, "attention_dim": 4, "fast_step": fast}, 10, 6)
        calls = {"key": 0, "query": 0}
        dec.attention.key_proj.register_forward_hook(lambda *a, c=calls: c.__setitem__("key", c["key"] + 1))
        dec.attention.query_proj.register_forward_hook(lambda *a, c=calls: c.__setitem__("query", c["query"] + 1))
        tokens = torch.tensor([[1, 4, 5, 6, 7, 2], [1, 4, 2, 0, 0, 0]])
        dec.compute_loss(torch.randn(2, 3, 6), None, tokens)
        assert calls == {"key": 1, "query": 0 if fast else 5}
        state = dec.init_state(torch.randn(2, 3, 6), None)
        for _ in range(4):
            _, _, state = dec.step(torch.tensor([1, 1]), state)
        assert calls == {"key": 2, "query": 0 if fast else 9}
