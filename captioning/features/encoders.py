"""Every encoder behind one entry point: 2-D CNN grids (``backbones``) and 3-D clip networks
(``clips``).  Both registries return a ``Backbone`` with the same feature contract; the jobs
(extraction, captioning raw media) build their encoder here."""

from __future__ import annotations

from captioning.errors import ConfigError
from captioning.features.backbones import (
    BACKBONES,
    Backbone,
    EncoderConfig,
    available_backbones,
    build_backbone,
    registry_key,
)
from captioning.features.clips import CLIP_BACKBONES, available_clip_backbones, build_clip_backbone

__all__ = ["build_encoder", "encoder_names", "is_clip_encoder"]


def is_clip_encoder(name: str) -> bool:
    """True for the 3-D (spatio-temporal) video encoders of ``captioning.features.clips``."""
    return name in CLIP_BACKBONES


def encoder_names() -> list[str]:
    return available_backbones() + available_clip_backbones()


def build_encoder(cfg: EncoderConfig) -> Backbone:
    """The Backbone of ``cfg.name`` (2-D registry key, ``timm:<model_name>`` or 3-D clip network)."""
    if is_clip_encoder(cfg.name):
        return build_clip_backbone(cfg)
    if registry_key(cfg.name) not in BACKBONES:
        raise ConfigError(f"encoder.name={cfg.name!r} is not a known encoder: use one of {', '.join(encoder_names())}")
    return build_backbone(cfg)
