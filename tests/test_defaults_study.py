"""The defaults study as code (conf/reproduce/defaults_study.yaml): its candidates are every store x
code, each run goes through the CLIs (faked here) on val only and writes its record from what ran, a
recorded run is never repeated, and the decision is the pre-registered rule applied to the records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captioning_reproduce.catalogue import load_protocol
from captioning_reproduce.defaults_report import decide_image, decide_video, write_study_report
from captioning_reproduce.defaults_study import DefaultsStudy, candidates, load_study, main

CFG = load_study()


def test_the_study_crosses_the_grids_and_codes_on_fresh_data_seeds():
    image = {(c.store, c.code) for c in candidates(CFG, "image")}
    stores = CFG["studies"]["image"]["stores"]
    assert len(image) == 9 and set(CFG["studies"]["image"]["codes"]) == {"none", "sinusoidal", "learned"}
    assert stores["lite0_7x7"][1:] == ["encoder.image_size=224", "encoder.layer=null"]
    assert stores["lite0_448"][1:] == ["encoder.image_size=448", "encoder.layer=null"]
    assert stores["lite0_stride16"][1:] == ["encoder.image_size=224", "encoder.layer=-2"]
    assert {c.code for c in candidates(CFG, "video")} == {"none", "sinusoidal", "learned"}
    used = {s for name in ("development", "confirmation", "confirmation_probes")
            for seeds in load_protocol(name).data_seeds.values() for s in seeds}
    assert len(CFG["data_seeds"]) >= 2 and not used & set(CFG["data_seeds"]), "the study's data seeds are fresh"


def _fake_cli(calls: list):
    def cli(module, *args):
        calls.append((module, args))
        opt = dict(a.split("=", 1) for a in args if "=" in a)
        if module == "extract":
            store = Path(opt["features_dir"])
            store.mkdir(parents=True, exist_ok=True)
            (store / "meta.json").write_text(json.dumps({"kind": "image", "grid": [14, 14], "dim": 1280}))
        elif module == "train":
            run = Path(opt["hydra.run.dir"])
            run.mkdir(parents=True)
            (run / "train_summary.json").write_text(json.dumps({
                "best_checkpoint": str(run / "checkpoints" / "epoch003.ckpt"), "last_checkpoint": "x",
                "fingerprint": "f00", "provenance": {"git_commit": "abc", "git_dirty": False, "threads": 1}}))
        elif module == "evaluate":
            ev = Path(opt["output_dir"])
            ev.mkdir(parents=True)
            (ev / "metrics.json").write_text(json.dumps({"CIDEr": 7.9, "Bleu_4": 0.95, "ROUGE_L": 0.96}))
            (ev / "report.json").write_text(json.dumps({
                "structure": {"binding_accuracy": 0.99, "chance_binding_accuracy": 0.52},
                "grounding": {"pointing_accuracy": 0.91, "chance_pointing_accuracy": 0.06}}))
            (ev / "probes.json").write_text(json.dumps({"probes": {
                "order": {"accuracy": 0.97, "chance": 0.5, "items": 3}, "binding": {"accuracy": 0.9, "chance": 0.5}}}))
    return cli


def test_a_study_run_trains_decodes_val_and_writes_its_record_once(tmp_path):
    calls: list = []
    study = DefaultsStudy(CFG, tmp_path / "work", tmp_path / "records", cli=_fake_cli(calls))
    c = next(c for c in candidates(CFG, "image") if c.name == "lite0_448-learned")
    study.prepare(c, 11)
    path = study.run_one(c, 11)
    record = json.loads(path.read_text())
    assert path == tmp_path / "records" / "image" / "lite0_448-learned" / "d11.json"
    assert record["split"] == "val" and record["grid"] == "14x14x1280" and record["data_seed"] == 11
    assert {"model.position_code=learned", "seed=11", "optim.lr=2e-3"} <= set(record["train_overrides"])
    assert record["metrics"]["pointing_accuracy"] == 0.91 and record["metrics"]["probe_order_accuracy"] == 0.97
    assert record["metrics"]["chance_probe_binding_accuracy"] == 0.5
    modules = [m for m, _ in calls]
    assert modules == ["generate", "extract", "train", "evaluate"]
    ev = dict(a.split("=", 1) for a in calls[-1][1] if "=" in a)
    assert ev["split"] == "val" and ev["probes"] == "[binding,order]" and [m for m, _ in calls].count("evaluate") == 1
    gen = dict(a.split("=", 1) for a in calls[0][1])
    assert (gen["seed"], gen["num_items"]) == ("11", "3000")


def test_a_recorded_run_is_never_repeated(tmp_path):
    calls: list = []
    study = DefaultsStudy(CFG, tmp_path / "work", tmp_path / "records", cli=_fake_cli(calls))
    for c in candidates(CFG, "image"):
        if c.name != "lite0_7x7-none":
            study.record_path(c, 11).parent.mkdir(parents=True)
            study.record_path(c, 11).write_text("{}")
    [path] = study.run(["image"], [11])
    assert path.parent.name == "lite0_7x7-none" and [m for m, _ in calls].count("train") == 1
    calls.clear()
    assert study.run(["image"], [11]) == [] and calls == []


def _rec(study: str, name: str, seed: int, metric: float, cider: float) -> dict:
    key = "pointing_accuracy" if study == "image" else "probe_order_accuracy"
    return {"study": study, "candidate": name, "data_seed": seed, "grid": "g", "seconds": {"train": 1.0},
            "metrics": {key: metric, "CIDEr": cider}, "train_provenance": {"git_commit": "abc", "threads": 1}}


def _image(table: dict[str, tuple[float, float, float]]) -> list[dict]:
    """candidate -> (pointing d11, pointing d12, CIDEr): every other candidate at 0.30 pointing, CIDEr 8."""
    out = []
    for c in candidates(CFG, "image"):
        p11, p12, cider = table.get(c.name, (0.30, 0.30, 8.0))
        out += [_rec("image", c.name, 11, p11, cider), _rec("image", c.name, 12, p12, cider)]
    return out


def test_the_image_rule_gates_then_prefers_the_last_stage_then_the_simpler_code():
    # the stride-16 stage points best, but a last-stage grid grounds: the last stage is chosen
    d = decide_image(CFG, _image({"lite0_stride16-learned": (0.97, 0.96, 8.1), "lite0_448-learned": (0.90, 0.88, 8.0),
                                  "lite0_448-sinusoidal": (0.89, 0.88, 8.0), "lite0_448-none": (0.95, 0.84, 8.0)}))
    assert d.chosen == "lite0_448-sinusoidal" and d.bar_met  # within 0.02 of learned, earlier; none fails d12
    # a code beyond the tie wins; a 7x7 candidate through the gate wins over 448
    assert decide_image(CFG, _image({"lite0_448-learned": (0.95, 0.95, 8.0),
                                     "lite0_448-sinusoidal": (0.89, 0.88, 8.0)})).chosen == "lite0_448-learned"
    assert decide_image(CFG, _image({"lite0_7x7-learned": (0.86, 0.86, 8.0),
                                     "lite0_448-learned": (0.95, 0.95, 8.0)})).chosen == "lite0_7x7-learned"
    # pointing bought with captions below 0.95 x the best CIDEr does not pass
    d = decide_image(CFG, _image({"lite0_448-learned": (0.95, 0.95, 7.0), "lite0_stride16-none": (0.9, 0.9, 8.0)}))
    assert d.chosen == "lite0_stride16-none"
    # nothing through the gate: the highest minimum pointing, and the bar is said not met
    d = decide_image(CFG, _image({"lite0_448-learned": (0.84, 0.80, 8.0), "lite0_7x7-learned": (0.99, 0.70, 8.0)}))
    assert d.chosen == "lite0_448-learned" and not d.bar_met


def test_no_decision_on_part_of_the_runs():
    records = _image({})[:-1]
    d = decide_image(CFG, records)
    assert d.chosen is None and d.reasons == ["pending (17 of 18 runs recorded): no decision on part of them"]


@pytest.mark.parametrize(("learned", "chosen"), [((0.99, 0.99), "frames_96-learned"), ((0.99, 0.95), "frames_96-sinusoidal")])
def test_the_video_rule_keeps_the_time_code_unless_another_beats_it_on_every_seed(learned, chosen):
    table = {"frames_96-none": (0.50, 0.50), "frames_96-sinusoidal": (0.94, 0.94), "frames_96-learned": learned}
    records = [_rec("video", n, s, v[i], 5.0) for n, v in table.items() for i, s in enumerate((11, 12))]
    assert decide_video(CFG, records).chosen == chosen


def test_the_report_is_written_from_the_records_alone(tmp_path, capsys):
    records = tmp_path / "defaults"
    for r in _image({"lite0_448-sinusoidal": (0.91, 0.90, 8.0)}):
        path = records / r["study"] / r["candidate"] / f"d{r['data_seed']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(r))
    main(["--report", "--records", str(records), "--work", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()  # nothing ran
    text = (tmp_path / "defaults_study.md").read_text()
    assert "from 18 per-run records" in text and "Decision: **lite0_448-sinusoidal**" in text
    assert "| lite0_448-sinusoidal | g | 0.910 | 0.900 | 8.000 | 8.000 |" in text
    assert "Decision: **pending**" in text  # the video study has no records
    assert write_study_report(CFG, [], tmp_path).read_text().count("pending (0 of") == 2
    assert "written: " in capsys.readouterr().out


def test_the_configured_defaults_are_the_studys_decision():
    """What ``captioning-extract ... encoder=efficientnet_lite0`` and ``model=soft_attention`` give by
    default is the image rule's decision from the committed records (docs/results/defaults_study.md),
    and ``model=temporal_attention``'s time code the video rule's; it fails when a config says
    otherwise, and while the study is incomplete."""
    import yaml
    from conftest import REPO
    from hydra import compose, initialize_config_dir

    import captioning.cli.extract  # noqa: F401  (registers the extract schema)
    import captioning.cli.train  # noqa: F401  (registers the train and decoder schemas)
    from captioning_reproduce.defaults_report import load_study_records

    records = load_study_records(REPO / "docs" / "results" / "defaults")
    decision, video = decide_image(CFG, records), decide_video(CFG, records)
    assert decision.chosen is not None and decision.bar_met, decision.reasons
    assert video.chosen is not None, video.reasons
    store, code = decision.chosen.rsplit("-", 1)
    want = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in CFG["studies"]["image"]["stores"][store])}
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        extract, train = compose("extract"), compose("train", overrides=["model=soft_attention"])
        temporal = compose("train", overrides=["model=temporal_attention"])
    got = {"encoder": extract.encoder.name, **{f"encoder.{k}": extract.encoder[k] for k in ("image_size", "layer")}}
    assert got == want
    assert train.model.position_code == code
    assert temporal.model.position_code == video.chosen.rsplit("-", 1)[1]
