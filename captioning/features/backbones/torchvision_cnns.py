"""torchvision's 2-D CNNs: ResNet-50/101/152 (a stage ``layer1`` .. ``layer4``) and VGG16 (``conv3_3`` ..
``conv5_3``, ``pool5``: Show-Attend-Tell's 14x14x512 grid); their fine-tuning stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from captioning.errors import ConfigError
from captioning.features.backbones import BACKBONES, Backbone, BuiltModel, EncoderConfig, weights


def _build_torchvision(cfg: EncoderConfig, arch: str) -> tuple[nn.Module, str, Any]:
    from torchvision.models import get_model, get_model_weights

    default = get_model_weights(arch).DEFAULT
    w = cfg.weights
    if w == "packaged":
        raise ConfigError(
            f"encoder.weights=packaged is only available for efficientnet_lite0; for {cfg.name} use "
            f"pretrained | none | a state dict path"
        )
    if w == "pretrained":
        try:
            model = get_model(arch, weights=default)
        except (OSError, RuntimeError, ValueError) as e:
            raise weights.download_error(cfg.name, e) from None
        weights_id = f"torchvision:{default}"
    else:
        model = weights.seeded_init(lambda: get_model(arch, weights=None))
        weights_id = "none"
        if w != "none":
            weights.load_into(model, weights.load_state_dict_file(w), w)
            weights_id = f"file:{Path(w).name}:sha256={weights.weights_digest(w)}"
    model.eval()
    return model, weights_id, default.transforms()


def _transform_meta(t: Any) -> tuple[tuple[float, float, float], tuple[float, float, float], str]:
    interp = str(getattr(t, "interpolation", "bilinear")).rsplit(".", 1)[-1].lower()
    if interp not in ("bilinear", "bicubic"):
        interp = "bilinear"
    return tuple(t.mean), tuple(t.std), interp  # type: ignore[return-value]


def _sequential_upto(stages: list[tuple[str, nn.Module]], layer: str, name: str) -> nn.Module:
    names = [n for n, _ in stages]
    if layer not in names:
        raise ConfigError(f"encoder.layer={layer!r} is not a stage of {name}: use one of {', '.join(names)}")
    upto = names.index(layer) + 1
    return nn.Sequential(*[m for _, m in stages[:upto]])


def _resnet_stages(backbone: Backbone) -> list[tuple[str, nn.Module]]:
    """torchvision ResNet: ``stem`` (conv1, bn1), ``layer1`` .. ``layer4``, up to ``layer``."""
    return list(zip(["stem", "layer1", "layer2", "layer3", "layer4"], backbone._features.children(), strict=False))


def _resnet(cfg: EncoderConfig, arch: str) -> BuiltModel:
    model, weights_id, t = _build_torchvision(cfg, arch)
    stem = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
    stages = [("stem", stem), ("layer1", model.layer1), ("layer2", model.layer2),
              ("layer3", model.layer3), ("layer4", model.layer4)]
    layer = cfg.layer or "layer4"
    trunk = _sequential_upto(stages, layer, cfg.name)
    mean, std, interp = _transform_meta(t)
    return BuiltModel(model, trunk, layer, weights_id, mean, std, interp)


@BACKBONES.register("resnet50", stages=_resnet_stages)
def _resnet50(cfg: EncoderConfig) -> BuiltModel:
    return _resnet(cfg, "resnet50")


@BACKBONES.register("resnet101", stages=_resnet_stages)
def _resnet101(cfg: EncoderConfig) -> BuiltModel:
    return _resnet(cfg, "resnet101")


@BACKBONES.register("resnet152", stages=_resnet_stages)
def _resnet152(cfg: EncoderConfig) -> BuiltModel:
    return _resnet(cfg, "resnet152")


def _vgg_stages(backbone: Backbone) -> list[tuple[str, nn.Module]]:
    """VGG16: the conv blocks between the max-pools, ``conv1`` .. ``conv5``, up to ``layer``."""
    out: list[tuple[str, nn.Module]] = []
    block: list[nn.Module] = []
    for m in backbone._features.children():  # features[:cut]: split after each pool
        block.append(m)
        if isinstance(m, nn.MaxPool2d):
            out.append((f"conv{len(out) + 1}", nn.Sequential(*block)))
            block = []
    if any(isinstance(m, nn.Conv2d) for m in block):
        out.append((f"conv{len(out) + 1}", nn.Sequential(*block)))
    return out


@BACKBONES.register("vgg16", stages=_vgg_stages)
def _vgg16(cfg: EncoderConfig) -> BuiltModel:
    """VGG16 (no BN): ``conv5_3`` is the ReLU output before the last max-pool (14x14 at 224 px)."""
    model, weights_id, t = _build_torchvision(cfg, "vgg16")
    feats = model.features
    # indices of the ReLU after conv3_3, conv4_3, conv5_3 and of the final max-pool in features
    cut = {"conv3_3": 16, "conv4_3": 23, "conv5_3": 30, "pool5": 31}
    layer = cfg.layer or "conv5_3"
    if layer not in cut:
        raise ConfigError(f"encoder.layer={layer!r} is not a stage of vgg16: use one of {', '.join(cut)}")
    trunk = nn.Sequential(*list(feats.children())[: cut[layer]])
    mean, std, interp = _transform_meta(t)
    return BuiltModel(model, trunk, layer, weights_id, mean, std, interp)
