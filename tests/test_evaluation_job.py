"""The evaluation job's decoding: fp32 unless asked (whatever the Trainer's autocast), recorded in
report.json and provenance.json; training's validation decodes the same way; predictions.json holds
each word's log-prob, and its attention file reads back into the reproduction records' statistic."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tiny_image_dataset
from test_caption_cli import save_checkpoint
from torch.utils.data import DataLoader

from captioning.config import DataConfig, TrainerConfig
from captioning.data.datamodule import CaptionEvalDataset, collate
from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError
from captioning.evaluation.grounding import coverage_entropy
from captioning.evaluation.job import EvaluateConfig, Laps, decode_split, evaluate, split_items
from captioning.models.decoders.lstm_forcing import native_low_precision
from captioning.models.search import DecodeConfig
from captioning.predictions import read_predictions
from captioning.store.feature_store import FeatureStore
from captioning.train.checkpoint import load_captioner
from captioning.train.inputs import checkpoint_data_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """The conftest's tiny dataset and an untrained checkpoint over its FeatureStore."""
    tmp = tmp_path_factory.mktemp("evaluation")
    d = make_tiny_image_dataset(tmp / "tiny")
    root = d["root"]
    data = asdict(DataConfig(name="tiny", kind="image", format="coco", root=str(root), media_dir=str(root / "images"),
                             annotations={s: str(root / "annotations" / f"captions_{s}.json")
                                          for s in ("train", "val", "test")}, num_workers=0))
    meta = dict(FeatureStore.open(d["features_dir"]).meta)
    words = ["a", "red", "green", "blue", "circle", "square", "triangle", "there", "is", "."]
    (tmp / "run" / "checkpoints").mkdir(parents=True)
    ckpt = save_checkpoint(tmp / "run" / "checkpoints" / "best.ckpt", meta, Vocabulary.build([words]).to_dict(), data,
                           d["features_dir"])
    return {**d, "ckpt": ckpt}


def _config(tiny: dict, out: Path, trainer_precision: str = "32-true", **kw) -> EvaluateConfig:
    kw.setdefault("decode", DecodeConfig(beam_size=3, max_length=6))
    return EvaluateConfig(ckpt_path=str(tiny["ckpt"]), split="test", output_dir=str(out), metrics=["bleu", "cider"],
                          trainer=TrainerConfig(accelerator="cpu", precision=trainer_precision,
                                                enable_progress_bar=False), num_workers=0, **kw)


def _read(summary: dict, name: str) -> object:
    return json.loads((Path(summary["output_dir"]) / name).read_text())


def test_evaluation_decodes_in_fp32_unless_asked_and_says_so(tiny, tmp_path) -> None:
    fp32 = evaluate(_config(tiny, tmp_path / "fp32"))
    gpu_preset = evaluate(_config(tiny, tmp_path / "preset", trainer_precision="bf16-mixed"))  # trainer=gpu's
    bf16 = evaluate(_config(tiny, tmp_path / "bf16", precision="bf16"))
    assert _read(gpu_preset, "predictions.json") == _read(fp32, "predictions.json")  # not the trainer's autocast
    scores = {name: [p["score"] for p in _read(s, "predictions.json")] for name, s in (("fp32", fp32), ("bf16", bf16))}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        native = native_low_precision(torch.device("cpu"))
    if native:
        assert scores["bf16"] != scores["fp32"]  # bf16 did decode in bf16
    else:  # a CPU without native bf16 products: the decoder computes in float32 (lstm_forcing.native_low_precision)
        assert scores["bf16"] == scores["fp32"]
    for summary, precision in ((fp32, "fp32"), (gpu_preset, "fp32"), (bf16, "bf16")):
        meta, prov = _read(summary, "report.json")["meta"], _read(summary, "provenance.json")
        assert summary["precision"] == meta["precision"] == prov["precision"] == precision
        assert ("precision_note" in meta) == (precision != "fp32")
    report = (Path(bf16["output_dir"]) / "report.md").read_text()
    assert "captions and metrics can differ from fp32 decoding" in report
    with pytest.raises(ConfigError, match="precision='fp64'"):
        evaluate(_config(tiny, tmp_path / "fp64", precision="fp64"))


def test_predictions_hold_word_log_probs_and_attention_that_reads_back(tiny, tmp_path) -> None:
    cfg = _config(tiny, tmp_path / "e", decode=DecodeConfig(beam_size=3, max_length=6, length_penalty="none"))
    evaluate(cfg)
    back = read_predictions(tmp_path / "e" / "predictions.json")
    for p in back:  # max_length forces <eos>: every caption finished, its <eos>'s log-prob last
        assert len(p["token_log_probs"]) == len(p["tokens"]) + 1 and max(p["token_log_probs"]) <= 0
        assert sum(p["token_log_probs"]) == pytest.approx(p["score"], abs=1e-3)  # no length penalty: the sum
    decoded = decode_split(cfg, Laps())  # the same captions in memory, attention in float32
    in_memory = [{"attention": decoded.predictions[i]["attention"]} for i in decoded.order]
    assert [p["tokens"] for p in back] == [decoded.predictions[i]["tokens"] for i in decoded.order]
    for p, m in zip(back, in_memory, strict=True):  # each item's own rows: float16, each weight to 2^-11
        np.testing.assert_allclose(p["attention"], np.asarray(m["attention"], dtype=np.float32), rtol=2.0**-11,
                                   atol=1e-7)
    # the reproduction records' statistic from the float16 file equals the float32 one
    assert coverage_entropy(back) == pytest.approx(coverage_entropy(in_memory), abs=1e-3)


def test_validation_decodes_in_fp32_inside_the_trainers_autocast(tiny) -> None:
    module = load_captioner(tiny["ckpt"])
    store = FeatureStore.open(tiny["features_dir"])
    items = split_items(_config(tiny, Path("unused")), checkpoint_data_config(module.hparams["config"]), store)
    batch = next(iter(DataLoader(CaptionEvalDataset(items), batch_size=4, collate_fn=collate)))
    autocast_seen, step = [], module.decoder.step

    def spy(*args, **kwargs):
        autocast_seen.append(torch.is_autocast_enabled("cpu"))
        return step(*args, **kwargs)

    module.decoder.step = spy
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what a bf16-mixed Trainer wraps validation in
        module.validation_step(batch, 0)
    assert autocast_seen and not any(autocast_seen)
    assert len(module._val_outputs) == 4
