"""3-D CNN clip features: local temporal structure around every sampled frame (Yao et al. 2015).

Yao et al. describe a video by *local* structure (a spatio-temporal 3-D CNN over short clips)
and *global* structure (temporal attention over the sequence).  Here the K frames that the 2-D
path samples (``encoder.frames``, ``frame_strategy``: the same keys and the same
``sample_frame_indices``, so both give identical ``frame_indices``) each become the centre of a
clip of ``L = encoder.clip_length`` frames taken every ``s = encoder.clip_stride`` decoded frames:

    clip(c) = [c + (j - L // 2) * s  for j in 0 .. L-1],  clamped to [0, F - 1]

(for even L the centre frame c is the clip's frame L // 2, one more frame before it than after).
Clamping repeats the first/last frame of the video for clips that reach past an end; a video
shorter than one clip's span ((L - 1) * s + 1 frames) therefore gives clips made of its frames
with the edge frames repeated (a one-frame video: L copies of its frame), and still yields K
features (with ``short_video=repeat`` K sampled frames repeat; with ``pad`` the padding
positions get no clip and zero features, as in the 2-D path).

One network pass per clip [3, L, S, S] gives [C, T', h, w]; the stored feature of the sampled
frame is its mean over (T', h, w) (``video_features=pooled``: [K, C] per video, frame-major
like the pooled 2-D features) or over T' only (``video_features=grid``: the clip's h x w grid,
[K*h*w, C]; ``grid_size=g`` pools it to g x g).

Decoding: the K clips of a video overlap (and repeat edge frames), so the union of the frames
they need is decoded once (``clip_union``) and resized/cropped once; the clips are gathered
from that union on the device.

Registry keys (``CLIP_BACKBONES``: torchvision's Kinetics-400 video networks; add one with
``@CLIP_BACKBONES.register(name)`` and its ``conf/encoder/<name>.yaml``): ``r3d_18``, ``mc3_18``, ``r2plus1d_18`` (112 px clips; ``layer``
``stem``, ``layer1`` .. ``layer4`` (default), 512 channels) and ``s3d`` (224 px; ``features``,
1024 channels).  Normalisation (Kinetics mean/std) and the resize/crop ratio (128 -> 112,
256 -> 224) come from torchvision's weight transforms; the shorter side is resized (aspect
kept) where torchvision's transform resizes to a fixed 128x171 (256x256 for S3D).

``weights``: ``none`` (seeded random init: every process builds the same network),
``pretrained`` (torchvision's download or its local cache; offline it fails and names the file
to download and pass) or a local state-dict path (``torch.load(weights_only=True)``), refused
with one line when it is not a state dict of the same architecture.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from captioning.errors import CheckpointError, ConfigError
from captioning.features.backbones import (
    Backbone,
    BuiltModel,
    EncoderConfig,
    Preprocessing,
    validate_encoder_config,
)
from captioning.features.backbones.weights import load_state_dict_file, seeded_init, weights_digest
from captioning.registry import Registry

log = logging.getLogger(__name__)


# -------------------------------------------------------------------------------- clip frames


def clip_frame_indices(centres: Sequence[int], num_frames: int, length: int, stride: int = 1) -> np.ndarray:
    """Frame indices of the clip centred on each centre: int64 [K, L], clamped to [0, F - 1].

    Row k is ``centres[k] + (j - L // 2) * stride`` for j = 0 .. L-1 (see the module docstring).
    """
    if num_frames < 1:
        raise ValueError(f"a video needs at least one frame (got num_frames={num_frames})")
    if length < 1 or stride < 1:
        raise ConfigError(f"encoder.clip_length and encoder.clip_stride must be >= 1 (got {length}, {stride})")
    c = np.asarray(list(centres), dtype=np.int64).reshape(-1, 1)
    offsets = (np.arange(length, dtype=np.int64) - length // 2) * stride
    return np.clip(c + offsets[None, :], 0, num_frames - 1)


def clip_union(clips: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The frames K clips need, each once: (sorted frame indices [U], positions in them [K, L])."""
    frames, inverse = np.unique(clips, return_inverse=True)
    return [int(f) for f in frames], inverse.reshape(clips.shape).astype(np.int64)


# ----------------------------------------------------------------------------------- registry


@dataclass
class BuiltClipModel(BuiltModel):
    """A ``BuiltModel`` whose ``features`` maps clips [B, 3, L, H, W] -> [B, C, T', h, w]."""

    resize_ratio: float  # shorter side before the crop / crop size, from the weights' transforms


ClipBuilder = Callable[[EncoderConfig], BuiltClipModel]
CLIP_BACKBONES: Registry[ClipBuilder] = Registry("3-D encoder", config_key="encoder.name")


def available_clip_backbones() -> list[str]:
    return CLIP_BACKBONES.names()


def _check_architecture(state: dict[str, torch.Tensor], model: nn.Module, path: str, name: str) -> None:
    """One-line CheckpointError naming ``path`` unless ``state`` has exactly ``model``'s tensors."""
    target = model.state_dict()
    missing = [k for k in target if k not in state]
    unknown = [k for k in state if k not in target]
    shapes = [k for k in target if k in state and tuple(state[k].shape) != tuple(target[k].shape)]
    if not (missing or unknown or shapes):
        return
    why = []
    if missing:
        why.append(f"{len(missing)} of the {len(target)} tensors missing, e.g. '{missing[0]}'")
    if unknown:
        why.append(f"{len(unknown)} unknown tensors, e.g. '{unknown[0]}'")
    if shapes:
        k = shapes[0]
        why.append(f"'{k}' is {list(state[k].shape)} where {name} has {list(target[k].shape)}")
    raise CheckpointError(f"encoder.weights={path} is not a {name} state dict ({'; '.join(why)}): pass the "
                          f"weights of torchvision's {name}, or encoder.weights=none")


def _torchvision_video(cfg: EncoderConfig, arch: str) -> tuple[nn.Module, str, Any]:
    """(network in eval mode, weights id, torchvision's transforms of the default weights)."""
    from torchvision.models import get_model, get_model_weights

    default = get_model_weights(arch).DEFAULT
    w = cfg.weights
    if w == "packaged":
        raise ConfigError(f"encoder.weights=packaged is only available for efficientnet_lite0; for {cfg.name} use "
                          f"pretrained | none | a state dict path")
    if w == "pretrained":
        try:
            model = get_model(arch, weights=default)
        except (OSError, RuntimeError, ValueError) as e:
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ConfigError(
                f"encoder.weights=pretrained for {cfg.name}: torchvision's download failed ({type(e).__name__}: "
                f"{text}); offline? fetch {default.url} elsewhere and pass the file: "
                f"encoder.weights=/path/to/{default.url.rsplit('/', 1)[-1]}"
            ) from None
        weights_id = f"torchvision:{default}"
    else:
        model = seeded_init(lambda: get_model(arch, weights=None))
        weights_id = "none"
        if w != "none":
            state = load_state_dict_file(w)
            _check_architecture(state, model, w, cfg.name)
            model.load_state_dict(state, strict=True)
            weights_id = f"file:{Path(w).name}:sha256={weights_digest(w)}"
    model.eval()
    return model, weights_id, default.transforms()


def _built(model: nn.Module, features: nn.Module, layer: str, weights_id: str, t: Any) -> BuiltClipModel:
    interp = str(getattr(t, "interpolation", "bilinear")).rsplit(".", 1)[-1].lower()
    ratio = float(t.resize_size[0]) / float(t.crop_size[0])  # 128/112 and 256/224: 8/7
    return BuiltClipModel(model, features, layer, weights_id, tuple(t.mean), tuple(t.std),  # type: ignore[arg-type]
                          "bicubic" if interp == "bicubic" else "bilinear", ratio)


def _video_resnet(cfg: EncoderConfig, arch: str) -> BuiltClipModel:
    """torchvision ``VideoResNet``: stem + layer1..layer4 (layer4: spatial stride 16; time stride 8, mc3: 1)."""
    model, weights_id, t = _torchvision_video(cfg, arch)
    stages = [("stem", model.stem), ("layer1", model.layer1), ("layer2", model.layer2),
              ("layer3", model.layer3), ("layer4", model.layer4)]
    layer = cfg.layer or "layer4"
    names = [n for n, _ in stages]
    if layer not in names:
        raise ConfigError(f"encoder.layer={layer!r} is not a stage of {cfg.name}: use one of {', '.join(names)}")
    trunk = nn.Sequential(*[m for _, m in stages[: names.index(layer) + 1]])
    return _built(model, trunk, layer, weights_id, t)


@CLIP_BACKBONES.register("r3d_18")
def _r3d_18(cfg: EncoderConfig) -> BuiltClipModel:
    """ResNet3D-18 (Tran et al. 2018): full 3x3x3 convolutions."""
    return _video_resnet(cfg, "r3d_18")


@CLIP_BACKBONES.register("mc3_18")
def _mc3_18(cfg: EncoderConfig) -> BuiltClipModel:
    """Mixed convolutions: 3-D in the stem and layer1, 2-D (1x3x3) after (no temporal downsampling)."""
    return _video_resnet(cfg, "mc3_18")


@CLIP_BACKBONES.register("r2plus1d_18")
def _r2plus1d_18(cfg: EncoderConfig) -> BuiltClipModel:
    """R(2+1)D-18: every 3x3x3 convolution factorised into 1x3x3 spatial then 3x1x1 temporal."""
    return _video_resnet(cfg, "r2plus1d_18")


@CLIP_BACKBONES.register("s3d")
def _s3d(cfg: EncoderConfig) -> BuiltClipModel:
    """S3D (Xie et al. 2018): separable 3-D Inception; ``features`` -> 1024 channels (stride 8 x 32 x 32)."""
    model, weights_id, t = _torchvision_video(cfg, "s3d")
    layer = cfg.layer or "features"
    if layer != "features":
        raise ConfigError(f"encoder.layer={layer!r} is not a stage of s3d: use features (or null)")
    return _built(model, model.features, layer, weights_id, t)


# ----------------------------------------------------------------------------------- backbone


class ClipBackbone(Backbone):
    """A frozen 3-D CNN: ``forward(clips [B, 3, L, S, S] normalised) -> [B, C, T', h, w]``.

    ``clip_features`` reduces that to what the store keeps per sampled frame; ``output_shape``
    is (C, h, w) of one clip's time-pooled grid.  ``settings(video=True)`` adds the clip length
    and stride to the 2-D backbone's settings.
    """

    is_clip_encoder = True

    def __init__(self, cfg: EncoderConfig, built: BuiltClipModel) -> None:
        super().__init__(cfg, built)
        self.resize_ratio = built.resize_ratio

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, 3, L, S, S] normalised -> [B, C, T', h, w] (h = w = g when grid_size is set)."""
        f = self._features(x)
        if self.grid_size is not None:
            f = F.adaptive_avg_pool3d(f, (f.shape[2], self.grid_size, self.grid_size))
        return f

    def clip_features(self, x: torch.Tensor, video_features: str = "pooled") -> torch.Tensor:
        """x: [B, 3, L, S, S] -> pooled [B, C] (mean over T', h, w) or grid [B, h*w, C] (mean over T')."""
        f = self(x).float()
        if video_features == "pooled":
            return f.mean(dim=(2, 3, 4))
        return f.mean(dim=2).flatten(2).transpose(1, 2)

    def output_shape(self, size: int | None = None) -> tuple[int, int, int]:
        """(C, h, w) for clips of ``clip_length`` frames of size x size (a dry run on the meta device)."""
        size = size or self.cfg.frame_size
        if size not in self._shapes:
            from torch.func import functional_call

            trunk = self._features  # run with shape-only (meta) copies of its tensors: no compute
            meta = {k: torch.empty_like(v, device="meta") for k, v in trunk.state_dict(keep_vars=True).items()}
            x = torch.zeros(1, 3, self.cfg.clip_length, size, size, device="meta")
            try:
                with torch.inference_mode():
                    f = functional_call(trunk, meta, (x,))
            except RuntimeError as e:
                raise ConfigError(
                    f"clips of encoder.clip_length={self.cfg.clip_length} frames of {size}x{size} px are too small "
                    f"for {self.cfg.name} ({str(e).strip().splitlines()[0][:120]}): use longer clips or larger "
                    f"encoder.frame_size"
                ) from None
            h, w = f.shape[-2:]
            if self.grid_size is not None:
                h = w = self.grid_size
            self._shapes[size] = (int(f.shape[1]), int(h), int(w))
        return self._shapes[size]

    def preprocessing(self, video: bool = True) -> Preprocessing:
        """Per-frame resize (shorter side: ``resize`` or frame_size x the weights' ratio) + crop."""
        size = self.cfg.frame_size
        resize = self.cfg.resize or round(size * self.resize_ratio)
        return Preprocessing(size, resize, self.cfg.crop, self.mean, self.std, self.interpolation)

    def settings(self, video: bool = True) -> dict[str, Any]:
        if not video:
            raise ConfigError(f"encoder.name={self.cfg.name} is a 3-D video encoder: it needs data.kind=video "
                              f"(for images use a 2-D encoder, e.g. encoder=efficientnet_lite0)")
        out = super().settings(video=True)
        out["clip"] = {"length": self.cfg.clip_length, "stride": self.cfg.clip_stride,
                       "centre": self.cfg.clip_length // 2, "edges": "clamp"}
        return out


def build_clip_backbone(cfg: EncoderConfig) -> ClipBackbone:
    """The ``ClipBackbone`` of registry key ``cfg.name`` with ``cfg.weights`` (see the module docstring)."""
    builder = CLIP_BACKBONES.get(cfg.name)
    validate_encoder_config(cfg, clip=True)
    built = builder(cfg)
    log.info("clip backbone %s weights=%s layer=%s clip=%dx%d", cfg.name, built.weights_id, built.layer,
             cfg.clip_length, cfg.clip_stride)
    return ClipBackbone(cfg, built)
