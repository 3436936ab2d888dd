"""No host read of a device value inside the training loop, outside its logging steps.

On a GPU every read of a device value (``.item()``, ``bool(t)``, ``torch.equal``) waits for the
device: the CPU can no longer run ahead, and the loader hand-off, Lightning's hooks and the next
launches stop overlapping the GPU's work.  Such reads dispatch ``aten._local_scalar_dense`` or
``aten.equal`` on any device, so a ``TorchDispatchMode`` counts them on a CPU.  The training job
runs in this process (``captioning.train.job.train``) with its default callbacks and loggers; each
training iteration is a window from one batch's start to the next's, and a window may read only
where a logger logged, the module reported its logging step (``CaptioningModule.report``), an epoch
ended or a validation ran.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from conftest import data_overrides, make_tiny_image_dataset
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger
from test_config import compose_train
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from captioning.config import to_config
from captioning.train.job import TrainConfig, train
from captioning.train.module import CaptioningModule

pytestmark = pytest.mark.slow

READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.equal.default, torch.ops.aten.is_nonzero.default}


class HostReads(TorchDispatchMode):
    """Counts the host reads of tensor values per training window (``window``: the current one)."""

    def __init__(self) -> None:
        super().__init__()
        self.window: tuple[int, int] | None = None
        self.windows: list[tuple[int, int]] = []
        self.reads: Counter = Counter()
        self.written: set[tuple[int, int]] = set()  # windows where a logger wrote, an epoch ended, a validation ran
        self.reported: set[tuple[int, int]] = set()  # windows where the module read its logged values

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.window is not None and func in READS:
            self.reads[self.window] += 1
        return func(*args, **(kwargs or {}))

    @property
    def logging(self) -> set[tuple[int, int]]:
        """Windows with a logging step, an epoch end or a validation: where a read is allowed."""
        return self.written | self.reported

    def flag(self, into: str = "written") -> None:
        if self.window is not None:
            getattr(self, into).add(self.window)


COUNTER: HostReads | None = None  # the test's counter, for the callback the job builds from its config


class Windows(pl.Callback):
    """One window per training iteration; epoch ends and validations flag theirs."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        COUNTER.window = (trainer.current_epoch, batch_idx)
        COUNTER.windows.append(COUNTER.window)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        COUNTER.flag()

    def on_validation_start(self, trainer, pl_module) -> None:
        COUNTER.flag()

    def on_train_end(self, trainer, pl_module) -> None:
        COUNTER.window = None


def _flagging(method, into: str = "written"):
    def wrapped(self, *args, **kwargs):
        COUNTER.flag(into)
        return method(self, *args, **kwargs)
    return wrapped


def count_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> HostReads:
    """Train 2 epochs of the tiny dataset in this process, counting host reads per window."""
    global COUNTER
    data = make_tiny_image_dataset(tmp_path / "tiny", n=60)
    cfg = compose_train(*data_overrides(data["root"], data["features_dir"]), "trainer.max_epochs=2",
                        "trainer.log_every_n_steps=5", "model.embed_dim=16", "model.hidden_dim=24",
                        "model.attention_dim=8", "callbacks.attention_images.media_dir=" + str(data["root"]),
                        f"+callbacks.windows._target_={__name__}.Windows", *overrides)
    cfg.output_dir = str(tmp_path / "run")
    for cls in (CSVLogger, TensorBoardLogger):
        monkeypatch.setattr(cls, "log_metrics", _flagging(cls.log_metrics))
    monkeypatch.setattr(CaptioningModule, "report", _flagging(CaptioningModule.report, "reported"))
    COUNTER = HostReads()
    with COUNTER:
        train(to_config(cfg, TrainConfig))
    return COUNTER


def check(counter: HostReads) -> None:
    reading = {w for w in counter.windows if counter.reads[w]}
    quiet = [w for w in counter.windows if w not in counter.logging]
    assert len(counter.windows) >= 20 and len(quiet) >= len(counter.windows) // 2, (counter.windows, counter.logging)
    outside = sorted(reading - counter.logging)
    assert not outside, (f"{len(outside)} of {len(quiet)} iterations outside a logging step read a device value "
                         f"({dict((w, counter.reads[w]) for w in outside[:5])} ...)")
    unwritten = sorted(counter.reported - counter.written)
    assert not unwritten, f"the module reported in {len(unwritten)} iterations where no logger wrote: {unwritten[:5]}"


@pytest.mark.parametrize("batching", ["image", "caption"])
def test_no_iteration_outside_a_logging_step_reads_a_device_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  batching: str) -> None:
    """The default (eager on a CPU) path, per-image and per-caption batches, default callbacks."""
    check(count_reads(tmp_path, monkeypatch, f"data.batching={batching}"))


def test_accumulated_batches_report_only_where_a_logger_writes(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``trainer.accumulate_grad_batches=2``: the global step stands still over a batch that only
    accumulates, so a rule on the step alone would report (and read) on both batches of a logging update."""
    check(count_reads(tmp_path, monkeypatch, "trainer.accumulate_grad_batches=2"))


def test_the_compiled_step_reads_no_device_value_outside_a_logging_step(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``compile=true`` on a CPU: the path ``compile=auto`` takes on a GPU (fixed shapes, one graph).
    torch.compile refuses to trace under a dispatch mode, so the compiled graph runs with the counter
    off; a graph (``fullgraph=True``) holds no host read, the code around it is counted.  AOT
    autograd's graphs without inductor's code generation: the same graphs, in seconds."""
    compile_ = torch.compile

    def compile_outside_the_counter(fn, **kwargs):
        compiled = compile_(fn, **{**kwargs, "backend": "aot_eager", "mode": None})

        def run(*args, **kw):
            with _disable_current_modes():
                return compiled(*args, **kw)
        return run

    monkeypatch.setattr(torch, "compile", compile_outside_the_counter)
    check(count_reads(tmp_path, monkeypatch, "compile=true"))


def test_the_counter_sees_the_reads_it_forbids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step that reads its loss (what ``torch.isfinite(loss).item()`` once did) fails the check."""
    step = CaptioningModule.training_step

    def reading(self, batch, batch_idx):
        loss = step(self, batch, batch_idx)
        bool(torch.isfinite(loss))
        return loss

    monkeypatch.setattr(CaptioningModule, "training_step", reading)
    with pytest.raises(AssertionError, match="outside a logging step read a device value"):
        check(count_reads(tmp_path, monkeypatch))
