"""Paper presets run end to end (one train + one val batch, `debug=fast`) on fixture data of the
format each paper used, and a Hydra multirun sweep runs with the local launcher."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_cli

pytestmark = pytest.mark.slow

FIXTURES = REPO / "tests" / "fixtures" / "annotations"
PRESETS = {  # experiment -> (data config, annotation fixture, kind, positions)
    "xu2015_soft": ("coco", "dataset_coco.json", "image", 196),
    "xu2015_hard": ("coco", "dataset_coco.json", "image", 196),
    "vinyals2015_showtell": ("coco", "dataset_coco.json", "image", 49),
    "yao2015_temporal": ("msvd", "AllVideoDescriptions.txt", "video", 28),
    "venugopalan2015_meanpool": ("msvd", "AllVideoDescriptions.txt", "video", 28),
    "rennie2017_scst": ("coco", "dataset_coco.json", "image", 196),  # SCST from scratch: the stage runs
    "luo2020_scst": ("coco", "dataset_coco.json", "image", 196),
    "ours_spatial": ("coco", "dataset_coco.json", "image", 196),
    "ours_temporal": ("msvd", "AllVideoDescriptions.txt", "video", 28),
}


def test_every_preset_is_covered():
    assert set(PRESETS) == {p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")}


def fixture_dataset(root: Path, data: str, annotation: str, kind: str, positions: int) -> Path:
    """The fixture annotations where ``data=<data>`` expects them, plus random features for every item."""
    from omegaconf import OmegaConf

    from captioning.config import DataConfig, to_config
    from captioning.data.annotations import read_dataset
    from captioning.store.writer import FeatureStoreWriter

    root.mkdir(parents=True)
    shutil.copy(FIXTURES / annotation, root / annotation)
    raw = OmegaConf.load(REPO / "conf" / "data" / f"{data}.yaml")
    raw.root = str(root)
    records = read_dataset(to_config(raw, DataConfig))
    grid = [14, 14] if positions == 196 else ([7, 7] if kind == "image" else None)
    meta = {"settings": {"backbone": "fixture", "weights": "none"}, "kind": kind, "positions": positions,
            "dim": 8, "grid": grid, "dtype": "float16"}
    rng = np.random.default_rng(0)
    with FeatureStoreWriter(root / "features", meta, shard_size=64) as w:
        for item in dict.fromkeys(r.item_id for r in records.records):
            w.add(item, rng.normal(size=(positions, 8)).astype(np.float32))
    return root / "features"


@pytest.mark.parametrize("experiment", sorted(PRESETS))
def test_preset_fast_dev_run(experiment, tmp_path):
    data, annotation, kind, positions = PRESETS[experiment]
    features = fixture_dataset(tmp_path / data, data, annotation, kind, positions)
    proc = run_cli("train", f"experiment={experiment}", f"data.root={tmp_path / data}", f"features_dir={features}",
                   "debug=fast", "data.num_workers=0", "data.batch_size=4", "trainer=cpu",
                   "callbacks.progress=null", f"hydra.run.dir={tmp_path / 'run'}")
    summary = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    assert summary["global_step"] == 1, proc.stdout[-2000:]


def test_multirun_sweep_with_the_local_launcher(tiny_images, tmp_path):
    from conftest import data_overrides

    sweep = tmp_path / "sweep"
    run_cli("train", "-m", *data_overrides(tiny_images["root"], tiny_images["features_dir"]), "debug=fast",
            "model=soft_attention,mean_pool", "seed=0,1", "callbacks.progress=null",
            f"hydra.sweep.dir={sweep}")
    runs = sorted(p.parent.name.rsplit("-", 1)[0] for p in sweep.glob("*/train_summary.json"))  # <run>-<fingerprint>
    assert runs == ["tiny-mean_pool-additive-s0", "tiny-mean_pool-additive-s1",
                    "tiny-soft_attention-additive-s0", "tiny-soft_attention-additive-s1"]
