"""The LSTM decoder's step (``captioning.models.decoders.lstm_step``): one product reads ``h_{t-1}``,
no weight is cast per time step under autocast, the precision rule, the attention mask's bias, and
the rule that picks the CPU kernels (``kernels.use_kernels``)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from captioning.models import kernels
from captioning.models.decoders import build_decoder, lstm_step

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
    monkeypatch.setattr(lstm_step, "native_autocast", lambda device: True)  # bf16 products, as on a GPU
    torch.manual_seed(1)
    dec = build_decoder({**SMALL, "fused_kernels": "false"}, V, C).train()
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
    monkeypatch.setattr(lstm_step, "native_autocast", lambda device: False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(dec.compute_loss(feats, None, tokens)["xe"], fp32)
    monkeypatch.setattr(lstm_step, "native_autocast", lambda device: True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = dec.compute_loss(feats, None, tokens)["xe"]
    assert not torch.equal(bf16, fp32) and float(bf16) == pytest.approx(float(fp32), rel=0.02)


def test_score_mask_bias_hand_computed() -> None:
    mask = torch.tensor([[True, True, False], [False, False, False], [True, True, True]])
    bias, keep = lstm_step.score_mask(mask, static=True)
    inf = float("-inf")
    torch.testing.assert_close(bias, torch.tensor([[0.0, 0.0, inf], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(keep, torch.tensor([[1.0], [0.0], [1.0]]))
    assert lstm_step.score_mask(torch.ones(2, 3, dtype=torch.bool), static=False) == (None, None)
    bias, keep = lstm_step.score_mask(mask[[0, 2]], static=False)  # no empty row: no keep
    assert keep is None and bias[0, 2] == inf
    bias, keep = lstm_step.score_mask(mask, static=True)
    alpha = lstm_step.LSTMStep._softmax(torch.zeros(3, 3), {"bias": bias, "keep": keep})
    torch.testing.assert_close(alpha, torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]]))


def test_the_kernels_rule() -> None:
    """auto is off (they no longer make a step faster, docs/benchmarks.md); true forces them where
    there is a backward to save work in; a bool set in code counts as its string."""
    assert not kernels.use_kernels("auto") and not kernels.use_kernels("false") and not kernels.use_kernels(False)
    assert kernels.use_kernels("true") and kernels.use_kernels(True)
    with torch.no_grad():
        assert not kernels.use_kernels("true")
