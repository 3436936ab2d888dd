"""Provenance: where a number came from (code, libraries, features, run).

``provenance(...)`` is a plain-data record written into checkpoints, ``train_summary.json``,
``metrics.json`` and the other outputs: the package version, the git commit of the checkout the
code ran from (with a ``dirty`` flag for uncommitted changes outside ``docs/``; absent for an installed package),
the torch / Lightning / Python versions, the feature store's identity (``store_id``:
``captioning.store.layout.store_id``) and the run's fingerprint (``captioning.train.identity``).
"""

from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

import captioning
from captioning.utils.io import atomic_write_json, file_sha256


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, Any]:
    """Package version, and the git commit (+ dirty flag) when running from a checkout."""
    return {"version": captioning.__version__, **checkout_state(Path(captioning.__file__).resolve().parents[1])}


def checkout_state(repo: Path) -> dict[str, Any]:
    """``git_commit`` and ``git_dirty`` of a checkout (empty when ``repo`` is not a checkout or git fails).
    Dirty means a tracked file outside ``docs/`` differs from the commit: ``docs/`` holds the
    reports the reproduction writes between its runs, which change no run."""
    if not (repo / ".git").exists():
        return {}
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no",
                                 "--", ".", ":(exclude)docs"], capture_output=True, text=True, timeout=10,
                                check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": commit, "git_dirty": bool(status.strip())}


def provenance(*, store: str | None = None, run: str | None = None, **extra: Any) -> dict[str, Any]:
    """The provenance record; ``store``: the FeatureStore's ``store_id``; ``run``: the run
    fingerprint; ``extra``: more plain-data fields."""
    rec: dict[str, Any] = {
        **code_version(),
        "torch": str(torch.__version__),  # a TorchVersion, which the weights-only loader refuses
        "lightning": pl.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),  # CPU float sums depend on it: same count, same bits
    }
    if store is not None:
        rec["store_id"] = store
    if run is not None:
        rec["run"] = run
    rec.update(extra)
    return rec


def write_provenance(out: str | Path, record: dict[str, Any], files: tuple[str, ...]) -> None:
    """``provenance.json`` beside the outputs: the record and the sha256 of each file it covers
    (``results.json`` keeps the COCO results format, a bare list, which has no room for it)."""
    atomic_write_json(Path(out) / "provenance.json", {**record, "files": {f: file_sha256(Path(out) / f) for f in files}})
