"""Loggers as config: every conf/logger/*.yaml builds working Lightning loggers, offline.

Each logger config is composed as ``captioning-train logger=<name>`` composes it, built with
``hydra.utils.instantiate``, given a metric and an image, and read back from what it wrote under
the run directory (W&B offline, MLflow's local SQLite store: no network, no login).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

LOGGER_CONFIGS = sorted(p.stem for p in (REPO / "conf" / "logger").glob("*.yaml"))
KINDS = {  # what each config builds, in order
    "csv": ["CSVLogger"],
    "default": ["TensorBoardLogger", "CSVLogger"],
    "many": ["TensorBoardLogger", "CSVLogger", "WandbLogger", "MLFlowLogger"],
    "mlflow": ["MLFlowLogger"],
    "none": [],
    "tensorboard": ["TensorBoardLogger"],
    "wandb": ["WandbLogger"],
}


def compose_train(*overrides: str):
    """The ``TrainConfig`` that ``captioning-train <overrides>`` would run with."""
    from hydra import compose, initialize_config_dir

    import captioning.cli.train  # noqa: F401  (registers the schemas and resolvers)
    from captioning.config import CONF_DIR, to_config
    from captioning.train.job import TrainConfig

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_config(compose("train", overrides=list(overrides)), TrainConfig)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No W&B account or server: offline mode, no API key, settings kept under tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_SILENT", "true")


def read_back(logger, out: Path) -> tuple[float, int]:
    """(the value of metric 'probe' at step 3, how many images were stored) from ``logger``'s files."""
    kind = type(logger).__name__
    if kind == "TensorBoardLogger":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"images": 0, "scalars": 0}).Reload()
        [event] = acc.Scalars("probe")
        assert event.step == 3
        return event.value, sum(len(acc.Images(t)) for t in acc.Tags()["images"])
    if kind == "CSVLogger":
        with open(out / "csv" / "metrics.csv") as f:
            [row] = [r for r in csv.DictReader(f) if r.get("probe")]
        assert int(row["step"]) == 3
        return float(row["probe"]), 0
    if kind == "WandbLogger":
        [run] = list((out / "wandb").glob("offline-run-*"))  # the offline run folder, to `wandb sync`
        assert list(run.glob("run-*.wandb"))  # the run's record log (written by wandb's service process)
        return 1.5, len(list(run.glob("files/media/images/**/*.png")))  # the value: its summary, before finish()
    if kind == "MLFlowLogger":
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
        [m] = client.get_metric_history(logger.run_id, "probe")
        assert m.step == 3
        return m.value, len(list((out / "mlflow").glob(f"{logger.run_id}/artifacts/**/*.png")))
    raise AssertionError(f"no reader for {kind}")


@pytest.mark.slow
def test_every_logger_config_builds_a_working_logger(tmp_path, offline):
    from captioning.caption.callbacks import log_images
    from captioning.train.job import build_loggers

    assert set(LOGGER_CONFIGS) == set(KINDS), "a new conf/logger/*.yaml: add what it builds to KINDS"
    image = np.zeros((24, 32, 3), np.uint8)
    image[:, :16, 0] = 255
    for name in LOGGER_CONFIGS:
        out = tmp_path / name
        out.mkdir()
        cfg = compose_train(f"logger={name}", f"output_dir={out}", "run_name=probe")
        loggers = build_loggers(cfg)
        assert [type(lg).__name__ for lg in loggers] == KINDS[name], name
        for lg in loggers:
            lg.log_metrics({"probe": 1.5}, step=3)
            took = log_images(lg, "val/attention", [image], ["7"], ["a red square"], step=3)
            assert took == (type(lg).__name__ != "CSVLogger")
            lg.save()
            lg.finalize("success")
            if type(lg).__name__ == "WandbLogger":
                assert lg.experiment.summary["probe"] == 1.5
                lg.experiment.finish()
        for lg in loggers:  # everything under this run's directory
            value, images = read_back(lg, out)
            assert value == 1.5 and images == (0 if type(lg).__name__ == "CSVLogger" else 1), (name, lg)
        if not loggers:
            assert list(out.iterdir()) == []


def test_logger_none_and_null_nodes_build_nothing(tmp_path):
    from captioning.train.job import build_loggers

    assert build_loggers(compose_train("logger=none", f"output_dir={tmp_path}")) == []
    cfg = compose_train("logger=default", "logger.tensorboard=null", f"output_dir={tmp_path}")
    assert [type(lg).__name__ for lg in build_loggers(cfg)] == ["CSVLogger"]


def test_resume_keeps_csv_rows_before_the_checkpoint_step(tmp_path):
    """The CSV logger node, built on resume at step 3, keeps the rows of steps 0-2 and appends."""
    from captioning.train.job import build_loggers

    path = tmp_path / "csv" / "metrics.csv"
    path.parent.mkdir()
    path.write_text("epoch,step,train/loss\n" + "".join(f"0,{s},{10 - s}.0\n" for s in range(6)))
    [logger] = build_loggers(compose_train("logger=csv", f"output_dir={tmp_path}"), resume_step=3)
    logger.log_metrics({"train/loss": 0.5}, step=3)
    logger.save()
    with open(path) as f:
        rows = [(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(f)]
    assert rows == [(0, 10.0), (1, 9.0), (2, 8.0), (3, 0.5)]


def test_a_logger_that_cannot_be_built_is_a_config_error(tmp_path):
    from captioning.errors import ConfigError
    from captioning.train.job import instantiate_nodes

    with pytest.raises(ConfigError, match=r"logger\.mine: cannot build nowhere\.Logger"):
        instantiate_nodes({"mine": {"_target_": "nowhere.Logger"}}, "logger")
    with pytest.raises(ConfigError, match=r"logger\.csv is not a node with a _target_.*logger\.csv=null"):
        instantiate_nodes({"csv": {"save_dir": str(tmp_path)}}, "logger")
