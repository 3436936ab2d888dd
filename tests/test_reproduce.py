"""The reproduction: the catalogue and protocols as config, the runner (runs once, records kept), the
pre-registered verdict rule against hand-computed intervals, the generated report, and a real
(tiny) run through the CLIs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from captioning.errors import ConfigError
from captioning_reproduce.catalogue import (
    REPRODUCE_CONF,
    Claim,
    claims_of,
    load_catalogue,
    load_protocol,
)
from captioning_reproduce.report import claim_values, t_interval, verdict, write_report
from captioning_reproduce.runner import Runner, needed

CATALOGUE = load_catalogue()
PROTOCOL_FILES = sorted(p.stem for p in REPRODUCE_CONF.glob("*.yaml") if p.stem not in ("catalogue", "demo_grid",
                                                                                          "defaults_study"))


def test_catalogue_and_protocols_load_and_agree():
    assert {c.id for c in CATALOGUE.claims if c.headline} == {
        "soft_beats_mean_pool_cider_14x14", "soft_beats_mean_pool_binding_14x14", "pointing_14x14",
        "event_order_224", "mean_pool_at_chance_order_224"}
    own = [c for name in PROTOCOL_FILES for c in claims_of(CATALOGUE, load_protocol(name)) if load_protocol(name).claims]
    used = {v for c in [*CATALOGUE.claims, *own] for v in c.variants}
    assert used == set(CATALOGUE.variants)  # every variant serves a claim of the catalogue or of a protocol
    dev, conf = load_protocol("development"), load_protocol("confirmation")
    assert dev.data_seeds == {"headline": [0], "other": [0]}
    assert len(conf.data_seeds["headline"]) >= 5 and len(conf.data_seeds["other"]) >= 3
    assert 0 not in conf.data_seeds["headline"] + conf.data_seeds["other"]  # fresh data, never developed on
    for key in ("budget", "decode", "select_on_val"):  # the confirmation changes only the data seeds
        assert getattr(dev, key) == getattr(conf, key), key


def test_a_catalogue_naming_an_unknown_store_or_variant_is_one_line(tmp_path):
    bad = tmp_path / "catalogue.yaml"
    bad.write_text("stores: {}\nvariants: {v: {store: nowhere, epochs: 1, overrides: []}}\nclaims: []\n")
    with pytest.raises(ConfigError, match="variant v reads store 'nowhere'"):
        load_catalogue(bad)
    bad.write_text("stores: {}\nvariants: {}\nclaims: [{id: c, text: t, rule: beats, a: x, b: y, metric: CIDEr}]\n")
    with pytest.raises(ConfigError, match="claim c names variant 'x'"):
        load_catalogue(bad)


def test_the_defaults_confirmation_is_fresh_and_trains_the_defaults():
    """Fixed before its runs: data seeds no other protocol or study used, the study's budget, and a
    variant that overrides nothing of the encoder's and the decoder's defaults."""
    protocol = load_protocol("defaults_confirmation")
    seeds = set(protocol.data_seeds["headline"]) | set(protocol.data_seeds["other"])
    others = {s for name in PROTOCOL_FILES if name != "defaults_confirmation"
              for k in ("headline", "other") for s in load_protocol(name).data_seeds[k]}
    assert len(protocol.data_seeds["headline"]) >= 5 and not seeds & (others | {11, 12})
    defaults = CATALOGUE.variants["defaults_soft"]
    assert defaults.store.extract == ("encoder=efficientnet_lite0",) and defaults.overrides == ("model=soft_attention",)
    assert (protocol.budget["hidden"], protocol.budget["lr"], protocol.budget["images"], defaults.epochs) == (128, 2e-3, 3000, 4)
    plan = needed(CATALOGUE, protocol)
    assert sorted(plan) == [13, 14, 15, 16, 17] and [v.name for v in plan[13]] == ["defaults_soft", "before_defaults_soft"]


def test_the_plan_runs_headline_claims_first_on_their_seeds():
    plan = needed(CATALOGUE, load_protocol("confirmation"))
    assert sorted(plan) == [1, 2, 3, 4, 5]
    assert [v.name for v in plan[5]] == ["soft_14x14", "mean_pool_14x14", "temporal_residual_224", "mean_pool_224"]
    assert plan[1][:4] == plan[5] and "hard_additive" in {v.name for v in plan[1]}
    only = needed(CATALOGUE, load_protocol("confirmation"), headline_only=True)
    assert all(len(v) == 4 for v in only.values())


def test_t_interval_by_hand():
    i = t_interval([1.0, 2.0, 3.0])  # mean 2, sample sd 1, t(0.975, 2) = 4.302653
    assert (i.mean, i.n) == (2.0, 3)
    assert i.low == pytest.approx(2 - 4.302653 / math.sqrt(3), abs=1e-5)
    assert i.high == pytest.approx(2 + 4.302653 / math.sqrt(3), abs=1e-5)
    five = t_interval([0.92, 0.95, 0.94, 0.96, 0.93])  # t(0.975, 4) = 2.776445
    sd = math.sqrt(sum((x - 0.94) ** 2 for x in [0.92, 0.95, 0.94, 0.96, 0.93]) / 4)
    assert five.low == pytest.approx(0.94 - 2.776445 * sd / math.sqrt(5), abs=1e-6)
    assert t_interval([0.5]) is None


def _records(rows):
    return [{"variant": v, "data_seed": s, "metrics": m} for v, s, m in rows]


def test_verdicts_of_each_rule():
    beats = Claim("b", "t", "beats", "a", "CIDEr", b="m")
    recs = _records([("a", s, {"CIDEr": 7 + s * 0.1}) for s in (1, 2, 3)] + [("m", s, {"CIDEr": 3.0}) for s in (1, 2, 3)])
    values = claim_values(beats, recs, [1, 2, 3])
    assert values == pytest.approx({1: 4.1, 2: 4.2, 3: 4.3})
    assert verdict(beats, t_interval(list(values.values()))) == "CONFIRMED"
    reversed_ = claim_values(Claim("r", "t", "beats", "m", "CIDEr", b="a"), recs, [1, 2, 3])
    assert verdict(beats, t_interval(list(reversed_.values()))) == "REFUTED"
    assert verdict(beats, t_interval([0.5, -0.4, 0.1])) == "INCONCLUSIVE"
    at_least = Claim("l", "t", "at_least", "a", "event_order_accuracy", threshold=0.9)
    assert verdict(at_least, t_interval([0.94, 0.95, 0.93, 0.94, 0.96])) == "CONFIRMED"
    assert verdict(at_least, t_interval([0.80, 0.82, 0.81])) == "REFUTED"
    assert verdict(at_least, t_interval([0.85, 0.97, 0.92])) == "INCONCLUSIVE"
    chance = Claim("c", "t", "at_chance", "p", "event_order_accuracy", margin=0.05)
    recs = _records([("p", s, {"event_order_accuracy": 0.05 + d, "chance_event_order_accuracy": 0.05})
                     for s, d in ((1, 0.01), (2, -0.01), (3, 0.0), (4, 0.005), (5, -0.005))])
    values = claim_values(chance, recs, [1, 2, 3, 4, 5])
    assert values == pytest.approx({1: 0.01, 2: -0.01, 3: 0.0, 4: 0.005, 5: -0.005})
    assert verdict(chance, t_interval(list(values.values()))) == "CONFIRMED"
    assert verdict(chance, t_interval([0.30, 0.31, 0.29])) == "REFUTED"
    times = Claim("x", "t", "times_chance", "a", "pointing_accuracy", factor=2.0)
    recs = _records([("a", 1, {"pointing_accuracy": 0.5, "chance_pointing_accuracy": 0.2})])
    assert claim_values(times, recs, [1]) == pytest.approx({1: 0.1})
    grows = Claim("g", "t", "lead_grows", "a", "Bleu_4_longest", b="m", metric_low="Bleu_4_shortest")
    recs = _records([("a", 1, {"Bleu_4_longest": 0.9, "Bleu_4_shortest": 0.8}),
                     ("m", 1, {"Bleu_4_longest": 0.5, "Bleu_4_shortest": 0.6})])
    assert claim_values(grows, recs, [1]) == pytest.approx({1: 0.2})  # (0.9 - 0.5) - (0.8 - 0.6)
    assert verdict(grows, None) == "-"  # one data seed: no interval, no verdict


def test_the_runner_runs_once_selects_on_val_and_keeps_a_record(tmp_path):
    calls = []
    val_cider = {"best.ckpt": 7.3, "last.ckpt": 7.8}  # the last checkpoint decodes val better

    def fake_cli(module, *args):
        calls.append((module, args))
        opt = dict(a.split("=", 1) for a in args if "=" in a)
        if module == "train":
            run = Path(opt["hydra.run.dir"])
            run.mkdir(parents=True, exist_ok=True)
            (run / "train_summary.json").write_text(json.dumps({
                "best_checkpoint": "best.ckpt", "last_checkpoint": "last.ckpt", "fingerprint": "abc",
                "provenance": {"git_commit": "0123456789abcdef"}}))
        elif module == "evaluate":
            ev = Path(opt["output_dir"])
            ev.mkdir(parents=True)
            cider = val_cider[opt["ckpt_path"]] if opt["split"] == "val" else 5.0
            (ev / "metrics.json").write_text(json.dumps({"CIDEr": cider, "Bleu_4": 0.5}))
            (ev / "report.json").write_text(json.dumps({"structure": {"event_order_accuracy": 0.93,
                                                                      "chance_event_order_accuracy": 0.45}}))
            (ev / "predictions.json").write_text(json.dumps([{"attention": [[0.5, 0.5], [1.0, 0.0]]}]))

    protocol = load_protocol("development")
    runner = Runner(CATALOGUE, protocol, tmp_path / "work", tmp_path / "runs", cli=fake_cli)
    variant = CATALOGUE.variants["temporal_residual_224"]
    [path] = runner.run({0: [variant]})
    modules = [m for m, _ in calls]
    assert modules == ["generate", "extract", "train", "evaluate", "evaluate", "evaluate"]
    train = dict(a.split("=", 1) for a in calls[2][1] if "=" in a)
    assert train["seed"] == "0" and train["trainer.max_epochs"] == "6" and train["model.residual"] == "median"
    assert train["features_dir"].endswith("d0/data/moving_shapes/features/frames_224")
    evals = [dict(a.split("=", 1) for a in args if "=" in a) for m, args in calls if m == "evaluate"]
    assert [e["split"] for e in evals] == ["val", "val", "test"] and evals[2]["ckpt_path"] == "last.ckpt"
    assert all(e["decode.block_trigrams"] == "true" for e in evals)  # val decodes as test does
    record = json.loads(path.read_text())
    assert path == tmp_path / "runs" / "development" / "temporal_residual_224" / "d0.json"
    assert record["checkpoint"] == "last.ckpt" and record["val_CIDEr"] == {"best.ckpt": 7.3, "last.ckpt": 7.8}
    assert record["metrics"]["event_order_accuracy"] == 0.93 and record["fingerprint"] == "abc"
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(2)  # coverage [1.5, 0.5]
    assert record["metrics"]["coverage_entropy"] == pytest.approx(h)
    calls.clear()
    assert runner.run({0: [variant]}) == [] and calls == []  # a recorded run is never repeated


def test_the_report_is_generated_from_records(tmp_path):
    protocol = load_protocol("confirmation")
    recs = []
    for s in (1, 2, 3, 4, 5):
        recs.append({"variant": "temporal_residual_224", "data": "moving_shapes", "data_seed": s,
                     "metrics": {"event_order_accuracy": 0.93 + 0.01 * (s % 3), "CIDEr": 7.5},
                     "train_provenance": {"git_commit": "feedbeef00"}})
    dev = [{"variant": "temporal_residual_224", "data": "moving_shapes", "data_seed": 0,
            "metrics": {"event_order_accuracy": 0.942}}]
    path = write_report(CATALOGUE, protocol, recs, tmp_path, dev)
    text = path.read_text()
    row = next(line for line in text.splitlines() if "names the events in order" in line)
    assert "CONFIRMED" in row and "(n=5)" in row and "0.942" in row  # the development value beside
    assert "feedbeef00" in text and "| temporal_residual_224 | 1,2,3,4,5 |" in text
    verdicts = {c["id"]: c["verdict"] for c in json.loads(path.with_suffix(".json").read_text())["claims"]}
    assert verdicts["event_order_224"] == "CONFIRMED" and verdicts["pointing_14x14"] == "pending (0 of 5 seeds)"
    partial = write_report(CATALOGUE, protocol, recs[:2], tmp_path / "partial", dev)
    verdicts = {c["id"]: c["verdict"] for c in json.loads(partial.with_suffix(".json").read_text())["claims"]}
    assert verdicts["event_order_224"] == "pending (2 of 5 seeds)"  # no verdict on part of the seeds


def test_the_development_report_has_no_verdict_column(tmp_path):
    recs = [{"variant": "temporal_residual_224", "data": "moving_shapes", "data_seed": 0,
             "metrics": {"event_order_accuracy": 0.942}}]
    text = write_report(CATALOGUE, load_protocol("development"), recs, tmp_path).read_text()
    assert "| claim | tested quantity | development: value (data seeds) |" in text and "verdict |" not in text
    row = next(line for line in text.splitlines() if "names the events in order" in line)
    assert row.endswith("| 0.942 (n=1) |")
    assert "by_length.png" not in text  # no shapes run with scores by length: no figure


def test_the_report_draws_bleu_and_cider_by_length_of_each_shapes_variant(tmp_path):
    bins = [{"bin": "short", "count": 4, "Bleu_4": 0.9, "CIDEr": 8.0},
            {"bin": "long", "count": 3, "Bleu_4": 0.7, "CIDEr": 6.0}]
    recs = [{"variant": v, "data": "shapes", "data_seed": 0, "metrics": {"CIDEr": 7.0}, "by_length": bins}
            for v in ("soft_14x14", "mean_pool_14x14")]
    text = write_report(CATALOGUE, load_protocol("development"), recs, tmp_path).read_text()
    assert "![BLEU-4 and CIDEr by reference length](development_by_length.png)" in text
    assert (tmp_path / "development_by_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_tiny_protocol_runs_through_the_clis(tmp_path):
    """Two image variants on one fresh data seed: data, store, training, test, record, report."""
    protocol = tmp_path / "tiny.yaml"
    protocol.write_text("name: tiny\ndata_seeds: {headline: [3], other: [3]}\n"
                        "budget: {images: 90, videos: 8, hidden: 32, lr: 1.0e-3}\n"
                        "decode: {shapes: [decode=beam, decode.beam_size=2], moving_shapes: [decode=beam]}\n"
                        "select_on_val: false\nverdict: {confidence: 0.95}\n")  # selection: the fake-CLI test
    env = {**os.environ, "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-m", "captioning_reproduce", "--protocol", str(protocol),
                           "--variants", "soft_additive", "mean_pool", "--work", str(tmp_path / "work"),
                           "--results", str(tmp_path / "results")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("soft_additive", "mean_pool"):
        record = json.loads((tmp_path / "results" / "runs" / "tiny" / name / "d3.json").read_text())
        assert record["data_seed"] == 3 and record["metrics"]["CIDEr"] >= 0 and record["fingerprint"]
        assert record["provenance"]["version"] and record["checkpoint"].endswith(".ckpt")
    generated = json.loads((tmp_path / "work" / "tiny" / "d3" / "data" / "shapes" / "generated.json").read_text())
    assert generated["params"]["seed"] == 3  # a fresh dataset per data seed
    report = (tmp_path / "results" / "tiny.md").read_text()
    assert "soft attention > mean pooling on shapes, 7x7 grid (CIDEr)" in report
