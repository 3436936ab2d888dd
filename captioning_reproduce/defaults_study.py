"""``python -m captioning_reproduce.defaults_study``: the study behind the default grid and codes.

``conf/reproduce/defaults_study.yaml`` (fixed before its runs) names the fresh data seeds, per
study (``image``: shapes, ``video``: moving_shapes) the feature stores and position codes whose
every pair is a candidate, the recipe every candidate trains and decodes with, and the decision
rule.  Each run goes through the real CLIs (``captioning-generate``, ``-extract``, ``-train``,
``-evaluate``) on the validation split only, and its record
``docs/results/defaults/<study>/<store>-<code>/d<seed>.json`` is written here from what ran (the
store's grid from its metadata, the overrides as passed, the checkpoint, val metrics, structure,
grounding and probes with their chance levels, seconds, provenance).  A run whose record exists is
never repeated.  Then ``docs/results/defaults_study.md`` is generated from the records, with the
rule's decision (``captioning_reproduce.defaults_report``; ``--report``: from the records alone).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from captioning.config import CONF_DIR
from captioning.provenance import provenance
from captioning.utils.io import atomic_write_json, read_json
from captioning_reproduce.defaults_report import load_study_records, write_study_report
from captioning_reproduce.runner import GROUNDING_KEYS, STRUCTURE_KEYS, Cli, run_cli

STUDY_CONF = Path(CONF_DIR) / "reproduce" / "defaults_study.yaml"
QUIET = ["trainer=cpu", "callbacks.progress=null", "logger=csv", "trainer.enable_progress_bar=false"]


@dataclass(frozen=True)
class Candidate:
    """One store x one position code of a study."""

    study: str
    store: str
    code: str

    @property
    def name(self) -> str:
        return f"{self.store}-{self.code}"


def load_study(path: str | Path = STUDY_CONF) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[return-value]


def candidates(cfg: dict[str, Any], study: str | None = None) -> list[Candidate]:
    """Every store x code of each study (or of ``study``), stores in the rule's order."""
    return [Candidate(name, store, code) for name, s in cfg["studies"].items() if study in (None, name)
            for store in s["stores"] for code in s["codes"]]


