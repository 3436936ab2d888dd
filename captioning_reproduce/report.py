"""The reproduction report: per-run records -> tables, verdicts and a figure, generated.

``verdict`` is the pre-registered rule (``conf/reproduce/confirmation.yaml``): per claim, the
values of the data seeds (paired by data seed when two variants are compared), a two-sided
t-interval of their mean at the protocol's confidence; or, with ``verdict.method:
random_effects`` (``conf/reproduce/confirmation_probes.yaml``), the probe items of every seed
pooled by a random-effects meta-analysis (``captioning_reproduce.pooling``).  A claim may carry its
own confidence (0.90 for an equivalence test: two one-sided tests at 5%).  CONFIRMED when the
interval clears the claim, REFUTED when it lies wholly on the other side, INCONCLUSIVE otherwise;
with fewer than two data seeds the values are shown without a verdict.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from captioning.evaluation.report import plot_metrics_by_length
from captioning.utils.io import atomic_write_text
from captioning_reproduce.catalogue import Catalogue, Claim, Protocol, claims_of
from captioning_reproduce.pooling import claim_pooled

TABLE = {  # dataset -> (column, metric key, chance key or None)
    "shapes": [("BLEU-4", "Bleu_4", None), ("CIDEr", "CIDEr", None),
               ("binding acc.", "binding_accuracy", "chance_binding_accuracy"),
               ("pointing", "pointing_accuracy", "chance_pointing_accuracy"),
               ("attention in object", "attention_in_object", "chance_attention_in_object"),
               ("coverage entropy", "coverage_entropy", None)],
    "moving_shapes": [("BLEU-4", "Bleu_4", None), ("CIDEr", "CIDEr", None),
                      ("event-order acc.", "event_order_accuracy", "chance_event_order_accuracy"),
                      ("order when both named", "order_accuracy_all_named", "chance_order_accuracy_all_named"),
                      ("event recall", "event_recall", None),
                      ("pointing", "pointing_accuracy", "chance_pointing_accuracy"),
                      ("attention in span", "attention_in_object", "chance_attention_in_object")],
}


def load_records(folder: Path) -> list[dict[str, Any]]:
    """Every per-run record under ``folder`` (``<variant>/d<seed>.json``)."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(folder).glob("*/d*.json"))]


def by_seed(records: Sequence[Mapping[str, Any]], variant: str, key: str) -> dict[int, float]:
    """data seed -> the variant's value of ``key`` (runs without it left out)."""
    out = {}
    for r in records:
        value = r["metrics"].get(key)
        if r["variant"] == variant and isinstance(value, (int, float)) and not math.isnan(value):
            out[int(r["data_seed"])] = float(value)
    return out


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval | None:
    """Two-sided t-interval of the mean (n - 1 degrees of freedom); None below two values."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return None
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return Interval(float(x.mean()), float(x.mean()) - half, float(x.mean()) + half, len(x))


def claim_values(claim: Claim, records: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> dict[int, float]:
    """data seed -> the quantity the claim's rule tests (a paired difference for comparisons)."""
    a = by_seed(records, claim.a, claim.metric)
    if claim.rule == "beats":
        b = by_seed(records, claim.b, claim.metric)
        return {s: a[s] - b[s] for s in seeds if s in a and s in b}
    if claim.rule == "lead_grows":
        a_low, b = by_seed(records, claim.a, claim.metric_low), by_seed(records, claim.b, claim.metric)
        b_low = by_seed(records, claim.b, claim.metric_low)
        return {s: (a[s] - b[s]) - (a_low[s] - b_low[s]) for s in seeds if all(s in d for d in (a, b, a_low, b_low))}
    chance = by_seed(records, claim.a, f"chance_{claim.metric}")
    if claim.rule == "above_chance":
        return {s: a[s] - chance[s] for s in seeds if s in a and s in chance}
    if claim.rule == "times_chance":
        return {s: a[s] - claim.factor * chance[s] for s in seeds if s in a and s in chance}
    if claim.rule == "at_chance":
        return {s: a[s] - chance[s] for s in seeds if s in a and s in chance}
    return {s: a[s] for s in seeds if s in a}  # at_least


def verdict(claim: Claim, interval: Interval | None) -> str:
    if interval is None:
        return "-"
    if claim.rule == "at_least":
        lo, hi, edge = interval.low, interval.high, claim.threshold
    elif claim.rule == "at_chance":
        m = claim.margin
        if -m <= interval.low and interval.high <= m:
            return "CONFIRMED"
        return "REFUTED" if interval.low > m or interval.high < -m else "INCONCLUSIVE"
    else:  # a difference that must be > 0
        lo, hi, edge = interval.low, interval.high, 0.0
    return "CONFIRMED" if lo > edge or (claim.rule == "at_least" and lo >= edge) else (
        "REFUTED" if hi < edge else "INCONCLUSIVE")


