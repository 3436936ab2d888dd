"""The demo's search as code: every run of conf/reproduce/demo_grid.yaml through the CLIs (faked
here), its record written from what ran, and a recorded run never repeated."""

from __future__ import annotations

import json
from pathlib import Path

from captioning.reproduce.demo_grid import DemoGrid, load_grid


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
