"""Caption decoders as registered components (the way timm registers models).

A decoder is one module of this package: a ``CaptionDecoder`` subclass (see ``base``) with its
own typed config dataclass, registered under a name with ``@register_decoder``.  ``model.name``
picks it (default ``lstm``); ``build_decoder`` checks the config at start (an unknown key, a
wrong type or a bad value is one line naming ``model.<key>``).  Every module of this package is
imported the first time the registry is asked, so a new decoder is ONE new module plus ONE
``conf/model/<name>.yaml``; nothing else has to change.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

from captioning.errors import ConfigError
from captioning.models.decoders.base import CaptionDecoder, DecoderState

__all__ = [
    "CaptionDecoder",
    "DecoderState",
    "build_decoder",
    "decoder_class",
    "decoder_config",
    "decoder_names",
    "register_decoder",
    "register_schemas",
]

DEFAULT = "lstm"
_REGISTRY: dict[str, type[CaptionDecoder]] = {}
_discovered = False


def register_decoder(name: str) -> Callable[[type[CaptionDecoder]], type[CaptionDecoder]]:
    """Class decorator: make ``model.name=<name>`` build this decoder."""

    def deco(cls: type[CaptionDecoder]) -> type[CaptionDecoder]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"decoder name {name!r} is registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_") and info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    _discovered = True


def decoder_names() -> list[str]:
    """The registered decoder names, sorted."""
    _discover()
    return sorted(_REGISTRY)


def decoder_class(name: str) -> type[CaptionDecoder]:
    _discover()
    if name not in _REGISTRY:
        raise ConfigError(f"model.name={name!r} is not a registered decoder; use one of {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def decoder_config(cfg: Any) -> Any:
    """The typed, validated config of ``cfg`` (a mapping / OmegaConf node / config dataclass).

    ``cfg["name"]`` picks the decoder (``lstm`` when absent, as in checkpoints written before the
    registry); the rest is merged onto that decoder's ``Config`` dataclass, whose ``validate()``
    (when it has one) checks the values.
    """
    from omegaconf import DictConfig, OmegaConf

    from captioning.config import to_config

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
    from hydra.core.config_store import ConfigStore

    for name in decoder_names():
        ConfigStore.instance().store(group="model", name=f"{name}_schema", node=_REGISTRY[name].Config)


def run_tag(cfg: Any) -> str:
    """Folder-name tag of a model config (e.g. ``soft_attention-additive``, ``transformer``)."""
    typed = decoder_config(cfg)
    return decoder_class(typed.name).run_tag(typed)
