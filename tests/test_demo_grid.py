"""The demo's search as code: every run of conf/reproduce/demo_grid.yaml through the CLIs (faked
here), its record written from what ran, and a recorded run never repeated."""

from __future__ import annotations

import json
from pathlib import Path

from captioning_reproduce.demo_grid import DemoGrid, load_grid, main
from captioning_reproduce.demo_report import write_demo_report


def test_a_grid_run_trains_decodes_val_and_writes_its_record(tmp_path):
    calls = []

    def fake_cli(module, *args):
        calls.append((module, args))
        opt = dict(a.split("=", 1) for a in args if "=" in a)
        if module == "extract":
            store = Path(opt["features_dir"])
            store.mkdir(parents=True, exist_ok=True)
            (store / "meta.json").write_text(json.dumps({"grid": [14, 14], "dim": 112, "positions": 196}))
        elif module == "train":
            run = Path(opt["hydra.run.dir"])
            run.mkdir(parents=True)
            (run / "train_summary.json").write_text(json.dumps({
                "best_checkpoint": str(run / "checkpoints" / "epoch003-cider7.9.ckpt"), "last_checkpoint": "x",
                "fingerprint": "f00", "provenance": {"git_commit": "abc", "git_dirty": False}}))
        elif module == "evaluate":
            ev = Path(opt["output_dir"])
            ev.mkdir(parents=True)
            (ev / "metrics.json").write_text(json.dumps({"CIDEr": 7.9, "Bleu_4": 0.95, "ROUGE_L": 0.96, "Bleu_1": 1}))
            (ev / "report.json").write_text(json.dumps({
                "structure": {"binding_accuracy": 0.99, "chance_binding_accuracy": 0.52},
                "grounding": {"pointing_accuracy": 0.89, "chance_pointing_accuracy": 0.06}}))

    grid = load_grid()
    assert len(grid["runs"]) == 17 and {r["store"] for r in grid["runs"].values()} <= set(grid["stores"])
    runner = DemoGrid(grid, tmp_path / "work", tmp_path / "records", cli=fake_cli)
    [path] = runner.run(["L_learned_seed3"])
    record = json.loads(path.read_text())
    assert path.name == "L_learned_seed3.json" and record["grid"] == "14x14x112" and record["split"] == "val"
    assert "seed=3" in record["train_overrides"] and "model.position_code=learned" in record["train_overrides"]
    assert record["checkpoint"] == "epoch003-cider7.9.ckpt" and record["metrics"] == {
        "Bleu_4": 0.95, "CIDEr": 7.9, "ROUGE_L": 0.96}
    assert record["pointing_accuracy"] == 0.89 and record["chance_binding_accuracy"] == 0.52
    assert set(record["seconds"]) == {"train", "evaluate"} and record["provenance"]["version"]
    evaluate = dict(a.split("=", 1) for a in calls[-1][1] if "=" in a)
    assert calls[-1][0] == "evaluate" and evaluate["split"] == "val" and evaluate["decode.beam_size"] == "3"
    calls.clear()
    assert runner.run(["L_learned_seed3"]) == [] and calls == []  # recorded: never repeated


def _record(run: str, overrides: list[str], pointing: float, cider: float) -> dict:
    return {"run": run, "store": "efficientnet_lite0_stride16", "grid": "14x14x112",
            "train_overrides": ["data=shapes", "model=soft_attention", *overrides],
            "checkpoint": "epoch003.ckpt", "metrics": {"Bleu_4": 0.9, "CIDEr": cider, "ROUGE_L": 0.95},
            "binding_accuracy": 0.99, "chance_binding_accuracy": 0.5204,
            "pointing_accuracy": pointing, "chance_pointing_accuracy": 0.0617,
            "train_provenance": {"git_commit": "0123456789abcdef", "git_dirty": run == "b", "threads": 1},
            "seconds": {"train": 95.4, "evaluate": 12.0}}


def test_the_demo_report_tables_runs_and_ranges_over_training_seeds(tmp_path):
    grid = {"data": {"images": 3000, "seed": 0}, "common": ["model=soft_attention"], "decode": ["decode=beam"],
            "runs": {"a": {"overrides": ["optim.lr=2e-3"]}, "b": {"overrides": ["optim.lr=2e-3", "seed=1"]},
                     "c": {"overrides": ["optim.lr=1e-3"]}, "d": {"overrides": ["optim.lr=1e-3", "seed=7"]}}}
    records = [_record("c", ["optim.lr=1e-3"], 0.28, 5.25), _record("a", ["optim.lr=2e-3"], 0.875, 8.1),
               _record("b", ["optim.lr=2e-3", "seed=1"], 0.62, 7.0)]
    text = write_demo_report(grid, records, tmp_path).read_text()
    assert "from 3 of the 4 runs" in text and "trained at commits 0123456789; 1 of them from a working tree" in text
    assert "uncommitted changes, so their code is that commit plus edits no record keeps: b; 1 thread per process)" in text
    assert "| a | 14x14x112 | optim.lr=2e-3 | 0 | 0.900 | 8.100 | 0.990 (0.520) | 0.875 (0.062) | epoch003.ckpt |" in text
    assert "| b | 14x14x112 | optim.lr=2e-3 | 1 |" in text
    assert "| d | - | optim.lr=1e-3 seed=7 | - |" + " not run yet |" * 5 in text
    # a and b differ only by their training seed: one setting, ranges over seeds 0 and 1
    settings = text.split("## Settings")[1]
    assert settings.index("optim.lr=2e-3 |") < settings.index("optim.lr=1e-3 |")  # the grid's order
    assert "| efficientnet_lite0_stride16: optim.lr=2e-3 | 0,1 | 0.900 | 7.000-8.100 | 0.990 | 0.620-0.875 |" in text
    assert "| efficientnet_lite0_stride16: optim.lr=1e-3 | 0 | 0.900 | 5.250 | 0.990 | 0.280 |" in text


def test_the_demo_report_is_written_from_the_records_alone(tmp_path, capsys):
    records = tmp_path / "demo"
    records.mkdir()
    (records / "make_demo").mkdir()  # make demo's own folder is not a grid run
    grid = load_grid()
    name = next(iter(grid["runs"]))
    (records / f"{name}.json").write_text(json.dumps(_record(name, grid["runs"][name]["overrides"], 0.5, 6.0)))
    main(["--report", "--records", str(records), "--work", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()  # nothing ran
    text = (tmp_path / "demo_grid.md").read_text()
    assert f"from 1 of the {len(grid['runs'])} runs" in text and f"| {name} | 14x14x112 |" in text
    assert "written: " in capsys.readouterr().out
