"""Position / time codes of annotation vectors (captioning.models.positions)."""

from __future__ import annotations

import math

import pytest
import torch

from captioning.errors import ConfigError
from captioning.models.decoders import build_decoder
from captioning.models.positions import (
    PositionCode,
    build_position_code,
    layout_from_meta,
    sinusoid,
)


def test_sinusoid_hand_computed() -> None:
    code = sinusoid(torch.tensor([0, 1, 2]), 4)  # frequencies 1 and 1/100
    expected = torch.tensor([
        [0.0, 1.0, 0.0, 1.0],
        [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
        [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
    ])
    torch.testing.assert_close(code, expected)
    assert sinusoid(torch.arange(3), 5).shape == (3, 5)


def _grid_2x2_codes() -> torch.Tensor:
    """By hand: a 2x2 grid, 8 code channels -> 4 per axis, frequencies 1 and 1/100; the code of
    cell (r, c) is [sin r, cos r, sin r/100, cos r/100, sin c, cos c, sin c/100, cos c/100]."""
    zero = [0.0, 1.0, 0.0, 1.0]
    one = [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]
    return torch.tensor([zero + zero, zero + one, one + zero, one + one])  # row-major: (0,0) (0,1) (1,0) (1,1)


def _three_frames_codes() -> torch.Tensor:
    """By hand: 3 frames, 6 code channels -> frequencies 10000^(-i/3), i = 0, 1, 2."""
    freqs = [1.0, 10000 ** (-1 / 3), 10000 ** (-2 / 3)]
    return torch.tensor([[f(t * w) for w in freqs for f in (math.sin, math.cos)] for t in range(3)])


def test_grid_and_time_codes_hand_computed() -> None:
    grid = build_position_code((2, 2), 3, "sinusoidal", "concat", 8)
    torch.testing.assert_close(grid.codes(), _grid_2x2_codes())
    assert grid.out_dim == 11
    frames = build_position_code((3,), 6, "sinusoidal", "add", 64)  # add: as many channels as the features
    torch.testing.assert_close(frames.codes(), _three_frames_codes())
    assert frames.out_dim == 6


def test_build_position_code_none_and_the_missing_layout() -> None:
    assert build_position_code((2, 2), 3, "none", "concat", 8) is None
    assert build_position_code(None, 3, "none", "concat", 8) is None
    with pytest.raises(ConfigError, match="which region features have not; set model.position_code=none"):
        build_position_code(None, 3, "learned", "concat", 8)


def test_the_decoders_attend_over_hand_computed_codes() -> None:
    """Both decoders' annotation vectors carry the codes computed by hand: the LSTM's values are
    ``[a_i ; p_i]`` (concat, 2x2 grid), the Transformer's memory is ``W_m (a_i + p_i)`` (add, 3 frames)."""
    torch.manual_seed(0)
    lstm = build_decoder(_small(variant="soft_attention", position_code="sinusoidal", position_dim=8), 10, 3,
                         layout=(2, 2)).eval()
    feats = torch.randn(2, 4, 3)
    memory, _ = lstm.memory(feats, None)
    torch.testing.assert_close(memory["values"], torch.cat([feats, _grid_2x2_codes().expand(2, 4, 8)], -1))

    torch.manual_seed(0)
    tf = build_decoder({"name": "transformer", "d_model": 8, "num_heads": 2, "num_layers": 1, "ff_dim": 16,
                        "dropout": 0.0, "position_code": "sinusoidal", "position_mode": "add"}, 10, 6,
                       layout=(3,)).eval()
    frames = torch.randn(2, 3, 6)
    with torch.no_grad():
        memory = tf._memory(frames, None)
        keys, values = tf.layers[0].memory_kv(tf.memory_proj(frames + _three_frames_codes()))
    torch.testing.assert_close(memory["k0"], keys)
    torch.testing.assert_close(memory["v0"], values)


def test_grid_code_shape_and_row_major_axes() -> None:
    pos = PositionCode((2, 3), feature_dim=5, code="sinusoidal", mode="concat", dim=8)
    assert pos.out_dim == 13 and pos.positions == 6
    codes = pos.codes()  # [6, 8]: 4 channels for the row, 4 for the column
    assert codes.shape == (6, 8)
    rows, cols = codes[:, :4], codes[:, 4:]
    torch.testing.assert_close(rows[0], rows[2])  # (0,0) and (0,2): same row code
    torch.testing.assert_close(cols[0], cols[3])  # (0,0) and (1,0): same column code
    assert not torch.equal(rows[0], rows[3]) and not torch.equal(cols[0], cols[1])
    values = torch.randn(2, 6, 5)
    out = pos(values)
    assert out.shape == (2, 6, 13)
    torch.testing.assert_close(out[..., :5], values)  # concat keeps the annotation vector
    torch.testing.assert_close(out[1, :, 5:], codes)


def test_time_code_distinguishes_every_frame_and_add_mode_keeps_the_size() -> None:
    pos = PositionCode((16,), feature_dim=32, code="sinusoidal", mode="add")
    codes = pos.codes()
    assert codes.shape == (16, 32) and pos.out_dim == 32
    assert len({tuple(c.tolist()) for c in codes}) == 16
    v = torch.zeros(1, 16, 32)
    torch.testing.assert_close(pos(v)[0], codes)
    learned = PositionCode((4, 2, 2), feature_dim=10, code="learned", mode="concat", dim=12)
    assert learned.codes().shape == (16, 12) and sum(p.numel() for p in learned.parameters()) == 4 * 4 + 2 * 4 + 2 * 4


def test_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="position_code"):
        PositionCode((2, 2), 4, code="fourier")
    with pytest.raises(ConfigError, match="position_mode"):
        PositionCode((2, 2), 4, mode="multiply")
    with pytest.raises(ConfigError, match="do not match"):
        PositionCode((2, 2), 4)(torch.zeros(1, 5, 4))
    # 2 channels per axis at least: 5 over 3 axes would leave two of them none (5//3//2*2 = 0)
    with pytest.raises(ConfigError, match="position_mode=add with 5-channel features is too small for 3 axes"):
        PositionCode((2, 1, 2), 5, code="learned", mode="add")
    with pytest.raises(ConfigError, match="model.position_dim=3 is too small for 2 axes"):
        PositionCode((2, 2), 4, dim=3)
    assert PositionCode((2, 1, 2), 6, mode="add").codes().shape == (4, 6)
    with pytest.raises(ConfigError, match="model.position_dim=1 is too small for 1 axes"):
        PositionCode((5,), 4, dim=1)
    assert PositionCode((5,), 4, dim=2).codes().shape == (5, 2)


def test_layout_from_store_meta() -> None:
    assert layout_from_meta({"kind": "image", "positions": 49, "grid": [7, 7]}) == (7, 7)
    assert layout_from_meta({"kind": "video", "positions": 16, "grid": None, "frames": 16}) == (16,)
    assert layout_from_meta({"kind": "video", "positions": 64, "grid": [2, 2], "frames": 16}) == (16, 2, 2)
    assert layout_from_meta({"kind": "image", "positions": 4, "grid": None}) == (4,)


def _small(**kw) -> dict:
    return {"embed_dim": 8, "hidden_dim": 12, "attention_dim": 6, "dropout": 0.0, **kw}


def test_mean_pooling_input_is_unchanged_by_a_position_code() -> None:
    """Codes go only where the decoder attends: mean_pool's context (and every parameter and
    loss) is exactly the same with position_code on or off."""
    feats = torch.randn(3, 4, 5)
    tokens = torch.tensor([[1, 4, 5, 2], [1, 6, 2, 0], [1, 7, 8, 2]])
    outs = []
    for code in ("none", "sinusoidal", "learned"):
        torch.manual_seed(0)
        dec = build_decoder(_small(variant="mean_pool", position_code=code), 10, 5, layout=(2, 2)).eval()
        assert dec.position is None
        state = dec.init_state(feats, None)
        torch.testing.assert_close(state.memory["context"], feats.mean(1))
        outs.append(dec.compute_loss(feats, None, tokens)["loss"])
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(outs[0], outs[2])


def test_frame_order_matters_only_with_an_order_aware_model() -> None:
    """Permutation test: reversing the frames changes an order-aware temporal model's output
    (time code, or BiLSTM over frames) and leaves an order-blind one's exactly unchanged."""
    torch.manual_seed(1)
    frames = torch.randn(2, 6, 5)
    reversed_frames = frames.flip(1)
    tokens = torch.tensor([[1, 4, 5, 2], [1, 6, 7, 2]])

    def logp(cfg: dict, feats: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(2)
        dec = build_decoder(_small(**cfg), 10, 5, layout=(6,)).eval()
        return -dec.compute_loss(feats, None, tokens)["xe"].detach()

    blind = [{"variant": "soft_attention"}, {"variant": "mean_pool"},
             {"variant": "soft_attention", "scoring": "general"}, {"variant": "soft_attention", "residual": "median"},
             {"variant": "soft_attention", "residual": "mean"}]
    aware = [{"variant": "soft_attention", "position_code": "sinusoidal"},
             {"variant": "soft_attention", "position_code": "sinusoidal", "residual": "median"},
             {"variant": "soft_attention", "position_code": "learned", "position_mode": "add"},
             {"variant": "soft_attention", "bidirectional_encoder": True}]
    for cfg in blind:
        torch.testing.assert_close(logp(cfg, frames), logp(cfg, reversed_frames), msg=str(cfg))
    for cfg in aware:
        assert abs(float(logp(cfg, frames) - logp(cfg, reversed_frames))) > 1e-5, cfg
