"""Every config composes and validates against its schema; mistakes fail at start in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from captioning.cli.train import TrainConfig
from captioning.config import to_config
from captioning.errors import ConfigError

CONF = REPO / "conf"
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
TRAINERS = sorted(p.stem for p in (CONF / "trainer").glob("*.yaml"))
DATA = sorted(p.stem for p in (CONF / "data").glob("*.yaml"))


def compose_train(*overrides: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=False)
    with open_dict(cfg):
        cfg.output_dir = "/tmp/x"  # set by Hydra at run time
    return cfg


@pytest.mark.parametrize("model", MODELS)
def test_models_compose(model):
    from captioning.models.decoders import decoder_config, decoder_names, run_tag

    cfg = to_config(compose_train(f"model={model}"), TrainConfig)
    typed = decoder_config(cfg.model)  # the registered decoder's own typed, validated config
    assert typed.name in decoder_names()
    assert cfg.run_name == f"shapes-{run_tag(cfg.model)}-s0"
    if typed.name == "lstm":
        assert typed.variant in {"show_tell", "mean_pool", "soft_attention", "hard_attention"}


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiments_compose(experiment):
    cfg = to_config(compose_train(f"experiment={experiment}"), TrainConfig)
    assert cfg.data.name in {"coco", "flickr8k", "flickr30k", "msvd", "msrvtt"}


def test_presets_override_the_train_defaults():
    """An experiment's own optimisation settings win over conf/train.yaml's defaults (they did
    not while _self_ came last in its defaults list), and stage=scst brings its own."""
    cfg = to_config(compose_train("experiment=xu2015_soft"), TrainConfig)
    assert (cfg.optim.lr, cfg.optim.scheduler, cfg.trainer.max_epochs) == (1e-4, "none", 20)
    assert cfg.optim.optimizer == "adam" and cfg.data.name == "coco"
    cfg = to_config(compose_train("stage=scst"), TrainConfig)
    assert cfg.stage == "scst" and cfg.optim.lr == 2e-5 and cfg.run_name.endswith("-scst-s0")
    cfg = to_config(compose_train("experiment=luo2020_scst"), TrainConfig)
    assert cfg.stage == "scst" and cfg.scst.baseline == "mean" and cfg.optim.lr == 5e-5
    cfg = to_config(compose_train("debug=tiny", "trainer.max_epochs=3"), TrainConfig)
    assert cfg.trainer.max_epochs == 3 and cfg.trainer.limit_train_batches == 5


@pytest.mark.parametrize("trainer", TRAINERS)
def test_trainers_compose(trainer):
    cfg = to_config(compose_train(f"trainer={trainer}"), TrainConfig)
    assert cfg.trainer.accelerator in {"cpu", "gpu", "auto"}


@pytest.mark.parametrize("data", DATA)
def test_data_compose(data):
    cfg = to_config(compose_train(f"data={data}"), TrainConfig)
    assert cfg.data.kind in {"image", "video"}
    assert cfg.features_dir.startswith(cfg.data.root)


def test_unknown_key_names_the_key():
    from captioning.models.decoders import decoder_config

    # the decoder's own config is checked as soon as the run name is resolved, before any data
    with pytest.raises(ConfigError, match=r"unknown config key 'model.hiden_dim'"):
        decoder_config(to_config(compose_train("+model.hiden_dim=3"), TrainConfig).model)


def test_wrong_type_names_the_key():
    cfg = OmegaConf.create({"trainer": {"max_epochs": "lots"}})
    with pytest.raises(ConfigError, match=r"wrong type for config key 'trainer.max_epochs'"):
        to_config(cfg, TrainConfig)


def test_missing_value_names_the_key():
    cfg = OmegaConf.create({"ckpt_path": "???"})
    from captioning.cli.evaluate import EvaluateConfig

    with pytest.raises(ConfigError, match=r"missing mandatory config value 'ckpt_path'"):
        to_config(cfg, EvaluateConfig)


def test_cli_config_errors_are_one_line(tmp_path):
    proc = run_cli("train", "+model.hiden_dim=3", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith("error: unknown config key 'model.hiden_dim'"), proc.stderr
    proc = run_cli("evaluate", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode == 2 and "ckpt_path" in proc.stderr.strip().splitlines()[-1]
    # Typed at composition too: Hydra refuses the override before the job starts, in one line.
    proc = run_cli("train", "trainer.max_epochs=lots", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: Error merging override trainer.max_epochs=lots: Value 'lots' of type 'str' could not be converted "
        "to Integer"], proc.stderr
    # the decoder's own typed config (model/lstm_schema) is checked at composition too
    proc = run_cli("train", "model.hidden_dim=wide", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode == 2 and "model.hidden_dim" in proc.stderr and "wide" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("key", ["optim.lrr=1e-3", "model.hiden_dim=5"])
def test_a_misspelt_training_key_fails_at_composition_in_one_line(tmp_path, key):
    """The schema (TrainConfig and the decoder's config) refuses a key it does not have while Hydra
    composes the config: before the job starts (no run folder, no config logged), one line, status 2."""
    run = tmp_path / "run"
    proc = run_cli("train", key, f"hydra.run.dir={run}", check=False)
    name = key.split("=")[0]
    section, field = name.rsplit(".", 1)
    schema = {"optim": "OptimConfig", "model": "LSTMConfig"}[section]
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: unknown config key '{name}' (Key '{field}' not in '{schema}'): check its spelling "
        f"(--cfg job prints the composed config with every key)"], proc.stderr
    assert not run.exists() and "config:" not in proc.stdout + proc.stderr


# The console scripts' own entry points, each called as its script calls it, in one process (one
# import of torch instead of one per script): what each prints on stderr and its exit status.
_ENTRY_POINTS = """
import contextlib, importlib, io, json, sys
calls, run_dir, out = json.loads(sys.argv[1]), sys.argv[2], []
for cli, arg in calls:
    main = importlib.import_module(f"captioning.cli.{cli}").main
    sys.argv = [f"captioning-{cli}", arg, "hydra.run.dir=" + run_dir]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code
    out.append([code, err.getvalue()])
print(json.dumps(out))
"""

_SCHEMAS = {"caption": "CaptionConfig", "evaluate": "EvaluateConfig", "extract": "ExtractConfig",
            "generate": "GenerateConfig", "import_features": "ImportConfig", "score": "ProbeScoreConfig"}


def test_every_cli_refuses_a_misspelt_key_or_a_mistyped_value_in_one_line(tmp_path):
    """Every Hydra console script, not only captioning-train, types its config at composition: a key
    its schema lacks, or a value of the wrong type, is one line and status 2, before the job starts."""
    run = tmp_path / "run"
    calls = [[cli, "ouput_dir=x"] for cli in _SCHEMAS] + [["caption", "batch_size=lots"]]
    proc = subprocess.run([sys.executable, "-c", _ENTRY_POINTS, json.dumps(calls), str(run)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for (cli, _), (code, err) in zip(calls[:-1], results[:-1], strict=True):
        assert code == 2 and err.strip().splitlines() == [
            f"error: unknown config key 'ouput_dir' (Key 'ouput_dir' not in '{_SCHEMAS[cli]}'): check its "
            f"spelling (--cfg job prints the composed config with every key)"], (cli, code, err)
    assert results[-1] == [2, "error: Error merging override batch_size=lots: Value 'lots' of type 'str' could "
                              "not be converted to Integer\n"]
    assert not run.exists()


def test_slurm_launcher_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF)):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "trainer=ddp"], return_hydra_config=True)
    assert cfg.hydra.launcher.nodes == 1
    assert "submitit" in cfg.hydra.launcher._target_.lower()


def test_every_yaml_is_used(tmp_path):
    assert MODELS and EXPERIMENTS and len(TRAINERS) >= 4
    assert {"cpu", "gpu", "ddp", "ddp_cpu"} <= set(TRAINERS)
    assert Path(CONF / "hydra" / "launcher" / "slurm.yaml").is_file()


def test_the_stage_is_one_value():
    from captioning.errors import ConfigError
    from captioning.train.stage import stage_named

    assert [stage_named(s).name for s in ("xe", "scst", "finetune")] == ["xe", "scst", "finetune"]
    with pytest.raises(ConfigError, match="stage='rl': use xe"):
        stage_named("rl")


def test_the_module_settings_of_a_run_and_of_its_checkpoint_agree():
    """The typed pieces the LightningModule reads are the same whether built from the run's
    TrainConfig (training) or from the plain config its checkpoints record (loading)."""
    from captioning.models.decoders import decoder_config
    from captioning.train.module import config_dict
    from captioning.train.optim import OptimConfig
    from captioning.train.settings import ModuleSettings
    from captioning.train.stage import STAGES

    cfg = to_config(compose_train("stage=scst", "compile=false", "data.batch_size=7", "decode=beam",
                                  "optim.label_smoothing=0.1"), TrainConfig)
    typed = ModuleSettings.of(cfg)
    assert typed == ModuleSettings.from_config(config_dict(cfg))
    assert (typed.stage, typed.compile, typed.batch_size, typed.scst.baseline) == (STAGES["scst"], "false", 7, "mean")
    assert typed.optim.label_smoothing == 0.1 and typed.decode.beam_size == 5
    # sections a minimal config leaves out take their defaults
    small = ModuleSettings.from_config({"model": {"name": "lstm"}, "stage": "scst", "scst": {"samples": 3},
                                        "data": {"batch_size": 4, "max_length": 9}})
    assert (small.stage.name, small.scst.samples, small.compile, small.batch_size, small.max_length) == (
        "scst", 3, "auto", 4, 9)
    assert small.model == decoder_config({"name": "lstm"}) and small.optim == OptimConfig()
    with pytest.raises(TypeError, match="lrr"):  # a key this code does not have (load_captioner: one line)
        ModuleSettings.from_config({"model": {"name": "lstm"}, "optim": {"lrr": 1e-3}})
