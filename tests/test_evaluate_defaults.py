"""The evaluation's decoding precision as its command line composes it: fp32 by default, also under
``trainer=gpu`` (whose ``trainer.precision`` is bf16-mixed); bf16 only when asked."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

import captioning.cli.evaluate  # noqa: F401  (registers evaluate_schema)
from captioning.config import CONF_DIR, to_config
from captioning.evaluation.job import EvaluateConfig, decoding_precision


def _evaluate_config(*overrides: str) -> EvaluateConfig:
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        raw = compose("evaluate", overrides=["ckpt_path=x.ckpt", *overrides])
    return to_config(raw, EvaluateConfig)


@pytest.mark.parametrize("trainer", ["cpu", "gpu"])
def test_captioning_evaluate_decodes_in_fp32_by_default(trainer: str) -> None:
    cfg = _evaluate_config(f"trainer={trainer}")
    assert cfg.precision == "fp32" and decoding_precision(cfg) == "32-true"


def test_captioning_evaluate_decodes_in_bf16_when_asked() -> None:
    cfg = _evaluate_config("trainer=gpu", "precision=bf16")
    assert decoding_precision(cfg) == "bf16-mixed"
