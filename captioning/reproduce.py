"""``make reproduce``: test the seed papers' claims on the embedded synthetic data.

The data are built so that attention is NEEDED (``captioning.data.synthetic``): ``shapes``
captions bind each colour to its shape and list 2-6 objects left to right, and the colours and
shapes recur in other pairings, so the bag of words a mean-pooled feature keeps does not give
the caption away; ``moving_shapes`` videos show two brief events, and a video and its partner
hold the same frames in the other order, so mean pooling over frames is at chance on order.

Claims (each variant x 3 seeds, mean +- std over seeds; structure metrics from the grounding
metadata, see ``captioning.evaluation.structure``):

1. Xu et al. / Bahdanau et al.: soft attention beats a fixed mean-pooled context (CIDEr and
   colour-shape binding accuracy), and its lead grows with caption length (BLEU-4 of the longest
   vs the shortest reference-length bin).
2. Xu et al.: soft and hard attention look at the object a word names (pointing accuracy for
   object words, against uniform-attention chance; soft >= 0.6); the doubly stochastic term at
   the paper's scale vs lambda = 0 (coverage entropy, pointing).
3. Additive vs Luong's general (bilinear) scoring.
4. Yao et al.: order-aware temporal attention (a time code per frame) names the events in the
   right order (event-order accuracy >= 0.9) where mean pooling is at chance; its attention
   lies in the events' frames (attention in span and pointing >= 2x chance); the same model
   WITHOUT the time code is at chance on order too (the code is what carries time).
5. Every other registered decoder (e.g. the Transformer) runs on both datasets as one more row.

Every run is the real CLI (``captioning-train`` then ``captioning-evaluate``); a training that
finished before (its ``train_summary.json`` exists) is reused, and so is an evaluation under the
same Protocol (its ``metrics.json`` exists), so an interrupted reproduction continues.  Writes
``results/reproduce/results.md``, ``results.json`` and plots (with ``--block-trigrams`` /
``--select-on-val``: ``results_block_trigrams.md``, ``results_block_trigrams_val_selected.md``,
..., from the same trained runs).
Equivalent Hydra multirun for one cell of the table:
``captioning-train -m data=shapes model=soft_attention,mean_pool seed=0,1,2``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from captioning.evaluation.report import plot_metrics_by_length
from captioning.models.decoders import decoder_names
from captioning.utils.io import atomic_write_json, atomic_write_text, read_json


@dataclass
class Variant:
    name: str
    data: str
    overrides: list[str] = field(default_factory=list)
    lstm: bool = True  # the budget's LSTM sizes apply (other decoders keep their conf/model sizes)
    stores: tuple[str, ...] = ()  # FeatureStores beyond the default one it reads (keys of EXTRA_STORES)


# spatial attention sees WHERE each region is (a 2-D code) and temporal attention WHEN each frame is
SOFT = ["model=soft_attention", "model.position_code=sinusoidal", "model.doubly_stochastic=1.0"]  # eq. 14, paper lambda
IMAGE_VARIANTS = [  # the main comparison first, then the ablations
    Variant("soft_additive", "shapes", SOFT),
    Variant("mean_pool", "shapes", ["model=mean_pool"]),
    Variant("soft_additive_no_ds", "shapes", [*SOFT, "model.doubly_stochastic=0.0"]),
    Variant("hard_additive", "shapes", ["model=hard_attention", "model.position_code=sinusoidal"]),
    Variant("soft_additive_no_code", "shapes", ["model=soft_attention", "model.position_code=none",
                                                "model.doubly_stochastic=1.0"]),
    Variant("soft_general", "shapes", [*SOFT, "model.scoring=general"]),
    Variant("show_tell", "shapes", ["model=show_tell"]),
]
VIDEO_VARIANTS = [
    Variant("temporal_attention", "moving_shapes", ["model=temporal_attention"]),
    Variant("temporal_residual", "moving_shapes", ["model=temporal_attention", "model.residual=median"]),
    Variant("temporal_order_blind", "moving_shapes", ["model=temporal_attention", "model.position_code=none"]),
    Variant("mean_pool", "moving_shapes", ["model=mean_pool"]),
]
# Yao et al.'s feature setting: appearance (2-D CNN per sampled frame), local motion (3-D CNN over
# the clip around it) or both concatenated per frame (captioning.store.streams).  The 3-D network
# is R(2+1)D-18 with SEEDED RANDOM weights (no Kinetics weights offline): what a random 3-D
# network keeps of a clip, not what a trained one would.
MOTION = "r2plus1d_18"
FRAMES = "encoder.frames=16"  # both streams sample the same frames (their indices must agree)
MOTION_EXTRACT = [f"encoder={MOTION}", "encoder.weights=none", FRAMES, "encoder.frame_size=64",
                  "encoder.clip_length=8"]  # 8-frame clips at 64 px: ~1/6 of the 16 x 112 px cost
STREAM_VARIANTS = [
    Variant("temporal_3d", "moving_shapes", ["model=temporal_attention", f"features_dir=${{data.root}}/features/{MOTION}"],
            stores=(MOTION,)),
    Variant("temporal_2d+3d", "moving_shapes", [
        "model=temporal_attention",
        f"features_dir=[${{data.root}}/features/efficientnet_lite0,${{data.root}}/features/{MOTION}]"], stores=(MOTION,)),
]
# A 14 x 14 grid: the same network at 448 px (16-px cells; an object covers ~3 x 3 cells instead of
# ~1.5 x 1.5, so a peak one cell off its centre still lies on it).  ~4x the extraction FLOPs.
FINE = "efficientnet_lite0_448"
FINE_VARIANTS = [  # lambda = 0 (the model=soft_attention default): at N = 196 regions lambda = 1 would
    # push the coverage of ~15 words towards uniform even harder than at N = 49
    Variant("soft_14x14", "shapes", ["model=soft_attention", "model.position_code=sinusoidal",
                                     f"features_dir=${{data.root}}/features/{FINE}"], stores=(FINE,)),
    Variant("mean_pool_14x14", "shapes", ["model=mean_pool", f"features_dir=${{data.root}}/features/{FINE}"],
            stores=(FINE,)),
]
# The same frames read at the backbone's own 224 px instead of 96 px: an object then spans 2-3 cells
# of the last 7x7 map instead of ~1 of 3x3, and a linear probe names its shape 0.99 instead of
# 0.88 of the time (README).  ~4x the extraction time of the default store (1.0 vs 3.9 videos/s on 2 cores).
FRAMES_224 = "efficientnet_lite0_224"
# Beside it, the same network's stride-8 stage (40 channels, pooled per frame): early layers keep
# colour, which the last layer (trained with colour augmentation) blurs; ~0.5x the extraction time of FRAMES_224.
LAYER2_224 = "efficientnet_lite0_224_layer2"
FRAMES_224_VARIANTS = [
    Variant("temporal_residual_224", "moving_shapes", [
        "model=temporal_attention", "model.residual=median", f"features_dir=${{data.root}}/features/{FRAMES_224}"],
        stores=(FRAMES_224,)),
    Variant("temporal_residual_224+layer2", "moving_shapes", [
        "model=temporal_attention", "model.residual=median",
        f"features_dir=[${{data.root}}/features/{FRAMES_224},${{data.root}}/features/{LAYER2_224}]"],
        stores=(FRAMES_224, LAYER2_224)),
]
# Variants that read a FeatureStore of their own: each costs another extraction, so they run only when named
ON_EXTRA_STORES = [*STREAM_VARIANTS, *FINE_VARIANTS, *FRAMES_224_VARIANTS]
# name -> extraction overrides of a FeatureStore that only some variants read (extracted when one is chosen)
EXTRA_STORES = {MOTION: MOTION_EXTRACT, FINE: ["encoder.image_size=448"],
                FRAMES_224: [FRAMES, "encoder.frame_size=224"],
                LAYER2_224: [FRAMES, "encoder.frame_size=224", "encoder.layer=2"]}
NO_ATTENTION = ("mean_pool", "show_tell")


def registered_variants() -> list[Variant]:
    """One row per dataset for every registered decoder other than the LSTM family (its own
    ``conf/model/<name>.yaml``, its own sizes)."""

    return [Variant(name, data, [f"model={name}"], lstm=False)
            for name in decoder_names() if name != "lstm" for data in ("shapes", "moving_shapes")]


@dataclass
class Budget:
    seeds: tuple[int, ...]
    images: int
    videos: int
    image_epochs: int
    video_epochs: int
    hidden: int


# Sized so that `make reproduce` takes about an hour on 2 CPU cores.
FULL = Budget(seeds=(0, 1, 2), images=1500, videos=2400, image_epochs=5, video_epochs=5, hidden=128)
QUICK = Budget(seeds=(0, 1), images=600, videos=240, image_epochs=8, video_epochs=12, hidden=128)


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


STRUCTURE_KEYS = ("binding_accuracy", "chance_binding_accuracy", "order_accuracy", "chance_order_accuracy",
                  "event_order_accuracy", "chance_event_order_accuracy", "object_recall", "event_recall",
                  "captions_ordered", "order_accuracy_all_named", "chance_order_accuracy_all_named",
                  "captions_all_named")
GROUNDING_KEYS = ("attention_in_object", "chance_attention_in_object", "pointing_accuracy",
                  "chance_pointing_accuracy")


@dataclass(frozen=True)
class Protocol:
    """How a trained run is tested: beam 3 (+ trigram blocking), on the best checkpoint by the
    training's greedy validation CIDEr or (``select_on_val``) on the one ``checkpoint_selected_on_val`` picks."""

    block_trigrams: bool = False
    select_on_val: bool = False

    @property
    def suffix(self) -> str:
        """Of the run's evaluation folder (``eval<suffix>/``) and of ``results<suffix>.md``."""
        return "_block_trigrams" * self.block_trigrams + "_val_selected" * self.select_on_val

    @property
    def decode(self) -> list[str]:
        return ["decode=beam", "decode.beam_size=3", *["decode.block_trigrams=true"] * self.block_trigrams]

    def describe(self) -> str:
        return (f"beam 3{', trigram blocking' if self.block_trigrams else ''}, "
                f"{'checkpoint selected on val with that decoding' if self.select_on_val else 'best val-CIDEr checkpoint'}")


