"""`make reproduce`: the table arithmetic and every verdict rule on fixed inputs, and a real
(tiny) reproduction run through the CLIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

import captioning.reproduce as reproduce
from captioning.reproduce import (
    EXTRA_STORES,
    FULL,
    IMAGE_VARIANTS,
    ON_EXTRA_STORES,
    VIDEO_VARIANTS,
    Protocol,
    Variant,
    aggregate,
    at_least,
    beats,
    claims,
    within_chance,
)


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


def test_variants_on_extra_stores_name_them_and_read_them():
    """A variant that reads another FeatureStore lists it (so reproduce extracts it first) and its
    features_dir points there; every listed store has its extraction overrides; the default variants
    read the default store only (a features_dir override there would skip its extraction)."""
    for v in IMAGE_VARIANTS + VIDEO_VARIANTS:
        assert not v.stores and not any(o.startswith("features_dir=") for o in v.overrides), v.name
    assert {s for v in ON_EXTRA_STORES for s in v.stores} == set(EXTRA_STORES)  # no store left unread
    for v in ON_EXTRA_STORES:
        assert v.stores, v.name
        features_dir = next(o for o in v.overrides if o.startswith("features_dir="))
        for store in v.stores:
            assert store in EXTRA_STORES, (v.name, store)
            assert f"/features/{store}" in features_dir, (v.name, store)


def test_run_variant_trains_once_and_evaluates_once_per_protocol(tmp_path, monkeypatch):
    """A finished training is never repeated; each protocol (beam 3, + trigram blocking, + the
    checkpoint selected on val) is evaluated once, into its own folder; selection on val tests the
    checkpoint (best or last) with the higher validation CIDEr under the same decoding."""
    calls = []
    val_cider = {"best.ckpt": 7.3, "last.ckpt": 7.8}  # the last checkpoint decodes better on val

    def fake_cli(module, *args):
        calls.append((module, args))
        opt = dict(a.split("=", 1) for a in args if "=" in a)
        if module == "train":
            run = tmp_path / opt["hydra.run.dir"]
            run.mkdir(parents=True, exist_ok=True)
            (run / "train_summary.json").write_text(json.dumps({"best_checkpoint": "best.ckpt",
                                                                "last_checkpoint": "last.ckpt"}))
            return
        ev = tmp_path / opt["output_dir"]
        ev.mkdir(parents=True)
        cider = val_cider[opt["ckpt_path"]] if opt["split"] == "val" else (
            2.0 if "decode.block_trigrams" in opt else 1.0) + (opt["ckpt_path"] == "last.ckpt")
        (ev / "metrics.json").write_text(json.dumps({"CIDEr": cider}))
        (ev / "report.json").write_text("{}")
        (ev / "predictions.json").write_text("[]")

    monkeypatch.setattr(reproduce, "cli", fake_cli)
    v, out = Variant("temporal_attention", "moving_shapes", ["model=temporal_attention"]), tmp_path / "rep"
    run = out / "runs" / "moving_shapes-temporal_attention-s0"
    first = reproduce.run_variant(v, 0, FULL, out)
    assert [m for m, _ in calls] == ["train", "evaluate"] and not first["reused"] and first["CIDEr"] == 1.0
    assert "decode.block_trigrams=true" not in calls[1][1] and "decode.beam_size=3" in calls[1][1]
    assert "ckpt_path=best.ckpt" in calls[1][1]
    calls.clear()
    blocked = reproduce.run_variant(v, 0, FULL, out, Protocol(block_trigrams=True))
    assert [m for m, _ in calls] == ["evaluate"] and blocked["reused"] and blocked["CIDEr"] == 2.0
    assert "ckpt_path=best.ckpt" in calls[0][1] and "decode.block_trigrams=true" in calls[0][1]
    assert f"output_dir={run / 'eval_block_trigrams'}" in calls[0][1]
    calls.clear()
    selected = reproduce.run_variant(v, 0, FULL, out, Protocol(block_trigrams=True, select_on_val=True))
    assert [(m, dict(a.split("=", 1) for a in args if "=" in a)["split"]) for m, args in calls] == [
        ("evaluate", "val"), ("evaluate", "val"), ("evaluate", "test")]
    assert all("decode.block_trigrams=true" in args for _, args in calls)  # val decodes as test does
    assert "ckpt_path=last.ckpt" in calls[2][1] and selected["CIDEr"] == 3.0
    assert json.loads((run / "eval_block_trigrams_val_selected_val" / "selection.json").read_text())["chosen"] == \
        "last.ckpt"
    calls.clear()
    for protocol in (Protocol(), Protocol(block_trigrams=True), Protocol(block_trigrams=True, select_on_val=True)):
        reproduce.run_variant(v, 0, FULL, out, protocol)
    assert calls == []  # all reused
    path = reproduce.write_tables(aggregate([selected]), [selected], out, FULL, 60.0, Protocol(True, True))
    assert path == out / "results_block_trigrams_val_selected.md" and not (out / "results.md").exists()
    assert "beam 3, trigram blocking, checkpoint selected on val with that decoding." in path.read_text()
    assert json.loads(path.with_suffix(".json").read_text())["runs"][0]["CIDEr"] == 3.0


def test_verdict_rules():
    # beats: the difference must exceed the SUM of the two stds
    assert beats((2.0, 0.1), (1.0, 0.2)) == "REPRODUCED"
    assert beats((1.25, 0.1), (1.0, 0.2)) == "INCONCLUSIVE (right direction, within std)"
    assert beats((1.3, 0.1), (1.0, 0.2)) == "INCONCLUSIVE (right direction, within std)"  # 0.3 is not > 0.3
    assert beats((0.9, 0.01), (1.0, 0.02)) == "NOT reproduced (reversed beyond std)"
    assert beats((0.99, 0.01), (1.0, 0.02)) == "NOT reproduced (within std)"
    assert beats(None, (1.0, 0.0)) == "not measured"
    # at_least: the mean minus its std must clear the threshold
    assert at_least((0.95, 0.04), 0.9) == "REPRODUCED"
    assert at_least((0.92, 0.04), 0.9) == "INCONCLUSIVE (mean above, within std)"
    assert at_least((0.85, 0.0), 0.9) == "NOT reproduced"
    # within chance: 2 binomial standard errors, sqrt(0.5 * 0.5 / 100) = 0.05 -> +-0.1
    assert within_chance((0.59, 0.2), (0.5, 0.0), 100) == "REPRODUCED"
    assert within_chance((0.61, 0.0), (0.5, 0.0), 100) == "NOT reproduced (away from chance)"
    assert within_chance((0.5, 0.0), (0.5, 0.0), None) == "not measured"


def _table() -> list[dict]:
    s, v = "shapes", "moving_shapes"
    return [
        {"data": s, "variant": "soft_additive", "CIDEr": (3.0, 0.1), "binding_accuracy": (0.78, 0.05),
         "chance_binding_accuracy": (0.6, 0.02),
         "Bleu_4_longest": (0.5, 0.01), "Bleu_4_shortest": (0.6, 0.01), "pointing_accuracy": (0.7, 0.05),
         "chance_pointing_accuracy": (0.05, 0.0), "coverage_entropy": (0.6, 0.02)},
        {"data": s, "variant": "mean_pool", "CIDEr": (2.0, 0.1), "binding_accuracy": (0.7, 0.05),
         "chance_binding_accuracy": (0.69, 0.02),
         "Bleu_4_longest": (0.3, 0.01), "Bleu_4_shortest": (0.6, 0.01)},
        {"data": s, "variant": "soft_additive_no_ds", "coverage_entropy": (0.5, 0.02), "pointing_accuracy": (0.6, 0.1)},
        {"data": s, "variant": "soft_general", "CIDEr": (3.1, 0.2)},
        {"data": s, "variant": "soft_14x14", "pointing_accuracy": (0.63, 0.05), "chance_pointing_accuracy": (0.05, 0.0),
         "CIDEr": (7.0, 0.1), "binding_accuracy": (0.9, 0.01)},
        {"data": s, "variant": "mean_pool_14x14", "CIDEr": (3.0, 0.1), "binding_accuracy": (0.85, 0.02)},
        {"data": v, "variant": "temporal_residual", "event_order_accuracy": (0.97, 0.01),
         "chance_event_order_accuracy": (0.5, 0.0), "event_recall": (0.9, 0.05)},
        {"data": v, "variant": "temporal_attention", "event_order_accuracy": (0.95, 0.02), "event_recall": (0.6, 0.02),
         "chance_event_order_accuracy": (0.5, 0.0), "CIDEr": (2.0, 0.1), "attention_in_object": (0.5, 0.05),
         "chance_attention_in_object": (0.2, 0.0), "pointing_accuracy": (0.35, 0.05),
         "chance_pointing_accuracy": (0.2, 0.0), "order_accuracy_all_named": (0.97, 0.01),
         "chance_order_accuracy_all_named": (0.5, 0.0)},
        {"data": v, "variant": "mean_pool", "event_order_accuracy": (0.52, 0.03),
         "chance_event_order_accuracy": (0.5, 0.0), "captions_ordered": (60.0, 0.0), "CIDEr": (1.0, 0.1)},
        {"data": v, "variant": "temporal_order_blind", "event_order_accuracy": (0.8, 0.03),
         "chance_event_order_accuracy": (0.5, 0.0), "captions_ordered": (60.0, 0.0),
         "order_accuracy_all_named": (0.55, 0.05), "chance_order_accuracy_all_named": (0.5, 0.0),
         "captions_all_named": (25.0, 0.0)},
    ]


def test_claims_on_a_fixed_table():
    lines = claims(_table())

    def verdict(prefix: str) -> str:
        (line,) = [ln for ln in lines if ln.startswith(f"- {prefix}")]
        return line

    assert "REPRODUCED (3.000 vs 2.000)" in verdict("soft attention > mean pooling on shapes (CIDEr)")
    # 0.78 vs 0.7 with stds 0.05 + 0.05: within the spread
    assert "INCONCLUSIVE" in verdict("soft attention > mean pooling on shapes (binding")
    # gaps: longest 0.5 - 0.3 = 0.2 (std 0.02), shortest 0.6 - 0.6 = 0 (std 0.02)
    assert "REPRODUCED (0.200 vs 0.000)" in verdict("attention's BLEU-4 lead")
    assert "REPRODUCED (0.700 vs 0.050)" in verdict("soft attention points")
    assert "INCONCLUSIVE (mean above, within std) (0.630 vs 0.050)" in verdict("soft attention over a 14x14 grid")
    assert "REPRODUCED (7.000 vs 3.000)" in verdict("soft attention > mean pooling on shapes, 14x14 grid (CIDEr)")
    assert "REPRODUCED (0.900 vs 0.850)" in verdict("soft attention > mean pooling on shapes, 14x14 grid (binding")
    assert "not measured" in verdict("soft_14x14 binds colours")  # no chance level in the fixed table
    assert "not measured" in verdict("hard attention points")
    assert "REPRODUCED (0.600 vs 0.500)" in verdict("doubly stochastic")
    assert "INCONCLUSIVE" in verdict("pointing with lambda")
    assert "NOT reproduced (within std) (3.000 vs 3.100)" in verdict("additive vs general")
    assert "REPRODUCED (0.950 vs 0.500)" in verdict("order-aware temporal attention")
    assert "REPRODUCED (0.970 vs 0.500)" in verdict("temporal attention over frames and their residuals")
    assert "not measured" in verdict("temporal attention over 224-px frames")
    assert "REPRODUCED (0.900 vs 0.600)" in verdict("frame residuals (a_i - median frame, standardised) raise event recall")
    # 0.97 vs 0.95: the gap 0.02 is within the summed stds 0.03
    assert "INCONCLUSIVE (right direction, within std)" in verdict("frame residuals (a_i - median frame, standardised) raise event-order")
    # binding against each caption set's own chance: 0.78 vs 0.6 (std 0.07) yes; 0.7 vs 0.69 no
    assert "REPRODUCED (0.780 vs 0.600)" in verdict("soft_additive binds colours")
    assert "INCONCLUSIVE" in verdict("mean_pool binds colours")
    assert "REPRODUCED (0.970 vs 0.500)" in verdict("when it names both events, order-aware")
    # 2 SE over 25 captions = 0.2: 0.55 is within chance
    assert "REPRODUCED (0.550 vs 0.500)" in verdict("when it names both events, the model without")
    assert "REPRODUCED (0.520 vs 0.500)" in verdict("mean_pool is at chance")  # 2 SE = 0.129 over 60 captions
    assert "NOT reproduced (away from chance)" in verdict("temporal_order_blind is at chance")
    assert "REPRODUCED (2.000 vs 1.000)" in verdict("temporal attention > mean pooling")
    # 2x chance: 0.5 vs 0.4 (std 0.05 + 0): 0.1 > 0.05 -> REPRODUCED; pointing 0.35 vs 0.4: NOT
    assert "REPRODUCED (0.500 vs 0.400)" in verdict("temporal attention grounds events: attention")
    assert "NOT reproduced" in verdict("temporal attention grounds events: pointing")


@pytest.mark.slow
def test_reproduce_runs_the_clis_and_writes_the_table(tmp_path):
    """The pipeline (generate, extract, train, evaluate, tabulate, reuse) on data too small to
    learn from: that the models learn what the table measures is test_learns_to_attend.py's job
    (and the README's full runs')."""
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "captioning.reproduce", "--quick", "--seeds", "0", "--variants", "soft_additive",
           "mean_pool", "temporal_attention", "--images", "240", "--videos", "80", "--image-epochs", "8",
           "--video-epochs", "8", "--out", str(out)]
    env = {**os.environ, "MPLBACKEND": "Agg"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    md = (out / "results.md").read_text()
    for row in ("| soft_additive |", "| mean_pool |", "| temporal_attention |"):
        assert row in md
    assert "soft attention > mean pooling on shapes (CIDEr): " in md
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert {(r["data"], r["variant"]) for r in runs} == {
        ("shapes", "soft_additive"), ("shapes", "mean_pool"),
        ("moving_shapes", "temporal_attention"), ("moving_shapes", "mean_pool")}
    for r in runs:  # every metric the table needs was measured, and is a probability / a score
        assert r["CIDEr"] >= 0 and 0 <= r["Bleu_4"] <= 1
        # the image models still learn the words at this size (CIDEr 0.47 / 0.73 measured); the
        # video models on 48 training videos do not (0.008 / 0.0), so only the range is checked there
        assert r["CIDEr"] > 0.1 or r["data"] == "moving_shapes", r
        key = "binding_accuracy" if r["data"] == "shapes" else "event_order_accuracy"
        assert 0 <= r[key] <= 1 and 0 <= r["chance_" + key] <= 1
    soft = next(r for r in runs if r["variant"] == "soft_additive")
    assert 0 < soft["chance_attention_in_object"] < 1 and 0 < soft["attention_in_object"] < 1
    assert "attention_in_object" not in next(r for r in runs if r["variant"] == "mean_pool")
    assert (out / "bleu_by_length.png").stat().st_size > 10_000
    # finished runs are reused: a second call only re-reads their metrics
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and "captioning-train" not in again.stdout
