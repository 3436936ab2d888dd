"""The reproduction runner: for each data seed of a protocol, generate the dataset, extract the
stores, train and test every variant a claim needs, and keep one compact JSON per run.

Every step is the real CLI (``captioning-generate``, ``-extract``, ``-train``, ``-evaluate``).
Big files (data, features, checkpoints) live under ``work/<protocol>/d<seed>/``; the per-run
record goes to ``runs/<protocol>/<variant>/d<seed>.json`` (``docs/results/runs``, committed).  A
run whose record exists is never repeated, so a protocol can be completed over several sittings.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from captioning.evaluation.grounding import coverage_entropy
from captioning.predictions import read_predictions
from captioning.provenance import provenance
from captioning.utils.io import atomic_write_json, read_json
from captioning_reproduce.catalogue import Catalogue, Protocol, Variant, claims_of

#: report.json keys kept per run (structure and grounding on the synthetic data)
STRUCTURE_KEYS = ("binding_accuracy", "chance_binding_accuracy", "order_accuracy", "chance_order_accuracy",
                  "event_order_accuracy", "chance_event_order_accuracy", "object_recall", "event_recall",
                  "captions_ordered", "order_accuracy_all_named", "chance_order_accuracy_all_named",
                  "captions_all_named")
GROUNDING_KEYS = ("attention_in_object", "chance_attention_in_object", "pointing_accuracy",
                  "chance_pointing_accuracy")

Cli = Callable[..., None]


def run_cli(module: str, *args: str) -> None:
    """``captioning-<module> args``; a failure stops the reproduction with the CLI's last lines."""
    print("$ captioning-" + module + " " + " ".join(args), flush=True)
    proc = subprocess.run([sys.executable, "-m", f"captioning.cli.{module}", *args],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and module != "extract"):
        sys.exit(f"reproduce: captioning-{module} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def needed(catalogue: Catalogue, protocol: Protocol, only: Iterable[str] | None = None,
           headline_only: bool = False) -> dict[int, list[Variant]]:
    """data seed -> the variants its claims need (headline claims' first), in catalogue order."""
    wanted = set(only) if only else None
    out: dict[int, list[Variant]] = {}
    for claim in sorted(claims_of(catalogue, protocol), key=lambda c: not c.headline):
        if headline_only and not claim.headline:
            continue
        for seed in protocol.seeds_for(claim):
            for name in claim.variants:
                if (wanted is None or name in wanted) and catalogue.variants[name] not in out.setdefault(seed, []):
                    out[seed].append(catalogue.variants[name])
    return dict(sorted(out.items()))


