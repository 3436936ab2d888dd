"""timm backbones: EfficientNet-Lite0 (the default; its packaged TF-ported weights), and any timm
model as ``timm:<model_name>``, vision transformers (ViT, DeiT, EVA, CLIP image towers) included:
their patch tokens laid out as the patch grid.  Their fine-tuning stages: timm's ``feature_info``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from captioning.errors import ConfigError
from captioning.features.backbones import (
    BACKBONES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    TIMM_FAMILY,
    WEIGHT_MODES,
    Backbone,
    BuiltModel,
    EncoderConfig,
    weights,
)


def _patch_embedding(model: nn.Module) -> nn.Module | None:
    """A token model's patch embedding (timm's ``PatchEmbed``: a ViT's ``patch_embed``, MLP-Mixer's ``stem``)."""
    return next((m for m in model.modules() if hasattr(m, "dynamic_feat_size") or hasattr(m, "strict_img_size")),
                None)


def patch_grid(model: nn.Module, size: tuple[int, int], embed: nn.Module | None = None) -> tuple[int, int]:
    """(h, w) of a token model's patch grid for an input of ``size`` (H, W): from its patch
    embedding (H // patch, W // patch; rounded up where it pads), else its last stride."""
    embed = embed if embed is not None else _patch_embedding(model)
    if embed is not None and hasattr(embed, "dynamic_feat_size"):
        h, w = embed.dynamic_feat_size(size)
        return int(h), int(w)
    info = getattr(model, "feature_info", None) or [{}]
    stride = int(info[-1].get("reduction") or 0)
    if not stride:
        raise ConfigError(f"this timm model ({type(model).__name__}) returns tokens but has no patch embedding "
                          f"or stride to lay them out as a grid: use encoder.layer=<index> (forward_intermediates)")
    return size[0] // stride, size[1] // stride


def tokens_to_grid(tokens: torch.Tensor, prefix: int, grid: tuple[int, int], name: str) -> torch.Tensor:
    """ViT tokens [B, prefix + h*w, C] (class/register tokens, then the patches row by row) -> [B, C, h, w]."""
    b, n, c = tokens.shape
    h, w = grid
    if n - prefix != h * w:
        raise ConfigError(
            f"encoder.name={name}: its {n - prefix} tokens after {prefix} prefix tokens are not its {h}x{w} patch "
            f"grid; use encoder.layer=<block index> (forward_intermediates returns the grid) or another model"
        )
    return tokens[:, prefix:].transpose(1, 2).reshape(b, c, h, w)


def _check_input_size(embed: nn.Module | None, x: torch.Tensor, name: str) -> None:
    """A model built for one input size only (no ``dynamic_img_size``) refuses others by name."""
    fixed = tuple(getattr(embed, "img_size", None) or ())
    if getattr(embed, "strict_img_size", False) and fixed and tuple(x.shape[-2:]) != fixed:
        raise ConfigError(f"encoder.name={name} takes {fixed[0]}x{fixed[1]} px inputs only (it has no "
                          f"dynamic_img_size): set encoder.image_size={fixed[0]} (encoder.frame_size for videos)")


def _timm_features(model: nn.Module, layer: str | None,
                   name: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], str]:
    embed = _patch_embedding(model)
    if layer in (None, "", "features", "last"):
        prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)
        channels = int(getattr(model, "num_features", 0) or 0)

        def forward_features(x: torch.Tensor) -> torch.Tensor:
            _check_input_size(embed, x, name)
            f = model.forward_features(x)
            if f.ndim == 3:  # [B, tokens, C] (ViT-like): the patch tokens laid out as the patch grid
                return tokens_to_grid(f, prefix, patch_grid(model, (x.shape[-2], x.shape[-1]), embed), name)
            if f.ndim == 4 and channels and f.shape[1] != channels and f.shape[-1] == channels:
                f = f.permute(0, 3, 1, 2)  # NHWC models (e.g. Swin)
            return f

        return forward_features, "features"
    try:
        index = int(layer)
    except ValueError:
        raise ConfigError(
            f"encoder.layer={layer!r} for a timm model: use 'features' (default) or an integer index "
            f"into forward_intermediates (e.g. -1, 3)"
        ) from None
    if not hasattr(model, "forward_intermediates"):
        raise ConfigError("this timm model has no forward_intermediates: use encoder.layer=features")

    def intermediate(x: torch.Tensor) -> torch.Tensor:
        _check_input_size(embed, x, name)
        return model.forward_intermediates(x, indices=[index], intermediates_only=True, stop_early=True)[0]

    return intermediate, str(index)