def evaluate(ckpt: str, split: str, protocol: Protocol, ev: Path) -> dict:
    """``captioning-evaluate`` of one checkpoint into ``ev`` (unless done before); its metrics."""
    if not (ev / "metrics.json").is_file():
        cli("evaluate", f"ckpt_path={ckpt}", f"split={split}", *protocol.decode, "metrics=[bleu,rouge,cider]",
            f"output_dir={ev}", "trainer.enable_progress_bar=false", f"hydra.run.dir={ev}_hydra")
    return read_json(ev / "metrics.json", f"{split} metrics")


def checkpoint_selected_on_val(run: Path, summary: dict, protocol: Protocol) -> str:
    """Of the best (by the greedy validation CIDEr logged in training) and the last checkpoint, the
    one with the higher validation CIDEr under the protocol's decoding (ties: the best).  Each is
    evaluated once (``eval<suffix>_val/<checkpoint>/``); the choice goes to ``selection.json`` there."""
    val = run / f"eval{protocol.suffix}_val"
    scores = {ckpt: evaluate(ckpt, "val", protocol, val / Path(ckpt).stem)["CIDEr"] for ckpt in
              dict.fromkeys(c for c in (summary.get("best_checkpoint"), summary.get("last_checkpoint")) if c)}
    chosen = max(scores, key=scores.get)  # the first (best) on a tie
    atomic_write_json(val / "selection.json", {"val_CIDEr": scores, "chosen": chosen})
    return chosen