def claim_interval(c: Claim, protocol: Protocol, records: Sequence[Mapping[str, Any]], seeds: Sequence[int],
                   values: Mapping[int, float]) -> Interval | None:
    """The interval the protocol's verdict rule reads: a t-interval over the seeds' values, or
    (``random_effects``) the seeds' probe items pooled."""
    conf = c.confidence or float(protocol.verdict.get("confidence", 0.95))
    if protocol.verdict.get("method", "t_interval") == "random_effects":
        pooled = claim_pooled(c, records, seeds, conf) if len(values) == len(seeds) else None
        return None if pooled is None else Interval(pooled.mean, pooled.low, pooled.high, pooled.n)
    return t_interval(list(values.values()), conf)


def _fmt(i: Interval | None, values: Mapping[int, float], c: Claim | None = None) -> str:
    if i is not None:
        own = f", {c.confidence:.0%}" if c is not None and c.confidence else ""
        return f"{i.mean:.3f} [{i.low:.3f}, {i.high:.3f}] (n={i.n}{own})"
    return " / ".join(f"{v:.3f}" for v in values.values()) + f" (n={len(values)})" if values else "not run"


def claims_table(catalogue: Catalogue, protocol: Protocol, records: Sequence[Mapping[str, Any]],
                 development: Sequence[Mapping[str, Any]] | None = None) -> tuple[list[str], list[dict]]:
    """Markdown lines and plain rows: each claim's quantity, interval and verdict (+ development).

    ``development=None``: this *is* the development protocol, where settings were chosen: its
    values are shown without a verdict column."""
    conf = float(protocol.verdict.get("confidence", 0.95))
    if development is None:
        lines = [f"| claim | tested quantity | {protocol.name}: value (data seeds) |", "|---|---|---|"]
    else:
        what = "pooled" if protocol.verdict.get("method") == "random_effects" else "mean"
        lines = [f"| claim | tested quantity | {protocol.name}: {what} [{conf:.0%} interval] | verdict | development |",
                 "|---|---|---|---|---|"]
    rows = []
    for c in sorted(claims_of(catalogue, protocol), key=lambda c: not c.headline):
        seeds = protocol.seeds_for(c)
        values = claim_values(c, records, seeds)
        interval = claim_interval(c, protocol, records, seeds, values)
        dev = claim_values(c, development or [], sorted({int(r["data_seed"]) for r in development or []}))
        # the rule is pre-registered for the protocol's seeds: no verdict on part of them
        v = verdict(c, interval) if len(values) == len(seeds) else f"pending ({len(values)} of {len(seeds)} seeds)"
        cells = [f"{'**' * c.headline}{c.text}{'**' * c.headline}", _quantity(c), _fmt(interval, values, c)]
        if development is not None:
            cells += [v, " / ".join(f"{x:.3f}" for x in dev.values()) or "-"]
        lines.append("| " + " | ".join(cells) + " |")
        rows.append({"id": c.id, "headline": c.headline, "verdict": v, "values": values, "development": dev,
                     **({"interval": vars(interval)} if interval else {}),
                     "claim": {k: x for k, x in vars(c).items() if x is not None and k not in ("id", "headline")}})
    return lines, rows


def _quantity(c: Claim) -> str:
    return {"beats": f"{c.a} - {c.b}: {c.metric} (> 0)", "at_least": f"{c.a}: {c.metric} (>= {c.threshold})",
            "above_chance": f"{c.a}: {c.metric} - chance (> 0)",
            "times_chance": f"{c.a}: {c.metric} - {c.factor} x chance (> 0)",
            "at_chance": f"{c.a}: {c.metric} - chance (within +-{c.margin})",
            "lead_grows": f"({c.a} - {c.b}) on {c.metric} minus on {c.metric_low} (> 0)"}[c.rule]


