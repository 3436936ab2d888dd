"""Residual annotations: deviations from the item's median (or mean) annotation, standardised."""

from __future__ import annotations

import math

import pytest
import torch

from captioning.models.decoders import build_decoder
from captioning.models.residual import Residual, centre_of


def test_median_and_mean_over_valid_positions_by_hand() -> None:
    # one channel; item 0: 1, 3, 8 and a padded 100 -> median 3, mean 4
    #              item 1: 0, 4, 2, 2 (all valid)  -> lower middle of 0 2 2 4 = 2, mean 2
    values = torch.tensor([[[1.0], [3.0], [8.0], [100.0]], [[0.0], [4.0], [2.0], [2.0]]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    torch.testing.assert_close(centre_of(values, mask, "median"), torch.tensor([[3.0], [2.0]]))
    torch.testing.assert_close(centre_of(values, mask, "mean"), torch.tensor([[4.0], [2.0]]))
    torch.testing.assert_close(centre_of(values[1:], None, "median"), torch.tensor([[2.0]]))


def test_residual_standardised_by_the_batch_then_by_the_running_estimate() -> None:
    # median residuals: item 0: -2, 0, 5, (pad) 0; item 1: -2, 2, 0, 0
    # second moment over the 7 valid positions: (4 + 0 + 25 + 4 + 4 + 0 + 0) / 7 = 37 / 7
    values = torch.tensor([[[1.0], [3.0], [8.0], [100.0]], [[0.0], [4.0], [2.0], [2.0]]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    r = Residual(1, "median", eps=0.0)
    s = math.sqrt(37 / 7)
    want = torch.tensor([[[-2.0], [0.0], [5.0], [0.0]], [[-2.0], [2.0], [0.0], [0.0]]]) / s
    torch.testing.assert_close(r(values, mask), want)
    assert float(r.running_var) == pytest.approx(0.9 * 1.0 + 0.1 * 37 / 7)  # BatchNorm's update, momentum 0.1
    r.eval()  # evaluation divides by the running estimate, whatever the batch
    var = 0.9 + 0.1 * 37 / 7
    torch.testing.assert_close(r(values[1:], None), torch.tensor([[[-2.0], [2.0], [0.0], [0.0]]]) / math.sqrt(var))


def test_a_brief_event_stands_out_of_a_median_background() -> None:
    """Neutral frames are ~0 around the median (the background) but carry minus the events'
    average around the mean: the shortcut the median removes."""
    neutral, event = torch.tensor([1.0, 0.0]), torch.tensor([1.0, 4.0])
    frames = torch.stack([neutral] * 6 + [event] * 2)[None]  # [1, 8, 2]: 2 of 8 frames hold the event
    dev = frames - centre_of(frames, None, "median").unsqueeze(1)
    assert dev[0, :6].abs().max() == 0 and dev[0, 6:, 1].min() == 4.0
    dev = frames - centre_of(frames, None, "mean").unsqueeze(1)
    torch.testing.assert_close(dev[0, :6, 1], torch.full((6,), -1.0))  # -(2 x 4) / 8 on every neutral frame


def test_decoder_attends_over_features_and_residuals() -> None:
    """With a residual the annotations are [a_i ; r_i]: twice the channels (+ a concatenated time
    code), and the running variance travels in the state dict (the checkpoint)."""
    cfg = {"name": "lstm", "variant": "soft_attention", "embed_dim": 8, "hidden_dim": 12, "attention_dim": 6,
           "dropout": 0.0, "position_code": "sinusoidal", "position_dim": 4, "residual": "median"}
    dec = build_decoder(cfg, 10, 5, layout=(7,))
    assert dec.context_dim == 2 * 5 + 4 and "residual.running_var" in dec.state_dict()
    frames = torch.randn(2, 7, 5)
    values = dec.init_state(frames, None).memory["values"]
    torch.testing.assert_close(values[..., :5], frames)  # the features themselves, unchanged
    dev = frames - frames.median(1, keepdim=True).values
    torch.testing.assert_close(values[..., 5:10], dev / (dev.pow(2).mean((0, 1)) + 1e-5).sqrt())
    plain = build_decoder({**cfg, "residual": "none"}, 10, 5, layout=(7,))
    assert plain.context_dim == 5 + 4 and plain.residual is None
    with pytest.raises(Exception, match="model.residual"):
        build_decoder({**cfg, "residual": "max"}, 10, 5, layout=(7,))
