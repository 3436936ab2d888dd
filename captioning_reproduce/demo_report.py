"""The demo search's report: ``docs/results/demo/<run>.json`` -> ``docs/results/demo_grid.md``, generated.

One row per recorded run of ``conf/reproduce/demo_grid.yaml`` (val split: the settings were chosen
on val), then one row per setting, the runs that differ only in their training seed pooled as a
range (min-max over seeds: with two to five seeds a range says more than a mean).  Chance levels
are each run's own (``chance_binding_accuracy``: the caption's words rearranged;
``chance_pointing_accuracy``: the named object's share of the grid).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from captioning.utils.io import atomic_write_text
from captioning_reproduce import report

#: (column, record key, chance key or None)
COLUMNS = (("BLEU-4", "Bleu_4", None), ("CIDEr", "CIDEr", None),
           ("binding acc.", "binding_accuracy", "chance_binding_accuracy"),
           ("pointing", "pointing_accuracy", "chance_pointing_accuracy"))


def load_demo_records(folder: Path) -> list[dict[str, Any]]:
    """Every ``<run>.json`` directly under ``folder`` (``make_demo/`` and other folders are not runs)."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(folder).glob("*.json"))]


def value(record: Mapping[str, Any], key: str) -> float | None:
    """A run's value of ``key``: caption metrics live under ``metrics``, the rest at the top."""
    v = record["metrics"].get(key, record.get(key))
    return float(v) if isinstance(v, (int, float)) else None


def overrides(record: Mapping[str, Any], common: Sequence[str]) -> str:
    """The run's own train overrides: less the dataset, the grid's common ones and the training seed."""
    return " ".join(o for o in record["train_overrides"]
                    if o != "data=shapes" and o not in common and not o.startswith("seed="))


def setting(record: Mapping[str, Any], common: Sequence[str]) -> str:
    """The run's store and own overrides: runs that share it differ only by their training seed."""
    return f"{record['store']}: {overrides(record, common)}"


def training_seed(record: Mapping[str, Any]) -> int:
    seeds = [o.split("=", 1)[1] for o in record["train_overrides"] if o.startswith("seed=")]
    return int(seeds[-1]) if seeds else 0  # captioning-train's default seed


def _cell(record: Mapping[str, Any], key: str, chance: str | None) -> str:
    v = value(record, key)
    if v is None:
        return "-"
    c = value(record, chance) if chance else None
    return f"{v:.3f}" + (f" ({c:.3f})" if c is not None else "")


def _range(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}-{hi:.3f}"


def runs_table(grid: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per run of the grid, in the grid's order; a run without a record says so."""
    by_name = {r["run"]: r for r in records}
    head = ["run", "grid", "overrides", "seed", *(c for c, _, _ in COLUMNS), "checkpoint"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---:|" + "---:|" * len(COLUMNS) + "---|"]
    for name, spec in grid["runs"].items():
        r = by_name.get(name)
        if r is None:
            lines.append(f"| {name} | - | {' '.join(spec['overrides'])} | - |" + " not run yet |" * (len(COLUMNS) + 1))
            continue
        cells = [_cell(r, key, chance) for _, key, chance in COLUMNS]
        lines.append(f"| {name} | {r['grid']} | {overrides(r, grid['common'])} | {training_seed(r)} | "
                     + " | ".join(cells) + f" | {r['checkpoint']} |")
    return lines


def settings_table(grid: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per setting, in the grid's order: its training seeds and each column's range over them."""
    order = {name: i for i, name in enumerate(grid["runs"])}
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in sorted(records, key=lambda r: order.get(r["run"], len(order))):
        groups.setdefault(setting(r, grid["common"]), []).append(r)
    lines = ["| setting (store, overrides) | training seeds | " + " | ".join(c for c, _, _ in COLUMNS) + " |",
             "|---|---|" + "---:|" * len(COLUMNS)]
    for name, runs in groups.items():
        seeds = ",".join(str(s) for s in sorted(training_seed(r) for r in runs))
        cells = []
        for _, key, _ in COLUMNS:
            values = [v for v in (value(r, key) for r in runs) if v is not None]
            cells.append(_range(values) if values else "-")
        lines.append(f"| {name} | {seeds} | " + " | ".join(cells) + " |")
    return lines


def provenance_note(records: Sequence[Mapping[str, Any]]) -> str:
    """The protocol reports' note (commits, runs from a dirty tree) with the thread counts the runs
    ran with."""
    if not records:
        return "none recorded yet"
    threads = sorted({p["threads"] for r in records if "threads" in (p := r.get("train_provenance") or {})})
    note = report.provenance_note(records, label=lambda r: r["run"])
    if threads:
        note += f"; {' or '.join(str(t) for t in threads)} thread{'s' if threads != [1] else ''} per process"
    return note


def write_demo_report(grid: Mapping[str, Any], records: Sequence[Mapping[str, Any]], out: Path) -> Path:
    """``<out>/demo_grid.md`` from the grid's config and its runs' records."""
    d = grid["data"]
    lines = ["# The demo's search: val split", "",
             f"Generated by `python -m captioning_reproduce.demo_grid --report` from {len(records)} of the "
             f"{len(grid['runs'])} runs of `conf/reproduce/demo_grid.yaml`, one record each in `demo/` "
             f"({provenance_note(records)}). Data: `shapes`, {d['images']} images, data seed {d['seed']}; "
             f"every run `{' '.join(grid['common'])}`; decoded on val with `{' '.join(grid['decode'])}`, "
             "the checkpoint with the best greedy val CIDEr. Chance levels in parentheses, each run's own. "
             "The test split plays no part; seconds are in the records (the runs shared the machine).", "",
             "## Runs", "", *runs_table(grid, records), "",
             "## Settings: the range over training seeds", "", *settings_table(grid, records), ""]
    path = Path(out) / "demo_grid.md"
    atomic_write_text(path, "\n".join(lines))
    return path
