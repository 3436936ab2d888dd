"""``make demo``'s defaults: the grid and decoder it extracts and trains compose with Hydra to the
chosen settings (docs/demo.md), and its summary prints val pointing with its chance level."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from conftest import REPO
from hydra import compose, initialize_config_dir

import captioning.cli.train  # noqa: F401  (registers the train and decoder schemas)
from captioning import demo
from captioning.cli.extract import ExtractConfig
from captioning.config import to_config
from captioning.features.backbones import build_backbone, validate_encoder_config
from captioning.utils.io import atomic_write_json


def composed(name: str, *overrides: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        return compose(name, overrides=list(overrides))


def test_demo_extracts_the_14x14_grid_of_the_stride16_stage_into_a_store_of_its_own():
    cfg = to_config(composed("extract", *demo.data_args("data/shapes", 3000), *demo.EXTRACT, "trainer=cpu"),
                    ExtractConfig)
    validate_encoder_config(cfg.encoder)
    assert (cfg.encoder.name, cfg.encoder.image_size, str(cfg.encoder.layer)) == ("efficientnet_lite0", 224, "-2")
    assert cfg.features_dir == "data/shapes/features/efficientnet_lite0_stride16"
    backbone = build_backbone(dataclasses.replace(cfg.encoder, weights="none"))  # same layers, no weights file
    assert backbone.output_shape() == (112, 14, 14)


def test_demo_trains_position_coded_soft_attention_on_that_store():
    cfg = composed("train", *demo.data_args("data/shapes", 3000), *demo.MODEL, "trainer=cpu")
    assert cfg.features_dir == "data/shapes/features/efficientnet_lite0_stride16"
    model = cfg.model
    assert (model.variant, model.position_code, model.doubly_stochastic) == ("soft_attention", "learned", 0.0)
    assert (model.hidden_dim, model.embed_dim, model.attention_dim, cfg.optim.lr) == (128, 64, 64, 2e-3)
    assert demo.EPOCHS == 4


def _write_eval(out: Path, split: str, pointing: float, chance: float) -> None:
    atomic_write_json(out / "eval" / split / "metrics.json", {"Bleu_4": 0.9, "CIDEr": 7.5})
    atomic_write_json(out / "eval" / split / "report.json", {
        "structure": {"binding_accuracy": 0.95, "chance_binding_accuracy": 0.5},
        "grounding": {"pointing_accuracy": pointing, "chance_pointing_accuracy": chance}})


def test_demo_summary_prints_val_pointing_with_its_chance(tmp_path, capsys):
    _write_eval(tmp_path, "val", 0.9541, 0.0613)
    _write_eval(tmp_path, "test", 0.25, 0.05)
    demo.print_summary(tmp_path, "run", "run/best.ckpt", 300.0)
    lines = capsys.readouterr().out.splitlines()
    assert "Demo finished in 5.0 min." in lines
    val = next(line for line in lines if line.lstrip().startswith("val:"))
    assert "BLEU-4 0.900  CIDEr 7.500  binding accuracy 0.950 (chance 0.500)" in val
    assert "pointing accuracy 0.954 (chance 0.061)" in val
    headline = [line for line in lines if "val pointing accuracy" in line]
    assert len(headline) == 1 and headline[0].strip().startswith("val pointing accuracy 0.954 (chance 0.061):")
