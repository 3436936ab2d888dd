"""The defaults study's report and decision: ``docs/results/defaults/**/d<seed>.json`` ->
``docs/results/defaults_study.md``, generated.

``decide`` applies the rule ``conf/reproduce/defaults_study.yaml`` fixed before the runs (its comment
states it in words) to the records, and says why at each step; no decision is taken before every
run of a study is recorded ("pending").  Per study, a table of the candidates' val figures per
data seed (chance levels in parentheses, each run's own), then the decision.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captioning.utils.io import atomic_write_text
from captioning_reproduce import report

Record = Mapping[str, Any]

#: study -> (column, metric key, chance key or None)
COLUMNS = {
    "image": (("pointing", "pointing_accuracy", "chance_pointing_accuracy"), ("CIDEr", "CIDEr", None),
              ("BLEU-4", "Bleu_4", None), ("binding acc.", "binding_accuracy", "chance_binding_accuracy"),
              ("binding probe", "probe_binding_accuracy", "chance_probe_binding_accuracy"),
              ("order probe", "probe_order_accuracy", "chance_probe_order_accuracy")),
    "video": (("order probe", "probe_order_accuracy", "chance_probe_order_accuracy"), ("CIDEr", "CIDEr", None),
              ("BLEU-4", "Bleu_4", None), ("event order", "event_order_accuracy", "chance_event_order_accuracy"),
              ("event recall", "event_recall", None), ("pointing", "pointing_accuracy", "chance_pointing_accuracy")),
}


def load_study_records(folder: Path) -> list[dict[str, Any]]:
    """Every ``<study>/<candidate>/d<seed>.json`` under ``folder``."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(folder).glob("*/*/d*.json"))]


def names(cfg: Mapping[str, Any], study: str) -> list[str]:
    """The study's candidates, ``<store>-<code>``, stores in the rule's order of preference."""
    s = cfg["studies"][study]
    return [f"{store}-{code}" for store in s["stores"] for code in s["codes"]]


def values(records: Sequence[Record], study: str, key: str) -> dict[str, dict[int, float]]:
    """candidate -> data seed -> its value of ``key`` (runs without it left out)."""
    out: dict[str, dict[int, float]] = {}
    for r in records:
        v = r["metrics"].get(key)
        if r["study"] == study and isinstance(v, (int, float)):
            out.setdefault(r["candidate"], {})[int(r["data_seed"])] = float(v)
    return out


@dataclass
class Decision:
    """The rule's outcome for one study: the chosen candidate (None: pending) and why."""

    study: str
    chosen: str | None
    reasons: list[str] = field(default_factory=list)
    bar_met: bool = True


def _mean(seeds: Mapping[int, float]) -> float:
    return sum(seeds.values()) / len(seeds)


def _pending(cfg: Mapping[str, Any], records: Sequence[Record], study: str) -> Decision | None:
    planned = len(names(cfg, study)) * len(cfg["data_seeds"])
    done = sum(1 for r in records if r["study"] == study and r["candidate"] in names(cfg, study)
               and int(r["data_seed"]) in cfg["data_seeds"])
    if done < planned:
        return Decision(study, None, [f"pending ({done} of {planned} runs recorded): no decision on part of them"])
    return None


def decide_image(cfg: Mapping[str, Any], records: Sequence[Record]) -> Decision:
    """Gate (pointing >= bar on every seed, CIDEr >= ratio x the seed's best), then the first store
    in the listed order with a candidate through the gate, then its code (best mean pointing; an
    earlier code within ``tie`` of it preferred); else the highest minimum pointing."""
    pending = _pending(cfg, records, "image")
    if pending:
        return pending
    rule, s = cfg["decision"]["image"], cfg["studies"]["image"]
    point, cider = values(records, "image", rule["metric"]), values(records, "image", "CIDEr")
    best_cider = {seed: max(c[seed] for c in cider.values()) for seed in cfg["data_seeds"]}
    through = [n for n in names(cfg, "image")
               if all(point[n][d] >= rule["bar"] and cider[n][d] >= rule["cider_ratio"] * best_cider[d]
                      for d in cfg["data_seeds"])]
    reasons = [f"through the gate (val {rule['metric']} >= {rule['bar']} on every data seed, val CIDEr >= "
               f"{rule['cider_ratio']} x the data seed's best): {', '.join(through) or 'none'}"]
    if not through:
        chosen = max(names(cfg, "image"), key=lambda n: min(point[n].values()))
        reasons.append(f"no candidate through the gate: the highest minimum val {rule['metric']}, {chosen} "
                       f"({min(point[chosen].values()):.3f}); the bar is not met")
        return Decision("image", chosen, reasons, bar_met=False)
    store = next(st for st in s["stores"] if any(n.startswith(f"{st}-") for n in through))
    reasons.append(f"grid: {store}, the first store in the rule's order ({', '.join(s['stores'])}) "
                   "with a candidate through the gate")
    codes = [c for c in s["codes"] if f"{store}-{c}" in through]
    means = {c: _mean(point[f"{store}-{c}"]) for c in codes}
    top = max(means.values())
    code = next(c for c in codes if means[c] >= top - rule["tie"])
    reasons.append("code: " + ", ".join(f"{c} {m:.3f}" for c, m in means.items())
                   + f" (mean val {rule['metric']}); {code}: the first in the rule's order ({', '.join(s['codes'])}) "
                   f"within {rule['tie']} of the best")
    return Decision("image", f"{store}-{code}", reasons)


def decide_video(cfg: Mapping[str, Any], records: Sequence[Record]) -> Decision:
    """The time code stays ``keep`` unless another beats it by more than ``margin`` on every data
    seed with a val CIDEr >= ratio x its own on every data seed (of several: the best mean)."""
    pending = _pending(cfg, records, "video")
    if pending:
        return pending
    rule, s = cfg["decision"]["video"], cfg["studies"]["video"]
    metric, cider = values(records, "video", rule["metric"]), values(records, "video", "CIDEr")
    store = next(iter(s["stores"]))
    keep = f"{store}-{rule['keep']}"
    better = [n for n in names(cfg, "video") if n != keep and all(
        metric[n][d] > metric[keep][d] + rule["margin"] and cider[n][d] >= rule["cider_ratio"] * cider[keep][d]
        for d in cfg["data_seeds"])]
    chosen = max(better, key=lambda n: _mean(metric[n])) if better else keep
    reasons = [", ".join(f"{n} {_mean(metric[n]):.3f}" for n in names(cfg, "video")) + f" (mean val {rule['metric']})",
               f"beat {keep} by more than {rule['margin']} on every data seed with val CIDEr >= "
               f"{rule['cider_ratio']} x its own: {', '.join(better) or 'none'}; chosen: {chosen}"]
    return Decision("video", chosen, reasons)


def _cell(seeds: Mapping[int, float], chances: Mapping[int, float], seed: int) -> str:
    if seed not in seeds:
        return "-"
    return f"{seeds[seed]:.3f}" + (f" ({chances[seed]:.3f})" if seed in chances else "")


def study_table(cfg: Mapping[str, Any], records: Sequence[Record], study: str) -> list[str]:
    """One row per candidate (in the rule's order): each column per data seed, chance in parentheses."""
    seeds, cols = cfg["data_seeds"], COLUMNS[study]
    head = [f"{col} d{d}" for col, _, _ in cols for d in seeds]
    lines = ["| candidate | grid | " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(head)]
    grids = {r["candidate"]: r["grid"] for r in records if r["study"] == study}
    table = {key: (values(records, study, key), values(records, study, chance) if chance else {})
             for _, key, chance in cols}
    for n in names(cfg, study):
        cells = [_cell(table[key][0].get(n, {}), table[key][1].get(n, {}), d) for _, key, _ in cols for d in seeds]
        lines.append(f"| {n} | {grids.get(n, '-')} | " + " | ".join(cells) + " |")
    return lines


def seconds_table(cfg: Mapping[str, Any], records: Sequence[Record]) -> list[str]:
    """Training seconds per candidate and data seed (one thread each, on a shared machine: a cost
    indication, not a benchmark)."""
    seeds = cfg["data_seeds"]
    lines = ["| candidate | " + " | ".join(f"train s d{d}" for d in seeds) + " |", "|---|" + "---:|" * len(seeds)]
    for study in cfg["studies"]:
        secs = {(r["candidate"], int(r["data_seed"])): r["seconds"]["train"] for r in records if r["study"] == study}
        for n in names(cfg, study):
            lines.append(f"| {n} | " + " | ".join(f"{secs[(n, d)]:.0f}" if (n, d) in secs else "-" for d in seeds) + " |")
    return lines


def write_study_report(cfg: Mapping[str, Any], records: Sequence[Record], out: Path) -> Path:
    """``<out>/defaults_study.md`` from the study's config and its runs' records."""
    decisions = [decide_image(cfg, records), decide_video(cfg, records)]
    note = report.provenance_note(records, label=lambda r: f"{r['study']}/{r['candidate']}/d{r['data_seed']}") \
        if records else "none recorded yet"
    lines = ["# The defaults study: validation split", "",
             f"Generated by `python -m captioning_reproduce.defaults_study --report` from {len(records)} per-run "
             f"records in `defaults/` ({note}). Protocol, recipe and decision rule, fixed before the runs: "
             f"`conf/reproduce/defaults_study.yaml`. Data seeds {', '.join(map(str, cfg['data_seeds']))}; every "
             "figure is on the validation split (the test split is not decoded); chance levels in parentheses, "
             "each run's own.", ""]
    for d in decisions:
        s = cfg["studies"][d.study]
        lines += [f"## {d.study}: {s['data']}, {s['items']} items, `{' '.join(s['train'])}`", "",
                  *study_table(cfg, records, d.study), "",
                  f"Decision: **{d.chosen or 'pending'}**" + ("" if d.bar_met else " (the bar is not met)"), "",
                  *[f"- {r}" for r in d.reasons], ""]
    lines += ["## Training time", "", *seconds_table(cfg, records), ""]
    path = Path(out) / "defaults_study.md"
    atomic_write_text(path, "\n".join(lines))
    return path
