"""Safe checkpoint loading: ``torch.load(weights_only=True)`` only, with errors that name the file.

A checkpoint holds the decoder weights plus plain-data hyper-parameters (resolved config,
vocabulary, feature-store meta).  Nothing in it is unpickled as an arbitrary object: a
crafted pickle payload is refused by torch's restricted unpickler and never executed.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import shutil
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.plugins import TorchCheckpointIO

from captioning.errors import CheckpointError, ConfigError, StorageError
from captioning.models.ensemble import EnsembleDecoder
from captioning.store.layout import settings_diff
from captioning.train.finetune import FinetuneModule, captioner_class
from captioning.train.identity import fingerprint
from captioning.utils.io import atomic_write


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoint writes that never leave a partial file under the final name.

    The checkpoint is serialised in memory, written to a temp file beside the target, fsynced
    and renamed over it: a failed write (full disk, quota, a kill) leaves the previous
    ``last.ckpt``/best checkpoint exactly as it was.  Remote (``scheme://``) paths use Lightning's writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        try:
            atomic_write(path, lambda tmp: tmp.write_bytes(buffer.getbuffer()))
        except OSError as e:
            reason = "the disk is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
            raise StorageError(
                f"cannot write checkpoint {path}: {reason}; the previous checkpoint under that name is intact. "
                f"Free space (or move output_dir) and run the same command again to resume from last.ckpt"
            ) from e


BEST_NAME = "best.ckpt"


class ResumableCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` is refreshed after EVERY validation, and whose best
    checkpoint is also ``best.ckpt`` beside it.

    Lightning 2.x refreshes ``last.ckpt`` only when a top-k checkpoint was saved at the same step,
    so after an epoch that did not improve the monitored score, ``last.ckpt`` is stale and a resumed
    run would silently repeat epochs.  Here a killed run loses at most the epoch in progress.

    ``best.ckpt`` is a hard link to (on a file system without them: a copy of) the best ranked
    checkpoint (``best_model_path``), replaced atomically each time another one becomes the best;
    it stays when Lightning deletes the ranked file it linked, and a resumed run keeps it.  A run
    that keeps no ranked checkpoint (``save_top_k=0``) has no ``best.ckpt``.
    """

    def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        if filepath == self.best_model_path:
            self._link_best(trainer)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        best = Path(self.dirpath or "", BEST_NAME)
        if self.best_model_path and not best.exists():  # a run resumed from before best.ckpt existed
            self._link_best(trainer)

    def _link_best(self, trainer: Any) -> None:
        source = Path(self.best_model_path)
        if not trainer.is_global_zero or "://" in str(source) or not source.is_file():
            return

        def link(tmp: Path) -> None:
            tmp.unlink()
            try:
                os.link(source, tmp)
            except OSError:
                shutil.copyfile(source, tmp)

        atomic_write(source.parent / BEST_NAME, link)

    def _refresh_last(self, trainer: Any) -> None:
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._refresh_last(trainer)  # skipped when super() saved at this step already

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._refresh_last(trainer)


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


