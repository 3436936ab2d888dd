"""The cosine schedule's length is resolved before a run starts (``captioning.train.job.schedule_length``):
it is what Lightning's ``trainer.estimated_stepping_batches`` counts once the run has started, for
per-image and per-caption batches, limited, accumulated and capped runs, and a DDP rank's share."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import pytorch_lightning as pl
from test_compile import _module, toy_data
from torch.utils.data import DistributedSampler

from captioning.config import TrainerConfig
from captioning.train.job import TrainConfig, schedule_length
from captioning.train.optim import OptimConfig


class Estimated(pl.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.steps = trainer.estimated_stepping_batches
        trainer.should_stop = True


@pytest.mark.parametrize("batching", ["image", "caption"])
@pytest.mark.parametrize("trainer", [{}, {"limit_train_batches": 3}, {"limit_train_batches": 0.5},
                                     {"accumulate_grad_batches": 2}, {"max_steps": 5}, {"fast_dev_run": True}],
                         ids=["plain", "limit-int", "limit-float", "accumulate", "max-steps", "fast-dev-run"])
def test_the_schedule_length_is_lightnings_estimate(tmp_path, batching: str, trainer: dict) -> None:
    module = _module("false")
    dm = toy_data(tmp_path, module, batching, val_items=3)
    cfg = TrainConfig(optim=OptimConfig(scheduler="cosine"), trainer=replace(TrainerConfig(max_epochs=3), **trainer))
    estimated = Estimated()
    pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, callbacks=[estimated], default_root_dir=tmp_path,
               **{k: v for k, v in vars(cfg.trainer).items() if k in ("max_epochs", "max_steps", *trainer)}
               ).fit(module, datamodule=dm)
    assert schedule_length(cfg, dm.train_batches(1), None) == estimated.steps > 0
    # a DDP rank's share: the batches of a DistributedSampler over the training samples
    ds = dm.train_dataloader().dataset
    share = len(DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True))
    assert dm.train_batches(2) == math.ceil(share / dm.items_per_batch)


def test_a_resumed_run_keeps_the_length_it_resolved_and_a_fixed_length_wins() -> None:
    cfg = TrainConfig(optim=OptimConfig(scheduler="cosine"), trainer=TrainerConfig(max_epochs=3))
    assert schedule_length(cfg, 10, None) == 30
    assert schedule_length(cfg, 10, {"run": {"schedule_steps": 12}}) == 12  # its own, not the new budget's
    assert schedule_length(replace(cfg, optim=OptimConfig(schedule_steps=7)), 10, {"run": {"schedule_steps": 12}}) == 7
    assert schedule_length(replace(cfg, optim=OptimConfig(scheduler="none")), 10, None) is None
