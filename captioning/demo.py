"""``make demo``: the README's pipeline commands on the embedded synthetic data, on CPU, in minutes.

generate shapes -> extract features -> train soft attention -> evaluate val and test (beam search,
the attention viewer) -> captions + per-word heatmaps + HTML gallery.  Each step is a command of
the README's pipeline section (``PIPELINE``), run through the real CLI with the defaults it shows;
the demo adds only the CPU budget (``SIZE_KEYS``: a CPU-sized LSTM, its epochs and learning rate, the
number of images: the budget the defaults study chose the defaults under), where
the files go (``WHERE_KEYS``) and how progress shows (``SHOW_KEYS``): tests/test_demo.py holds both.
Re-running skips finished work (data stamp, store, last.ckpt).  It prints its total time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from captioning.utils.io import read_json

#: the README pipeline's commands of the jobs the demo runs, as the README writes them (less the
#: checkpoint, inputs and output folder of evaluate and caption, which the demo fills in)
PIPELINE = {
    "generate": ["dataset=shapes"],
    "extract": ["data=shapes", "encoder=efficientnet_lite0", "trainer=cpu"],
    "train": ["data=shapes", "model=soft_attention", "trainer=cpu"],
    "evaluate": ["split=test", "viewer=true"],
    "caption": [],
}
#: what the demo may add to them: sizes only, where the files go, how progress shows
SIZE_KEYS = ("num_items", "data.num_items", "model.hidden_dim", "model.embed_dim", "model.attention_dim",
             "trainer.max_epochs", "optim.lr")
WHERE_KEYS = ("root", "data.root", "ckpt_path", "inputs", "output_dir", "hydra.run.dir")
SHOW_KEYS = ("callbacks.progress.bar", "trainer.enable_progress_bar")
# A CPU-sized LSTM (the default is 512-d with 256-d embeddings and attention) and the learning rate its
# 4 epochs were chosen with (docs/results/demo_grid.md; the defaults study trained every candidate so).
CPU_LSTM = ["model.hidden_dim=128", "model.embed_dim=64", "model.attention_dim=64", "optim.lr=2e-3"]
EPOCHS = 4
IMAGES = 3000  # captioning-generate's default for shapes
DATA_ROOT = "data/shapes"  # conf/data/shapes.yaml's root


def where_data(root: str, images: int) -> list[str]:
    """The dataset's folder and size, as extract and train get them (nothing when the defaults)."""
    return ([f"data.root={root}"] if root != DATA_ROOT else []) + ([f"data.num_items={images}"] if images != IMAGES else [])


def first_steps(out: str, root: str, images: int, epochs: int) -> list[tuple[str, str, list[str]]]:
    """(title, job, arguments) of generate, extract and train."""
    generate = ([f"root={root}"] if root != DATA_ROOT else []) + ([f"num_items={images}"] if images != IMAGES else [])
    return [("1/5 generate synthetic images", "generate", [*PIPELINE["generate"], *generate]),
            ("2/5 extract CNN features", "extract", [*PIPELINE["extract"], *where_data(root, images)]),
            ("3/5 train soft attention", "train", [*PIPELINE["train"], *where_data(root, images), *CPU_LSTM,
                                                  f"trainer.max_epochs={epochs}", f"hydra.run.dir={out}/train",
                                                  "callbacks.progress.bar=tqdm"])]


def last_steps(out: str, ckpt: str, inputs: list[str]) -> list[tuple[str, str, list[str]]]:
    """(title, job, arguments) of the evaluations (val, then test: the README's command on both) and captioning."""
    steps = []
    for split in ("val", "test"):
        args = [a if a != "split=test" else f"split={split}" for a in PIPELINE["evaluate"]]
        steps.append((f"4/5 evaluate on {split}", "evaluate", [f"ckpt_path={ckpt}", *args, f"output_dir={out}/eval/{split}",
                                                              f"hydra.run.dir={out}/hydra/evaluate-{split}",
                                                              "trainer.enable_progress_bar=false"]))
    steps.append(("5/5 caption images with attention heatmaps", "caption",
                  [f"ckpt_path={ckpt}", *PIPELINE["caption"], f"inputs=[{','.join(inputs)}]",
                   f"output_dir={out}/captions", f"hydra.run.dir={out}/hydra/caption"]))
    return steps


