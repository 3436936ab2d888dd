"""`make reproduce`: the table arithmetic by hand, and a real (tiny) reproduction run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

from captioning.reproduce import aggregate, claims


def test_aggregate_mean_and_population_std():
    rows = [{"data": "shapes", "variant": "a", "seed": s, "CIDEr": c, "Bleu_4": 0.5} for s, c in enumerate([1, 2, 3])]
    rows.append({"data": "shapes", "variant": "b", "seed": 0, "CIDEr": 4.0, "Bleu_4": float("nan")})
    table = aggregate(rows)
    a, b = table
    assert (a["variant"], a["seeds"]) == ("a", 3)
    assert a["CIDEr"][0] == pytest.approx(2.0)
    assert a["CIDEr"][1] == pytest.approx((2 / 3) ** 0.5)  # sqrt(((1-2)^2 + 0 + (3-2)^2) / 3)
    assert a["Bleu_4"] == (0.5, 0.0)
    assert "Bleu_4" not in b  # NaN values are left out, not averaged


def test_claim_verdicts():
    table = [
        {"data": "moving_shapes", "variant": "temporal_attention", "CIDEr": (2.0, 0.1)},
        {"data": "moving_shapes", "variant": "mean_pool", "CIDEr": (1.0, 0.2)},
        {"data": "shapes", "variant": "soft_additive", "Bleu_4": (0.4, 0.05)},
        {"data": "shapes", "variant": "mean_pool", "Bleu_4": (0.42, 0.05)},
    ]
    table[2].update(Bleu_4_shortest=(0.5, 0.0), Bleu_4_longest=(0.45, 0.01))
    table[3].update(Bleu_4_shortest=(0.6, 0.0), Bleu_4_longest=(0.30, 0.01))
    lines = claims(table)
    assert lines[0].startswith("- temporal attention > mean pooling") and "REPRODUCED (2.000 vs 1.000)" in lines[0]
    assert "NOT reproduced (within std) (0.400 vs 0.420)" in lines[1]
    # gaps: longest 0.45 - 0.30 = 0.15 (std 0.02), shortest 0.5 - 0.6 = -0.1 (std 0)
    assert "grows with caption length" in lines[2] and "REPRODUCED (0.150 vs -0.100)" in lines[2]
    assert all("not measured" in ln for ln in lines[3:] if "grounds" in ln)
    table[0]["CIDEr"] = (1.1, 0.1)
    assert "INCONCLUSIVE (right direction, within std) (1.100 vs 1.000)" in claims(table)[0]


@pytest.mark.slow
def test_reproduce_runs_the_clis_and_writes_the_table(tmp_path):
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "captioning.reproduce", "--quick", "--seeds", "0", "--variants", "soft_additive",
           "mean_pool", "temporal_attention", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**__import__("os").environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    md = (out / "results.md").read_text()
    for row in ("| shapes | soft_additive |", "| shapes | mean_pool |", "| moving_shapes | temporal_attention |",
                "| moving_shapes | mean_pool |"):
        assert row in md
    assert "temporal attention > mean pooling on moving_shapes (CIDEr): " in md
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 4 and all(r["CIDEr"] >= 0 for r in runs)
    soft = next(r for r in runs if r["variant"] == "soft_additive")
    assert 0 < soft["chance_attention_in_object"] < 1 and "attention_in_object" in soft
    assert (out / "bleu_by_length.png").stat().st_size > 10_000
    # finished runs are reused: a second call only re-reads their metrics
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "captioning-train" not in again.stdout
