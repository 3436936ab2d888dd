"""Compiled training: when the loss is compiled, and the one shape a compiled run sees.

``compile`` (``auto`` | ``true`` | ``false``, ``conf/train.yaml``): the teacher-forced loss
(``CaptionDecoder.compute_loss(static=True)``) and self-critical training's decoding
(``captioning.train.scst.SelfCritical``) under ``torch.compile``, replayed from CUDA graphs on a GPU.
``auto`` compiles on a CUDA device and runs eagerly elsewhere.  Every batch of a compiled run is
padded to one shape (``fixed_shapes``), so the run compiles once: not again for a caption length,
an epoch's smaller last batch, a validation pass or a resumed run (``tests/test_compile.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from captioning.errors import ConfigError

__all__ = ["COMPILE_SETTINGS", "compile_mode", "compile_setting", "compiled", "fixed_shapes"]

COMPILE_SETTINGS = ("auto", "true", "false")


def compile_setting(value: Any) -> str:
    """``compile`` as one of auto | true | false (``compile=true`` may arrive as a bool)."""
    setting = str(value).lower()
    if setting not in COMPILE_SETTINGS:
        raise ConfigError(f"compile={value!r} is not one of auto, true, false; set one of those")
    return setting


def compile_mode(setting: str, device: torch.device, compilable: bool) -> str | None:
    """How the training loss runs: None (eager), or compiled with torch.compile's mode
    ``reduce-overhead`` (CUDA graphs: a decoder step's kernels are too small to keep a GPU busy
    when launched one by one) on CUDA, ``default`` elsewhere.  ``auto``: compiled on a CUDA device
    when the decoder compiles whole, eager elsewhere (on a CPU the eager packed loss is the faster:
    it runs only the captions still going, docs/benchmarks.md); ``true``/``false`` force it."""
    if setting == "false" or (setting == "auto" and (device.type != "cuda" or not compilable)):
        return None
    return "reduce-overhead" if device.type == "cuda" else "default"


def compiled(fn: Any, mode: str) -> Any:
    """``fn`` under ``torch.compile`` as one graph at static shapes (``fullgraph``: a graph break, e.g.
    a host read, is an error) in torch.compile's ``mode`` (``compile_mode``)."""
    return torch.compile(fn, fullgraph=True, dynamic=False, mode=mode)


def fixed_shapes(features: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor, items: int, rows: int,
                 length: int, pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A training batch at the one shape a compiled run sees: captions padded to ``length`` tokens
    (``data.max_length + 2``), and a smaller batch (an epoch's last) padded to ``items`` items and
    ``rows`` captions (the full batch's ``items * G``) with items that have no position and captions
    that have no token, which add nothing to the loss or the gradients."""
    b, r = features.shape[0], tokens.shape[0]
    if tokens.shape[1] < length:
        tokens = F.pad(tokens, (0, length - tokens.shape[1]), value=pad)
    if b < items:
        features = F.pad(features, (0, 0, 0, 0, 0, items - b))
        mask = F.pad(mask, (0, 0, 0, items - b), value=False)
    if r < rows:
        tokens = F.pad(tokens, (0, 0, 0, rows - r), value=pad)
    return features, mask, tokens
