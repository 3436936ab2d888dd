"""Batch norms folded into their convolutions for inference (captioning.features.backbones.fusion):
the folded weights by hand, the networks' outputs unchanged, shared and reused modules handled,
fine-tuning left alone, and the extraction job folding."""

from __future__ import annotations

import torch
from torch import nn

from captioning.features.backbones import EncoderConfig, build_backbone
from captioning.features.backbones.fusion import conv_norm_pairs, fold_batch_norms, within_rounding


def _norm(channels: int, mean: float, var: float, gamma: float, beta: float) -> nn.BatchNorm2d:
    norm = nn.BatchNorm2d(channels, eps=0.0).eval()
    norm.running_mean.fill_(mean)
    norm.running_var.fill_(var)
    norm.weight.data.fill_(gamma)
    norm.bias.data.fill_(beta)
    return norm


#: A fold's change to a deep network's output, relative to the output's largest magnitude: float32
#: rounding of 49-53 folded layers' sums (measured up to 1.1e-5 for EfficientNet-Lite0, depending on
#: the CPU's convolution kernels); a wrong fold moves the output by a sizeable fraction of its scale.
ROUNDING = 1e-4


def _randomise_norms(model: nn.Module) -> None:
    """Running statistics and affine parameters away from the identity, so a wrong fold shows."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.rand(n, generator=g) * 2 - 1)
            m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            m.bias.data.copy_(torch.rand(n, generator=g) - 0.5)


def test_a_fold_by_hand():
    # conv: y = 2x + 1; norm: 0.5 * (y - 3) / sqrt(4) + 0.25 = 0.5x - 0.25
    conv = nn.Conv2d(1, 1, 1)
    conv.weight.data.fill_(2.0)
    conv.bias.data.fill_(1.0)
    model = nn.Sequential(conv, _norm(1, mean=3.0, var=4.0, gamma=0.5, beta=0.25)).eval()
    assert fold_batch_norms(model, torch.zeros(1, 1, 2, 2)) == 1
    assert isinstance(model[1], nn.Identity)
    assert conv.weight.item() == 0.5 and conv.bias.item() == -0.25
    x = torch.tensor([[[[0.0, 1.0], [2.0, -4.0]]]])
    assert torch.equal(model(x), torch.tensor([[[[-0.25, 0.25], [0.75, -2.25]]]]))


def test_a_conv_without_bias_gets_one_and_the_activation_of_a_timm_norm_stays():
    from timm.layers.norm_act import BatchNormAct2d

    conv = nn.Conv2d(1, 1, 1, bias=False)
    conv.weight.data.fill_(1.0)
    norm = BatchNormAct2d(1, eps=0.0, act_layer=nn.ReLU6).eval()
    norm.running_mean.fill_(1.0)
    norm.running_var.fill_(1.0)
    model = nn.Sequential(conv, norm).eval()
    assert fold_batch_norms(model, torch.zeros(1, 1, 2, 2)) == 1
    x = torch.tensor([[[[-3.0, 2.0], [5.0, 9.0]]]])
    assert torch.equal(model(x), torch.tensor([[[[0.0, 1.0], [4.0, 6.0]]]]))  # relu6(x - 1)


class _RawOutputUsedTwice(nn.Module):
    """norm(conv(x)) + conv(x): the conv's raw output is needed besides the norm's."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 1)
        self.norm = _norm(1, mean=3.0, var=4.0, gamma=0.5, beta=0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.norm(y) + y


def test_a_norm_whose_conv_output_is_used_elsewhere_is_left_as_it_was():
    model = _RawOutputUsedTwice().eval()
    x = torch.randn(1, 1, 3, 3, generator=torch.Generator().manual_seed(0))
    before = model(x)
    weight = model.conv.weight.clone()
    assert fold_batch_norms(model, x) == 0
    assert isinstance(model.norm, nn.BatchNorm2d) and torch.equal(model.conv.weight, weight)
    assert torch.equal(model(x), before)


def test_only_a_norm_fed_by_the_conv_pairs_with_it():
    # registered conv, norm, but run norm on the input and conv after it: nothing to fold
    class NormFirst(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 1, 1)
            self.norm = _norm(1, 1.0, 1.0, 1.0, 0.0)

        def forward(self, x):
            return self.conv(self.norm(x))

    assert conv_norm_pairs(NormFirst().eval(), torch.zeros(1, 1, 2, 2))[0] == []


def test_the_check_weighs_a_change_against_the_outputs_scale_not_element_by_element():
    # rounding at scale 1000 leaves 0.002 on an output near 0: element-wise (allclose, 1e-3) that is
    # a change; against the scale (1e-3 + 1e-3 * 1000 = 1.001) it is rounding.  A wrong fold moves
    # the output by a fraction of its scale (100 of 1000), beyond 1.001.
    before = torch.tensor([1000.0, 0.0])
    assert not torch.allclose(before, torch.tensor([1000.002, 0.002]), atol=1e-3, rtol=1e-3)
    assert within_rounding(before, torch.tensor([1000.002, 0.002]), atol=1e-3, rtol=1e-3)
    assert within_rounding(before, torch.tensor([1001.0, 0.0]), atol=1e-3, rtol=1e-3)
    assert not within_rounding(before, torch.tensor([1001.002, 0.0]), atol=1e-3, rtol=1e-3)
    assert not within_rounding(before, torch.tensor([1100.0, 0.0]), atol=1e-3, rtol=1e-3)


def test_efficientnet_lite0_folds_every_norm_and_gives_the_same_grid():
    backbone = build_backbone(EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64))
    _randomise_norms(backbone)
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        before = backbone(x)
    assert backbone.for_inference().folded_norms == 49
    assert not any(isinstance(m, nn.BatchNorm2d) for m in backbone.modules())
    with torch.inference_mode():
        after = backbone(x)
    assert (after - before).abs().max() <= ROUNDING * before.abs().max()
    assert backbone.for_inference().folded_norms == 49  # once


