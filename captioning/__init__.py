"""captioning: image and video captioning with attention.

Pipeline: ``captioning-extract`` (CNN features -> FeatureStore) ->
``captioning-train`` (LSTM decoder with soft/hard attention) ->
``captioning-evaluate`` / ``captioning-caption`` (beam search, metrics, heatmaps).

From Python: ``from captioning import Captioner`` (``captioning.caption.api``; imported on first use, so
``import captioning`` stays cheap).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["CaptionResult", "Captioner", "__version__"]

_LAZY = {"Captioner": "captioning.caption.api", "CaptionResult": "captioning.caption.result"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'captioning' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
