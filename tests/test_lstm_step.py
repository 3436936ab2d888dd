"""The LSTM decoder's two steps (``captioning.models.decoders.lstm_forcing``): the fast step equals the
plain one (the modules as written) in values and gradients; one product reads ``h_{t-1}``; no weight
is cast per time step under autocast; the precision rule; the attention mask's bias."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from captioning.models.decoders import build_decoder, lstm_forcing

V, C = 12, 6
SMALL = {"embed_dim": 8, "hidden_dim": 10, "attention_dim": 6, "dropout": 0.0}


class OpLog(TorchDispatchMode):
    """Every aten op dispatched, with its tensor arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[torch.Tensor]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        flat += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
        self.calls.append((str(func.overloadpacket.__name__), flat))
        return func(*args, **(kwargs or {}))


def _reads(calls, x: torch.Tensor) -> list[str]:
    """The ops that read tensor ``x`` (the same memory and shape)."""
    return [name for name, ts in calls
            if any(t.data_ptr() == x.data_ptr() and t.shape == x.shape for t in ts)]


@pytest.mark.parametrize("layers", [1, 2])
def test_one_product_reads_h_for_the_query_the_gate_and_the_recurrent_gates(layers: int) -> None:
    """Additive attention with the gate: W_a h (query), W_beta h (gate) and W_hh h (the top layer's
    recurrent gates) are one addmm; nothing else reads the top layer's h_{t-1}."""
    torch.manual_seed(0)
    dec = build_decoder({**SMALL, "num_layers": layers}, V, C).eval()
    with torch.no_grad():
        state = dec.init_state(torch.randn(3, 4, C), None)
        _, _, state = dec.step(torch.tensor([1, 1, 1]), state)
        h_top = state.rows["h"][:, -1]
        log = OpLog()
        with log:
            dec.step(torch.tensor([4, 5, 6]), state)
    reads = _reads(log.calls, h_top)
    assert reads == ["addmm"], reads
    # products, hand-counted: word gates, the h product, the scores, the context, W_z z, the deep output's
    # two layers (7), and per layer above the first its input and (below the top) recurrent products
    assert sum(name in ("mm", "addmm", "bmm", "mv") for name, _ in log.calls) == 7 + 2 * (layers - 1)


def _casts(dec, tokens: torch.Tensor) -> Counter:
    """The shapes of the tensors cast (``_to_copy``) in one teacher-forced loss under bf16 autocast."""
    feats, mask = torch.randn(tokens.shape[0], 4, C), torch.ones(tokens.shape[0], 4, dtype=torch.bool)
    log = OpLog()
    with log, torch.autocast("cpu", dtype=torch.bfloat16):
        dec.compute_loss(feats, mask, tokens)
    return Counter(tuple(ts[0].shape) for name, ts in log.calls if name == "_to_copy")


def test_bf16_autocast_casts_the_weights_once_per_batch_not_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five more steps add two casts per step of the step's attention weights ``[B,N]`` (to float32
    for the softmax, back for the context product) and none of a weight: the weights the step
    reads (the parameters, the merged ``[W_a; W_beta; W_hh]`` of 6 + 1 + 40 rows, ``W_ih``'s word
    and context columns) are cast as often for 10 steps as for 5."""
    monkeypatch.setattr(lstm_forcing, "native_low_precision", lambda device: True)  # bf16 products, as on a GPU
    torch.manual_seed(1)
    dec = build_decoder(SMALL, V, C).train()
    short = _casts(dec, torch.tensor([[1] + [5] * 4 + [2], [1] + [6] * 4 + [2]]))
    long = _casts(dec, torch.tensor([[1] + [5] * 9 + [2], [1] + [6] * 9 + [2]]))
    weights = {tuple(p.shape) for p in dec.parameters()} | {(47, 10), (47,), (40, 8), (40, 6)}
    assert long[(2, 4)] - short[(2, 4)] == 10
    assert {w: long[w] for w in weights} == {w: short[w] for w in weights} and sum(short[w] for w in weights) > 0


def test_on_a_cpu_without_native_bf16_the_decoder_computes_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(2)
    dec = build_decoder(SMALL, V, C).eval()
    feats, tokens = torch.randn(2, 4, C), torch.tensor([[1, 4, 5, 2], [1, 6, 2, 0]])
    fp32 = dec.compute_loss(feats, None, tokens)["xe"]
    monkeypatch.setattr(lstm_forcing, "native_low_precision", lambda device: False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(dec.compute_loss(feats, None, tokens)["xe"], fp32)
    monkeypatch.setattr(lstm_forcing, "native_low_precision", lambda device: True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = dec.compute_loss(feats, None, tokens)["xe"]
    assert not torch.equal(bf16, fp32) and float(bf16) == pytest.approx(float(fp32), rel=0.02)


def test_score_mask_bias_hand_computed() -> None:
    mask = torch.tensor([[True, True, False], [False, False, False], [True, True, True]])
    bias, keep = lstm_forcing.score_mask(mask, read_host=False)
    inf = float("-inf")
    torch.testing.assert_close(bias, torch.tensor([[0.0, 0.0, inf], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(keep, torch.tensor([[1.0], [0.0], [1.0]]))
    assert lstm_forcing.score_mask(torch.ones(2, 3, dtype=torch.bool), read_host=True) == (None, None)
    bias, keep = lstm_forcing.score_mask(mask[[0, 2]], read_host=True)  # no empty row: no keep
    assert keep is None and bias[0, 2] == inf
    alpha = torch.softmax(torch.zeros(3, 3) + bias_of(mask), -1) * lstm_forcing.score_mask(mask, False)[1]
    torch.testing.assert_close(alpha, torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]]))


def bias_of(mask: torch.Tensor) -> torch.Tensor:
    return lstm_forcing.score_mask(mask, read_host=False)[0]


# ----------------------------------------------------------------------------- fast step == plain step

CASES = [
    {},
    {"num_layers": 2, "scoring": "general", "deep_output": False},
    {"gate": False, "position_code": "learned"},
    {"variant": "mean_pool"},
    {"variant": "show_tell"},
    {"scoring": "dot", "attention_dim": 10, "init_from_mean": False},
    {"variant": "hard_attention", "test_mode": "argmax"},
    {"residual": "median", "position_code": "sinusoidal", "num_layers": 3},
]
IDS = ["additive", "general-2-layers", "no-gate", "mean_pool", "show_tell", "dot", "hard-argmax", "residual-3"]


def _pair(cfg: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same weights with the fast step and with the plain step."""
    torch.manual_seed(5)
    c = 10 if cfg.get("scoring") == "dot" else C
    fast = build_decoder({**SMALL, **cfg}, V, c, layout=(2, 2)).eval()
    plain = build_decoder({**SMALL, **cfg, "fast_step": False}, V, c, layout=(2, 2)).eval()
    plain.load_state_dict(fast.state_dict())
    return fast, plain