def run_variant(v: Variant, seed: int, b: Budget, out: Path, protocol: Protocol = Protocol()) -> dict:
    """Train (unless the run finished before) and test under ``protocol`` (unless tested under it
    before: ``eval<protocol.suffix>/``)."""
    run = out / "runs" / f"{v.data}-{v.name}-s{seed}"
    ev = run / f"eval{protocol.suffix}"
    reused = (run / "train_summary.json").is_file()
    if not reused:
        epochs = b.image_epochs if v.data == "shapes" else b.video_epochs
        sizes = [f"model.hidden_dim={b.hidden}", f"model.embed_dim={b.hidden // 2}",
                 f"model.attention_dim={b.hidden // 2}"] if v.lstm else []
        cli("train", f"data={v.data}", *v.overrides, *sizes, f"seed={seed}", f"trainer.max_epochs={epochs}",
            "optim.lr=1e-3", "callbacks.early_stopping=null", "callbacks.progress=null", "logger=csv",
            "trainer.enable_progress_bar=false", f"hydra.run.dir={run}")
    if not (ev / "metrics.json").is_file():
        summary = read_json(run / "train_summary.json", "training summary")
        ckpt = (checkpoint_selected_on_val(run, summary, protocol) if protocol.select_on_val
                else summary["best_checkpoint"] or summary["last_checkpoint"])
        evaluate(ckpt, "test", protocol, ev)
    metrics = read_json(ev / "metrics.json", "metrics")
    report = read_json(ev / "report.json", "evaluation report")
    predictions = read_json(ev / "predictions.json", "predictions")
    row = {"variant": v.name, "data": v.data, "seed": seed, "reused": reused, **metrics,
           "coverage_entropy": coverage_entropy(predictions)}
    g = report.get("grounding") or {}
    row.update({k: g[k] for k in GROUNDING_KEYS if g.get(k) is not None})
    st = report.get("structure") or {}
    row.update({k: st[k] for k in STRUCTURE_KEYS if st.get(k) is not None})
    counts = st.get("by_count") or {}
    if counts:  # binding accuracy with the fewest and the most objects of an image
        lo, hi = min(counts, key=int), max(counts, key=int)
        for name, key in (("fewest", lo), ("most", hi)):
            if counts[key].get("binding_accuracy") is not None:
                row[f"binding_{name}"] = counts[key]["binding_accuracy"]
    row["by_length"] = report.get("by_length")
    bins = [b for b in row["by_length"] or [] if b.get("count") and b.get("Bleu_4") is not None]
    if bins:  # Bahdanau et al.'s figure, reduced to its two ends
        row["Bleu_4_shortest"], row["Bleu_4_longest"] = bins[0]["Bleu_4"], bins[-1]["Bleu_4"]
    return row


