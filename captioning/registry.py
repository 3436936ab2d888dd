"""One registry idea for every pluggable part (decoders, backbones, metrics, annotation formats).

A ``Registry`` maps a name to an object (a class, a builder function) plus free-form metadata,
the way timm registers models::

    METRICS = Registry("metric", config_key="metrics")

    @METRICS.register("cider", keys=("CIDEr",), default=True)
    def cider(...): ...

    METRICS.get("cider")            # the function
    METRICS.entry("cider").meta     # {"keys": ("CIDEr",), "default": True}
    METRICS.names(default=True)     # names whose metadata match

Registering a name twice with another object is refused.  ``get`` of an unknown name is one line
naming the config key and the valid names.  A registry may name a package whose modules register
themselves on import (``discover=``): they are imported the first time the registry is read, so a
new entry is one new module (plus its yaml where a config group exists) and nothing else.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from captioning.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered object with its name and metadata."""

    name: str
    obj: T
    meta: dict[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """Name -> object (+ metadata).  ``kind`` names the thing in messages ("decoder", "metric");
    ``config_key`` is the key a user sets to choose one (``model.name``); ``discover`` is a package
    whose submodules are imported before the first lookup."""

    def __init__(self, kind: str, *, config_key: str | None = None, discover: str | None = None) -> None:
        self.kind = kind
        self.config_key = config_key or kind
        self._discover = discover
        self._discovered = discover is None
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        """Decorator: register the decorated object under ``name`` with ``meta``."""

        def deco(obj: T) -> T:
            self.add(name, obj, **meta)
            return obj

        return deco

    def add(self, name: str, obj: T, **meta: Any) -> None:
        """Register ``obj`` under ``name``; the same name with another object is refused."""
        old = self._entries.get(name)
        if old is not None and old.obj is not obj:
            raise ValueError(f"{self.kind} {name!r} is registered twice ({_where(old.obj)} and {_where(obj)})")
        self._entries[name] = Entry(name, obj, dict(meta))

    def _load(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        package = importlib.import_module(self._discover)
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self._discover}.{info.name}")

    def entry(self, name: str) -> Entry[T]:
        """The entry of ``name``; a ConfigError naming the valid names when there is none."""
        self._load()
        if name not in self._entries:
            raise ConfigError(f"{self.config_key}={name!r} is not a registered {self.kind}; "
                              f"use one of {', '.join(sorted(self._entries))}")
        return self._entries[name]

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def names(self, **meta: Any) -> list[str]:
        """Registered names in registration order; with ``meta``, those whose metadata equal it."""
        self._load()
        return [n for n, e in self._entries.items() if all(e.meta.get(k) == v for k, v in meta.items())]

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        self._load()
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        self._load()
        return len(self._entries)


def _where(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