def _batch(c: int, items: int = 3, group: int = 2):
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(items, 4, c, generator=g)
    mask = torch.ones(items, 4, dtype=torch.bool)
    mask[1, 3:] = False
    tokens = torch.tensor([[1, 4, 5, 6, 2], [1, 7, 2, 0, 0], [1, 9, 10, 2, 0], [1, 5, 2, 0, 0], [1, 6, 8, 9, 2],
                           [1, 11, 2, 0, 0]])[: items * group]
    return feats, mask, tokens


@pytest.mark.parametrize("cfg", CASES, ids=IDS)
@pytest.mark.parametrize("static", [False, True])
def test_the_fast_step_equals_the_plain_step_in_loss_and_gradients(cfg: dict, static: bool) -> None:
    """Teacher forcing through ``FastStep`` (one product of h_{t-1}, weights cast once) and through
    ``plain_step`` (``self.attention``, ``self.gate``, one ``nn.LSTMCell`` per layer): the same loss
    and the same gradient of every parameter, packed and static, two captions per item."""
    if static and cfg.get("variant") == "hard_attention":
        pytest.skip("hard attention has no static schedule")
    fast, plain = _pair(cfg)
    feats, mask, tokens = _batch(fast.feature_dim)
    grads = []
    for dec in (fast, plain):
        out = dec.compute_loss(feats, mask, tokens, static=static)
        out["loss"].backward()
        grads.append((out, {n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}))
    (fo, fg), (po, pg) = grads
    torch.testing.assert_close(fo["loss"], po["loss"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fo["ds"], po["ds"], rtol=1e-5, atol=1e-6)
    assert fg.keys() == pg.keys() and len(fg) > 5
    for name in fg:
        torch.testing.assert_close(fg[name], pg[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("cfg", CASES, ids=IDS)
def test_the_fast_step_decodes_as_the_plain_step(cfg: dict) -> None:
    """Decoding (grouped rows, as beam search runs them): the same log-probabilities and attention."""
    fast, plain = _pair(cfg)
    feats, mask, _ = _batch(fast.feature_dim)
    with torch.no_grad():
        states = [d.init_state(feats, mask).repeat_interleave(2) for d in (fast, plain)]
        prev = torch.tensor([1, 1, 1, 1, 1, 1])
        for _ in range(4):
            (lf, af, states[0]), (lp, ap, states[1]) = fast.step(prev, states[0]), plain.step(prev, states[1])
            torch.testing.assert_close(lf, lp, rtol=1e-5, atol=1e-5)
            if af is not None:
                torch.testing.assert_close(af, ap, rtol=1e-5, atol=1e-6)
            prev = lf.argmax(-1)


def test_a_broken_fast_step_is_caught() -> None:
    """The equality tests see a fast step that drops the gate."""
    fast, plain = _pair({})
    feats, mask, tokens = _batch(C)
    broken = lstm_forcing.FastStep._attend

    def no_gate(self, parts, h_top, memory, mode):
        z, alpha, logp = broken(self, parts, h_top, memory, mode)
        return z / torch.sigmoid(parts[1]), alpha, logp

    lstm_forcing.FastStep._attend = no_gate
    try:
        bad = fast.compute_loss(feats, mask, tokens)["loss"]
    finally:
        lstm_forcing.FastStep._attend = broken
    assert not torch.allclose(bad, plain.compute_loss(feats, mask, tokens)["loss"], rtol=1e-5)
