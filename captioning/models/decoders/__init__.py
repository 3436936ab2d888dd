"""Caption decoders as registered components (the way timm registers models).

A decoder is one module of this package: a ``CaptionDecoder`` subclass (see ``base``) with its
own typed config dataclass, registered under a name with ``@register_decoder``.  ``model.name``
picks it (default ``lstm``); ``build_decoder`` checks the config at start (an unknown key, a
wrong type or a bad value is one line naming ``model.<key>``).  Every module of this package is
imported the first time the registry is asked, so a new decoder is ONE new module plus ONE
``conf/model/<name>.yaml``; nothing else has to change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from captioning.config import to_config
from captioning.errors import ConfigError
from captioning.models.decoders.base import CaptionDecoder, DecoderState
from captioning.registry import Registry

__all__ = [
    "CaptionDecoder",
    "DECODERS",
    "DecoderState",
    "build_decoder",
    "decoder_class",
    "decoder_config",
    "decoder_names",
    "register_decoder",
    "register_schemas",
]

DEFAULT = "lstm"
#: name -> decoder class; every module of this package is imported the first time it is read
DECODERS: Registry[type[CaptionDecoder]] = Registry("decoder", config_key="model.name", discover=__name__)


def register_decoder(name: str) -> Callable[[type[CaptionDecoder]], type[CaptionDecoder]]:
    """Class decorator: make ``model.name=<name>`` build this decoder."""

    def deco(cls: type[CaptionDecoder]) -> type[CaptionDecoder]:
        cls.name = name
        return DECODERS.register(name)(cls)

    return deco


def decoder_names() -> list[str]:
    """The registered decoder names, sorted."""
    return sorted(DECODERS.names())


def decoder_class(name: str) -> type[CaptionDecoder]:
    return DECODERS.get(name)


def decoder_config(cfg: Any) -> Any:
    """The typed, validated config of ``cfg`` (a mapping / OmegaConf node / config dataclass).

    ``cfg["name"]`` picks the decoder (``lstm`` when absent, as in checkpoints written before the
    registry); the rest is merged onto that decoder's ``Config`` dataclass, whose ``validate()``
    (when it has one) checks the values.
    """
    if is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = asdict(cfg)
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"model config must be a mapping, got {type(cfg).__name__}")
    data = {"name": DEFAULT, **cfg}
    cls = decoder_class(str(data["name"]))
    try:
        typed = to_config(OmegaConf.create(data), cls.Config)
    except ConfigError as e:  # name the key the way the user writes it
        raise ConfigError(str(e).replace("config key '", "config key 'model.")) from None
    validate = getattr(typed, "validate", None)
    return validate() if callable(validate) else typed


def build_decoder(cfg: Any, vocab_size: int, feature_dim: int, layout: tuple[int, ...] | None = None,
                  pad_id: int = 0) -> CaptionDecoder:
    """Build the registered decoder that ``cfg`` names (see ``decoder_config``)."""
    typed = decoder_config(cfg)
    return decoder_class(typed.name)(typed, vocab_size, feature_dim, layout, pad_id)


def register_schemas() -> None:
    """Store every decoder's config dataclass in Hydra's ConfigStore as ``model/<name>_schema``:
    a ``conf/model/*.yaml`` lists it first in its defaults, so every key of that decoder exists
    (with its type) at composition and ``model.<key>=...`` overrides are type-checked."""
    for entry in DECODERS:
        ConfigStore.instance().store(group="model", name=f"{entry.name}_schema", node=entry.obj.Config)


def run_tag(cfg: Any) -> str:
    """Folder-name tag of a model config (e.g. ``soft_attention-additive``, ``transformer``)."""
    typed = decoder_config(cfg)
    return decoder_class(typed.name).run_tag(typed)