TABLE_KEYS = ("Bleu_4", "CIDEr", "ROUGE_L", *GROUNDING_KEYS, *STRUCTURE_KEYS, "coverage_entropy",
              "Bleu_4_shortest", "Bleu_4_longest", "binding_fewest", "binding_most")


def aggregate(rows: list[dict]) -> list[dict]:
    """Mean and (population) std over seeds of every numeric metric, per (data, variant)."""
    table = []
    for (data, name) in dict.fromkeys((r["data"], r["variant"]) for r in rows):
        group = [r for r in rows if r["data"] == data and r["variant"] == name]
        entry = {"data": data, "variant": name, "seeds": len(group)}
        for k in TABLE_KEYS:
            vals = [r[k] for r in group if isinstance(r.get(k), (int, float)) and not math.isnan(r[k])]
            if vals:
                entry[k] = (float(np.mean(vals)), float(np.std(vals)))
        table.append(entry)
    return table


def fmt(v) -> str:
    return "-" if v is None else f"{v[0]:.3f} ± {v[1]:.3f}"


def _with_chance(e: dict, key: str) -> str:
    if e.get(key) is None:
        return "n/a (no attention)" if e["variant"] in NO_ATTENTION and "chance_" + key in GROUNDING_KEYS else "-"
    return f"{fmt(e.get(key))} ({fmt(e.get('chance_' + key))})"


