"""Paper presets are the papers; the project's additions are presets of their own that differ from
their paper's preset in exactly the keys they document; every default has one source of truth."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import REPO
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import captioning.cli.train  # noqa: F401  (registers the train and decoder schemas)
from captioning.models.decoders.lstm import LSTMConfig


def composed(*overrides: str) -> dict:
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        return OmegaConf.to_container(compose("train", overrides=list(overrides)), resolve=False)


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# What each paper fixes (its text, or its authors' released code where the preset file says so).
PAPERS = {
    "xu2015_soft": {"model.variant": "soft_attention", "model.scoring": "additive", "model.gate": True,
                    "model.deep_output": True, "model.position_code": "none", "model.doubly_stochastic": 1.0,
                    "model.hidden_dim": 1800, "model.embed_dim": 512, "model.dropout": 0.5, "encoder": "vgg16",
                    "optim.optimizer": "adam", "data.min_count": 5},
    "xu2015_hard": {"model.variant": "hard_attention", "model.position_code": "none", "encoder": "vgg16"},
    "yao2015_temporal": {"model.variant": "soft_attention", "model.position_code": "none", "model.residual": "none",
                         "model.doubly_stochastic": 0.70602, "model.embed_dim": 468, "model.gate": True,
                         "model.deep_output": True, "decode.block_trigrams": False},
    "venugopalan2015_meanpool": {"model.variant": "mean_pool", "model.num_layers": 2, "model.hidden_dim": 1000},
    "vinyals2015_showtell": {"model.variant": "show_tell", "decode.strategy": "beam"},
    # the SCST papers start from the XE model of stage 1 (xu2015_soft): its architecture, no position code
    "rennie2017_scst": {"scst.baseline": "greedy", "scst.samples": 1, "optim.lr": 5e-5, "model.position_code": "none"},
    "luo2020_scst": {"scst.baseline": "mean", "scst.samples": 5, "optim.lr": 5e-5, "model.position_code": "none"},
}
# ours preset -> (its paper's preset, the keys it changes and their values)
OURS = {
    "ours_spatial": ("xu2015_soft", {"model.position_code": "sinusoidal", "model.doubly_stochastic": 0.0}),
    "ours_temporal": ("yao2015_temporal", {"model.position_code": "sinusoidal", "model.residual": "median",
                                           "model.doubly_stochastic": 0.0, "decode.block_trigrams": True}),
}


def test_every_preset_is_a_paper_or_ours():
    names = {p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")}
    assert names == set(PAPERS) | set(OURS)


@pytest.mark.parametrize("paper", sorted(PAPERS))
def test_paper_presets_set_what_the_paper_fixes(paper):
    cfg = flat(composed(f"experiment={paper}"))
    assert {k: cfg[k] for k in PAPERS[paper]} == PAPERS[paper]


@pytest.mark.parametrize("ours", sorted(OURS))
def test_ours_differs_from_its_paper_in_exactly_the_documented_keys(ours):
    paper, changes = OURS[ours]
    a, b = flat(composed(f"experiment={paper}")), flat(composed(f"experiment={ours}"))
    diff = {k: b[k] for k in a.keys() | b.keys() if a.get(k) != b.get(k) and k != "run_name"}
    assert diff == changes
    header = (REPO / "conf" / "experiment" / f"{ours}.yaml").read_text().splitlines()[1]
    assert header.startswith(f"# {ours}: {paper} + "), header  # one line says what it adds


def test_lstm_defaults_have_one_source_of_truth():
    """Every key a conf/model yaml sets equals the dataclass default, except the keys the yaml exists
    to set (listed here: soft attention's position code is the defaults study's decision, the dataclass
    keeps the paper's none); lambda defaults to 0 in both."""
    own = {"soft_attention": {"position_code"}, "hard_attention": {"variant"}, "mean_pool": {"variant", "gate"},
           "show_tell": {"variant", "gate", "deep_output"}, "temporal_attention": {"position_code"}}
    defaults = {f.name: f.default for f in dataclasses.fields(LSTMConfig)}
    assert defaults["doubly_stochastic"] == 0.0
    for name, keys in own.items():
        raw = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml"))
        raw.pop("defaults", None)
        differ = {k for k, v in raw.items() if k in defaults and v != defaults[k]}
        assert differ == keys, (name, {k: (raw[k], defaults[k]) for k in differ ^ keys if k in raw})
    assert composed("model=soft_attention")["model"]["doubly_stochastic"] == 0.0