def variants_table(records: Sequence[Mapping[str, Any]], data: str) -> list[str]:
    """Per variant: mean +- sample std over data seeds of each column (chance in brackets); the
    probes' accuracies too where the runs ran probes."""
    probes = sorted({p for r in records if r["data"] == data for p in r.get("probes") or {}})
    cols = TABLE[data] + [(f"{p} probe", f"probe_{p}_accuracy", f"chance_probe_{p}_accuracy") for p in probes]
    lines = ["| variant | seeds | " + " | ".join(c for c, _, _ in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for name in dict.fromkeys(r["variant"] for r in records if r["data"] == data):
        cells = []
        for _, key, chance in cols:
            v = list(by_seed(records, name, key).values())
            text = "-" if not v else f"{np.mean(v):.3f} ± {np.std(v, ddof=1) if len(v) > 1 else 0.0:.3f}"
            ch = list(by_seed(records, name, chance).values()) if chance else []
            cells.append(text + (f" ({np.mean(ch):.3f})" if ch else ""))
        seeds = sorted({int(r["data_seed"]) for r in records if r["variant"] == name})
        lines.append(f"| {name} | {','.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    return lines


def probe_coverage(records: Sequence[Mapping[str, Any]], data: str) -> list[str]:
    """Per probe and data seed: the test items it could perturb, of all, and the questions asked
    (the same for every variant of a seed: the perturbations come from the annotations)."""
    runs = {(p, int(r["data_seed"])): r["probes"][p] for r in records if r["data"] == data
            for p in r.get("probes") or {}}
    if not runs:
        return []
    seeds = sorted({s for _, s in runs})
    lines = ["| probe | " + " | ".join(f"d{s}: items (questions)" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for probe in sorted({p for p, _ in runs}):
        cells = [f"{x['items']} of {x['items_total']} ({x['questions']})" if (x := runs.get((probe, s))) else "-"
                 for s in seeds]
        lines.append(f"| {probe} | " + " | ".join(cells) + " |")
    return lines


def seeds_table(rows: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> list[str]:
    """Each claim's tested quantity per data seed (the values its interval pools)."""
    lines = ["| claim | " + " | ".join(f"d{s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for row in rows:
        cells = [f"{row['values'][s]:.3f}" if s in row["values"] else "-" for s in seeds]
        lines.append(f"| {row['id']} | " + " | ".join(cells) + " |")
    return lines


def run_label(record: Mapping[str, Any]) -> str:
    """A protocol run's name: ``<variant>/d<data seed>``."""
    return f"{record['variant']}/d{record['data_seed']}"


def provenance_note(records: Sequence[Mapping[str, Any]],
                    label: Callable[[Mapping[str, Any]], str] = run_label) -> str:
    """The commits the runs were trained at, and which runs (named by ``label``) were trained from a
    tree with uncommitted changes (``git_dirty`` in their training provenance)."""
    commits = sorted({(r.get("train_provenance") or {}).get("git_commit", "?")[:10] for r in records})
    dirty = [label(r) for r in records if (r.get("train_provenance") or {}).get("git_dirty")]
    note = f"trained at commits {', '.join(commits)}"
    if dirty:
        note += (f"; {len(dirty)} of them from a working tree with uncommitted changes, so their code is "
                 f"that commit plus edits no record keeps: {', '.join(dirty)}")
    return note


def write_report(catalogue: Catalogue, protocol: Protocol, records: Sequence[Mapping[str, Any]], out: Path,
                 development: Sequence[Mapping[str, Any]] | None = None) -> Path:
    """``<out>/<protocol>.md`` (+ ``.json`` with the verdicts) and the by-length figure."""
    claim_lines, rows = claims_table(catalogue, protocol, records, development)
    lines = [f"# Reproduction: {protocol.name}", "",
             f"Generated by `python -m captioning_reproduce --protocol {protocol.name} --report` from the "
             f"{len(records)} per-run records in `runs/{protocol.name}/` ({provenance_note(records)}). "
             f"Protocol: `conf/reproduce/{protocol.name}.yaml`; catalogue: `conf/reproduce/catalogue.yaml`. "
             f"Data seeds: headline claims {protocol.data_seeds['headline']}, the rest {protocol.data_seeds['other']}; "
             f"{protocol.budget['images']} images / {protocol.budget['videos']} videos; LSTM {protocol.budget['hidden']}-d; "
             f"test split; checkpoint {'selected on val' if protocol.select_on_val else 'best by val CIDEr'}.", "",
             "## Claims (headline in bold)", "", *claim_lines, ""]
    seeds = sorted({s for k in ("headline", "other") for s in protocol.data_seeds[k]})
    if development is not None:
        lines += ["## Tested quantity per data seed", "", *seeds_table(rows, seeds), ""]
    for data, title in (("shapes", "shapes (images)"), ("moving_shapes", "moving_shapes (videos)")):
        if any(r["data"] == data for r in records):
            lines += [f"## {title}: mean ± std over data seeds (chance)", "", *variants_table(records, data), ""]
            coverage = probe_coverage(records, data)
            lines += [f"Test items each probe could perturb, {title}:", "", *coverage, ""] if coverage else []
    figure = plot_by_length(records, out / f"{protocol.name}_by_length.png")
    if figure:
        lines += [f"![BLEU-4 and CIDEr by reference length]({figure.name})", ""]
    path = out / f"{protocol.name}.md"
    atomic_write_text(path, "\n".join(lines))
    atomic_write_text(path.with_suffix(".json"), json.dumps({"protocol": protocol.name, "claims": rows}, indent=1))
    return path


def plot_by_length(records: Sequence[Mapping[str, Any]], path: Path) -> Path | None:
    """BLEU-4 and CIDEr by reference length of each shapes variant (its lowest data seed's run)."""
    per_model: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: r["data_seed"]):
        if r["data"] == "shapes" and r.get("by_length") and r["variant"] not in per_model:
            per_model[r["variant"]] = r["by_length"]
    if not per_model:
        return None
    return plot_metrics_by_length(per_model, path, title="shapes: BLEU-4 and CIDEr by reference length")
