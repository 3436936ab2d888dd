"""Callbacks as config (conf/callbacks/*.yaml), quiet progress off a terminal, attention images."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from conftest import data_overrides, make_tiny_image_dataset, run_cli
from PIL import Image
from test_loggers import compose_train

FAST = ["model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16", "optim.lr=0.01",
        "optim.warmup_steps=0", "callbacks.early_stopping=null"]


def built(*overrides: str) -> list[str]:
    from captioning.train.job import build_callbacks

    cfg = compose_train("output_dir=/nonexistent/run", *overrides)
    return [type(c).__name__ for c in build_callbacks(cfg, loggers=["a logger"])]


def test_callback_configs_build_lightning_callbacks():
    default = ["ResumableCheckpoint", "EarlyStopping", "LearningRateMonitor", "LineProgress", "AttentionImages"]
    assert built() == default  # pytest's stdout is not a terminal
    assert built("callbacks=[default,swa]") == [*default, "StochasticWeightAveraging"]  # one yaml adds one
    assert built("callbacks.early_stopping=null", "callbacks.attention_images=null") == [
        "ResumableCheckpoint", "LearningRateMonitor", "LineProgress"]
    assert built("callbacks=none") == ["ResumableCheckpoint", "LineProgress"]
    assert built("trainer.enable_progress_bar=false", "callbacks=none") == ["ResumableCheckpoint"]


def test_callback_settings_reach_the_callbacks():
    from captioning.train.job import build_callbacks

    cfg = compose_train("output_dir=/runs/x", "callbacks.checkpoint.save_top_k=0", "callbacks.early_stopping.patience=2",
                        "callbacks.progress.every_percent=25", "callbacks.attention_images.items=3",
                        "data.root=/data/tiny")
    ckpt, stop, progress, images = build_callbacks(cfg, loggers=[])  # no logger: no learning-rate monitor
    assert (ckpt.dirpath, ckpt.save_top_k, ckpt.save_last, ckpt.monitor) == ("/runs/x/checkpoints", 0, True, "val/CIDEr")
    assert (stop.monitor, stop.mode, stop.patience) == ("val/CIDEr", "max", 2)
    assert progress.every == 25
    assert (images.items, images.media_dir) == (3, "/data/tiny/images")


def test_a_callback_node_without_target_is_a_config_error():
    from captioning.errors import ConfigError
    from captioning.train.job import build_callbacks

    cfg = compose_train("output_dir=/runs/x", "experiment=xu2015_soft", "callbacks=none")  # sets a patience only
    with pytest.raises(ConfigError, match=r"callbacks\.early_stopping is not a node with a _target_"):
        build_callbacks(cfg, loggers=[])
    with pytest.raises(ConfigError, match=r"callbacks\.progress\.bar='live'"):
        build_callbacks(compose_train("output_dir=/runs/x", "callbacks.progress.bar=live"), loggers=[])


def test_progress_is_a_live_bar_on_a_terminal_and_lines_elsewhere():
    from pytorch_lightning.callbacks import RichProgressBar, TQDMProgressBar

    from captioning.errors import ConfigError
    from captioning.train.callbacks import LineProgress, LoggedLosses, progress_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    rich, tqdm = progress_bar("rich", stream=Terminal()), progress_bar("tqdm", stream=Terminal())
    assert isinstance(rich, RichProgressBar) and isinstance(tqdm, TQDMProgressBar)
    piped = progress_bar("tqdm", every_percent=25, stream=io.StringIO())
    assert type(piped) is LineProgress and piped.every == 25
    # every bar shows the losses of the last logging step, read there (nothing logged with prog_bar)
    module = type("M", (), {"progress_metrics": {"loss": 2.5}})()
    trainer = type("T", (), {"progress_bar_metrics": {"val/CIDEr": 0.5}, "loggers": []})()
    for bar in (rich, tqdm, piped):
        assert isinstance(bar, LoggedLosses) and bar.get_metrics(trainer, module) == {"val/CIDEr": 0.5, "loss": 2.5}
    with pytest.raises(ConfigError, match="callbacks.progress.bar='live'"):
        progress_bar("live")
    with pytest.raises(ConfigError, match="every_percent=0"):
        progress_bar("rich", every_percent=0, stream=io.StringIO())


def test_attention_image_is_the_saved_figure(tmp_path):
    """The array sent to the loggers is, pixel for pixel, the figure ``plot_result`` saves."""
    from captioning.caption.api import CaptionResult
    from captioning.caption.callbacks import attention_image
    from captioning.viz.heatmaps import plot_result

    image = CaptionResult("1", "image", caption="a red circle", tokens=["a", "red", "circle"],
                          attention=np.array([[1.0, 0, 0, 0], [0, 0, 0, 1], [0.25, 0.25, 0.25, 0.25]]),
                          attention_shape=[2, 2])
    video = CaptionResult("2", "video", caption="a b", tokens=["a", "b"], attention=np.array([[0.5, 0.5, 0], [0, 0, 1]]),
                          attention_shape=[3], frame_indices=[0, 5, 10])
    for result in (image, video):
        drawn = attention_image(result, dpi=40)
        saved = np.asarray(Image.open(plot_result(result, tmp_path / f"{result.input}.png", dpi=40)).convert("RGB"))
        assert drawn.dtype == np.uint8 and drawn.shape == saved.shape
        assert np.array_equal(drawn, saved)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    return make_tiny_image_dataset(tmp_path_factory.mktemp("cb") / "tiny")


@pytest.mark.slow
def test_piped_training_prints_a_line_per_tenth_of_an_epoch(tiny, tmp_path):
    """One epoch of 12 batches (32 items x 3 captions / 8) with stdout piped: progress lines at
    batches 2, 3, 4, 5, 6, 8, 9, 10, 11, 12 (the first batch past each 10%) and one validation
    line, even with the tqdm bar asked for; the whole output stays short."""
    proc = run_cli("train", *data_overrides(tiny["root"], tiny["features_dir"]), *FAST, "logger=csv",
                   "callbacks.progress.bar=tqdm", "trainer.max_epochs=1", "data.batching=caption",
                   f"hydra.run.dir={tmp_path / 'run'}")
    lines = re.split(r"\r\n|\r|\n", proc.stdout + proc.stderr)  # a live bar's redraws count as lines
    progress = [ln for ln in lines if "[captioning.progress]" in ln]
    done = [int(m.group(1)) for ln in progress if (m := re.search(r"\((\d+)/12 batches", ln))]
    assert done == [2, 3, 4, 5, 6, 8, 9, 10, 11, 12]
    assert [round(100 * d / 12) for d in done] == [int(re.search(r"(\d+)% \(", ln).group(1))
                                                   for ln in progress if "batches" in ln]
    [val] = [ln for ln in progress if "validation" in ln]
    assert "epoch 0/0 validation" in val and "val/CIDEr=" in val
    # the job's config dump (one log record) aside, the output of the epoch is short
    config_end = lines.index("", next(i for i, ln in enumerate(lines) if ln.endswith("- config:")))
    rest = [ln for ln in lines[config_end:] if ln.strip()]
    assert len(rest) < 50, "\n".join(rest)


@pytest.mark.slow
def test_attention_images_reach_tensorboard_every_epoch(tiny, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    run_cli("train", *data_overrides(tiny["root"], tiny["features_dir"]), *FAST, "logger=default",
            "callbacks.attention_images.items=2", "callbacks.lr_monitor=null", "trainer.max_epochs=2",
            "data.batching=caption", f"hydra.run.dir={run}")
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0}).Reload()
    first_val = [str(i) for i in tiny["splits"]["val"][:2]]  # the same two items every epoch
    assert sorted(acc.Tags()["images"]) == sorted(f"val/attention/{i}" for i in first_val)
    for tag in acc.Tags()["images"]:
        events = acc.Images(tag)
        assert [e.step for e in events] == [12, 24]  # after each epoch's 12 steps
        for e in events:
            png = Image.open(io.BytesIO(e.encoded_image_string))
            assert png.size == (e.width, e.height) and e.width > e.height > 50