def write_tables(table: list[dict], rows: list[dict], out: Path, budget: Budget, seconds: float,
                 protocol: Protocol = Protocol()) -> Path:
    lines = [f"Seeds: {list(budget.seeds)}; {budget.images} images / {budget.videos} videos; "
             f"{budget.image_epochs} / {budget.video_epochs} epochs; LSTM hidden {budget.hidden}; "
             f"test split, {protocol.describe()}. This invocation: {seconds / 60:.1f} min, {sum(not r['reused'] for r in rows)} "
             f"runs trained, {sum(r['reused'] for r in rows)} reused from an earlier invocation.", ""]
    images = [e for e in table if e["data"] == "shapes"]
    videos = [e for e in table if e["data"] == "moving_shapes"]
    if images:
        lines += ["shapes (images): metric (chance)", "",
                  "| variant | BLEU-4 | CIDEr | binding acc. | order acc. | pointing | attention in object | "
                  "coverage entropy |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {e['variant']} | {fmt(e.get('Bleu_4'))} | {fmt(e.get('CIDEr'))} | "
                  f"{_with_chance(e, 'binding_accuracy')} | {_with_chance(e, 'order_accuracy')} | "
                  f"{_with_chance(e, 'pointing_accuracy')} | {_with_chance(e, 'attention_in_object')} | "
                  f"{fmt(e.get('coverage_entropy'))} |" for e in images]
    if videos:
        lines += ["", "moving_shapes (videos): metric (chance)", "",
                  "| variant | BLEU-4 | CIDEr | event-order acc. | order acc. when both named | pointing | "
                  "attention in span | event recall |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {e['variant']} | {fmt(e.get('Bleu_4'))} | {fmt(e.get('CIDEr'))} | "
                  f"{_with_chance(e, 'event_order_accuracy')} | {_with_chance(e, 'order_accuracy_all_named')} | "
                  f"{_with_chance(e, 'pointing_accuracy')} | "
                  f"{_with_chance(e, 'attention_in_object')} | {fmt(e.get('event_recall'))} |" for e in videos]
    by_length = [e for e in images if "Bleu_4_longest" in e]
    if by_length:
        lines += ["", "By length: BLEU-4 in the shortest and the longest reference-length bin (see "
                  "bleu_by_length.png), binding accuracy with the fewest and the most objects:", "",
                  "| variant | BLEU-4 shortest | BLEU-4 longest | binding, fewest objects | binding, most objects |",
                  "|---|---|---|---|---|"]
        lines += [f"| {e['variant']} | {fmt(e.get('Bleu_4_shortest'))} | {fmt(e.get('Bleu_4_longest'))} | "
                  f"{fmt(e.get('binding_fewest'))} | {fmt(e.get('binding_most'))} |" for e in by_length]
    lines += ["", "Claims (REPRODUCED: a difference beyond the sum of the two stds over seeds; a threshold "
              "met by the mean minus its std; 'within chance': within two binomial standard errors of the "
              "chance level over the scored test captions):"]
    lines += claims(table)
    path = out / f"results{protocol.suffix}.md"  # protocols side by side
    atomic_write_text(path, "\n".join(lines) + "\n")
    atomic_write_json(path.with_suffix(".json"), {"table": table, "runs": rows})
    return path


# ---------------------------------------------------------------------------------- verdicts


def beats(a: tuple[float, float] | None, b: tuple[float, float] | None) -> str:
    """``a`` > ``b``: REPRODUCED beyond the seed spread, INCONCLUSIVE within it, else NOT."""
    if a is None or b is None:
        return "not measured"
    sep = abs(a[0] - b[0]) > (a[1] + b[1])
    if a[0] > b[0]:
        return "REPRODUCED" if sep else "INCONCLUSIVE (right direction, within std)"
    return "NOT reproduced" + (" (reversed beyond std)" if sep else " (within std)")


def at_least(a: tuple[float, float] | None, threshold: float) -> str:
    """mean >= threshold: REPRODUCED when mean - std clears it too, INCONCLUSIVE when only the mean does."""
    if a is None:
        return "not measured"
    if a[0] - a[1] >= threshold:
        return "REPRODUCED"
    return "INCONCLUSIVE (mean above, within std)" if a[0] >= threshold else "NOT reproduced"


def within_chance(a: tuple[float, float] | None, chance: tuple[float, float] | None, n: float | None) -> str:
    """|a - chance| <= 2 binomial standard errors of a proportion near chance over n captions."""
    if a is None or chance is None or not n:
        return "not measured"
    se = math.sqrt(max(chance[0] * (1 - chance[0]), 1e-12) / n)
    return "REPRODUCED" if abs(a[0] - chance[0]) <= 2 * se else "NOT reproduced (away from chance)"