def _timm_meta(model: nn.Module) -> tuple[tuple[float, float, float], tuple[float, float, float], str]:
    """Normalisation and resize interpolation of the model's weights (its ``pretrained_cfg``: the
    default tag's, also for random init; e.g. OpenAI CLIP's mean/std for ``*_clip_*`` models)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    mean = tuple(float(v) for v in cfg.get("mean", IMAGENET_MEAN))
    std = tuple(float(v) for v in cfg.get("std", IMAGENET_STD))
    interp = cfg.get("interpolation", "bilinear")
    if interp not in ("bilinear", "bicubic"):
        interp = "bilinear"
    return mean, std, interp  # type: ignore[return-value]


def _create_timm(arch: str, pretrained: bool, size: int) -> nn.Module:
    """``timm.create_model``.  Models that take ``dynamic_img_size`` (the ViT family) get it with
    ``img_size=size``: position embeddings for the ``size`` patch grid (resampled from the weights'
    grid when pretrained), resampled again on the fly for other input sizes (video frames)."""
    import timm  # start-up time: timm's model zoo is imported only when a timm model is built

    def create(**kw: Any) -> nn.Module:
        if pretrained:
            return timm.create_model(arch, pretrained=True, **kw)
        return weights.seeded_init(lambda: timm.create_model(arch, pretrained=False, **kw))

    try:
        return create(dynamic_img_size=True, img_size=size)
    except TypeError as e:  # a model without these keywords (CNNs): its __init__ refuses them
        if "img_size" not in str(e):
            raise
    return create()


def _build_timm(cfg: EncoderConfig, arch: str, packaged_ok: bool = False,
                state: dict[str, torch.Tensor] | None = None) -> BuiltModel:
    """timm ``arch`` with ``cfg.weights``; ``state``: the weights file's state dict when the caller
    has read it already."""
    w = cfg.weights
    if w == "packaged" and not packaged_ok:
        raise ConfigError(
            f"encoder.weights=packaged is only available for efficientnet_lite0; for {cfg.name} use "
            f"pretrained | none | a state dict path"
        )
    try:
        if w == "pretrained":
            try:
                model = _create_timm(arch, True, cfg.image_size)
            except (RuntimeError, OSError, ValueError) as e:
                if "Unknown model" in str(e):
                    raise
                raise weights.download_error(cfg.name, e) from None
            pcfg = getattr(model, "pretrained_cfg", {}) or {}
            weights_id = f"timm:{pcfg.get('hf_hub_id') or pcfg.get('architecture', arch)}.{pcfg.get('tag', '')}"
        else:
            model = _create_timm(arch, False, cfg.image_size)
            weights_id = "none"
    except RuntimeError as e:
        if "Unknown model" in str(e):
            raise ConfigError(
                f"encoder.name={cfg.name}: timm has no model '{arch}' (see timm.list_models())"
            ) from None
        raise
    if w == "packaged":
        path = weights.packaged_lite0_path()
        state = torch.load(path, map_location="cpu", weights_only=True)
        weights.load_into(model, weights.map_state_dict_by_position(state, model.state_dict(), str(path)), str(path))
        weights_id = f"packaged:{arch}:{path.stem}:sha256={weights.weights_digest(path)}"
    elif w not in WEIGHT_MODES:
        state = weights.load_state_dict_file(w) if state is None else state
        target = model.state_dict()
        if packaged_ok and set(state) != set(target) and _lukemelas_keys(state):
            state = weights.map_state_dict_by_position(state, target, w)
        weights.load_into(model, state, w)
        weights_id = f"file:{Path(w).name}:sha256={weights.weights_digest(w)}"
    model.eval()
    features, layer = _timm_features(model, cfg.layer, cfg.name)
    mean, std, interp = _timm_meta(model)
    return BuiltModel(model, features, layer, weights_id, mean, std, interp)


def _timm_stages(backbone: Backbone) -> list[tuple[str, nn.Module]]:
    """A timm model's stages, found by running it once: the modules with weights that its grid
    passes through, in the order they run, cut after each ``feature_info`` module (timm's own
    stage list: a ViT's ``blocks.i``, a ResNet's ``act1``, ``layer1`` ..); the ones that run after the
    last of them (a ViT's final ``norm``, EfficientNet's ``conv_head`` + ``bn2``) are one more stage,
    ``head`` (or that module's name when it is one).  The model's own parameters (a ViT's class
    token and position embedding) belong to the first stage.  An intermediate ``layer`` stops at its
    stage.  Modules that do not run (classifier heads, pooling) belong to none."""
    net = backbone.classifier
    ends = {str(f["module"]): k for k, f in enumerate(getattr(net, "feature_info", None) or [])}
    if not ends:
        return []
    groups: dict[int, list[nn.Module]] = {}
    pending: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    modules = dict(net.named_modules())

    def ran(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, *_: Any) -> None:
            if id(module) not in seen and any(True for _ in module.parameters(recurse=False)):
                seen.add(id(module))
                pending.append((name, module))
            if name in ends:  # a stage ends (forward hooks fire after the children's)
                groups.setdefault(ends[name], []).extend(m for _, m in pending)
                pending.clear()
        return hook

    handles = [m.register_forward_hook(ran(n)) for n, m in modules.items() if n]
    try:
        p = next(net.parameters())
        size = backbone.cfg.image_size
        with torch.no_grad():
            backbone._features(torch.zeros(1, 3, size, size, device=p.device, dtype=p.dtype))
    finally:
        for h in handles:
            h.remove()
    names = {k: n for n, k in ends.items()}
    found = [(names[k], nn.ModuleList(groups[k])) for k in sorted(groups)]
    own = [p for _, p in net.named_parameters(recurse=False)]
    if found and own:
        found[0][1].append(_ParameterHolder(own))
    if pending:
        found.append((pending[0][0] if len(pending) == 1 else "head", nn.ModuleList(m for _, m in pending)))
    return found


class _ParameterHolder(nn.Module):
    """A stage's view of parameters that belong to no submodule (a ViT's class token, position embedding)."""

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        super().__init__()
        for i, p in enumerate(params):
            self.register_parameter(f"p{i}", p)


def _lukemelas_keys(state: dict[str, torch.Tensor]) -> bool:
    """lukemelas-style EfficientNet keys (``_conv_stem...``): a TensorFlow port, TF "same" padding."""
    return next(iter(state), "").startswith("_conv_stem")


def _efficientnet_stages(backbone: Backbone) -> list[tuple[str, nn.Module]]:
    """timm EfficientNet: ``stem`` (conv_stem, bn1), ``blocks.0`` .. ``blocks.6``, ``head`` (conv_head,
    bn2), up to ``layer`` (an intermediate index stops at its block)."""
    net = backbone.classifier
    blocks = [(f"blocks.{i}", b) for i, b in enumerate(net.blocks)]
    stem = ("stem", nn.ModuleList([net.conv_stem, net.bn1]))
    if backbone.layer == "features":
        return [stem, *blocks, ("head", nn.ModuleList([net.conv_head, net.bn2]))]
    ends = list(net.stage_ends)  # forward_intermediates' index i ends after block ends[i] - 1
    return [stem, *blocks[: ends[int(backbone.layer)]]]


@BACKBONES.register("efficientnet_lite0", stages=_efficientnet_stages)
def _efficientnet_lite0(cfg: EncoderConfig) -> BuiltModel:
    """timm ``efficientnet_lite0`` (its own weights: ``pretrained``, ``none``) or, for the TF-ported
    ``packaged`` weights mapped by position, timm ``tf_efficientnet_lite0``: the same tensors, TF's
    asymmetric "same" padding.  With that padding an object's grid response is centred on it
    (probe: mean offset of its centroid -0.04 / -0.02 cells vs +0.69 / +0.47 below-right with
    symmetric padding), and the classifier is surer of skimage's cat ("Egyptian cat" 0.37 vs 0.32
    centre-cropped, 0.80 vs 0.54 squeezed to 224 x 224 with a bilinear resize).
    Preprocessing stays as with ``efficientnet_lite0``: ImageNet mean/std, bicubic resize."""
    state = weights.load_state_dict_file(cfg.weights) if cfg.weights not in WEIGHT_MODES else None  # read once
    if not (cfg.weights == "packaged" or (state is not None and _lukemelas_keys(state))):
        return _build_timm(cfg, "efficientnet_lite0", packaged_ok=True, state=state)
    built = _build_timm(cfg, "tf_efficientnet_lite0", packaged_ok=True, state=state)
    return dataclasses.replace(built, mean=IMAGENET_MEAN, std=IMAGENET_STD)


@BACKBONES.register(TIMM_FAMILY, stages=_timm_stages)
def _timm_model(cfg: EncoderConfig) -> BuiltModel:
    """``timm:<model_name>``: any timm model (see the module docstring)."""
    arch = cfg.name.split(":", 1)[1]
    if not arch:
        raise ConfigError("encoder.name=timm:<model_name> needs a model name, e.g. timm:resnet18")
    return _build_timm(cfg, arch)