def checkpoint_run(path: str | Path, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run a checkpoint belongs to: ``{checkpoint, fingerprint, step}`` (the fingerprint of a
    checkpoint written before run identity is computed from its config)."""
    state = load_checkpoint(path) if state is None else state
    run = state.get("run") or {}
    return {"checkpoint": str(path), "step": int(state.get("global_step", 0)),
            "fingerprint": run.get("fingerprint") or fingerprint(state["hyper_parameters"]["config"])}


def check_compatible(hparams: Mapping[str, Any], vocab: Mapping[str, Any], feature_meta: Mapping[str, Any],
                     path: str | Path) -> None:
    """Refuse to resume/evaluate with a vocabulary or features other than the checkpoint's.

    hparams: the checkpoint's ``hyper_parameters``; vocab / feature_meta: what the data and the
    FeatureStore at hand give.  Features agree when their encoder ``settings`` and ``dim`` do.
    """
    theirs = list(hparams["vocab"].get("itos", []))
    if theirs != list(vocab.get("itos", [])):
        raise ConfigError(
            f"vocabulary mismatch: {path} was trained with a different vocabulary ({len(theirs)} "
            f"words) than this data gives ({len(vocab.get('itos', []))}); use the checkpoint's data config "
            f"(data.min_count, annotations) or start a new run in its own folder (run_name=<name>)"
        )
    diff = settings_diff(hparams["feature_meta"], feature_meta, keys=("settings", "dim"))
    if diff:
        raise ConfigError(
            f"encoder mismatch: {path} was trained on features with { {k: t for k, (t, _) in diff.items()} } "
            f"but features_dir has { {k: m for k, (_, m) in diff.items()} }; point features_dir at the "
            f"features the checkpoint was trained on"
        )


def load_captioner(path: str | Path, map_location: str | torch.device = "cpu"):
    """The trained LightningModule (``captioning.train.module``) of a checkpoint, in eval mode; its
    ``checkpoint_runs`` is ``[checkpoint_run(path)]`` (an ensemble's: one per member).

    Safe loading (``load_checkpoint``); for captioning from Python use ``captioning.Captioner``.
    A model trained end to end comes back with its encoder (``captioning.train.finetune``).
    """

    ckpt = load_checkpoint(path, map_location)
    hp = ckpt["hyper_parameters"]
    config = dict(hp["config"])
    model_cfg = dict(config.get("model") or {})
    if model_cfg.get("scoring") == "dot" and "decoder.attention.key_proj.weight" in ckpt["state_dict"]:
        model_cfg["scoring"] = "general"  # written before 'dot' meant h.v: it projected, i.e. Luong's general
        config["model"] = model_cfg
    try:
        model = captioner_class(config).from_hparams(config, hp["vocab"], hp["feature_meta"])
        model.load_state_dict(ckpt["state_dict"])
    except (TypeError, KeyError, RuntimeError, ConfigError) as e:
        written = ((ckpt.get("run") or {}).get("provenance") or {}).get("git_commit") or "an older version"
        raise CheckpointError(f"checkpoint {path} does not match this code's model: "
                              f"{str(e).splitlines()[0][:300]}; to convert it, rename the key in its "
                              f"hyper_parameters['config'] to this code's (docs/configuration.md) or load it "
                              f"with the code that wrote it ({written})") from None
    model.checkpoint_runs = [checkpoint_run(path, ckpt)]  # provenance without reading the file again
    model.eval()
    return model


def load_ensemble(paths: Sequence[str | Path], map_location: str | torch.device = "cpu"):
    """The first checkpoint's LightningModule decoding with all checkpoints' decoders as one
    ``captioning.models.ensemble.EnsembleDecoder`` (the mean of their word distributions; its
    attention is the mean of theirs), in eval mode.

    The members must have the same vocabulary and features (encoder settings and dimension);
    end-to-end fine-tuned checkpoints (each with its own encoder) cannot be ensembled.
    """
    paths = [str(p) for p in paths]
    modules = [load_captioner(p, map_location) for p in paths]
    first, first_meta = modules[0], modules[0].hparams["feature_meta"]
    for path, module in zip(paths, modules, strict=True):
        if len(paths) > 1 and isinstance(module, FinetuneModule):
            raise ConfigError(f"ensemble: {path} was fine-tuned end to end (its own encoder); ensemble "
                              f"checkpoints trained on stored features only")
        if list(module.vocab.itos) != list(first.vocab.itos):
            raise ConfigError(f"ensemble: {path} has a different vocabulary ({len(module.vocab)} words) than "
                              f"{paths[0]} ({len(first.vocab)} words); ensemble checkpoints trained on the same data")
        diff = settings_diff(first_meta, module.hparams["feature_meta"], keys=("settings", "dim"))
        if diff:
            raise ConfigError(f"ensemble: {path} reads other features than {paths[0]} (they differ in "
                              f"{sorted(diff)}); ensemble checkpoints trained on the same features_dir")
    first.decoder = EnsembleDecoder([m.decoder for m in modules])
    first.checkpoint_runs = [run for m in modules for run in m.checkpoint_runs]
    return first.eval()