def claims(table: list[dict]) -> list[str]:
    def get(data: str, variant: str, key: str):
        for e in table:
            if e["data"] == data and e["variant"] == variant and key in e:
                return e[key]
        return None

    def num(x) -> str:
        return "-" if x is None else f"{x[0]:.3f}"

    def scaled(x, factor: float):
        return None if x is None else (x[0] * factor, x[1] * factor)

    def gap(key: str):
        a, b = get("shapes", "soft_additive", key), get("shapes", "mean_pool", key)
        return None if a is None or b is None else (a[0] - b[0], a[1] + b[1])

    s, v = "shapes", "moving_shapes"
    out = []

    def line(text: str, verdict: str, *values) -> None:
        out.append(f"- {text}: {verdict} ({' vs '.join(num(x) for x in values)})")

    for soft, pool, grid in (("soft_additive", "mean_pool", ""), ("soft_14x14", "mean_pool_14x14", ", 14x14 grid")):
        for key, what in (("CIDEr", "CIDEr"), ("binding_accuracy", "binding accuracy")):
            a, b = get(s, soft, key), get(s, pool, key)
            line(f"soft attention > mean pooling on shapes{grid} ({what})", beats(a, b), a, b)
    for name in ("soft_additive", "mean_pool", "soft_14x14"):  # each caption set has its own chance level
        a, c = get(s, name, "binding_accuracy"), get(s, name, "chance_binding_accuracy")
        line(f"{name} binds colours to shapes above its chance level", beats(a, c), a, c)
    a, b = gap("Bleu_4_longest"), gap("Bleu_4_shortest")
    line("attention's BLEU-4 lead over mean pooling grows with caption length (longest vs shortest bin)",
         beats(a, b), a, b)
    for name, who in (("soft_additive", "soft attention"),
                      ("soft_14x14", "soft attention over a 14x14 grid (448 px, lambda = 0)")):
        a = get(s, name, "pointing_accuracy")
        line(f"{who} points at the object a word names (pointing >= 0.6)", at_least(a, 0.6), a,
             get(s, name, "chance_pointing_accuracy"))
    a, c = get(s, "hard_additive", "pointing_accuracy"), get(s, "hard_additive", "chance_pointing_accuracy")
    line("hard attention points above chance", beats(a, c), a, c)
    a, b = get(s, "soft_additive", "coverage_entropy"), get(s, "soft_additive_no_ds", "coverage_entropy")
    line("doubly stochastic term (paper scale) spreads attention vs lambda=0 (coverage entropy)", beats(a, b), a, b)
    a, b = get(s, "soft_additive", "pointing_accuracy"), get(s, "soft_additive_no_ds", "pointing_accuracy")
    line("pointing with lambda at paper scale vs lambda=0", beats(a, b), a, b)
    a, b = get(s, "soft_additive", "CIDEr"), get(s, "soft_general", "CIDEr")
    line("additive vs general (bilinear) scoring (CIDEr; additive first)", beats(a, b), a, b)
    for name, model in (("temporal_attention", "order-aware temporal attention"),
                        ("temporal_residual", "temporal attention over frames and their residuals"),
                        ("temporal_residual_224", "temporal attention over 224-px frames and their residuals"),
                        ("temporal_residual_224+layer2", "the same with the stride-8 stage beside the last")):
        a = get(v, name, "event_order_accuracy")
        line(f"{model} names events in order (event-order accuracy >= 0.9)", at_least(a, 0.9), a,
             get(v, name, "chance_event_order_accuracy"))
    for key, what in (("event_recall", "event recall"), ("event_order_accuracy", "event-order accuracy")):
        a, b = get(v, "temporal_residual", key), get(v, "temporal_attention", key)
        line(f"frame residuals (a_i - median frame, standardised) raise {what} over temporal attention", beats(a, b), a, b)
    a, c = get(v, "temporal_attention", "order_accuracy_all_named"), get(v, "temporal_attention",
                                                                          "chance_order_accuracy_all_named")
    line("when it names both events, order-aware temporal attention orders them right (>= 0.9)", at_least(a, 0.9), a, c)
    a, c = get(v, "temporal_order_blind", "order_accuracy_all_named"), get(v, "temporal_order_blind",
                                                                            "chance_order_accuracy_all_named")
    n = get(v, "temporal_order_blind", "captions_all_named")
    line("when it names both events, the model without the time code is at chance on their order",
         within_chance(a, c, n and n[0]), a, c)
    for name in ("mean_pool", "temporal_order_blind"):
        a, c = get(v, name, "event_order_accuracy"), get(v, name, "chance_event_order_accuracy")
        n = get(v, name, "captions_ordered")
        line(f"{name} is at chance on event order", within_chance(a, c, n and n[0]), a, c)
    a, b = get(v, "temporal_attention", "CIDEr"), get(v, "mean_pool", "CIDEr")
    line("temporal attention > mean pooling on moving_shapes (CIDEr)", beats(a, b), a, b)
    for key, what in (("attention_in_object", "attention in the event's frames"), ("pointing_accuracy", "pointing")):
        a, c = get(v, "temporal_attention", key), get(v, "temporal_attention", "chance_" + key)
        line(f"temporal attention grounds events: {what} >= 2x chance", beats(a, scaled(c, 2.0)), a, scaled(c, 2.0))
    return out


