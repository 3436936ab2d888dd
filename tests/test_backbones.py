"""Backbone registry: one contract (normalised [B,3,H,W] -> grid [B,C,h,w]), weights, layers, preprocessing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.errors import CheckpointError, ConfigError
from captioning.features.backbones import (
    EncoderConfig,
    Preprocessing,
    available_backbones,
    build_backbone,
)
from captioning.features.backbones.weights import map_state_dict_by_position, weights_digest

# name -> (channels, reduction) of the default layer
REGISTRY = {
    "efficientnet_lite0": (1280, 32),
    "resnet50": (2048, 32),
    "resnet101": (2048, 32),
    "resnet152": (2048, 32),
    "vgg16": (512, 16),
    "timm:resnet18": (512, 32),
}


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_registry_contract(name: str) -> None:
    channels, reduction = REGISTRY[name]
    b = build_backbone(EncoderConfig(name=name, weights="none", image_size=64))
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        f = b(x)
    assert f.shape == (2, channels, 64 // reduction, 64 // reduction)
    assert b.channels == channels
    assert b.output_shape(64) == (channels, 64 // reduction, 64 // reduction)
    assert len(b.mean) == 3 and len(b.std) == 3 and all(s > 0 for s in b.std)
    s = b.settings()
    assert s["name"] == name and s["weights"] == "none" and s["layer"]
    assert s["preprocessing"]["size"] == 64 and s["preprocessing"]["mean"] == list(b.mean)
    assert not any(p.requires_grad for p in b.parameters())
    assert name in available_backbones() or name.startswith("timm:")


def test_grid_size_pools_to_g_by_g() -> None:
    b = build_backbone(EncoderConfig(name="timm:resnet18", weights="none", image_size=64, grid_size=3))
    with torch.inference_mode():
        f = b(torch.randn(1, 3, 64, 64))
    assert f.shape == (1, 512, 3, 3)
    assert b.settings()["grid_size"] == 3


@pytest.mark.parametrize(
    ("name", "layer", "channels", "reduction"),
    [("resnet50", "layer3", 1024, 16), ("vgg16", "conv4_3", 512, 8), ("vgg16", "pool5", 512, 32),
     ("efficientnet_lite0", "-2", 112, 16), ("timm:resnet18", "2", 128, 8)],
)
def test_layers(name: str, layer: str, channels: int, reduction: int) -> None:
    b = build_backbone(EncoderConfig(name=name, weights="none", image_size=64, layer=layer))
    assert b.output_shape(64) == (channels, 64 // reduction, 64 // reduction)
    assert b.settings()["layer"] == layer


def test_weights_none_is_the_same_network_every_time() -> None:
    x = torch.randn(1, 3, 64, 64)
    a = build_backbone(EncoderConfig(weights="none", image_size=64))
    torch.manual_seed(123)  # the global RNG must not matter
    b = build_backbone(EncoderConfig(weights="none", image_size=64))
    with torch.inference_mode():
        assert torch.equal(a(x), b(x))


def test_local_checkpoint_path_roundtrip(tmp_path: Path) -> None:
    src = build_backbone(EncoderConfig(name="timm:resnet18", weights="none", image_size=64))
    for p in src.classifier.parameters():
        p.data.add_(0.01)  # differ from the seeded init
    path = tmp_path / "r18.pt"
    torch.save({"state_dict": src.classifier.state_dict()}, path)
    b = build_backbone(EncoderConfig(name="timm:resnet18", weights=str(path), image_size=64))
    x = torch.randn(1, 3, 64, 64)
    with torch.inference_mode():
        assert torch.equal(b(x), src(x))
    assert b.settings()["weights"].startswith("file:r18.pt:sha256=")


def test_a_weights_file_is_named_by_the_first_12_hex_digits_of_its_sha256(tmp_path: Path) -> None:
    path = tmp_path / "w.pt"
    path.write_bytes(b"abc")  # sha256("abc") = ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad
    assert weights_digest(path) == "ba7816bf8f01"


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (EncoderConfig(name="alexnet", weights="none"), "encoder.name='alexnet' is not a registered 2-D backbone"),
        (EncoderConfig(name="resnet50", weights="packaged"), "only available for efficientnet_lite0"),
        (EncoderConfig(name="resnet50", weights="none", layer="layer9"), "not a stage of resnet50"),
        (EncoderConfig(name="vgg16", weights="none", layer="conv9"), "not a stage of vgg16"),
        (EncoderConfig(name="timm:resnet18", weights="none", layer="stage2"), "integer index"),
        (EncoderConfig(name="timm:no_such_model_xyz", weights="none"), "timm has no model"),
        (EncoderConfig(weights="/nonexistent/weights.pt"), "no such file"),
        (EncoderConfig(weights="none", crop="random"), "encoder.crop"),
        (EncoderConfig(weights="none", image_size=224, resize=200), "encoder.resize"),
        (EncoderConfig(weights="none", frame_strategy="fps"), "target_fps"),
    ],
)
def test_config_errors_name_the_key(cfg: EncoderConfig, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_backbone(cfg)


def test_corrupt_weights_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="bad.pt"):
        build_backbone(EncoderConfig(name="timm:resnet18", weights=str(bad)))
    wrong = tmp_path / "wrong.pt"
    torch.save({"fc.weight": torch.zeros(3, 3)}, wrong)
    with pytest.raises(CheckpointError, match="does not fit"):
        build_backbone(EncoderConfig(name="timm:resnet18", weights=str(wrong)))


def test_map_by_position_checks_shapes() -> None:
    src = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    assert list(map_state_dict_by_position(src, {"x": torch.ones(2, 3), "y": torch.ones(4)}, "f")) == ["x", "y"]
    with pytest.raises(CheckpointError, match="does not match"):
        map_state_dict_by_position(src, {"x": torch.ones(2, 3), "y": torch.ones(5)}, "f")
    with pytest.raises(CheckpointError, match="tensors but the model has"):
        map_state_dict_by_position(src, {"x": torch.ones(2, 3)}, "f")


def test_packaged_lite0_classifies_chelsea_as_a_cat() -> None:
    data = pytest.importorskip("skimage.data")
    b = build_backbone(EncoderConfig())  # efficientnet_lite0, weights=packaged (offline)
    assert b.settings()["weights"].startswith("packaged:")
    pre = b.preprocessing()
    x = pre.normalize(pre(torch.from_numpy(data.chelsea()).permute(2, 0, 1)))[None]
    with torch.inference_mode():
        top5 = b.classify(x).topk(5).indices[0].tolist()
        grid = b(x)
    cats = set(range(281, 286))  # tabby, tiger cat, Persian, Siamese, Egyptian cat
    assert top5[0] in cats, top5
    assert b.settings()["weights"].startswith("packaged:tf_efficientnet_lite0:")
    assert grid.shape == (1, 1280, 7, 7)


def test_lite0_state_dict_file_with_lukemelas_keys_runs_like_the_packaged_weights(tmp_path: Path) -> None:
    """The packaged file given by path (lukemelas keys: a TF port) builds the same TF-padded network."""
    import shutil

    from captioning.features.backbones.weights import packaged_lite0_path

    path = tmp_path / "lite0.pth"
    shutil.copy(packaged_lite0_path(), path)
    packaged, by_path = build_backbone(EncoderConfig()), build_backbone(EncoderConfig(weights=str(path)))
    assert by_path.settings()["weights"].startswith("file:lite0.pth:sha256=")
    x = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        assert torch.equal(packaged(x), by_path(x))


def test_packaged_lite0_grid_response_is_centred_on_the_object() -> None:
    """A red square in cell (r, c) of a grey 224-px image: the centroid of the squared change it
    makes to the 7x7 grid lies on that cell on average (with symmetric padding it sat +0.69 rows,
    +0.47 columns off, below-right: attention then peaks next to the object)."""
    b = build_backbone(EncoderConfig())
    pre = b.preprocessing()

    def grid(img: np.ndarray) -> torch.Tensor:
        return b(pre.normalize(pre(torch.from_numpy(img).permute(2, 0, 1)))[None])[0]  # [C, 7, 7]

    grey = np.full((224, 224, 3), 128, np.uint8)
    rows, cols = torch.meshgrid(torch.arange(7.0), torch.arange(7.0), indexing="ij")
    offsets = []
    with torch.inference_mode():
        blank = grid(grey)
        for r, c in [(1, 1), (1, 5), (3, 3), (5, 1), (5, 5), (2, 4), (4, 2)]:
            img = grey.copy()
            img[r * 32 + 6: r * 32 + 26, c * 32 + 6: c * 32 + 26] = (255, 0, 0)
            w = (grid(img) - blank).pow(2).sum(0)
            w = w / w.sum()
            offsets.append(((w * rows).sum() - r, (w * cols).sum() - c))
    mean = torch.tensor(offsets).mean(0)
    assert mean.abs().max() < 0.25, (mean, offsets)
    assert torch.tensor(offsets).abs().max() < 0.8, offsets  # every position near its own cell


def test_features_of_an_image_do_not_depend_on_its_batch() -> None:
    b = build_backbone(EncoderConfig(weights="none", image_size=64))
    x = torch.randn(5, 3, 64, 64)
    with torch.inference_mode():
        batched = b(x)
        alone = b(x[2:3])
    np.testing.assert_allclose(alone[0].half().float().numpy(), batched[2].half().float().numpy(),
                               rtol=1e-2, atol=1e-3)


def test_pretrained_weights_when_cached() -> None:
    hub = Path(torch.hub.get_dir()) / "checkpoints"
    if not any(hub.glob("resnet50-*.pth")):
        pytest.skip("torchvision resnet50 weights are not in the torch hub cache (offline)")
    b = build_backbone(EncoderConfig(name="resnet50", weights="pretrained", image_size=64))
    assert b.settings()["weights"].startswith("torchvision:ResNet50_Weights")


def test_preprocessing_resize_crop_and_normalise() -> None:
    pre = Preprocessing(size=4, resize=4, crop="center", mean=(0.5, 0.5, 0.5), std=(0.25, 0.5, 1.0))
    x = torch.zeros(3, 8, 16, dtype=torch.uint8)
    x[:, :, 6:10] = 255  # a bright vertical band in the middle
    y = pre(x)
    assert y.shape == (3, 4, 4) and y.dtype == torch.uint8  # shorter side 8 -> 4, width 16 -> 8 -> crop 4
    assert (y[:, :, 1:3] > 200).all()  # the band stays in the centre
    squash = Preprocessing(size=4, resize=4, crop="none", mean=(0.5,) * 3, std=(0.5,) * 3)
    assert squash(x).shape == (3, 4, 4)
    frames = torch.zeros(5, 3, 8, 16, dtype=torch.uint8)
    assert pre(frames).shape == (5, 3, 4, 4)
    v = torch.tensor([0, 255, 51], dtype=torch.uint8).view(3, 1, 1)
    n = pre.normalize(v)
    # (0/255 - .5)/.25 = -2; (1 - .5)/.5 = 1; (.2 - .5)/1 = -.3
    torch.testing.assert_close(n.flatten(), torch.tensor([-2.0, 1.0, -0.3]))


def test_clip_keys_leave_2d_encoders_as_they_were() -> None:
    """clip_length/clip_stride only concern 3-D encoders: 2-D settings (what stores compare) and frame
    sampling are unchanged, so stores extracted before these keys existed stay compatible."""
    from captioning.features.extract import VideoSampling

    plain = build_backbone(EncoderConfig(weights="none", image_size=64))
    keyed = build_backbone(EncoderConfig(weights="none", image_size=64, clip_length=8, clip_stride=3))
    assert keyed.settings(video=True) == plain.settings(video=True) and "clip" not in plain.settings(video=True)
    assert not plain.is_clip_encoder
    assert VideoSampling.from_encoder(keyed.cfg) == VideoSampling.from_encoder(plain.cfg)
    assert VideoSampling.from_encoder(keyed.cfg).clip_length is None
    clip = EncoderConfig(name="r2plus1d_18", frames=5, frame_strategy="fps", target_fps=2.0, clip_length=8)
    assert VideoSampling.from_encoder(clip) == VideoSampling(5, "fps", 2.0, "repeat", "auto", 8, 1)
    from captioning.features.encoders import encoder_names

    assert {"r3d_18", "mc3_18", "r2plus1d_18", "s3d"} <= set(encoder_names())


def test_a_new_backbone_is_one_registered_function(monkeypatch) -> None:
    """A builder registered in BACKBONES (with the function listing its stages) is built by every
    entry point and can be fine-tuned; registering its name again with another builder is refused."""
    from captioning.features.backbones import (
        BACKBONES,
        IMAGENET_MEAN,
        IMAGENET_STD,
        BuiltModel,
        stages,
    )
    from captioning.features.encoders import build_encoder, encoder_names

    # registered for this test only (iterating imports the family modules first: their entries stay)
    monkeypatch.setattr(BACKBONES, "_entries", {e.name: e for e in BACKBONES})

    def tiny_stages(backbone) -> list:
        return list(backbone._features.named_children())

    @BACKBONES.register("tiny_cnn", stages=tiny_stages)
    def tiny_cnn(cfg: EncoderConfig) -> BuiltModel:
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.Conv2d(8, 16, 3, 2, 1))
        return BuiltModel(net, net, "features", "none", IMAGENET_MEAN, IMAGENET_STD, "bilinear")

    b = build_encoder(EncoderConfig(name="tiny_cnn", weights="none", image_size=32))
    assert b.output_shape(32) == (16, 8, 8) and "tiny_cnn" in encoder_names()
    assert [n for n, _ in stages(b)] == ["0", "1"]
    with pytest.raises(ValueError, match="2-D backbone 'tiny_cnn' is registered twice"):
        BACKBONES.register("tiny_cnn")(lambda cfg: None)
