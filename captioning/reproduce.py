"""``make reproduce``: test the seed papers' qualitative claims on the embedded synthetic data.

Claims (each variant x 3 seeds, mean +- std over seeds):
1. Yao et al. 2015: temporal attention beats mean pooling when the caption depends on the
   ORDER of events (``moving_shapes``; CIDEr, BLEU-4).
2. Bahdanau et al. 2014: attention beats a fixed context vector as captions get longer
   (``shapes``; BLEU-4 by reference length, soft attention vs mean pooling / show-tell).
3. Xu et al. 2015: soft and hard attention both ground words in the right place (attention
   mass in the named object, pointing accuracy, against uniform-attention chance), and the
   doubly stochastic term spreads attention over the image (coverage entropy, lambda 1 vs 0).
4. Additive vs dot-product scoring.

Every run is the real CLI (``captioning-train`` then ``captioning-evaluate``); runs that
finished before are reused (their ``metrics.json`` exists), so an interrupted reproduction
continues.  Writes ``results/reproduce/results.md``, ``results.json`` and plots.
Equivalent Hydra multirun for one cell of the table:
``captioning-train -m data=shapes model=soft_attention,mean_pool seed=0,1,2``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Variant:
    name: str
    data: str
    overrides: list[str] = field(default_factory=list)


IMAGE_VARIANTS = [
    Variant("soft_additive", "shapes", ["model=soft_attention", "model.scoring=additive"]),
    Variant("soft_dot", "shapes", ["model=soft_attention", "model.scoring=dot"]),
    Variant("soft_additive_no_ds", "shapes", ["model=soft_attention", "model.doubly_stochastic=0.0"]),
    Variant("hard_additive", "shapes", ["model=hard_attention"]),
    Variant("mean_pool", "shapes", ["model=mean_pool"]),
    Variant("show_tell", "shapes", ["model=show_tell"]),
]
VIDEO_VARIANTS = [
    Variant("temporal_attention", "moving_shapes", ["model=temporal_attention"]),
    Variant("mean_pool", "moving_shapes", ["model=mean_pool"]),
]


@dataclass
class Budget:
    seeds: tuple[int, ...]
    images: int
    videos: int
    image_epochs: int
    video_epochs: int
    hidden: int


# Sized so that `make reproduce` (24 training runs + their evaluations) takes < 60 min on 2 CPU cores.
FULL = Budget(seeds=(0, 1, 2), images=1500, videos=600, image_epochs=6, video_epochs=15, hidden=128)
QUICK = Budget(seeds=(0, 1), images=400, videos=160, image_epochs=4, video_epochs=6, hidden=64)


def cli(module: str, *args: str) -> None:
    cmd = [sys.executable, "-m", f"captioning.cli.{module}", *args]
    print("$ captioning-" + module + " " + " ".join(args), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and module != "extract"):
        sys.exit(f"reproduce: captioning-{module} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def coverage_entropy(predictions: list[dict]) -> float:
    """Mean normalised entropy of sum_t alpha_t (1 = attention spread evenly over all positions)."""
    values = []
    for p in predictions:
        att = p.get("attention")
        if not att:
            continue
        cov = np.asarray(att, dtype=np.float64).sum(0)
        if cov.size < 2 or cov.sum() <= 0:
            continue
        q = cov / cov.sum()
        values.append(float(-(q[q > 0] * np.log(q[q > 0])).sum() / math.log(cov.size)))
    return float(np.mean(values)) if values else float("nan")


def run_variant(v: Variant, seed: int, b: Budget, out: Path) -> dict:
    run = out / "runs" / f"{v.data}-{v.name}-s{seed}"
    ev = run / "eval"
    reused = (ev / "metrics.json").is_file()
    if not reused:
        epochs = b.image_epochs if v.data == "shapes" else b.video_epochs
        cli("train", f"data={v.data}", *v.overrides, f"seed={seed}", f"trainer.max_epochs={epochs}",
            f"model.hidden_dim={b.hidden}", f"model.embed_dim={b.hidden // 2}", f"model.attention_dim={b.hidden // 2}",
            "optim.lr=1e-3",
            "callbacks.early_stopping=false", "callbacks.progress_bar=none", "logger=csv",
            "trainer.enable_progress_bar=false", f"hydra.run.dir={run}")
        summary = json.loads((run / "train_summary.json").read_text())
        cli("evaluate", f"ckpt_path={summary['best_checkpoint'] or summary['last_checkpoint']}", "split=test",
            "decode=beam", "decode.beam_size=3", "metrics=[bleu,rouge,cider]", f"output_dir={ev}",
            "trainer.enable_progress_bar=false", f"hydra.run.dir={run}/hydra_eval")
    metrics = json.loads((ev / "metrics.json").read_text())
    report = json.loads((ev / "report.json").read_text())
    predictions = json.loads((ev / "predictions.json").read_text())
    row = {"variant": v.name, "data": v.data, "seed": seed, "reused": reused, **metrics,
           "coverage_entropy": coverage_entropy(predictions)}
    g = report.get("grounding") or {}
    for k in ("attention_in_object", "chance_attention_in_object", "pointing_accuracy", "chance_pointing_accuracy"):
        if k in g:
            row[k] = g[k]
    row["by_length"] = report.get("by_length") or report.get("metrics_by_length")
    bins = [b for b in row["by_length"] or [] if b.get("count") and b.get("Bleu_4") is not None]
    if bins:  # Bahdanau et al.'s figure, reduced to its two ends
        row["Bleu_4_shortest"], row["Bleu_4_longest"] = bins[0]["Bleu_4"], bins[-1]["Bleu_4"]
    return row


def aggregate(rows: list[dict]) -> list[dict]:
    keys = ["Bleu_4", "CIDEr", "ROUGE_L", "attention_in_object", "chance_attention_in_object",
            "pointing_accuracy", "chance_pointing_accuracy", "coverage_entropy", "Bleu_4_shortest", "Bleu_4_longest"]
    table = []
    for (data, name) in dict.fromkeys((r["data"], r["variant"]) for r in rows):
        group = [r for r in rows if r["data"] == data and r["variant"] == name]
        entry = {"data": data, "variant": name, "seeds": len(group)}
        for k in keys:
            vals = [r[k] for r in group if isinstance(r.get(k), (int, float)) and not math.isnan(r[k])]
            if vals:
                entry[k] = (float(np.mean(vals)), float(np.std(vals)))
        table.append(entry)
    return table


def fmt(v) -> str:
    return "-" if v is None else f"{v[0]:.3f} ± {v[1]:.3f}"


def write_tables(table: list[dict], rows: list[dict], out: Path, budget: Budget, seconds: float) -> Path:
    lines = [f"Seeds: {list(budget.seeds)}; {budget.images} images / {budget.videos} videos; "
             f"{budget.image_epochs} / {budget.video_epochs} epochs; hidden {budget.hidden}; "
             f"test split, beam 3. This invocation: {seconds / 60:.1f} min, {sum(not r['reused'] for r in rows)} "
             f"runs trained, {sum(r['reused'] for r in rows)} reused from an earlier invocation.", ""]
    lines += ["| data | variant | BLEU-4 | CIDEr | attention in object (chance) | pointing (chance) | coverage entropy |",
              "|---|---|---|---|---|---|---|"]
    for e in table:
        att = f"{fmt(e.get('attention_in_object'))} ({fmt(e.get('chance_attention_in_object'))})"
        pnt = f"{fmt(e.get('pointing_accuracy'))} ({fmt(e.get('chance_pointing_accuracy'))})"
        if e["variant"] in ("mean_pool", "show_tell"):
            att = pnt = "n/a (no attention)"
        lines.append(f"| {e['data']} | {e['variant']} | {fmt(e.get('Bleu_4'))} | {fmt(e.get('CIDEr'))} | {att} | "
                     f"{pnt} | {fmt(e.get('coverage_entropy'))} |")
    by_length = [e for e in table if "Bleu_4_longest" in e]
    if by_length:
        lines += ["", "BLEU-4 in the shortest and the longest reference-length bin (see bleu_by_length.png):", "",
                  "| data | variant | shortest bin | longest bin |", "|---|---|---|---|"]
        lines += [f"| {e['data']} | {e['variant']} | {fmt(e.get('Bleu_4_shortest'))} | {fmt(e.get('Bleu_4_longest'))} |"
                  for e in by_length]
    lines += ["", "Claims (REPRODUCED: the difference exceeds the sum of the two stds over seeds):"]
    lines += claims(table)
    path = out / "results.md"
    path.write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps({"table": table, "runs": rows}, indent=1))
    return path


def claims(table: list[dict]) -> list[str]:
    def get(data, variant, key):
        for e in table:
            if e["data"] == data and e["variant"] == variant and key in e:
                return e[key]
        return None

    out = []

    def verdict(text, a, b):
        if a is None or b is None:
            out.append(f"- {text}: not measured")
            return
        held = a[0] > b[0]
        sep = abs(a[0] - b[0]) > (a[1] + b[1])
        if held and sep:
            word = "REPRODUCED"
        elif held:
            word = "INCONCLUSIVE (right direction, within std)"
        else:
            word = "NOT reproduced" + (" (reversed beyond std)" if sep else " (within std)")
        out.append(f"- {text}: {word} ({a[0]:.3f} vs {b[0]:.3f})")

    def gap(key: str) -> tuple[float, float] | None:
        a, b = get("shapes", "soft_additive", key), get("shapes", "mean_pool", key)
        return None if a is None or b is None else (a[0] - b[0], a[1] + b[1])

    verdict("temporal attention > mean pooling on moving_shapes (CIDEr)",
            get("moving_shapes", "temporal_attention", "CIDEr"), get("moving_shapes", "mean_pool", "CIDEr"))
    verdict("soft attention > mean pooling on shapes (BLEU-4)",
            get("shapes", "soft_additive", "Bleu_4"), get("shapes", "mean_pool", "Bleu_4"))
    verdict("attention's BLEU-4 lead over mean pooling grows with caption length (longest vs shortest bin)",
            gap("Bleu_4_longest"), gap("Bleu_4_shortest"))
    verdict("soft attention grounds words above chance (attention in object)",
            get("shapes", "soft_additive", "attention_in_object"), get("shapes", "soft_additive", "chance_attention_in_object"))
    verdict("hard attention grounds words above chance (pointing)",
            get("shapes", "hard_additive", "pointing_accuracy"), get("shapes", "hard_additive", "chance_pointing_accuracy"))
    verdict("doubly stochastic term spreads attention (coverage entropy, lambda=1 vs 0)",
            get("shapes", "soft_additive", "coverage_entropy"), get("shapes", "soft_additive_no_ds", "coverage_entropy"))
    verdict("additive vs dot scoring (CIDEr; additive first)",
            get("shapes", "soft_additive", "CIDEr"), get("shapes", "soft_dot", "CIDEr"))
    verdict("temporal attention grounds events above chance (pointing)",
            get("moving_shapes", "temporal_attention", "pointing_accuracy"),
            get("moving_shapes", "temporal_attention", "chance_pointing_accuracy"))
    return out


def plot_by_length(rows: list[dict], out: Path) -> Path | None:
    from captioning.evaluation.report import plot_metrics_by_length

    per_model: dict[str, list[dict]] = {}
    for r in rows:
        if r["data"] == "shapes" and r["seed"] == rows[0]["seed"] and r.get("by_length"):
            per_model[r["variant"]] = r["by_length"]
    if not per_model:
        return None
    return plot_metrics_by_length(per_model, out / "bleu_by_length.png",
                                  title="shapes: BLEU-4 by reference length (seed 0)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data and few epochs (CI, < 10 min)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--only", choices=["images", "videos"], default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="override the budget's seeds")
    parser.add_argument("--variants", nargs="+", default=None,
                        help=f"run only these variants (of {sorted({v.name for v in IMAGE_VARIANTS + VIDEO_VARIANTS})})")
    args = parser.parse_args(argv)
    b = QUICK if args.quick else FULL
    if args.seeds:
        b = dataclasses.replace(b, seeds=tuple(args.seeds))
    out = Path(args.out or ("results/reproduce-quick" if args.quick else "results/reproduce"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def chosen(vs: list[Variant]) -> list[Variant]:
        return [v for v in vs if args.variants is None or v.name in args.variants]

    variants = []
    if args.only != "videos" and chosen(IMAGE_VARIANTS):
        root = out / "data" / "shapes"
        cli("generate", "dataset=shapes", f"num_items={b.images}", f"root={root}")
        cli("extract", "data=shapes", f"data.root={root}", "trainer.enable_progress_bar=false")
        variants += [(v, [f"data.root={root}"]) for v in chosen(IMAGE_VARIANTS)]
    if args.only != "images" and chosen(VIDEO_VARIANTS):
        root = out / "data" / "moving_shapes"
        cli("generate", "dataset=moving_shapes", f"num_items={b.videos}", f"root={root}")
        cli("extract", "data=moving_shapes", f"data.root={root}", "encoder.frames=16", "encoder.frame_size=96",
            "trainer.enable_progress_bar=false")
        variants += [(v, [f"data.root={root}"]) for v in chosen(VIDEO_VARIANTS)]
    if not variants:
        sys.exit(f"reproduce: no variant selected by --variants {args.variants} --only {args.only}")
    rows = []
    for v, extra in variants:
        for seed in b.seeds:
            rows.append(run_variant(Variant(v.name, v.data, v.overrides + extra), seed, b, out))
    table = aggregate(rows)
    path = write_tables(table, rows, out, b, time.time() - t0)
    plot_by_length(rows, out)
    print(path.read_text())
    print(f"written: {path}, {out / 'results.json'}, {out / 'bleu_by_length.png'}")


if __name__ == "__main__":
    main()
