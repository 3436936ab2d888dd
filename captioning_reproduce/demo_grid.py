"""``python -m captioning_reproduce.demo_grid``: the search behind ``make demo``'s defaults, rerun.

``conf/reproduce/demo_grid.yaml`` lists the runs of docs/demo.md's "What was tried": one
``shapes`` dataset, the feature stores (grids) and per run its ``captioning-train`` overrides.
Each run is trained and decoded on val (settings were chosen on val only) through the real CLIs,
and its record ``docs/results/demo/<run>.json`` is written here from what ran: the store and its
grid as its metadata gives it, the train overrides as passed, the checkpoint (the best by the
training's greedy val CIDEr), the val metrics, binding and grounding with their chance levels,
seconds measured, and both provenances.  A run whose record exists is never repeated.  Then the
report ``docs/results/demo_grid.md`` is written from the records (``--report``: from them alone).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from captioning.config import CONF_DIR
from captioning.provenance import provenance
from captioning.utils.io import atomic_write_json, read_json
from captioning_reproduce.demo_report import load_demo_records, write_demo_report
from captioning_reproduce.runner import GROUNDING_KEYS, STRUCTURE_KEYS, Cli, run_cli

GRID_CONF = Path(CONF_DIR) / "reproduce" / "demo_grid.yaml"
QUIET = ["trainer=cpu", "callbacks.progress=null", "logger=csv", "trainer.enable_progress_bar=false"]


def load_grid(path: str | Path = GRID_CONF) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[return-value]


class DemoGrid:
    """Runs the grid's missing runs; ``work``: data, stores, checkpoints; ``records``: the JSONs."""

    def __init__(self, grid: dict[str, Any], work: Path, records: Path, cli: Cli = run_cli) -> None:
        self.grid, self.work, self.records, self.cli = grid, Path(work), Path(records), cli
        self.root = self.work / "data" / "shapes"

    def store_dir(self, store: str) -> Path:
        return self.root / "features" / store

    def data_args(self, store: str) -> list[str]:
        d = self.grid["data"]
        return ["data=shapes", f"data.root={self.root}", f"data.num_items={d['images']}",
                f"features_dir={self.store_dir(store)}"]

    def run(self, only: list[str] | None = None) -> list[Path]:
        written = []
        d = self.grid["data"]
        for name, spec in self.grid["runs"].items():
            if (only and name not in only) or (self.records / f"{name}.json").is_file():
                continue
            self.cli("generate", "dataset=shapes", f"num_items={d['images']}", f"seed={d['seed']}", f"root={self.root}")
            store = self.grid["stores"][spec["store"]]
            self.cli("extract", *self.data_args(spec["store"]), *store["extract"], "trainer=cpu",
                     "trainer.enable_progress_bar=false")
            written.append(self.run_one(name, spec))
        return written

    def run_one(self, name: str, spec: dict[str, Any]) -> Path:
        run, ev = self.work / "runs" / name, self.work / "runs" / name / "eval_val"
        overrides = [*self.grid["common"], *spec["overrides"]]
        clock = time.time()
        if not (run / "train_summary.json").is_file():
            self.cli("train", *self.data_args(spec["store"]), *overrides, *QUIET, f"hydra.run.dir={run}")
        trained = time.time() - clock
        summary = read_json(run / "train_summary.json", "training summary")
        ckpt = summary.get("best_checkpoint") or summary["last_checkpoint"]
        if not (ev / "metrics.json").is_file():
            self.cli("evaluate", f"ckpt_path={ckpt}", "split=val", *self.grid["decode"], f"output_dir={ev}",
                     "trainer.enable_progress_bar=false", f"hydra.run.dir={ev}_hydra")
        seconds = {"train": round(trained, 1), "evaluate": round(time.time() - clock - trained, 1)}
        path = self.records / f"{name}.json"
        atomic_write_json(path, self.record(name, spec, overrides, ckpt, ev, summary, seconds))
        return path

    def record(self, name: str, spec: dict[str, Any], overrides: list[str], ckpt: str, ev: Path,
               summary: dict[str, Any], seconds: dict[str, float]) -> dict[str, Any]:
        meta = read_json(self.store_dir(spec["store"]) / "meta.json", "feature store metadata")
        report = read_json(ev / "report.json", "evaluation report")
        metrics = read_json(ev / "metrics.json", "metrics")
        st, g = report.get("structure") or {}, report.get("grounding") or {}
        grid = "x".join(str(x) for x in (*(meta.get("grid") or [meta.get("positions")]), meta.get("dim")))
        return {
            "run": name, "store": spec["store"], "extract": self.grid["stores"][spec["store"]]["extract"],
            "grid": grid, "train_overrides": ["data=shapes", *overrides], "data": self.grid["data"],
            "split": "val", "decode": self.grid["decode"], "checkpoint": Path(ckpt).name,
            "metrics": {k: metrics[k] for k in ("Bleu_4", "CIDEr", "ROUGE_L") if k in metrics},
            **{k: st[k] for k in STRUCTURE_KEYS if st.get(k) is not None},
            **{k: g[k] for k in GROUNDING_KEYS if g.get(k) is not None},
            "fingerprint": summary.get("fingerprint"), "train_provenance": summary.get("provenance"),
            "provenance": provenance(), "seconds": seconds,
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=None, help="only these runs")
    parser.add_argument("--work", default="results/demo_grid", help="data, stores and checkpoints")
    parser.add_argument("--records", default="docs/results/demo", help="the per-run records")
    parser.add_argument("--report", action="store_true", help="write the report from the records, run nothing")
    args = parser.parse_args(argv)
    grid = load_grid()
    os.environ.setdefault("OMP_NUM_THREADS", str(grid.get("threads", 1)))  # as the search ran
    records = Path(args.records)
    if not args.report:
        for path in DemoGrid(grid, Path(args.work), records).run(args.runs):
            print(f"written: {path}", flush=True)
    report = write_demo_report(grid, load_demo_records(records), records.parent)
    print(report.read_text(encoding="utf-8"))
    print(f"written: {report}")


if __name__ == "__main__":
    main()