class DefaultsStudy:
    """Runs the study's missing runs; ``work``: data, stores, checkpoints; ``records``: the JSONs."""

    def __init__(self, cfg: dict[str, Any], work: Path, records: Path, cli: Cli = run_cli) -> None:
        self.cfg, self.work, self.records, self.cli = cfg, Path(work), Path(records), cli

    def record_path(self, c: Candidate, seed: int) -> Path:
        return self.records / c.study / c.name / f"d{seed}.json"

    def data_root(self, c: Candidate, seed: int) -> Path:
        return self.work / f"d{seed}" / "data" / self.cfg["studies"][c.study]["data"]

    def store_dir(self, c: Candidate, seed: int) -> Path:
        return self.data_root(c, seed) / "features" / c.store

    def data_args(self, c: Candidate, seed: int) -> list[str]:
        s = self.cfg["studies"][c.study]
        return [f"data={s['data']}", f"data.root={self.data_root(c, seed)}", f"data.seed={seed}",
                f"data.num_items={s['items']}", f"features_dir={self.store_dir(c, seed)}"]

    def run(self, studies: list[str] | None = None, seeds: list[int] | None = None) -> list[Path]:
        """Every run without a record: data seed by data seed, the data and store first."""
        written = []
        for seed in self.cfg["data_seeds"]:
            if seeds and seed not in seeds:
                continue
            for c in candidates(self.cfg):
                if (studies and c.study not in studies) or self.record_path(c, seed).is_file():
                    continue
                self.prepare(c, seed)
                written.append(self.run_one(c, seed))
        return written

    def prepare(self, c: Candidate, seed: int) -> None:
        """Generate the data seed's dataset and extract the candidate's store (each CLI skips what is done)."""
        s = self.cfg["studies"][c.study]
        self.cli("generate", f"dataset={s['data']}", f"num_items={s['items']}", f"seed={seed}",
                 f"root={self.data_root(c, seed)}")
        self.cli("extract", *self.data_args(c, seed), *s["stores"][c.store], "trainer=cpu",
                 "trainer.enable_progress_bar=false")

    def train_overrides(self, c: Candidate, seed: int) -> list[str]:
        """The candidate's ``captioning-train`` overrides, less where the files are."""
        return [*self.cfg["studies"][c.study]["train"], f"model.position_code={c.code}", f"seed={seed}"]

    def run_one(self, c: Candidate, seed: int) -> Path:
        run = self.work / f"d{seed}" / "runs" / c.study / c.name
        ev = run / "eval_val"
        clock = time.time()
        if not (run / "train_summary.json").is_file():
            self.cli("train", *self.data_args(c, seed), *self.train_overrides(c, seed), *QUIET, f"hydra.run.dir={run}")
        trained = time.time() - clock
        summary = read_json(run / "train_summary.json", "training summary")
        ckpt = summary.get("best_checkpoint") or summary["last_checkpoint"]
        if not (ev / "metrics.json").is_file():
            self.cli("evaluate", f"ckpt_path={ckpt}", "split=val", *self.cfg["studies"][c.study]["evaluate"],
                     "metrics=[bleu,rouge,cider]", f"output_dir={ev}", "trainer.enable_progress_bar=false",
                     f"hydra.run.dir={ev}_hydra")
        seconds = {"train": round(trained, 1), "evaluate": round(time.time() - clock - trained, 1)}
        path = self.record_path(c, seed)
        atomic_write_json(path, self.record(c, seed, ckpt, ev, summary, seconds))
        return path

    def record(self, c: Candidate, seed: int, ckpt: str, ev: Path, summary: dict[str, Any],
               seconds: dict[str, float]) -> dict[str, Any]:
        s = self.cfg["studies"][c.study]
        meta = read_json(self.store_dir(c, seed) / "meta.json", "feature store metadata")
        report = read_json(ev / "report.json", "evaluation report")
        metrics = read_json(ev / "metrics.json", "metrics")
        st, g = report.get("structure") or {}, report.get("grounding") or {}
        probes = (read_json(ev / "probes.json", "probe results")["probes"]
                  if (ev / "probes.json").is_file() else {})
        values: dict[str, Any] = {k: metrics[k] for k in ("Bleu_4", "CIDEr", "ROUGE_L") if k in metrics}
        values.update({k: st[k] for k in STRUCTURE_KEYS if st.get(k) is not None})
        values.update({k: g[k] for k in GROUNDING_KEYS if g.get(k) is not None})
        for name, p in probes.items():
            values[f"probe_{name}_accuracy"], values[f"chance_probe_{name}_accuracy"] = p["accuracy"], p["chance"]
        shape = meta.get("grid") if meta.get("kind", "image") == "image" else [meta.get("frames")]
        return {
            "study": c.study, "candidate": c.name, "store": c.store, "code": c.code, "data": s["data"],
            "data_seed": seed, "items": s["items"], "extract": s["stores"][c.store],
            "grid": "x".join(str(x) for x in (*shape, meta.get("dim"))),
            "train_overrides": [f"data={s['data']}", *self.train_overrides(c, seed)],
            "split": "val", "evaluate": s["evaluate"], "checkpoint": Path(ckpt).name, "metrics": values,
            "fingerprint": summary.get("fingerprint"), "train_provenance": summary.get("provenance"),
            "provenance": provenance(), "seconds": seconds,
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", nargs="+", default=None, help="only these studies (image, video)")
    parser.add_argument("--data-seeds", type=int, nargs="+", default=None, help="only these data seeds")
    parser.add_argument("--work", default="results/defaults_study", help="data, stores and checkpoints")
    parser.add_argument("--records", default="docs/results/defaults", help="the per-run records")
    parser.add_argument("--report", action="store_true", help="write the report from the records, run nothing")
    args = parser.parse_args(argv)
    cfg = load_study()
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg["threads"]))  # as the study ran
    records = Path(args.records)
    if not args.report:
        for path in DefaultsStudy(cfg, Path(args.work), records).run(args.studies, args.data_seeds):
            print(f"written: {path}", flush=True)
    report = write_study_report(cfg, load_study_records(records), records.parent)
    print(report.read_text(encoding="utf-8"))
    print(f"written: {report}")


if __name__ == "__main__":
    main()