def step(title: str, module: str, *args: str) -> None:
    cmd = [sys.executable, "-m", f"captioning.cli.{module}", *args]
    print(f"\n=== {title}\n$ captioning-{module} {' '.join(args)}", flush=True)
    start = time.time()
    proc = subprocess.run(cmd)
    if proc.returncode not in (0,) and not (module == "extract" and proc.returncode == 1):
        sys.exit(f"demo: step '{title}' failed with exit status {proc.returncode}")
    print(f"--- {title}: {time.time() - start:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=IMAGES, help="synthetic images to generate")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--out", default="outputs/demo")
    parser.add_argument("--data-root", default=DATA_ROOT, help="where the images and features go")
    args = parser.parse_args(argv)
    out, root = args.out, args.data_root
    t0 = time.time()
    for title, job, job_args in first_steps(out, root, args.images, args.epochs):
        step(title, job, *job_args)
    summary = read_json(Path(out, "train", "train_summary.json"), "training summary")
    ckpt = summary["best_checkpoint"] or summary["last_checkpoint"]
    test_ann = read_json(Path(root, "annotations", "captions_test.json"), "test annotations")
    images = [f"{root}/images/{im['file_name']}" for im in test_ann["images"][:12]]
    for title, job, job_args in last_steps(out, ckpt, images):
        step(title, job, *job_args)
    print_summary(Path(out), f"{out}/train", ckpt, time.time() - t0)


def split_line(out: Path, split: str) -> tuple[str, dict]:
    """One line of a split's BLEU-4, CIDEr, binding and pointing accuracy (chance levels); its grounding."""
    metrics = read_json(Path(out, "eval", split, "metrics.json"), "metrics")
    report = read_json(Path(out, "eval", split, "report.json"), "evaluation report")
    structure, grounding = report.get("structure") or {}, report.get("grounding") or {}
    shown = {"BLEU-4": metrics.get("Bleu_4"), "CIDEr": metrics.get("CIDEr"),
             "binding accuracy": structure.get("binding_accuracy"),
             "pointing accuracy": grounding.get("pointing_accuracy")}
    chance = {"binding accuracy": structure.get("chance_binding_accuracy"),
              "pointing accuracy": grounding.get("chance_pointing_accuracy")}
    line = "  ".join(f"{k} {v:.3f}" + (f" (chance {chance[k]:.3f})" if chance.get(k) is not None else "")
                     for k, v in shown.items() if v is not None)
    return f"  {split + ':':16} {line}  ({out}/eval/{split}/metrics.json)", grounding


def print_summary(out: Path, run: str, ckpt: str, seconds: float) -> None:
    print(f"\nDemo finished in {seconds / 60:.1f} min ({seconds:.0f} s).")
    print(f"  checkpoint:      {os.path.relpath(ckpt)}")  # as the other paths: from where the demo ran
    lines, grounding = zip(*(split_line(out, split) for split in ("val", "test")), strict=True)
    print("\n".join(lines))
    val = grounding[0]
    if val.get("pointing_accuracy") is not None:
        print(f"  val pointing accuracy {val['pointing_accuracy']:.3f} (chance {val['chance_pointing_accuracy']:.3f}): "
              "how often the most attended cell lies in the object a colour or shape word names")
    print(f"  report:          {out}/eval/test/report.md (metrics by caption length, grounding)")
    print(f"  captions + maps: {out}/captions/captions.json, {out}/captions/index.html")
    print(f"  attention viewer: {out}/eval/test/viewer/index.html (open it in a browser: hover a word)")
    print(f"  logs:            {run}/tensorboard (tensorboard --logdir {run})")


if __name__ == "__main__":
    main()
