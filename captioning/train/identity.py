"""Run identity: a run is everything that changes its trained weights or which weights it reports.

``CONTINUATION_KEYS`` decides, key by key and with the reason, what may change while continuing a
run and what is part of it; ``identity(config)`` is a training config (a plain dict) without what
may change, ``fingerprint`` a short hash of the rest.  The config carries the feature store's
identity as ``store_id`` (``run_config``: the hash of the store's meta, not its path).  The
fingerprint is stored in every checkpoint, in the run folder's own record (``run.json``, written
before the first step) and in ``train_summary.json``, and names the folder of every sweep job.  A
run folder is resumed only by a config with the same fingerprint (``decide_resume``, checked
against the record and against ``last.ckpt``): a changed setting is a different experiment, and
its numbers must never be reported as the old run's.

The budget (``trainer.max_epochs`` / ``max_steps``) is part of a run whose learning-rate schedule
spans it (cosine with ``optim.schedule_steps=null``, resolved once at the start to the budget's
optimizer steps and stored in every checkpoint); with a fixed ``optim.schedule_steps``, or a
schedule that does not depend on the budget, more epochs continue the same run.  A run whose
schedule spanned its budget continues past it only explicitly: on the same schedule with
``optim.schedule_steps=<its length>``, or as a new run from its weights (``init_from``).

What the data *are* is checked apart from the config (``checkpoint.check_compatible``: the
vocabulary and the feature store's settings), so the paths that say where they *live* are not part
of the identity: a moved dataset is the same run.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from captioning.store.layout import store_id

CONTINUES = "continues"  # may change while continuing the run
PART = "part of the run"
WITH_FIXED_SCHEDULE = "continues when the schedule is fixed"  # part of the run while the schedule spans it


class Rule(NamedTuple):
    """What a key is to a run (``CONTINUES``, ``PART`` or ``WITH_FIXED_SCHEDULE``) and why."""

    status: str
    why: str


#: Every key (dotted) decided on: what may change while continuing the same run, and why.  A key
#: not listed here is part of the run; so is every callback not listed (it may change the weights).
CONTINUATION_KEYS: dict[str, Rule] = {
    "trainer.max_epochs": Rule(WITH_FIXED_SCHEDULE, "the budget: the cosine schedule's length is the budget's "
                               "unless optim.schedule_steps fixes it (SWA's fractional start too)"),
    "trainer.max_steps": Rule(WITH_FIXED_SCHEDULE, "the budget in optimizer steps: as trainer.max_epochs"),
    "optim.schedule_steps": Rule(PART, "the learning-rate schedule's length (null: the budget's optimizer steps, "
                                 "resolved at the start and stored in every checkpoint)"),
    "trainer.devices": Rule(PART, "the global batch is data.batch_size x devices x nodes, and the schedule's "
                            "length follows it (a list of devices counts as its length)"),
    "trainer.num_nodes": Rule(PART, "the global batch, as trainer.devices"),
    "trainer.accelerator": Rule(CONTINUES, "where it runs: a requeued job may land on another kind of machine"),
    "trainer.strategy": Rule(CONTINUES, "how the processes talk, not what they compute"),
    "trainer.enable_progress_bar": Rule(CONTINUES, "what is printed"),
    "trainer.log_every_n_steps": Rule(CONTINUES, "how often metrics are logged"),
    "trainer.default_root_dir": Rule(CONTINUES, "Lightning's fallback folder (the run folder is output_dir)"),
    "data.cache": Rule(CONTINUES, "where the training features are read from (the device or the store): the same "
                                  "batches in the same order"),
    "data.num_workers": Rule(CONTINUES, "loader processes: the same batches in the same order, the training's random "
                             "stream drawn alike (SCST's reference draw: seeded by seed, epoch and item)"),
    "eval_batch_size": Rule(CONTINUES, "validation decoding batch: the same captions"),
    "optim.nonfinite": Rule(CONTINUES, "the fault policy for a NaN/inf loss: with finite losses the run is the same"),
    "logger": Rule(CONTINUES, "where metrics are recorded"),
    "callbacks.progress": Rule(CONTINUES, "only shows: progress lines"),
    "callbacks.lr_monitor": Rule(CONTINUES, "only shows: the learning rate to the loggers"),
    "callbacks.attention_images": Rule(CONTINUES, "only shows: attention figures to the loggers"),
    "callbacks.checkpoint._target_": Rule(CONTINUES, "how checkpoints are written"),
    "callbacks.checkpoint.dirpath": Rule(CONTINUES, "where checkpoints are written (the run folder)"),
    "callbacks.checkpoint.filename": Rule(CONTINUES, "how checkpoint files are named"),
    "callbacks.checkpoint.auto_insert_metric_name": Rule(CONTINUES, "how checkpoint files are named"),
    "callbacks.checkpoint.save_last": Rule(CONTINUES, "whether last.ckpt is kept (resuming needs it)"),
    "callbacks.checkpoint.monitor": Rule(PART, "which weights are reported as the best"),
    "callbacks.checkpoint.mode": Rule(PART, "which weights are reported as the best"),
    "callbacks.checkpoint.save_top_k": Rule(PART, "0 keeps no ranked checkpoint: the last weights are reported"),
    "callbacks.early_stopping": Rule(PART, "when training stops: the trained weights"),
    "callbacks.swa": Rule(PART, "the averaged weights are the final model"),
    "store_id": Rule(PART, "what the features are: the store's meta hash (captioning.store.feature_store.store_id)"),
    "features_dir": Rule(CONTINUES, "where the FeatureStore lives (what it holds: store_id)"),
    "data.root": Rule(CONTINUES, "where the dataset lives (its content: the vocabulary and store checks)"),
    "data.media_dir": Rule(CONTINUES, "where the media live"),
    "data.annotations": Rule(CONTINUES, "where the annotation files live (their content: the vocabulary check)"),
    "data.grounding": Rule(CONTINUES, "where the grounding file lives (read by evaluation, not by training)"),
    "data.caption_cache": Rule(CONTINUES, "where the caption tables are cached (each one named by its inputs' hash)"),
    "init_from": Rule(PART, "the weights it starts from (named by the parent checkpoint's path)"),
    "resume": Rule(CONTINUES, "the resume policy itself"),
    "run_name": Rule(CONTINUES, "the folder's name"),
    "output_dir": Rule(CONTINUES, "the run folder itself"),
}

#: The identity's definition: checkpoints and records of another version are compared on the keys
#: both configs have (``identity_diff(common_only=True)``), not by fingerprint.
IDENTITY_VERSION = 2
BUDGET_KEYS = ("trainer.max_epochs", "trainer.max_steps")
FINGERPRINT_CHARS = 10


def schedule_spans_budget(config: Mapping[str, Any]) -> str | None:
    """Why the budget is part of this run (None: it is not): the cosine schedule is as long as the
    budget unless ``optim.schedule_steps`` fixes it; SWA started at a fraction of ``max_epochs``."""
    optim = config.get("optim") or {}
    if optim.get("scheduler", "cosine") == "cosine" and optim.get("schedule_steps") is None:
        return "the cosine schedule spans the budget"
    for node in (config.get("callbacks") or {}).values():
        if isinstance(node, Mapping) and str(node.get("_target_", "")).endswith("StochasticWeightAveraging") \
                and isinstance(node.get("swa_epoch_start", 0.8), float):
            return "SWA starts at a fraction of trainer.max_epochs"
    return None


def _pop(tree: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    node: Any = tree
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a training config as a nested plain dict) without what may change while
    continuing it; a list of devices counts as its length, a callback turned off as absent."""
    out = json.loads(json.dumps(config, default=str))  # a deep copy in JSON's own types
    fixed_schedule = schedule_spans_budget(out) is None
    for dotted, rule in CONTINUATION_KEYS.items():
        if rule.status == CONTINUES or (rule.status == WITH_FIXED_SCHEDULE and fixed_schedule):
            _pop(out, dotted)
    trainer = out.get("trainer")
    if isinstance(trainer, dict) and isinstance(trainer.get("devices"), list):
        trainer["devices"] = len(trainer["devices"])
    callbacks = out.get("callbacks")
    if isinstance(callbacks, dict):
        for name in [n for n, node in callbacks.items() if node is None or node is False]:
            del callbacks[name]
    return out


