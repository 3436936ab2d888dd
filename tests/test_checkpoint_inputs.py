"""A checkpoint's inputs (``captioning.train.inputs.checkpoint_inputs``): its data config, its feature
store(s) and its vocabulary, found by one rule for evaluation, captioning and the API, with the data
moved since training (``data_root=``) or the features elsewhere (``features_dir=``), one stream or two.

The checkpoints are untrained decoders (``test_caption_cli.save_checkpoint``) on a tiny dataset with
real image files and two imported stores of its items (16 + 8 channels); "moved" means the dataset's
folder is renamed, so the old paths no longer exist while a test runs.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tiny_image_dataset, run_cli
from PIL import Image
from test_caption_cli import save_checkpoint

from captioning.config import DataConfig, TrainerConfig
from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError, DataError
from captioning.models.search import DecodeConfig
from captioning.store.feature_store import FeatureStore
from captioning.store.streams import open_features
from captioning.store.writer import FeatureStoreWriter

IMPORTED = {"format": "npy", "source": "synthetic", "key": None}  # figures: the whole image, no crop


def write_stream(root: Path, ids: list[str], dim: int, name: str, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    meta = {"settings": {"backbone": "imported", "name": name}, "kind": "image", "positions": 4, "dim": dim,
            "grid": [2, 2], "dtype": "float16", "imported": IMPORTED}
    with FeatureStoreWriter(root, meta, shard_size=16) as w:
        for i in ids:
            w.add(i, rng.normal(size=(4, dim)).astype(np.float32))
    return root


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict:
    """A one-stream and a two-stream checkpoint of the same tiny dataset (48 images, 8 in test)."""
    tmp = tmp_path_factory.mktemp("inputs")
    d = make_tiny_image_dataset(tmp / "tiny")
    root = d["root"]
    ids = list(FeatureStore.open(d["features_dir"]).ids)
    for i in ids:
        Image.new("RGB", (64, 48), (40 * (int(i) % 6), 90, 160)).save(root / "images" / f"{int(i):06d}.jpg")
    app = write_stream(root / "features" / "app", ids, 16, "app", 0)
    mot = write_stream(root / "features" / "mot", ids, 8, "mot", 1)
    data = asdict(DataConfig(name="tiny", kind="image", format="coco", root=str(root), media_dir=str(root / "images"),
                             annotations={s: str(root / "annotations" / f"captions_{s}.json")
                                          for s in ("train", "val", "test")}, num_workers=0))
    vocab = Vocabulary.build([["a", "red", "green", "blue", "circle", "square", "triangle"]], min_count=1).to_dict()
    one = save_checkpoint(tmp / "one.ckpt", dict(FeatureStore.open(app).meta), vocab, data, app)
    two = save_checkpoint(tmp / "two.ckpt", dict(open_features([app, mot]).meta), vocab, data, app)
    state = torch.load(two, weights_only=True)  # the config of a two-stream run: features_dir=[app, mot]
    state["hyper_parameters"]["config"]["features_dir"] = [str(app), str(mot)]
    torch.save(state, two)
    return {"root": root, "app": app, "mot": mot, "one": one, "two": two, "test": d["splits"]["test"]}


class Moved:
    """The dataset folder renamed to ``dest`` while in the block (the old paths do not exist)."""

    def __init__(self, src: Path, dest: Path) -> None:
        self.src, self.dest = src, dest

    def __enter__(self) -> Path:
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self.src.rename(self.dest)
        return self.dest

    def __exit__(self, *exc) -> None:
        self.dest.rename(self.src)


def evaluate_args(ckpt: Path, out: Path, *overrides: str) -> list[str]:
    return [f"ckpt_path={ckpt}", "split=test", "decode=greedy", f"output_dir={out}", "metrics=[bleu]", "num_workers=0",
            "grounding=false", "trainer.enable_progress_bar=false", f"hydra.run.dir={out}/hydra", *overrides]


def test_a_two_stream_checkpoint_evaluates_its_moved_data_via_data_root(ckpts, tmp_path) -> None:
    out = tmp_path / "eval"
    with Moved(ckpts["root"], tmp_path / "elsewhere" / "tiny") as moved:
        proc = run_cli("evaluate", *evaluate_args(ckpts["two"], out, f"data_root={moved}"), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert sorted(r["image_id"] for r in results) == sorted(ckpts["test"])


def _evaluate(ckpt: Path, out: Path, **kw) -> dict:
    from captioning.evaluation.job import EvaluateConfig, evaluate

    return evaluate(EvaluateConfig(ckpt_path=str(ckpt), split="test", decode=DecodeConfig(beam_size=1, max_length=5),
                                   trainer=TrainerConfig(accelerator="cpu", enable_progress_bar=False),
                                   output_dir=str(out), metrics=["bleu"], num_workers=0, grounding=False, **kw))


def test_data_root_moves_every_path_under_the_recorded_root_and_only_those(ckpts, tmp_path) -> None:
    from captioning.train.checkpoint import load_checkpoint
    from captioning.train.inputs import checkpoint_inputs, moved

    assert moved("/d/tiny/features/app", "/d/tiny", "/e/t") == "/e/t/features/app"
    assert moved("/d/tiny", "/d/tiny", "/e/t") == "/e/t"
    assert moved("/d/tiny2/features", "/d/tiny", "/e/t") == "/d/tiny2/features"  # a sibling, not under the root
    hp = load_checkpoint(ckpts["two"])["hyper_parameters"]
    with Moved(ckpts["root"], tmp_path / "elsewhere" / "tiny") as new:
        inputs = checkpoint_inputs(hp, ckpts["two"], data_root=str(new))
        assert inputs.features_dir == [str(new / "features" / "app"), str(new / "features" / "mot")]
        assert inputs.store.meta["dim"] == 16 + 8 and [s.root for s in inputs.store.stores] == [
            new / "features" / "app", new / "features" / "mot"]
        assert inputs.data.root == str(new) and inputs.data.media_dir == str(new / "images")
        assert inputs.data.annotations["test"] == str(new / "annotations" / "captions_test.json")
        assert inputs.vocab.itos == hp["vocab"]["itos"]
        # not told where: one line that names the missing stores, the checkpoint and both ways forward
        with pytest.raises(DataError) as e:
            checkpoint_inputs(hp, ckpts["two"])
    msg = str(e.value)
    assert msg.startswith(f"no feature store at {ckpts['app']}, {ckpts['mot']}: {ckpts['two']} was trained on")
    assert "data_root=<the dataset's new folder>" in msg and "features_dir=[<one folder per stream>]" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("streams", ["one", "two"])
def test_features_dir_names_the_moved_stores_of_one_or_two_streams(ckpts, streams, tmp_path) -> None:
    """Only the features moved (the dataset where it was): ``features_dir=`` a folder, or one per stream."""
    names = ["app"] if streams == "one" else ["app", "mot"]
    (tmp_path / "stores").mkdir()
    for n in names:
        ckpts[n].rename(tmp_path / "stores" / n)
    try:
        dirs = [str(tmp_path / "stores" / n) for n in names]
        summary = _evaluate(ckpts[streams], tmp_path / "eval", features_dir=dirs[0] if streams == "one" else dirs)
        # the store the checkpoint recorded is refused with the fix named
        with pytest.raises(DataError, match=f"no feature store at {ckpts['app']}.*pass data_root=.* or features_dir="):
            _evaluate(ckpts[streams], tmp_path / "refused")
    finally:
        for n in names:
            (tmp_path / "stores" / n).rename(ckpts[n])
    assert summary["items"] == len(ckpts["test"])
    # a store of other features (the motion stream for a one-stream checkpoint) is refused
    with pytest.raises(Exception, match="encoder mismatch"):
        _evaluate(ckpts["one"], tmp_path / "other", features_dir=str(ckpts["mot"]))


def test_evaluate_takes_a_list_of_stores_from_the_command_line() -> None:
    """``features_dir=[a,b]`` composes (the evaluate schema types it as a folder or a list of them)."""
    from hydra import compose, initialize_config_dir

    import captioning.cli.evaluate  # noqa: F401  (registers the evaluate schema)
    from captioning.config import to_config
    from captioning.evaluation.job import EvaluateConfig

    with initialize_config_dir(config_dir=str(Path(__file__).parents[1] / "conf"), version_base="1.3"):
        raw = compose("evaluate", overrides=["ckpt_path=x.ckpt", "features_dir=[/a,/b]", "data_root=/d"])
    cfg = to_config(raw, EvaluateConfig)
    assert list(cfg.features_dir) == ["/a", "/b"] and cfg.data_root == "/d"


def test_caption_api_and_job_read_a_stored_split_of_moved_data(ckpts, tmp_path) -> None:
    """``Captioner.iter_split(data_root=)`` and ``captioning-caption store_split=test data_root=``: the
    features from the moved stores, the figures' images from the moved media folder."""
    from captioning.caption.api import Captioner
    from captioning.caption.job import CaptionConfig, caption

    captioner, decode = Captioner.from_checkpoint(ckpts["two"], device="cpu"), DecodeConfig(beam_size=2, max_length=4)
    with Moved(ckpts["root"], tmp_path / "elsewhere" / "tiny") as new:
        results = captioner.caption_split("test", data_root=str(new), decode=decode)
        job = caption(CaptionConfig(ckpt_path=str(ckpts["two"]), store_split="test", data_root=str(new),
                                    output_dir=str(tmp_path / "captions"), device="cpu", num_workers=0,
                                    progress=False, decode=decode))
    assert len(results) == len(ckpts["test"]) and all(r.ok for r in results)
    assert all(r.image is not None and r.image.shape == (48, 64, 3) for r in results)  # read from the new folder
    assert job.captioned == len(ckpts["test"]) and job.failed == 0
    assert [e["caption"] for e in job.entries] == [r.caption for r in results]
    with pytest.raises(ConfigError, match="pass store_split=<split>"):
        caption(CaptionConfig(ckpt_path=str(ckpts["two"]), inputs=["x.jpg"], data_root=str(tmp_path)))
