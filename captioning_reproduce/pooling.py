"""Items and data seeds pooled into one interval: a random-effects meta-analysis over data seeds.

Each data seed is a replication (its own dataset and training) whose value is a mean over test
items; a probe record keeps every item's value (``runner.probe_records``).  Per seed the
sampling unit is the item, or the cluster the item was drawn with (a time-reversal pair of
videos); one pseudo-unit of value 1/2 (a difference: 0) is added, the Haldane-Anscombe
correction.  The seed's estimate is the ratio mean over units and its variance the
cluster-robust one::

    p_s = sum_c S_c / sum_c n_c,     v_s = C/(C-1) * sum_c (S_c - p_s n_c)^2 / (sum_c n_c)^2

(``S_c``: the sum of unit c's item values, ``n_c``: its items, C units).  Accuracies are pooled
as ``y_s = logit(p_s)`` with ``v_s / (p_s (1 - p_s))^2`` (delta method), paired differences as
they are.  Between seeds: DerSimonian-Laird ``tau^2``, weights ``w_s = 1 / (v_s + tau^2)``, mean
``mu = sum w y / sum w`` and its Hartung-Knapp-Sidik-Jonkman interval ``mu +- t_{n-1} * sqrt(q)``
with ``q = max(1, sum w (y - mu)^2 / (n - 1)) / sum w`` (the Knapp-Hartung modification: never
narrower than the within-seed variances alone allow).  Accuracy intervals are transformed back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

PSEUDO = {"proportion": 0.5, "difference": 0.0}


@dataclass(frozen=True)
class SeedEstimate:
    """One seed's estimate on the pooling scale (``y``), its variance ``v`` and its plain value."""

    y: float
    v: float
    value: float
    units: int


def unit_sums(values: Mapping[str, float], clusters: Mapping[str, str] | None = None) -> list[tuple[float, int]]:
    """``(sum of item values, items)`` per sampling unit (an item's cluster, else the item)."""
    units: dict[str, list[float]] = {}
    for key, x in values.items():
        units.setdefault((clusters or {}).get(key, key), []).append(float(x))
    return [(sum(xs), len(xs)) for xs in units.values()]


def seed_estimate(values: Mapping[str, float], clusters: Mapping[str, str] | None, scale: str) -> SeedEstimate:
    """The seed's pooled-scale estimate and variance (``scale``: proportion | difference)."""
    units = [*unit_sums(values, clusters), (PSEUDO[scale], 1)]
    s = np.array([u[0] for u in units])
    n = np.array([u[1] for u in units], dtype=np.float64)
    p = float(s.sum() / n.sum())
    c = len(units)
    var = float(c / (c - 1) * np.sum((s - p * n) ** 2) / n.sum() ** 2)
    plain = float(sum(values.values()) / len(values))
    if scale == "difference":
        return SeedEstimate(p, var, plain, c - 1)
    return SeedEstimate(math.log(p / (1 - p)), var / (p * (1 - p)) ** 2, plain, c - 1)


@dataclass(frozen=True)
class Pooled:
    """The pooled mean and interval (on the value's own scale), and what went into it."""

    mean: float
    low: float
    high: float
    n: int
    tau2: float


def pool(estimates: Sequence[SeedEstimate], confidence: float, scale: str) -> Pooled | None:
    """Random-effects pooled mean and HKSJ interval (see the module); None below two seeds."""
    if len(estimates) < 2:
        return None
    y = np.array([e.y for e in estimates])
    v = np.maximum(np.array([e.v for e in estimates]), 1e-12)
    k = len(y)
    w = 1 / v
    q_stat = float(np.sum(w * (y - np.sum(w * y) / w.sum()) ** 2))
    tau2 = max(0.0, (q_stat - (k - 1)) / (w.sum() - np.sum(w**2) / w.sum()))
    w = 1 / (v + tau2)
    mu = float(np.sum(w * y) / w.sum())
    q = max(1.0, float(np.sum(w * (y - mu) ** 2)) / (k - 1)) / w.sum()
    half = float(stats.t.ppf(0.5 + confidence / 2, k - 1)) * math.sqrt(q)
    back = (lambda x: x) if scale == "difference" else (lambda x: 1 / (1 + math.exp(-x)))
    return Pooled(back(mu), back(mu - half), back(mu + half), k, tau2)


def item_values(record: Mapping[str, Any], probe: str) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """A run record's probe: item -> value (share of its questions right), item -> chance, clusters."""
    p = record["probes"][probe]
    values = {k: credit / q for k, (q, credit, _) in p["per_item"].items()}
    chance = {k: ch / q for k, (q, _, ch) in p["per_item"].items()}
    return values, chance, p.get("clusters") or {}


def probe_of(metric: str) -> str:
    """``probe_<name>_accuracy`` -> ``<name>``; a metric no probe writes cannot be pooled by item."""
    if not (metric.startswith("probe_") and metric.endswith("_accuracy")):
        raise ValueError(f"{metric}: the random-effects verdict pools probe items (probe_<name>_accuracy)")
    return metric[len("probe_"): -len("_accuracy")]


def claim_pooled(claim: Any, records: Sequence[Mapping[str, Any]], seeds: Sequence[int],
                 confidence: float) -> Pooled | None:
    """The claim's tested quantity (``report.claim_values``) pooled over its seeds' items."""
    probe = probe_of(claim.metric)
    runs = {(r["variant"], int(r["data_seed"])): r for r in records if "probes" in r}
    if not all((v, s) in runs for v in claim.variants for s in seeds):
        return None
    estimates, chances = [], []
    for s in seeds:
        a, chance, clusters = item_values(runs[(claim.a, s)], probe)
        chances.append(sum(chance.values()) / len(chance))
        if claim.rule == "beats":
            b = item_values(runs[(claim.b, s)], probe)[0]
            estimates.append(seed_estimate({k: a[k] - b[k] for k in a if k in b}, clusters, "difference"))
        elif claim.rule == "lead_grows":
            raise ValueError(f"claim {claim.id}: lead_grows compares two metrics; probes pool one")
        else:
            estimates.append(seed_estimate(a, clusters, "proportion"))
    scale = "difference" if claim.rule == "beats" else "proportion"
    pooled = pool(estimates, confidence, scale)
    if pooled is None or claim.rule in ("beats", "at_least"):
        return pooled
    shift = float(np.mean(chances)) * (claim.factor if claim.rule == "times_chance" else 1.0)
    return Pooled(pooled.mean - shift, pooled.low - shift, pooled.high - shift, pooled.n, pooled.tau2)