def plot_by_length(rows: list[dict], out: Path) -> Path | None:

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
                        help="run only these variants (see IMAGE_VARIANTS / VIDEO_VARIANTS; those on stores of "
                             "their own, ON_EXTRA_STORES, run only when named; registered decoders by their "
                             "model name)")
    parser.add_argument("--block-trigrams", action="store_true",
                        help="decode with decode.block_trigrams=true (no trigram twice in a caption; no "
                             "moving_shapes reference repeats one); runs trained before are only re-evaluated")
    parser.add_argument("--select-on-val", action="store_true",
                        help="test the best or the last checkpoint, whichever has the higher validation CIDEr "
                             "under the test's decoding (default: the best by the greedy validation CIDEr of training)")
    for name in ("images", "videos", "image-epochs", "video-epochs"):
        parser.add_argument(f"--{name}", type=int, default=None, help=f"override the budget's {name.replace('-', ' ')}")
    args = parser.parse_args(argv)
    b = QUICK if args.quick else FULL
    if args.seeds:
        b = dataclasses.replace(b, seeds=tuple(args.seeds))
    for key in ("images", "videos", "image_epochs", "video_epochs"):
        if getattr(args, key):
            b = dataclasses.replace(b, **{key: getattr(args, key)})
    out = Path(args.out or ("results/reproduce-quick" if args.quick else "results/reproduce"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    every = IMAGE_VARIANTS + VIDEO_VARIANTS + registered_variants()
    if args.variants:  # variants on stores of their own cost another extraction: only when asked for by name
        every += ON_EXTRA_STORES

    def chosen(data: str) -> list[Variant]:
        return [v for v in every if v.data == data and (args.variants is None or v.name in args.variants)]

    variants = []
    for data, items, default_store in (("shapes", b.images, []),
                                       ("moving_shapes", b.videos, [FRAMES, "encoder.frame_size=96"])):
        kind = "images" if data == "shapes" else "videos"
        if args.only not in (None, kind) or not chosen(data):
            continue
        root = out / "data" / data
        cli("generate", f"dataset={data}", f"num_items={items}", f"root={root}")
        cli("extract", f"data={data}", f"data.root={root}", *default_store, "trainer.enable_progress_bar=false")
        for store in dict.fromkeys(name for v in chosen(data) for name in v.stores):
            cli("extract", f"data={data}", f"data.root={root}", *EXTRA_STORES[store],
                f"features_dir={root}/features/{store}", "trainer.enable_progress_bar=false")
        variants += [dataclasses.replace(v, overrides=[*v.overrides, f"data.root={root}"]) for v in chosen(data)]
    if not variants:
        sys.exit(f"reproduce: no variant selected by --variants {args.variants} --only {args.only}")
    protocol = Protocol(args.block_trigrams, args.select_on_val)
    rows = [run_variant(v, seed, b, out, protocol) for v in variants for seed in b.seeds]
    table = aggregate(rows)
    path = write_tables(table, rows, out, b, time.time() - t0, protocol)
    plot_by_length(rows, out)
    print(path.read_text())
    print(f"written: {path}, {path.with_suffix('.json')}, {out / 'bleu_by_length.png'}")


if __name__ == "__main__":
    main()
