"""``captioning-bench train --cli``: captioning-train's steady-state step rate beside the benchmark's
(``captioning_bench.train_cli``): the steady state hand-computed, the CLI's overrides compose,
the synthetic dataset has the benchmark's shape, and a real run on a CPU."""

from __future__ import annotations

import argparse
import importlib
import json

import pytest
from conftest import run_bench

from captioning.store.feature_store import FeatureStore
from captioning_bench import train as bench_train
from captioning_bench.train_cli import cli_overrides, steady_state, write_dataset

TINY = "--batch-size 4 --regions 4 --feature-dim 8 --hidden 8 --attention-dim 4 --embed 8 --vocab 30 --length 6"


def _args(extra: str = "") -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    bench_train.add_arguments(parser)
    return parser.parse_args(f"{TINY} {extra}".split())


def test_steady_state_leaves_out_the_warm_up_and_each_epochs_first_step() -> None:
    clock = {"batches": [[0, 0.0], [0, 10.0], [0, 11.0], [0, 11.5], [0, 12.0], [1, 20.0], [1, 20.5], [1, 21.0]]}
    got = steady_state(clock, warmup=2)
    assert got == {"steps_per_s": pytest.approx(5 / 3), "steps": 5, "epoch_end_s": pytest.approx(8.0)}
    with pytest.raises(RuntimeError, match="no steady-state steps"):
        steady_state({"batches": clock["batches"][:2]}, warmup=2)


def test_the_synthetic_dataset_has_the_benchmarks_shape(tmp_path) -> None:
    write_dataset(tmp_path, items=3, eval_items=1, regions=4, dim=8, vocab=30, length=6)
    images = json.loads((tmp_path / "dataset_coco.json").read_text())["images"]
    assert [im["split"] for im in images] == ["train"] * 3 + ["val", "test"]
    lengths = [len(s["tokens"]) for im in images for s in im["sentences"]]
    assert len(lengths) == 25 and min(lengths) >= 3 and max(lengths) <= 6
    store = FeatureStore.open(tmp_path / "features")
    assert len(store) == 5 and store.positions == 4 and store.dim == 8


def test_the_cli_overrides_compose_with_the_benchmarks_model(tmp_path) -> None:
    from hydra import compose, initialize_config_dir

    from captioning.config import CONF_DIR

    importlib.import_module("captioning.cli.train")
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=cli_overrides(_args(), tmp_path, "cuda", "auto",
                                                                    tmp_path / "c.json"))
    assert (cfg.model.embed_dim, cfg.model.hidden_dim, cfg.model.attention_dim) == (8, 8, 4)
    assert cfg.model.deep_output is False and cfg.data.batch_size == 4 and cfg.data.max_length == 6
    assert cfg.trainer.precision == "bf16-mixed" and cfg.compile == "auto"
    assert cfg.callbacks.clock.path == str(tmp_path / "c.json")
    # the job as a user runs it: its default callbacks, loggers and progress, per-image batches
    assert {"checkpoint", "early_stopping", "lr_monitor", "progress", "attention_images"} <= set(cfg.callbacks)
    assert all(cfg.callbacks[k] is not None for k in cfg.callbacks) and set(cfg.logger) == {"tensorboard", "csv"}
    assert cfg.trainer.enable_progress_bar and (cfg.data.batching, cfg.data.cache) == ("image", "auto")


@pytest.mark.slow
def test_a_cli_run_beside_the_benchmark_on_a_cpu() -> None:
    records = run_bench("train", f"{TINY} --steps 1 --warmup 0 --cli --cli-items 16 --cli-epochs 2 --cli-workers 0")
    by_name = {r["name"]: r for r in records}
    assert {"train/cli", "train/cli_vs_ours", "train/cli_vs_baseline", "train/cli_loader", "train/cli_loop"} <= set(
        by_name)
    cli = by_name["train/cli"]
    assert cli["value"] > 0 and cli["steps_timed"] >= 10 and cli["compile"] == "false" and cli["batching"] == "image"
    assert by_name["train/cli_vs_ours"]["value"] > 0 and by_name["train/cli_vs_ours"]["target"] == 0.85  # a CPU
    assert by_name["train/cli_loader"]["value"] > 0 and by_name["train/cli_loop"]["steps_timed"] >= 40
    assert by_name["train/ours"]["captions"] == 5  # round(4 / 5) = 1 item with its 5 captions


def test_dispatched_ops_leave_views_out() -> None:
    import torch

    from captioning_bench.dispatch import dispatched_ops

    x = torch.randn(3, 4)
    assert dispatched_ops(lambda: (x.t().unsqueeze(0) * 2).sum()) == 2  # mul, sum: the views launch nothing


def test_a_training_step_dispatches_fewer_operations_than_the_tutorials() -> None:
    """The eager overhead, device-independent: one training step of ours (forward, backward, Adam)
    dispatches under 0.65x the tutorial decoder's operations (1299 vs 2276 at batch 64; 1967 before
    the step's one product of h_{t-1}, i.e. 0.86x)."""
    ours, base, _ = run_bench("train", "--batch-size 8 --regions 16 --feature-dim 64 --hidden 32 --attention-dim 32 "
                                       "--embed 32 --vocab 100 --steps 1 --warmup 0")
    assert ours["ops_per_step"] < 0.65 * base["ops_per_step"], (ours["ops_per_step"], base["ops_per_step"])
