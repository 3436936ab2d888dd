"""The probes protocol's verdict: items and data seeds pooled by a random-effects meta-analysis,
checked against hand-computed values, and honest (non-zero, inside [0, 1]) where every item is right."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from captioning_reproduce.catalogue import Claim, load_catalogue, load_protocol
from captioning_reproduce.pooling import SeedEstimate, claim_pooled, pool, seed_estimate
from captioning_reproduce.report import claims_table, t_interval, verdict


def test_seed_estimate_by_hand():
    e = seed_estimate({"a": 1.0, "b": 0.0, "c": 1.0}, None, "proportion")
    # units 1, 0, 1 and the pseudo-unit 1/2: p = 2.5 / 4; sandwich variance 4/3 * sum (s - p n)^2 / 4^2
    p, var = 0.625, 4 / 3 * (0.375**2 + 0.625**2 + 0.375**2 + 0.125**2) / 16
    assert e.y == pytest.approx(math.log(p / (1 - p))) and e.v == pytest.approx(var / (p * (1 - p)) ** 2)
    assert e.value == pytest.approx(2 / 3) and e.units == 3
    paired = seed_estimate({"a": 1.0, "b": 0.0, "c": 1.0}, {"a": "pair0", "b": "pair0"}, "proportion")
    # units (a+b: sum 1 over 2 items), c, pseudo: p = 2.5 / 4, variance 3/2 * (...) / 4^2
    assert paired.v == pytest.approx(1.5 * ((1 - 1.25) ** 2 + 0.375**2 + 0.125**2) / 16 / (p * (1 - p)) ** 2)
    d = seed_estimate({"a": 1.0, "b": -1.0, "c": 0.0}, None, "difference")  # pseudo-unit 0
    assert (d.y, d.v) == (0.0, pytest.approx(4 / 3 * 2 / 16))


def test_pool_by_hand():
    t1 = stats.t.ppf(0.975, 1)
    same = pool([SeedEstimate(0.0, 1.0, 0.5, 9), SeedEstimate(0.0, 1.0, 0.5, 9)], 0.95, "difference")
    # no spread between seeds: tau^2 = 0 and the Knapp-Hartung floor 1 / sum w = 1/2 sets the width
    assert (same.mean, same.tau2) == (0.0, 0.0) and same.high == pytest.approx(t1 * math.sqrt(0.5))
    apart = pool([SeedEstimate(0.0, 0.1, 0.0, 9), SeedEstimate(2.0, 0.1, 2.0, 9)], 0.95, "difference")
    # Q = 20, tau^2 = (20 - 1) / (20 - 200/20) = 1.9, weights 1/2 each, q = 1 / 1
    assert apart.tau2 == pytest.approx(1.9) and apart.mean == pytest.approx(1.0)
    assert apart.low == pytest.approx(1 - t1) and apart.high == pytest.approx(1 + t1)
    assert pool([SeedEstimate(0.0, 1.0, 0.5, 9)], 0.95, "difference") is None


def _probe_record(variant: str, seed: int, values: dict[str, float], clusters: dict | None = None) -> dict:
    per_item = {k: [5, 5 * v, 2.5] for k, v in values.items()}  # 5 two-way questions per item
    acc = sum(values.values()) / len(values)
    return {"variant": variant, "data": "moving_shapes", "data_seed": seed,
            "metrics": {"probe_order_accuracy": acc, "chance_probe_order_accuracy": 0.5},
            "probes": {"order": {"per_item": per_item, **({"clusters": clusters} if clusters else {})}}}


def test_every_item_right_on_every_seed_still_has_an_interval():
    claim = Claim("c", "t", "at_least", "temporal_residual_224", "probe_order_accuracy", threshold=0.9)
    recs = [_probe_record("temporal_residual_224", s, {f"video{i}": 1.0 for i in range(240)}) for s in (6, 7, 8)]
    pooled = claim_pooled(claim, recs, [6, 7, 8], 0.95)
    assert 0.9 < pooled.low < pooled.mean < pooled.high < 1.0  # inside [0, 1], with a width
    flat = t_interval([1.0, 1.0, 1.0])
    assert flat.low == flat.high == 1.0  # what a t-interval over seed means gives
    assert verdict(claim, pooled) == "CONFIRMED"


def test_time_reversed_pairs_are_one_unit():
    """Mean pooling gets one video of each pair right: item by item that looks like coin flips, pair
    by pair it is exactly 1/2, and the equivalence test can tell."""
    claim = Claim("c", "t", "at_chance", "mean_pool_224", "probe_order_accuracy", margin=0.03, confidence=0.90)
    recs = []
    for s in (6, 7, 8, 9, 10):
        values = {f"video{i}": float((i + s) % 2) for i in range(240)}
        recs.append(_probe_record("mean_pool_224", s, values, {f"video{i}": f"pair{i // 2}" for i in range(240)}))
    assert verdict(claim, claim_pooled(claim, recs, [6, 7, 8, 9, 10], 0.90)) == "CONFIRMED"
    for r in recs:
        del r["probes"]["order"]["clusters"]
    loose = claim_pooled(claim, recs, [6, 7, 8, 9, 10], 0.90)  # items taken as independent
    assert loose.high - loose.low > 0.06 and verdict(claim, loose) == "INCONCLUSIVE"


def test_the_probes_protocol_pools_paired_items():
    protocol = load_protocol("confirmation_probes")
    assert protocol.verdict["method"] == "random_effects" and protocol.probes == ["binding", "order", "shuffle"]
    recs = []
    for s in protocol.data_seeds["headline"]:
        for v, acc in (("soft_14x14", 0.9), ("mean_pool_14x14", 0.6)):
            vals = {str(i): acc if i % 2 else acc - 0.1 for i in range(60)}
            r = _probe_record(v, s, vals)
            r["data"], r["probes"] = "shapes", {"binding": r["probes"]["order"]}
            r["metrics"] = {"probe_binding_accuracy": acc - 0.05, "chance_probe_binding_accuracy": 0.5}
            recs.append(r)
    lines, rows = claims_table(load_catalogue(), protocol, recs, [])
    row = next(r for r in rows if r["id"] == "soft_binds_above_mean_pool_probe_14x14")
    assert row["verdict"] == "CONFIRMED" and row["interval"]["mean"] == pytest.approx(0.3, abs=0.01)
    assert next(r for r in rows if r["id"] == "temporal_orders_probe_224")["verdict"] == "pending (0 of 5 seeds)"
    assert any("pooled [95% interval]" in line for line in lines)