class Runner:
    """Runs a protocol's missing runs.  ``work``: big files; ``records``: the per-run JSONs."""

    def __init__(self, catalogue: Catalogue, protocol: Protocol, work: Path, records: Path,
                 cli: Cli = run_cli) -> None:
        self.catalogue, self.protocol, self.cli = catalogue, protocol, cli
        self.work, self.records = Path(work) / protocol.name, Path(records) / protocol.name

    def record_path(self, variant: str, seed: int) -> Path:
        return self.records / variant / f"d{seed}.json"

    def run(self, plan: dict[int, list[Variant]]) -> list[Path]:
        """Every run of ``plan`` without a record: data and stores first, then train and test."""
        written = []
        for seed, variants in plan.items():
            todo = [v for v in variants if not self.record_path(v.name, seed).is_file()]
            for variant in todo:
                self.prepare(variant, seed)
                written.append(self.run_variant(variant, seed))
        return written

    def data_root(self, data: str, seed: int) -> Path:
        return self.work / f"d{seed}" / "data" / data

    def prepare(self, variant: Variant, seed: int) -> None:
        """Generate the data seed's dataset and extract the variant's store (each CLI skips what is done)."""
        root, store = self.data_root(variant.data, seed), variant.store
        self.cli("generate", f"dataset={variant.data}", f"num_items={self.protocol.items(variant.data)}",
                 f"seed={seed}", f"root={root}")
        self.cli("extract", f"data={variant.data}", f"data.root={root}", *store.extract,
                 f"features_dir={root / 'features' / store.name}", "trainer.enable_progress_bar=false")

    def run_variant(self, v: Variant, seed: int) -> Path:
        run = self.work / f"d{seed}" / "runs" / v.name
        root = self.data_root(v.data, seed)
        b = self.protocol.budget
        clock = time.time()
        if not (run / "train_summary.json").is_file():
            self.cli("train", f"data={v.data}", f"data.root={root}", f"data.seed={seed}",
                     f"data.num_items={self.protocol.items(v.data)}", f"features_dir={root / 'features' / v.store.name}",
                     *v.overrides, f"model.hidden_dim={b['hidden']}", f"model.embed_dim={b['hidden'] // 2}",
                     f"model.attention_dim={b['hidden'] // 2}", f"seed={seed}", f"trainer.max_epochs={v.epochs}",
                     f"optim.lr={b['lr']}", "callbacks.early_stopping=null", "callbacks.progress=null", "logger=csv",
                     "trainer.enable_progress_bar=false", f"hydra.run.dir={run}")
        trained = time.time() - clock
        summary = read_json(run / "train_summary.json", "training summary")
        ckpt, val = self.select_checkpoint(run, summary, v.data)
        ev = run / "eval_test"
        self.evaluate(ckpt, "test", v.data, ev)
        record = self.record(v, seed, run, ev, summary, ckpt, val,
                             {"train": round(trained, 1), "total": round(time.time() - clock, 1)})
        path = self.record_path(v.name, seed)
        atomic_write_json(path, record)
        return path

    def evaluate(self, ckpt: str, split: str, data: str, ev: Path) -> dict:
        """The split decoded under the protocol's decoding; the test split also runs its probes."""
        probes = self.protocol.probes if split == "test" else []
        if not (ev / "metrics.json").is_file() or (probes and not (ev / "probes.json").is_file()):
            self.cli("evaluate", f"ckpt_path={ckpt}", f"split={split}", *self.protocol.decode[data],
                     "metrics=[bleu,rouge,cider]", f"output_dir={ev}", "trainer.enable_progress_bar=false",
                     *([f"probes=[{','.join(probes)}]"] if probes else []), f"hydra.run.dir={ev}_hydra")
        return read_json(ev / "metrics.json", f"{split} metrics")

    def select_checkpoint(self, run: Path, summary: dict, data: str) -> tuple[str, dict[str, float]]:
        """The best (by the training's greedy val CIDEr) or, with ``select_on_val``, whichever of it
        and the last decodes val better under the protocol's decoding (ties: the best)."""
        best = summary.get("best_checkpoint") or summary["last_checkpoint"]
        if not self.protocol.select_on_val:
            return best, {}
        candidates = dict.fromkeys(c for c in (best, summary.get("last_checkpoint")) if c)
        scores = {c: self.evaluate(c, "val", data, run / "eval_val" / Path(c).stem)["CIDEr"] for c in candidates}
        return max(scores, key=scores.get), {Path(c).name: s for c, s in scores.items()}

    def record(self, v: Variant, seed: int, run: Path, ev: Path, summary: dict, ckpt: str,
               val: dict[str, float], seconds: dict[str, float]) -> dict[str, Any]:
        """The compact per-run JSON: the test metrics the claims read, and where they came from."""
        metrics = read_json(ev / "metrics.json", "metrics")
        report = read_json(ev / "report.json", "evaluation report")
        values: dict[str, Any] = {k: metrics[k] for k in ("Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr") if k in metrics}
        g, st = report.get("grounding") or {}, report.get("structure") or {}
        values.update({k: g[k] for k in GROUNDING_KEYS if g.get(k) is not None})
        values.update({k: st[k] for k in STRUCTURE_KEYS if st.get(k) is not None})
        values["coverage_entropy"] = coverage_entropy(read_predictions(ev / "predictions.json"))
        bins = [b for b in report.get("by_length") or [] if b.get("count") and b.get("Bleu_4") is not None]
        if bins:  # Bahdanau et al.'s figure, reduced to its two ends
            values["Bleu_4_shortest"], values["Bleu_4_longest"] = bins[0]["Bleu_4"], bins[-1]["Bleu_4"]
        probes = probe_records(ev, self.protocol.probes)
        for name, p in probes.items():  # accuracy and its exact chance, as the claims read them
            values[f"probe_{name}_accuracy"], values[f"chance_probe_{name}_accuracy"] = p["accuracy"], p["chance"]
        values = {k: (None if isinstance(x, float) and math.isnan(x) else x) for k, x in values.items()}
        return {
            "protocol": self.protocol.name, "variant": v.name, "data": v.data, "data_seed": seed, "seed": seed,
            "store": v.store.name, "epochs": v.epochs, "budget": self.protocol.budget,
            "decode": self.protocol.decode[v.data], "checkpoint": Path(ckpt).name, "val_CIDEr": val,
            "metrics": values,
            "by_length": [{k: b.get(k) for k in ("bin", "count", "Bleu_4", "CIDEr") if k in b} for b in bins],
            "fingerprint": summary.get("fingerprint"), "train_provenance": summary.get("provenance"),
            "provenance": provenance(), "seconds": seconds, **({"probes": probes} if probes else {}),
        }


def probe_records(ev: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each probe's summary from ``probes.json`` (per item: questions, credit, chance sum; the
    clusters), without the questions themselves."""
    if not names:
        return {}
    data = read_json(ev / "probes.json", "probe results")["probes"]
    return {n: {k: v for k, v in data[n].items() if k not in ("probe", "questions_asked")} for n in names}
