"""Safe checkpoint loading: ``torch.load(weights_only=True)`` only, with errors that name the file.

A checkpoint holds the decoder weights plus plain-data hyper-parameters (resolved config,
vocabulary, feature-store meta).  Nothing in it is unpickled as an arbitrary object: a
crafted pickle payload is refused by torch's restricted unpickler and never executed.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from captioning.errors import CheckpointError, ConfigError


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint dict with ``weights_only=True``; clear errors for missing/corrupt/unsafe files."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path} (pass ckpt_path=<run>/checkpoints/<name>.ckpt)")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): the write was interrupted; use another checkpoint")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"checkpoint {path} was refused by the safe loader (weights_only=True): it contains objects "
            f"other than tensors and plain data ({first[:200]}); it was not executed. Only load checkpoints "
            f"written by captioning-train"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            f"use another checkpoint (e.g. last.ckpt or the best one) or re-train"
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{path} is not a captioning checkpoint (no state_dict)")
    hp = ckpt.get("hyper_parameters") or {}
    for key in ("config", "vocab", "feature_meta"):
        if key not in hp:
            raise CheckpointError(f"{path} is not a captioning checkpoint: hyper_parameters lack '{key}'")
    return ckpt


def check_compatible(ckpt: dict, vocab: dict, feature_meta: dict, path: str | Path) -> None:
    """Refuse to resume/evaluate with a vocabulary or features other than the checkpoint's."""
    hp = ckpt["hyper_parameters"]
    if list(hp["vocab"].get("itos", [])) != list(vocab.get("itos", [])):
        raise ConfigError(
            f"vocabulary mismatch: {path} was trained with a different vocabulary ({len(hp['vocab'].get('itos', []))} "
            f"words) than this data gives ({len(vocab.get('itos', []))}); use the checkpoint's data config "
            f"(data.min_count, annotations) or start a new run (resume=false or another run_name)"
        )
    mine, theirs = feature_meta.get("settings"), hp["feature_meta"].get("settings")
    if mine != theirs or feature_meta.get("dim") != hp["feature_meta"].get("dim"):
        raise ConfigError(
            f"encoder mismatch: {path} was trained on features {theirs} but features_dir has {mine}; "
            f"point features_dir at the features the checkpoint was trained on"
        )


def load_captioner(path: str | Path, map_location: str | torch.device = "cpu"):
    """A ``Captioner`` in eval mode from a checkpoint (safe loading)."""
    from captioning.models.captioner import Captioner

    ckpt = load_checkpoint(path, map_location)
    hp = ckpt["hyper_parameters"]
    try:
        model = Captioner(config=hp["config"], vocab=hp["vocab"], feature_meta=hp["feature_meta"])
        model.load_state_dict(ckpt["state_dict"])
    except (TypeError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {path} does not match this code's model: {str(e).splitlines()[0][:300]}") from None
    model.eval()
    return model