def fingerprint(config: Mapping[str, Any]) -> str:
    """Short sha256 of ``identity(config)`` (canonical JSON: sorted keys)."""
    text = json.dumps(identity(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]


def store_identity(features_dir: Any) -> str | list[str] | None:
    """The identity of the store(s) in ``features_dir`` (a folder or a list of them): ``store_id`` of
    each ``meta.json`` (a list for several streams); None when a store is missing (the job then
    fails on it with its own error)."""
    dirs = features_dir if isinstance(features_dir, list) else [features_dir]
    ids = []
    for d in dirs:
        path = Path(str(d), "meta.json")
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict):
            return None
        meta.setdefault("dtype", "float16")  # what FeatureStore.open assumes of older metas
        meta.setdefault("grid", None)
        ids.append(store_id(meta))
    return ids if isinstance(features_dir, list) else ids[0]


def run_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A training config (plain dict) with its store's identity (``store_id``): what a run is
    fingerprinted, recorded and checkpointed with."""
    return {**config, "store_id": store_identity(config.get("features_dir"))}


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict) or not d:
        return {prefix.rstrip("."): d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}."))
    return out


ABSENT = object()


def identity_diff(old: Mapping[str, Any], new: Mapping[str, Any], *, common_only: bool = False) -> dict[str, tuple]:
    """``{dotted key: (old value, new value)}`` where the two identities differ.  ``common_only``:
    compare only keys both have (a checkpoint written before a key existed)."""
    a, b = _flatten(identity(old)), _flatten(identity(new))
    keys = (a.keys() & b.keys()) if common_only else (a.keys() | b.keys())
    return {k: (a.get(k, ABSENT), b.get(k, ABSENT)) for k in sorted(keys) if a.get(k, ABSENT) != b.get(k, ABSENT)}


def describe(diff: Mapping[str, tuple], limit: int = 4) -> str:
    """``optim.lr 0.001 -> 0.005, seed 0 -> 1`` (at most ``limit`` keys, then how many more)."""
    show = lambda v: "(absent)" if v is ABSENT else json.dumps(v, default=str)  # noqa: E731
    parts = [f"{k} {show(o)} -> {show(n)}" for k, (o, n) in list(diff.items())[:limit]]
    more = len(diff) - limit
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


def identity_table() -> str:
    """``CONTINUATION_KEYS`` as the markdown table of README's "Runs and sweeps"."""
    rows = ["| key | while continuing a run | why |", "|---|---|---|"]
    for key, rule in CONTINUATION_KEYS.items():
        status = {CONTINUES: "may change", PART: "part of the run",
                  WITH_FIXED_SCHEDULE: "may change when the schedule is fixed"}[rule.status]
        rows.append(f"| `{key}` | {status} | {rule.why} |")
    return "\n".join(rows)
