"""The run folder: one process trains it, it records its run before the first step, and only the
same run resumes it.

``hold_run_folder`` keeps a second process off a folder being trained; ``write_record`` puts the
run's identity (fingerprint, identity version, world size, the schedule's length once resolved,
the resolved config) into ``<run>/run.json`` before the first step; ``decide_resume`` checks a new
config against that record and against ``checkpoints/last.ckpt``, whichever exist: a folder whose
run died before its first checkpoint, or trained without checkpoints, refuses another config too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from captioning.errors import ConfigError, DataError
from captioning.train.identity import (
    BUDGET_KEYS,
    IDENTITY_VERSION,
    describe,
    fingerprint,
    identity_diff,
    schedule_spans_budget,
)
from captioning.utils.io import atomic_write_json, read_json
from captioning.utils.locks import ExclusiveLock

RESUME_POLICIES = ("auto", "must", "never")
RECORD_NAME = "run.json"
WORLD_SIZE = "world size (trainer.devices x trainer.num_nodes processes)"


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


def world_size(trainer: Any) -> int:
    """The processes a ``TrainerConfig`` trains with: devices x nodes, as Lightning counts them
    (a device count or list is counted here; ``-1`` / ``auto`` by Lightning's own connector)."""
    devices, nodes = trainer.devices, int(trainer.num_nodes or 1)
    if isinstance(devices, (list, tuple)) or (isinstance(devices, str) and "," in devices):
        count = len([d for d in (devices.split(",") if isinstance(devices, str) else devices) if str(d).strip()])
        return count * nodes
    if str(devices).strip().lstrip("-").isdigit() and int(devices) > 0:
        return int(devices) * nodes
    import pytorch_lightning as pl  # -1 or auto: the devices this machine shows Lightning
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    try:
        probe = pl.Trainer(accelerator=trainer.accelerator, devices=devices, strategy=trainer.strategy,
                           num_nodes=nodes, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                           enable_model_summary=False)
    except (MisconfigurationException, ValueError, RuntimeError) as e:
        raise ConfigError(f"trainer.accelerator={trainer.accelerator} trainer.devices={devices}: "
                          f"{str(e).strip().splitlines()[0][:200]} (trainer=cpu runs on the CPU)") from None
    return int(probe.world_size)


def run_entry(config: Mapping[str, Any], processes: int, **extra: Any) -> dict[str, Any]:
    """The ``run`` part of a record or checkpoint: fingerprint, identity version, world size."""
    return {"fingerprint": fingerprint(config), "identity_version": IDENTITY_VERSION, "world_size": processes,
            **extra}


def write_record(folder: str | Path, config: Mapping[str, Any], run: Mapping[str, Any]) -> Path:
    """``<folder>/run.json``: ``{"run": run entry, "config": the resolved config}``."""
    return atomic_write_json(Path(folder) / RECORD_NAME, {"run": dict(run), "config": dict(config)})


def read_record(folder: str | Path) -> dict[str, Any] | None:
    """The folder's ``run.json`` (None when there is none); an unreadable one is a one-line error."""
    path = Path(folder) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        record = read_json(path, "run record")
    except DataError as e:
        raise ConfigError(f"{e}; move it away to start this folder afresh") from None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict):
        raise ConfigError(f"{path} is not a run record (config and run); move it away to start this folder afresh")
    return record


def run_diff(saved: Mapping[str, Any], config: Mapping[str, Any], processes: int | None = None) -> dict[str, tuple]:
    """Where ``config`` (and its ``processes``) is not the run ``saved`` holds (``{"config", "run"}``
    of a record or checkpoint); empty when it is the same run.

    A record of another identity version is compared on the keys both configs have.  A run whose
    cosine schedule spanned its budget is the same run with ``optim.schedule_steps`` set to the length
    it resolved (``run.schedule_steps``): continuing it past its budget on the same schedule."""
    run = saved.get("run") or {}
    same_version = run.get("identity_version") == IDENTITY_VERSION
    old = dict(saved["config"])
    steps = run.get("schedule_steps")
    optim = dict(old.get("optim") or {})
    continued = bool(steps) and optim.get("schedule_steps") is None \
        and (config.get("optim") or {}).get("schedule_steps") == steps
    if continued:
        old["optim"] = {**optim, "schedule_steps": steps}
    if same_version and not continued and run.get("fingerprint") == fingerprint(config):
        diff: dict[str, tuple] = {}
    else:
        diff = identity_diff(old, config, common_only=not same_version)
    theirs = run.get("world_size")
    if processes is not None and theirs is not None and int(theirs) != int(processes):
        diff[WORLD_SIZE] = (int(theirs), int(processes))
    return diff


def check_same_run(folder: Path, saved: Mapping[str, Any], config: Mapping[str, Any], processes: int | None,
                   source: str) -> None:
    """Refuse (one line, naming the keys) a ``config`` that is not the run ``saved`` (from ``source``)."""
    diff = run_diff(saved, config, processes)
    if not diff:
        return
    run = saved.get("run") or {}
    hint = ""
    reason = schedule_spans_budget(saved["config"])
    if reason and diff.keys() & set(BUDGET_KEYS):
        steps = run.get("schedule_steps") or "<its schedule's length, in its train.log>"
        hint = (f"; {reason}: to continue this run past its budget on the same schedule add "
                f"optim.schedule_steps={steps}, or train on a new schedule as a new run from its weights "
                f"(init_from={folder}/checkpoints/last.ckpt run_name=<name>)")
    if "store_id" in diff:
        hint += (f"; features_dir holds other features than this run trained on (another encoder or settings): "
                 f"point features_dir at the run's ({saved['config'].get('features_dir')})")
    raise ConfigError(
        f"{folder} holds another run (its {source}: fingerprint {run.get('fingerprint') or 'from its config'} "
        f"-> {fingerprint(config)}: {describe(diff)}){hint}; to continue it, run it with its own settings; "
        f"to train this config, give it its own folder (run_name=<name> or hydra.run.dir=<dir>). Nothing was changed"
    )


def decide_resume(policy: str, last: Path, config: Mapping[str, Any], saved: Mapping[str, Any] | None,
                  record: Mapping[str, Any] | None = None, processes: int | None = None) -> bool:
    """Whether to resume from ``last`` (a run folder's ``last.ckpt``), or a ConfigError (one line).

    ``saved``: that checkpoint's ``config`` and ``run`` entry (None when there is no checkpoint);
    ``record``: the folder's ``run.json`` (None when there is none); ``processes``: this run's world
    size.  Both are checked: the same run resumes (``auto``, ``must``) or, with no checkpoint, starts;
    another one is refused, naming the keys that differ, and nothing in the folder is touched.
    ``never`` refuses a folder that holds a checkpoint, rather than overwrite it.
    """
    policy = normalise_resume(policy)
    folder = last.parent.parent
    if record is not None:
        check_same_run(folder, record, config, processes, RECORD_NAME)
    if saved is None:
        if policy == "must":
            raise ConfigError(f"resume=must: nothing to resume in {folder} (no checkpoints/last.ckpt); "
                              f"run without resume=must to start the run")
        return False
    if policy == "never":
        raise ConfigError(f"resume=never: {folder} already holds a run ({last}); give this run its own folder "
                          f"(run_name=<name>) or move that one away")
    check_same_run(folder, saved, config, processes, last.name)
    return True
