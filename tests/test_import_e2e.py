"""A store imported from the bottom-up TSV layout trains, evaluates and captions through the real CLIs,
with box heatmaps: region features of synthetic shapes (one region per object, at its true box, plus
background regions), written as the original TSV, imported, trained on with soft attention."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from PIL import Image

from captioning.store.feature_store import FeatureStore
from captioning.viz.captions_file import read_captions

pytestmark = pytest.mark.slow

DIM = 32
FAST = [
    "model=soft_attention", "model.position_code=none", "model.embed_dim=32", "model.hidden_dim=64",
    "model.attention_dim=32", "optim.lr=0.005", "optim.warmup_steps=0", "logger=csv", "callbacks.progress=null",
    "callbacks.early_stopping=null", "callbacks.attention_images=null", "trainer.enable_progress_bar=false",
    "trainer.max_epochs=2", "data.num_workers=0", "data.batch_size=16",
]


def b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.float32).tobytes()).decode("ascii")


def write_bottom_up_tsv(root: Path, path: Path) -> dict[str, int]:
    """One TSV row per image: a region per object (its grounding box; features: one-hot colour and
    shape + noise) and 2 background regions (noise); num_boxes = objects + 2 (3..8)."""
    grounding = json.loads((root / "annotations" / "grounding.json").read_text())
    colours, shapes = grounding["word_classes"]["colour"], grounding["word_classes"]["shape"]
    rng = np.random.default_rng(0)
    counts = {}
    with open(path, "w") as f:
        for image_id, entry in grounding["items"].items():
            w, h = entry["size"]
            boxes, feats = [], []
            for o in entry["objects"]:
                v = rng.normal(0, 0.05, DIM)
                v[colours.index(o["colour"])] += 1.0
                v[len(colours) + shapes.index(o["shape"])] += 1.0
                boxes.append(o["box"])
                feats.append(v)
            for _ in range(2):
                x, y = rng.uniform(0, w - 20), rng.uniform(0, h - 20)
                boxes.append([x, y, x + rng.uniform(10, 20), y + rng.uniform(10, 20)])
                feats.append(rng.normal(0, 0.05, DIM))
            counts[image_id] = len(boxes)
            f.write("\t".join([image_id, str(w), str(h), str(len(boxes)), b64(np.array(boxes)),
                               b64(np.array(feats))]) + "\n")
    return counts


def data_args(root: Path) -> list[str]:
    return ["data=shapes", "data.name=tiny_shapes", f"data.root={root}", "data.synthetic=null"]


def test_bottom_up_store_trains_evaluates_and_captions_with_box_heatmaps(tmp_path: Path) -> None:
    from captioning.data.synthetic import generate_shapes

    root = tmp_path / "shapes"
    generate_shapes(root, num_images=60, seed=0, image_size=128, workers=1)
    counts = write_bottom_up_tsv(root, tmp_path / "bottom_up.tsv")
    store_dir = root / "features" / "bottom_up"
    run_cli("import_features", *data_args(root), "format=bottom_up_tsv", f"source={tmp_path / 'bottom_up.tsv'}",
            "name=bottom_up", "max_regions=10", "progress=false", f"hydra.run.dir={tmp_path / 'import'}")
    store = FeatureStore.open(store_dir)
    assert len(store) == 60 and store.positions == 10 and store.dim == DIM and store.boxes
    assert all(store[i].valid == n for i, n in counts.items()) and store["1"].image_size == (128, 128)

    run_dir = tmp_path / "run"
    run_cli("train", *data_args(root), *FAST, f"features_dir={store_dir}", f"hydra.run.dir={run_dir}")
    summary = json.loads((run_dir / "train_summary.json").read_text())
    ckpt = summary["last_checkpoint"]
    meta = torch.load(ckpt, weights_only=True)["hyper_parameters"]["feature_meta"]
    assert meta["regions"] and meta["boxes"] and meta["imported"]["format"] == "bottom_up_tsv"

    run_cli("evaluate", f"ckpt_path={ckpt}", "split=test", f"output_dir={tmp_path / 'eval'}", "num_workers=0",
            "metrics=[bleu,cider]", "trainer.enable_progress_bar=false")
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert "CIDEr" in json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert report["grounding"]["items"] == 6  # measured over the regions' boxes (hand-checked in test_import_features)

    out = tmp_path / "captions"
    run_cli("caption", f"ckpt_path={ckpt}", "store_split=test", f"output_dir={out}", "device=cpu",
            "progress=false")
    entries = read_captions(out / "captions.json")
    assert len(entries) == 6 and all("error" not in e for e in entries)
    for e in entries:
        n = counts[Path(e["input"]).stem.lstrip("0")]
        assert e["attention_shape"] == [n] and len(e["boxes"]) == n and e["image_size"] == [128, 128]
        assert all(len(row) == n for row in e["attention"])
        figure = Image.open(out / e["figure"])
        assert figure.size[0] > 400  # the input and one panel per word
