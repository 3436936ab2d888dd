"""The viewer's settings (``viewer.*`` of ``captioning-evaluate`` / ``captioning-caption``).

``viewer`` is a config group (``conf/viewer/false.yaml``, the default, and ``true.yaml``) typed by
``ViewerConfig``.  Hydra's override parser reads ``viewer=true`` as the boolean ``true``, which
cannot name a group option, so the two CLIs quote it (``switch_overrides``) before Hydra reads the
command line: ``viewer=true`` selects ``conf/viewer/true.yaml``, as a user would expect.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captioning.errors import ConfigError

__all__ = ["ViewerConfig", "switch_overrides", "viewer_switch"]


@dataclass
class ViewerConfig:
    """Where and how ``<output_dir>/viewer/`` is written (``captioning.viz.viewer.ViewerWriter``)."""

    enabled: bool = False  # viewer=true: write <output_dir>/viewer/index.html
    compare: str | None = None  # another run's predictions.json (or captions.json): side by side; implies enabled
    page_size: int = 50  # items per data/page-NNNN.js, loaded when one of its items is shown
    image_side: int = 224  # longest side of each JPEG of what the model saw (video: each frame), pixels
    jpeg_quality: int = 85
    max_items: int | None = None  # the first N items only (None: all)

    @property
    def wanted(self) -> bool:
        return bool(self.enabled or self.compare)

    def validate(self) -> ViewerConfig:
        if self.page_size < 1 or self.image_side < 16 or not 1 <= self.jpeg_quality <= 100:
            raise ConfigError(f"viewer.page_size={self.page_size} must be >= 1, viewer.image_side={self.image_side} "
                              f">= 16 and viewer.jpeg_quality={self.jpeg_quality} in 1..100")
        if self.max_items is not None and self.max_items < 1:
            raise ConfigError(f"viewer.max_items={self.max_items} must be >= 1 (or null: every item)")
        if self.compare and not Path(self.compare).exists():
            raise ConfigError(f"viewer.compare={self.compare}: no such file; pass another run's predictions.json "
                              f"(captioning-evaluate) or captions.json (captioning-caption)")
        return self


def switch_overrides(argv: Sequence[str], group: str = "viewer") -> list[str]:
    """``argv`` with the boolean option names of ``group`` quoted: ``viewer=true`` -> ``viewer='true'``
    (a sweep ``viewer=true,false`` -> ``viewer='true','false'``); every other argument as it is."""
    switch = re.compile(rf"^{re.escape(group)}=((?:true|false)(?:,(?:true|false))*)$", re.IGNORECASE)
    return [f"{group}=" + ",".join(f"'{v.lower()}'" for v in m.group(1).split(",")) if (m := switch.match(arg)) else arg
            for arg in argv]


def viewer_switch(main: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator of a Hydra entry point (above ``@hydra.main``): ``viewer=true`` on the command line
    selects ``conf/viewer/true.yaml`` (``switch_overrides`` is applied to ``sys.argv`` first)."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sys.argv = switch_overrides(sys.argv)
        return main(*args, **kwargs)

    return wrapper
