"""The LSTM decoders: variants train, masking, training path == step path, the loss of eq. 14,
hard attention's REINFORCE reward, position codes, state handling, the static schedule."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from conftest import run_bench
from omegaconf import OmegaConf

from captioning.errors import ConfigError
from captioning.models.decoders import build_decoder, decoder_config
from captioning.models.decoders.lstm import VARIANTS, LSTMConfig, LSTMDecoder

V, C, N = 12, 6, 4
_TINY_BENCH = "--batch-size 4 --regions 5 --feature-dim 8 --hidden 8 --attention-dim 4 --embed 8 --vocab 20"


def _small(variant: str, **kw) -> dict:
    base = dict(variant=variant, embed_dim=16, hidden_dim=24, attention_dim=8, dropout=0.0)
    base.update(kw)
    return base


def _decoder(cfg: dict) -> LSTMDecoder:
    """The registered LSTM decoder over the toy features (N = 4 positions on a 2x2 grid)."""
    return build_decoder(cfg, V, C, layout=(2, 2))


def _toy_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(6, N, C, generator=g)
    mask = torch.ones(6, N, dtype=torch.bool)
    mask[1, 2:] = False
    mask[4, 3:] = False
    tokens = torch.tensor(
        [
            [1, 4, 5, 6, 2, 0],
            [1, 7, 8, 2, 0, 0],
            [1, 9, 10, 11, 4, 2],
            [1, 5, 5, 2, 0, 0],
            [1, 6, 2, 0, 0, 0],
            [1, 11, 10, 9, 2, 0],
        ]
    )
    return feats, mask, tokens


@pytest.mark.parametrize(
    "variant,extra",
    [
        ("show_tell", {}),
        ("mean_pool", {}),
        ("soft_attention", {}),
        ("soft_attention", {"scoring": "general", "deep_output": False, "num_layers": 2}),
        ("soft_attention", {"scoring": "general", "gate": False, "bidirectional_encoder": True}),
        ("soft_attention", {"position_code": "sinusoidal"}),
        ("soft_attention", {"position_code": "learned", "position_mode": "add"}),
        ("hard_attention", {"soft_fraction": 0.5}),
    ],
)
def test_variants_train_on_toy_problem(variant: str, extra: dict) -> None:
    torch.manual_seed(0)
    dec = _decoder(_small(variant, **extra))
    feats, mask, tokens = _toy_batch()
    opt = torch.optim.Adam(dec.parameters(), lr=2e-2)
    xes = []
    for _ in range(40):
        out = dec.compute_loss(feats, mask, tokens)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        xes.append(float(out["xe"].detach()))
        assert torch.isfinite(out["loss"])
    assert xes[-1] < 0.5 * xes[0], xes
    if variant == "hard_attention":
        assert {"reinforce", "entropy", "baseline"} <= set(out)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_layers", [1, 2])
def test_training_path_equals_step_path(variant: str, num_layers: int) -> None:
    torch.manual_seed(1)
    dec = _decoder(_small(variant, num_layers=num_layers)).eval()
    feats, mask, tokens = _toy_batch(1)
    xe = dec.compute_loss(feats, mask, tokens)["xe"].detach()
    total, count = 0.0, 0
    with torch.no_grad():
        state = dec.init_state(feats, mask)
        for t in range(tokens.shape[1] - 1):
            lp, alpha, state = dec.step(tokens[:, t], state)
            tgt = tokens[:, t + 1]
            real = tgt != 0
            total += float(-lp[real].gather(1, tgt[real].unsqueeze(1)).sum())
            count += int(real.sum())
            if alpha is not None:
                assert torch.all(alpha[~mask] == 0)
                torch.testing.assert_close(alpha.sum(-1), torch.ones(6))
    assert float(xe) == pytest.approx(total / count, rel=1e-5)


@pytest.mark.parametrize("variant", ["show_tell", "mean_pool", "soft_attention"])
def test_deferred_weight_gradients_equal_plain_autograd(variant: str) -> None:
    """compute_loss (weight grads computed once after the loop) == step-by-step autograd."""
    torch.manual_seed(7)
    dec = _decoder(_small(variant, num_layers=2)).eval()
    feats, mask, tokens = _toy_batch(7)
    dec.compute_loss(feats, mask, tokens)["xe"].backward()
    fast = {n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}
    dec.zero_grad(set_to_none=True)
    state = dec.init_state(feats, mask)
    total = torch.zeros(())
    count = 0
    for t in range(tokens.shape[1] - 1):
        lp, _, state = dec.step(tokens[:, t], state)
        tgt = tokens[:, t + 1]
        real = tgt != 0
        total = total - lp[real].gather(1, tgt[real].unsqueeze(1)).sum()
        count += int(real.sum())
    (total / count).backward()
    slow = {n: p.grad for n, p in dec.named_parameters() if p.grad is not None}
    assert fast.keys() == slow.keys()
    for name in fast:
        torch.testing.assert_close(fast[name], slow[name], atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("scoring", ["additive", "general"])
@pytest.mark.parametrize("variant", ["soft_attention", "hard_attention", "mean_pool"])
def test_masked_positions_get_zero_attention_and_zero_gradient(variant: str, scoring: str) -> None:
    torch.manual_seed(2)
    dec = _decoder(_small(variant, scoring=scoring)).eval()
    feats, mask, tokens = _toy_batch(2)
    feats.requires_grad_(True)
    dec.compute_loss(feats, mask, tokens)["loss"].backward()
    assert torch.all(feats.grad[~mask] == 0)
    assert feats.grad[mask].abs().sum() > 0
    # padded features do not change anything
    feats2 = feats.detach().clone()
    feats2[~mask] = 1e3
    a = dec.compute_loss(feats.detach(), mask, tokens)["loss"]
    b = dec.compute_loss(feats2, mask, tokens)["loss"]
    torch.testing.assert_close(a, b)


def test_bidirectional_encoder_ignores_padding() -> None:
    torch.manual_seed(3)
    dec = _decoder(_small("soft_attention", bidirectional_encoder=True)).eval()
    feats, mask, tokens = _toy_batch(3)
    feats2 = feats.clone()
    feats2[~mask] = 7.0
    torch.testing.assert_close(
        dec.compute_loss(feats, mask, tokens)["loss"],
        dec.compute_loss(feats2, mask, tokens)["loss"],
    )
    assert dec.context_dim == 24


def test_hard_attention_reward_is_per_token_and_the_baseline_moves() -> None:
    """Reward = a caption's MEAN token log-likelihood (arctic-captions' per-token cost), so the
    advantage does not track caption length.  Hand-computed: with zero output weights the logits
    are the output bias beta whatever was attended, so caption b's reward is
    mean_t (beta[y_bt] - logsumexp(beta))."""
    torch.manual_seed(4)
    dec = _decoder(_small("hard_attention", soft_fraction=0.0, baseline_decay=0.5))
    feats, mask, tokens = _toy_batch(4)
    with torch.no_grad():
        dec.out_vocab.weight.zero_()
        dec.out_vocab.bias.zero_()
    out = dec.compute_loss(feats, mask, tokens)
    # every token costs log V: every caption's reward is -log V, whatever its length (a summed
    # reward would be -len * log V and the advantage would track length)
    assert float(out["baseline"]) == pytest.approx(-math.log(V), rel=1e-6)
    assert float(out["reinforce"].detach()) == pytest.approx(0.0, abs=1e-6)  # zero advantage everywhere
    assert int(dec.reinforce_updates) == 1
    beta = torch.linspace(-1.0, 2.0, V)
    with torch.no_grad():
        dec.out_vocab.bias.copy_(beta)
    log_p = beta - torch.logsumexp(beta, 0)
    targets = tokens[:, 1:]
    rewards = [float(log_p[row[row != 0]].mean()) for row in targets]
    out2 = dec.compute_loss(feats, mask, tokens)
    expected = 0.5 * -math.log(V) + 0.5 * sum(rewards) / len(rewards)
    assert float(out2["baseline"]) == pytest.approx(expected, rel=1e-5)
    out2["loss"].backward()
    assert dec.attention.query_proj.weight.grad.abs().sum() > 0  # REINFORCE reaches attention
    # soft batches: no REINFORCE, baseline untouched
    dec.cfg.soft_fraction = 1.0
    out3 = dec.compute_loss(feats, mask, tokens)
    assert float(out3["reinforce"].detach()) == 0.0
    assert int(dec.reinforce_updates) == 2
    # eval: deterministic (argmax), no update
    dec.eval()
    a = dec.compute_loss(feats, mask, tokens)["loss"]
    b = dec.compute_loss(feats, mask, tokens)["loss"]
    assert float(a.detach()) == float(b.detach())
    assert int(dec.reinforce_updates) == 2


def test_regulariser_weighs_against_the_summed_caption_nll_as_in_eq_14() -> None:
    """Hand-computed: with zero output weights every token costs log V, with zero scores the
    attention is uniform over a caption's real positions, so caption b's penalty is
    sum_i (1 - T_b/N_b)^2 = (N_b - T_b)^2 / N_b.  Eq. 14 adds lambda times that to the caption's
    SUMMED NLL; per token: loss = (n_tok log V + lambda sum_b pen_b) / n_tok."""
    dec = _decoder(_small("soft_attention", doubly_stochastic=1.0)).eval()
    with torch.no_grad():
        dec.out_vocab.weight.zero_()
        dec.out_vocab.bias.zero_()
        dec.attention.score_proj.weight.zero_()
    feats, mask, tokens = _toy_batch(5)
    # real steps T_b = [4, 3, 5, 3, 2, 4] (21 tokens), real positions N_b = [4, 2, 4, 4, 3, 4]
    penalties = [0.0, 0.5, 0.25, 0.25, 1 / 3, 0.0]
    out = dec.compute_loss(feats, mask, tokens)
    assert float(out["xe"]) == pytest.approx(math.log(V), rel=1e-6)
    assert float(out["ds"]) == pytest.approx(sum(penalties) / 6, rel=1e-5)  # logged per caption
    paper = math.log(V) + sum(penalties) / 21
    assert float(out["loss"]) == pytest.approx(paper, rel=1e-6)
    assert float(dec.compute_loss(feats, mask, tokens, static=True)["loss"]) == pytest.approx(paper, rel=1e-6)
    dec.cfg.doubly_stochastic = 2.0
    assert float(dec.compute_loss(feats, mask, tokens)["loss"]) == pytest.approx(
        math.log(V) + 2 * sum(penalties) / 21, rel=1e-6)
    dec.cfg.doubly_stochastic = 0.0
    assert float(dec.compute_loss(feats, mask, tokens)["loss"]) == pytest.approx(math.log(V), rel=1e-6)
    smooth = dec.compute_loss(feats, mask, tokens, label_smoothing=0.1)
    assert float(smooth["xe"]) == pytest.approx(math.log(V), rel=1e-6)  # uniform logits: unchanged
    with torch.no_grad():
        dec.out_vocab.bias[4] = 3.0
    assert float(dec.compute_loss(feats, mask, tokens, label_smoothing=0.1)["xe"]) != pytest.approx(
        float(dec.compute_loss(feats, mask, tokens)["xe"]))


def test_state_index_select_and_groups() -> None:
    torch.manual_seed(6)
    dec = _decoder(_small("soft_attention")).eval()
    feats, mask, _ = _toy_batch(6)
    st = dec.init_state(feats, mask).repeat_interleave(3)  # 18 rows, group 3
    assert st.num_rows == 18 and st.group == 3 and st.memory["keys"].shape[0] == 6
    prev = torch.full((18,), 1)
    _, _, st = dec.step(prev, st)
    idx = torch.tensor([2, 2, 0] + [3 * i + 1 for i in range(1, 6) for _ in range(3)])
    grouped = st.index_select(idx, within_groups=True)
    generic = st.index_select(idx)
    assert generic.group == 1 and generic.memory["keys"].shape[0] == 18
    lp_a, al_a, _ = dec.step(prev, grouped)
    lp_b, al_b, _ = dec.step(prev, generic)
    torch.testing.assert_close(lp_a, lp_b)
    torch.testing.assert_close(al_a, al_b)
    sub = st.select_groups(torch.tensor([4, 1]))
    assert sub.num_rows == 6 and sub.memory["keys"].shape[0] == 2
    torch.testing.assert_close(sub.rows["h"][:3], st.rows["h"][12:15])


def test_config_structured_and_errors() -> None:
    node = OmegaConf.structured(LSTMConfig)
    node.variant = "mean_pool"
    dec = build_decoder(node, V, C)
    assert dec.cfg.variant == "mean_pool" and dec.attention is None
    assert decoder_config({"variant": "show_tell"}).name == "lstm"  # checkpoints before the registry
    with pytest.raises(ConfigError, match="variant"):
        build_decoder({"variant": "nope"}, V, C)
    with pytest.raises(ConfigError, match="model.hidden'"):
        build_decoder({"variant": "show_tell", "hidden": 3}, V, C)
    with pytest.raises(ConfigError, match="scoring"):
        build_decoder({"scoring": "cosine"}, V, C)
    with pytest.raises(ConfigError, match="model.hidden_dim"):
        build_decoder({"hidden_dim": "wide"}, V, C)
    with pytest.raises(ConfigError, match="model.name='nope' is not a registered decoder"):
        build_decoder({"name": "nope"}, V, C)
    with pytest.raises(ConfigError, match="position_code needs the layout"):
        build_decoder({"position_code": "sinusoidal"}, V, C)


def test_train_benchmark_smoke() -> None:
    results = run_bench("train", f"{_TINY_BENCH} --length 5 --steps 1 --warmup 0")
    assert [r["name"] for r in results] == ["train/ours", "train/baseline", "train/speedup"]
    assert all(r["value"] > 0 and r["unit"] for r in results)


@pytest.mark.slow
def test_train_benchmark_compiled_static_loss() -> None:
    (ours,) = run_bench("train", f"{_TINY_BENCH} --length 2 --steps 1 --warmup 0 --compile --skip-baseline")
    assert ours["compile"] is True and ours["compile_s"] > 0 and ours["value"] > 0


def test_compute_loss_does_not_depend_on_batch_order() -> None:
    """Sequences are sorted by length inside compute_loss; any input order, same loss/grads."""
    torch.manual_seed(8)
    dec = _decoder(_small("soft_attention", num_layers=2)).eval()
    feats, mask, tokens = _toy_batch(8)
    out = dec.compute_loss(feats, mask, tokens)
    out["loss"].backward()
    grads = {n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}
    dec.zero_grad(set_to_none=True)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    out2 = dec.compute_loss(feats[perm], mask[perm], tokens[perm])
    out2["loss"].backward()
    for key in ("loss", "xe", "ds"):
        torch.testing.assert_close(out2[key], out[key])
    for name, g in grads.items():
        torch.testing.assert_close(dict(dec.named_parameters())[name].grad, g, msg=name)


def test_compute_loss_refuses_padding_inside_a_caption() -> None:
    dec = _decoder(_small("soft_attention"))
    feats, mask, tokens = _toy_batch()
    tokens[0, 2] = 0  # pad between words
    with pytest.raises(ValueError, match="padding inside a caption"):
        dec.compute_loss(feats, mask, tokens)


def test_training_batches_come_sorted_by_caption_length() -> None:
    from captioning.data.datamodule import collate

    samples = [
        (torch.zeros(N, C), N, torch.tensor([1, 4, 2]), 0),
        (torch.ones(N, C), 2, torch.tensor([1, 4, 5, 6, 2]), 1),
        (torch.full((N, C), 2.0), 3, torch.tensor([1, 4, 5, 2]), 2),
    ]
    batch = collate(samples)
    assert batch.index.tolist() == [1, 2, 0]
    assert (batch.tokens != 0).sum(1).tolist() == [5, 4, 3]
    assert batch.features[:, 0, 0].tolist() == [1.0, 2.0, 0.0]
    assert batch.mask.sum(1).tolist() == [2, 3, N]


def _loss_and_grads(dec: LSTMDecoder, fn, *args, **kw) -> tuple[dict, dict]:
    dec.zero_grad(set_to_none=True)
    out = fn(*args, **kw)
    out["loss"].backward()
    grads = {n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in out.items()}, grads


@pytest.mark.parametrize(
    "variant,extra",
    [
        ("show_tell", {}),
        ("show_tell", {"num_layers": 2}),
        ("mean_pool", {"deep_output": True}),
        ("soft_attention", {"doubly_stochastic": 0.7}),
        ("soft_attention", {"scoring": "general", "deep_output": True, "num_layers": 2}),
        ("soft_attention", {"position_code": "sinusoidal", "bidirectional_encoder": True}),
        ("soft_attention", {"scoring": "general", "gate": False, "init_from_mean": False}),
        ("soft_attention", {"bidirectional_encoder": True}),
    ],
)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_static_schedule_equals_compute_loss(variant: str, extra: dict, smoothing: float) -> None:
    """Fixed-shape loss (all rows every step, padded positions masked) == the packed loss:
    same values and the same gradient for every parameter and for the features."""
    torch.manual_seed(9)
    dec = _decoder(_small(variant, **extra)).train()  # dropout 0: deterministic
    feats, mask, tokens = _toy_batch(9)
    feats.requires_grad_(True)
    packed, g_packed = _loss_and_grads(dec, dec.compute_loss, feats, mask, tokens, smoothing)
    d_packed = feats.grad.clone()
    feats.grad = None
    static_loss = functools.partial(dec.compute_loss, static=True)
    static, g_static = _loss_and_grads(dec, static_loss, feats, mask, tokens, smoothing)
    assert set(static) == {"loss", "xe", "ds"}
    for key in ("loss", "xe", "ds"):
        torch.testing.assert_close(static[key], packed[key], msg=key)
    assert g_static.keys() == g_packed.keys()
    for name, g in g_packed.items():
        torch.testing.assert_close(g_static[name], g, atol=1e-6, rtol=1e-4, msg=name)
    torch.testing.assert_close(feats.grad, d_packed, atol=1e-6, rtol=1e-4)


def test_static_schedule_hand_checked_xe_and_refuses_hard_attention() -> None:
    """xe is the mean over REAL tokens only: a batch of two captions (4 and 3 targets) gives
    the token-weighted mean of each caption's xe computed alone, cut to its own length."""
    torch.manual_seed(10)
    dec = _decoder(_small("soft_attention")).eval()
    feats, mask, tokens = _toy_batch(10)
    static = functools.partial(dec.compute_loss, static=True)
    both = static(feats[:2], mask[:2], tokens[:2])["xe"]
    first = static(feats[:1], mask[:1], tokens[:1, :5])["xe"]  # 4 real tokens
    second = static(feats[1:2], mask[1:2], tokens[1:2, :4])["xe"]  # 3 tokens
    torch.testing.assert_close(both, (4 * first + 3 * second) / 7)
    hard = _decoder(_small("hard_attention"))
    assert not hard.compilable
    with pytest.raises(ConfigError, match="static=True"):
        hard.compute_loss(feats, mask, tokens, static=True)


@pytest.mark.slow
def test_static_schedule_compiles_as_one_graph() -> None:
    """torch.compile(fullgraph=True): no graph break, no host sync; same loss and gradients."""
    torch.manual_seed(11)
    dec = _decoder(_small("soft_attention", num_layers=2)).train()
    feats, mask, tokens = _toy_batch(11)
    tokens = tokens[:, :4]  # 3 steps keep the compile short
    tokens[tokens[:, 3] != 0, 3] = 2  # end every caption inside the window
    tokens[1, 2], tokens[1, 3] = 2, 0
    static = functools.partial(dec.compute_loss, static=True)
    eager, g_eager = _loss_and_grads(dec, static, feats, mask, tokens)
    compiled_fn = torch.compile(static, fullgraph=True, dynamic=False)
    compiled, g_comp = _loss_and_grads(dec, compiled_fn, feats, mask, tokens)
    for key in eager:
        torch.testing.assert_close(compiled[key], eager[key], msg=key)
    for name, g in g_eager.items():
        torch.testing.assert_close(g_comp[name], g, atol=1e-5, rtol=1e-4, msg=name)
