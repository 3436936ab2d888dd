"""Run identity: a run is its resolved config, minus what may change while continuing it.

``identity(config)`` drops the ``CONTINUATION_KEYS`` from a training config (as a plain dict);
``fingerprint`` is a short hash of the rest.  The fingerprint is stored in every checkpoint and in
``train_summary.json``, and names the folder of every sweep job.  A run folder is resumed only by
a config with the same fingerprint (``decide_resume``): a changed setting is a different
experiment, and its numbers must never be reported as the old run's.

What the data *are* is checked apart from the config (``checkpoint.check_compatible``: the
vocabulary and the feature store's settings), so the paths that say where they *live* are not part
of the identity: a moved dataset is the same run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from captioning.errors import ConfigError
from captioning.utils.locks import ExclusiveLock

#: Keys (dotted) that may change while continuing the same run, and why.
CONTINUATION_KEYS: dict[str, str] = {
    "trainer.max_epochs": "the budget: a finished run given more epochs continues",
    "trainer.max_steps": "the budget, counted in optimizer steps",
    "trainer.accelerator": "where it runs: a requeued job may land on another machine",
    "trainer.devices": "where it runs (the per-process batch stays data.batch_size)",
    "trainer.num_nodes": "where it runs",
    "trainer.strategy": "how the processes talk, not what they compute",
    "trainer.enable_progress_bar": "what is printed",
    "trainer.log_every_n_steps": "how often metrics are logged",
    "data.num_workers": "loader processes: the same batches, read in parallel",
    "eval_batch_size": "validation decoding batch: the same captions",
    "optim.nonfinite": "the fault policy for a NaN/inf loss: with finite losses the run is the same",
    "logger": "where metrics are recorded",
    "callbacks": "progress, checkpoint and image callbacks: what is saved and shown",
    "resume": "the resume policy itself",
    "run_name": "the folder's name",
    "output_dir": "the run folder itself",
    "data.root": "where the dataset lives (its content: vocabulary and store checks)",
    "data.media_dir": "where the media live",
    "data.annotations": "where the annotation files live (their content: the vocabulary check)",
    "data.caption_cache": "where the caption tables are cached (each one named by its inputs' hash)",
    "features_dir": "where the FeatureStore lives (its content: the store settings check)",
}

RESUME_POLICIES = ("auto", "must", "never")
FINGERPRINT_CHARS = 10


def identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a training config as a nested plain dict) without the continuation keys."""
    out = json.loads(json.dumps(config, default=str))  # a deep copy in JSON's own types
    for dotted in CONTINUATION_KEYS:
        *parents, leaf = dotted.split(".")
        node = out
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


def fingerprint(config: Mapping[str, Any]) -> str:
    """Short sha256 of ``identity(config)`` (canonical JSON: sorted keys)."""
    text = json.dumps(identity(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict) or not d:
        return {prefix.rstrip("."): d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}."))
    return out


_ABSENT = object()


def identity_diff(old: Mapping[str, Any], new: Mapping[str, Any], *, common_only: bool = False) -> dict[str, tuple]:
    """``{dotted key: (old value, new value)}`` where the two identities differ.  ``common_only``:
    compare only keys both have (a checkpoint written before a key existed)."""
    a, b = _flatten(identity(old)), _flatten(identity(new))
    keys = (a.keys() & b.keys()) if common_only else (a.keys() | b.keys())
    return {k: (a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in sorted(keys) if a.get(k, _ABSENT) != b.get(k, _ABSENT)}


def describe(diff: Mapping[str, tuple], limit: int = 4) -> str:
    """``optim.lr 0.001 -> 0.005, seed 0 -> 1`` (at most ``limit`` keys, then how many more)."""
    show = lambda v: "(absent)" if v is _ABSENT else json.dumps(v, default=str)  # noqa: E731
    parts = [f"{k} {show(o)} -> {show(n)}" for k, (o, n) in list(diff.items())[:limit]]
    more = len(diff) - limit
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


def normalise_resume(value: Any) -> str:
    """``auto | must | never``; the booleans of older configs read as ``auto`` / ``never``."""
    text = str(value).strip().lower()
    text = {"true": "auto", "false": "never"}.get(text, text)
    if text not in RESUME_POLICIES:
        raise ConfigError(f"resume={value!r}: use auto (resume the same run, start one when there is none), "
                          f"must (fail when there is nothing to resume) or never (always a fresh run)")
    return text


@contextlib.contextmanager
def hold_run_folder(folder: str | Path, rank: int = 0) -> Iterator[None]:
    """This process trains ``folder`` until the block ends; a second process started on the same
    folder meanwhile is refused (one line) instead of writing the same checkpoints beside it.

    An ``ExclusiveLock`` on the folder itself (created if missing): no lock file, nothing to go
    stale.  Rank zero only: the other DDP ranks are its children, launched while it holds it.
    """
    folder = Path(folder)
    if rank != 0:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    lock = ExclusiveLock(folder)
    if not lock.acquire():
        raise ConfigError(
            f"{folder} is being trained by another process (it holds the folder); wait for it to "
            f"finish or stop it, then run this again to continue the run. Nothing was changed"
        )
    try:
        yield
    finally:
        lock.release()


def decide_resume(policy: str, last: Path, config: Mapping[str, Any], saved: Mapping[str, Any] | None) -> bool:
    """Whether to resume from ``last`` (a run folder's ``last.ckpt``), or a ConfigError (one line).

    ``saved``: that checkpoint's ``config`` and ``run`` record (None when there is no checkpoint).
    The same fingerprint resumes (``auto``, ``must``); another one is refused, naming the keys that
    differ, and nothing in the folder is touched.  ``never`` refuses a folder that holds a run,
    rather than overwrite it.
    """
    policy = normalise_resume(policy)
    folder = last.parent.parent
    if saved is None:
        if policy == "must":
            raise ConfigError(f"resume=must: nothing to resume in {folder} (no checkpoints/last.ckpt); "
                              f"run without resume=must to start the run")
        return False
    if policy == "never":
        raise ConfigError(f"resume=never: {folder} already holds a run ({last}); give this run its own folder "
                          f"(run_name=<name>) or move that one away")
    run = saved.get("run") or {}
    theirs = run.get("fingerprint")
    mine = fingerprint(config)
    if theirs == mine:
        return True
    diff = identity_diff(saved["config"], config, common_only=theirs is None)
    if theirs is None and not diff:  # written before run identity: same settings wherever both have them
        return True
    raise ConfigError(
        f"{folder} holds another run (fingerprint {theirs or 'from its config'} -> {mine}: "
        f"{describe(diff) or 'settings differ'}); to continue it, run it with its own settings; to train "
        f"this config, give it its own folder (run_name=<name> or hydra.run.dir=<dir>). Nothing was changed"
    )
