"""Hyper-parameter search: ``captioning-train -m hparams_search=cider_optuna`` through the real CLI."""

from __future__ import annotations

import csv
import json
import math

import pytest
from conftest import data_overrides, make_tiny_image_dataset, run_cli
from omegaconf import OmegaConf

SEARCHED = ("optim.lr", "model.dropout", "model.doubly_stochastic", "model.attention_dim")


def _get(cfg, dotted: str):
    return OmegaConf.select(cfg, dotted)


@pytest.mark.slow
def test_two_trial_optuna_sweep_maximises_val_cider(tmp_path):
    data = make_tiny_image_dataset(tmp_path / "tiny")
    sweep = tmp_path / "sweep"
    run_cli("train", "-m", "hparams_search=cider_optuna", "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={sweep}",
            *data_overrides(data["root"], data["features_dir"]), "model.embed_dim=16", "model.hidden_dim=32",
            "trainer.max_epochs=1", "logger=csv", "callbacks.progress=null", "trainer.enable_progress_bar=false")
    trials = sorted((p for p in sweep.iterdir() if (p / "train_summary.json").is_file()),
                    key=lambda p: int(OmegaConf.load(p / ".hydra" / "hydra.yaml").hydra.job.num))
    assert len(trials) == 2  # one run folder per trial, named by its fingerprint: no trial resumed another
    scores, params = [], []
    for run in trials:
        summary = json.loads((run / "train_summary.json").read_text())
        assert summary["epochs"] == 1 and summary["best_val_CIDEr"] is not None and summary["global_step"] > 0
        assert run.name.endswith(f"-{summary['fingerprint']}")
        cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
        p = {k: _get(cfg, k) for k in SEARCHED}
        assert 1e-4 <= p["optim.lr"] <= 1e-2 and 0 <= p["model.dropout"] <= 0.5
        assert 0 <= p["model.doubly_stochastic"] <= 2 and p["model.attention_dim"] in (64, 128, 256, 512)
        scores.append(summary["best_val_CIDEr"])
        params.append(p)
    assert params[0] != params[1]  # two different points of the space were tried
    with open(sweep / "summary.csv", newline="") as f:  # the sweep summary lists every trial with its own score
        rows = sorted(csv.DictReader(f), key=lambda r: int(r["job"]))
    assert [r["run_dir"] for r in rows] == [str(t) for t in trials]
    assert [float(r["best_val_CIDEr"]) for r in rows] == pytest.approx(scores)
    assert all("optim.lr=" in r["differs"] for r in rows)
    result = OmegaConf.to_container(OmegaConf.load(sweep / "optimization_results.yaml"))
    best = max(range(2), key=lambda i: scores[i])
    assert math.isclose(result["best_value"], scores[best], rel_tol=1e-9)
    assert result["best_params"] == pytest.approx(params[best])