def test_a_resnet_norm_shared_by_its_trunk_and_classifier_is_folded_in_both():
    backbone = build_backbone(EncoderConfig(name="resnet50", weights="none", image_size=64))
    _randomise_norms(backbone)
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        grid, logits = backbone(x), backbone.classify(x)
    assert backbone.for_inference().folded_norms == 53
    assert not any(isinstance(m, nn.BatchNorm2d) for m in backbone.modules())
    with torch.inference_mode():
        for now, then in ((backbone(x), grid), (backbone.classify(x), logits)):
            assert (now - then).abs().max() <= ROUNDING * then.abs().max()


def test_a_built_backbone_keeps_its_norms_for_fine_tuning():
    backbone = build_backbone(EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64))
    assert backbone.folded_norms is None
    assert sum(isinstance(m, nn.BatchNorm2d) for m in backbone.modules()) == 49


def test_the_extraction_job_folds_the_norms(tmp_path):
    import numpy as np
    from PIL import Image

    from captioning.features.extract import MediaItem, run_extraction

    paths = []
    for i in range(3):
        p = tmp_path / f"{i}.png"
        Image.fromarray(np.full((40, 40, 3), 60 * i, dtype=np.uint8)).save(p)
        paths.append(p)
    backbone = build_backbone(EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64))
    _randomise_norms(backbone)
    reference = build_backbone(EncoderConfig(name="efficientnet_lite0", weights="none", image_size=64))
    reference.load_state_dict(backbone.state_dict())
    run_extraction([MediaItem(str(i), str(p)) for i, p in enumerate(paths)], "image", backbone, tmp_path / "f",
                   trainer={"accelerator": "cpu", "devices": 1}, batch_size=2, num_workers=0, progress=False)
    assert backbone.folded_norms == 49
    from captioning.store.feature_store import FeatureStore

    store = FeatureStore.open(tmp_path / "f")
    pre = reference.preprocessing()
    for i in range(len(paths)):
        x = pre.normalize(torch.full((1, 3, 64, 64), 60.0 * i))  # a flat image: any resize gives it
        with torch.inference_mode():
            expected = reference(x).flatten(2).transpose(1, 2)[0]
        stored = torch.from_numpy(np.asarray(store[str(i)].features, dtype=np.float32))
        torch.testing.assert_close(stored, expected, rtol=2e-3, atol=2e-3)


def test_the_extraction_benchmark_reports_the_fold_against_the_network_as_built(tmp_path):
    import json

    from captioning_bench.cli import main

    out = tmp_path / "bench.jsonl"
    assert main(["extract-images", "--device", "cpu", "--num-images", "8", "--batch-size", "4", "--image-size", "64",
                 "--weights", "none", "--workers", "0", "--src-size", "80x60", "--output", str(out)]) == 0
    records = {r["name"]: r for r in map(json.loads, out.read_text().splitlines())}
    fold = records["extract_images/fold_speedup"]
    assert fold["folded_norms"] == 49 and fold["value"] > 0
    assert abs(fold["value"] - fold["forward_items_per_s"] / fold["unfolded_items_per_s"]) < 0.01  # rounding
    assert records["extract_images/ratio"]["forward_items_per_s"] == fold["forward_items_per_s"]
    assert (fold["grid"], fold["dim"], fold["layer"]) == ([2, 2], 1280, None)


def test_the_extraction_benchmark_times_the_layer_it_is_given(tmp_path):
    import json

    from captioning_bench.cli import main

    out = tmp_path / "bench.jsonl"
    assert main(["extract-images", "--device", "cpu", "--num-images", "4", "--batch-size", "4", "--image-size", "64",
                 "--layer", "-2", "--weights", "none", "--workers", "0", "--src-size", "80x60", "--output", str(out)]) == 0
    ratio = next(r for r in map(json.loads, out.read_text().splitlines()) if r["name"] == "extract_images/ratio")
    assert (ratio["grid"], ratio["dim"], ratio["layer"]) == ([4, 4], 112, "-2")  # the stride-16 stage
