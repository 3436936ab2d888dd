"""``make demo``: the whole pipeline on the embedded synthetic data, on CPU, in minutes.

generate shapes -> extract EfficientNet-Lite0 grids -> train soft attention -> evaluate
(beam 3) -> captions + per-word heatmaps + HTML gallery.  Each step is the real CLI, as
a user would type it; re-running skips finished work (data stamp, store, last.ckpt).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from captioning.utils.io import read_json


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
    parser.add_argument("--images", type=int, default=3000, help="synthetic images to generate")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--out", default="outputs/demo")
    args = parser.parse_args(argv)
    out = Path(args.out)
    run = f"{out}/train"
    t0 = time.time()
    step("1/5 generate synthetic images", "generate", "dataset=shapes", f"num_items={args.images}")
    step("2/5 extract CNN grids", "extract", "data=shapes", f"data.num_items={args.images}",
         "encoder=efficientnet_lite0", "trainer=cpu")
    # a CPU-sized decoder (the paper's 512-d LSTM is the model default): ~35 s per epoch on 2 cores
    step("3/5 train soft attention", "train", "data=shapes", "model=soft_attention", "trainer=cpu",
         "model.hidden_dim=256", "model.embed_dim=128", "model.attention_dim=128", "optim.lr=1e-3",
         f"trainer.max_epochs={args.epochs}", f"hydra.run.dir={run}", "callbacks.progress.bar=tqdm")
    summary = read_json(Path(run, "train_summary.json"), "training summary")
    ckpt = summary["best_checkpoint"] or summary["last_checkpoint"]
    for split in ("val", "test"):
        step(f"4/5 evaluate on {split} (beam 3)", "evaluate", f"ckpt_path={ckpt}", f"split={split}",
             "decode.beam_size=3", f"output_dir={out}/eval/{split}", f"hydra.run.dir={out}/hydra/evaluate-{split}",
             "trainer.enable_progress_bar=false")
    test_ann = read_json(Path("data/shapes/annotations/captions_test.json"), "test annotations")
    images = [f"data/shapes/images/{im['file_name']}" for im in test_ann["images"][:12]]
    step("5/5 caption images with attention heatmaps", "caption", f"ckpt_path={ckpt}",
         f"inputs=[{','.join(images)}]", f"output_dir={out}/captions", f"hydra.run.dir={out}/hydra/caption")
    print(f"\nDemo finished in {(time.time() - t0) / 60:.1f} min.")
    print(f"  checkpoint:      {ckpt}")
    for split in ("val", "test"):
        metrics = read_json(Path(out, "eval", split, "metrics.json"), "metrics")
        report = read_json(Path(out, "eval", split, "report.json"), "evaluation report")
        structure, grounding = report.get("structure") or {}, report.get("grounding") or {}
        shown = {"BLEU-4": metrics.get("Bleu_4"), "CIDEr": metrics.get("CIDEr"),
                 "binding accuracy": structure.get("binding_accuracy"),
                 "pointing accuracy": grounding.get("pointing_accuracy")}
        chance = {"binding accuracy": structure.get("chance_binding_accuracy"),
                  "pointing accuracy": grounding.get("chance_pointing_accuracy")}
        print(f"  {split + ':':16} " + "  ".join(
            f"{k} {v:.3f}" + (f" (chance {chance[k]:.3f})" if chance.get(k) is not None else "")
            for k, v in shown.items() if v is not None) + f"  ({out}/eval/{split}/metrics.json)")
    print(f"  report:          {out}/eval/test/report.md (metrics by caption length, grounding)")
    print(f"  captions + maps: {out}/captions/captions.json, {out}/captions/index.html")
    print(f"  logs:            {run}/tensorboard (tensorboard --logdir {run})")


if __name__ == "__main__":
    main()
