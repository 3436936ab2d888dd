"""The training job: fit a caption decoder on a FeatureStore with Lightning (CPU, GPU, DDP).

``train(TrainConfig)`` reads the dataset and its features, builds the vocabulary, and fits the
``CaptioningModule`` (teacher forcing; validation decodes and scores BLEU/CIDEr) with checkpoints,
early stopping and TensorBoard/CSV logs under ``output_dir``.  The folder's record ``run.json`` (the
run's identity, ``captioning.train.run_folder``) is written before the first step; a run whose
``checkpoints/last.ckpt`` exists resumes from it (the same run, vocabulary and features required);
the CSV log keeps the rows before the checkpoint.  ``captioning-train`` composes the ``TrainConfig`` and calls ``train``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, OmegaConf
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities import rank_zero_only

from captioning.config import DataConfig, TrainerConfig
from captioning.data.datamodule import CaptionDataModule
from captioning.errors import CaptioningError, CheckpointError, ConfigError
from captioning.models.search import DecodeConfig
from captioning.provenance import provenance
from captioning.store.layout import store_id
from captioning.train.callbacks import DataEpoch
from captioning.train.checkpoint import (
    AtomicCheckpointIO,
    check_compatible,
    checkpoint_run,
    load_checkpoint,
)
from captioning.train.finetune import FinetuneConfig, FinetuneModule, finetune_data
from captioning.train.identity import run_config
from captioning.train.inputs import Inputs, run_inputs
from captioning.train.module import CaptioningModule, config_dict
from captioning.train.optim import OptimConfig
from captioning.train.relaunch import as_single_run
from captioning.train.run_folder import (
    decide_resume,
    hold_run_folder,
    read_record,
    run_entry,
    world_size,
    write_record,
)
from captioning.train.scst import ScstConfig
from captioning.train.settings import ModuleSettings
from captioning.utils.io import atomic_write_json, atomic_write_text

log = logging.getLogger("captioning.train")


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    # a registered decoder's config: model.name picks it (captioning.models.decoders), its own
    # typed config checks the other keys at start
    model: dict[str, Any] = field(default_factory=lambda: {"name": "lstm"})
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    # Lightning callbacks and loggers by name, each a ``_target_`` node (conf/callbacks/*.yaml,
    # conf/logger/*.yaml) built at start; a null node is left out
    callbacks: dict[str, Any] = field(default_factory=dict)
    logger: dict[str, Any] = field(default_factory=dict)
    encoder: str = "efficientnet_lite0"  # which extracted features to train on
    # the FeatureStore written by captioning-extract, or a list of stores of the same items read as
    # one (two-stream: features concatenated per position, captioning.store.streams); str | list[str]
    features_dir: Any = MISSING
    run_name: str = MISSING
    output_dir: str = MISSING  # the run directory (set by Hydra)
    seed: int = 0
    # auto: resume this run's last.ckpt if there is one (another run's is refused) | must: fail when
    # there is nothing to resume (requeue scripts) | never: always a fresh run (a folder holding a run is refused)
    resume: str = "auto"
    eval_batch_size: int = 128
    compile: str = "auto"  # auto: compiled with CUDA graphs on a CUDA device, eager elsewhere | true | false
    stage: str = "xe"  # xe | scst | finetune (conf/stage/; captioning.train.stage)
    scst: ScstConfig = field(default_factory=ScstConfig)  # stage=scst: self-critical fine-tuning
    init_from: str | None = None  # start from this checkpoint's weights (a new run; e.g. XE -> SCST)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)  # stage=finetune: the encoder too


def instantiate_nodes(nodes: Mapping[str, Any], group: str) -> list[Any]:
    """Build the ``_target_`` nodes of config group ``group`` (callbacks, logger) in their order
    with ``hydra.utils.instantiate``; a null (or false) node is turned off."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate


    built = []
    for name, node in nodes.items():
        if node is None or node is False:
            continue
        if not isinstance(node, Mapping) or "_target_" not in node:
            raise ConfigError(f"{group}.{name} is not a node with a _target_ (the class to build and its "
                              f"arguments, see conf/{group}/): set it as one, or {group}.{name}=null to turn it off")
        try:
            built.append(instantiate(node))
        except InstantiationException as e:
            cause = e.__cause__
            if isinstance(cause, CaptioningError):
                raise cause from None
            hint = (" (pip install 'captioning[loggers]' for wandb and mlflow)"
                    if isinstance(cause, ImportError) else "")
            reason = str(cause or e).strip().splitlines()
            raise ConfigError(f"{group}.{name}: cannot build {node['_target_']}: "
                              f"{reason[0][:300] if reason else type(cause).__name__}{hint}") from None
    return built


def build_callbacks(cfg: TrainConfig, loggers: list) -> list[pl.Callback]:
    """The ``cfg.callbacks`` nodes, built.  Without a logger the learning-rate monitor (it needs one)
    is left out, and so is the progress bar with ``trainer.enable_progress_bar=false``."""
    from pytorch_lightning.callbacks import LearningRateMonitor, ProgressBar

    callbacks = instantiate_nodes(cfg.callbacks, "callbacks")
    if not loggers:
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    if not cfg.trainer.enable_progress_bar:
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    return callbacks


def build_loggers(cfg: TrainConfig, resume_step: int | None = None) -> list:
    """The ``cfg.logger`` nodes, built (they write under the run dir).  On resume, the rows a CSV
    logger wrote before the checkpoint's step are kept (Lightning's CSVLogger would delete them);
    the killed tail is re-logged."""
    from pytorch_lightning.loggers import CSVLogger

    loggers = instantiate_nodes(cfg.logger, "logger")
    for logger in loggers:
        if isinstance(logger, CSVLogger) and resume_step is not None:
            csv_path = Path(logger.log_dir) / "metrics.csv"
            history = read_csv_history(csv_path, resume_step)
            if history is not None:
                restore_csv_history(logger, csv_path, *history)
    return loggers


def read_csv_history(path: Path, before_step: int) -> tuple[list[str], list[dict]] | None:
    """(header, rows with step < before_step) of a CSV metrics log, or None if there is none."""
    import csv

    if not path.is_file():
        return None
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if r.get("step") not in (None, "") and int(float(r["step"])) < before_step]
        return list(reader.fieldnames or []), rows


def restore_csv_history(logger, path: Path, header: list[str], rows: list[dict]) -> None:
    """Write the kept rows back once the (rank-zero) writer exists, so new rows append to them."""
    import csv

    from lightning_fabric.loggers.csv_logs import _ExperimentWriter

    writer = logger.experiment  # creating the writer is what clears the old file
    if not isinstance(writer, _ExperimentWriter):  # a non-zero rank: nothing to write
        return
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=header)
        out.writeheader()
        out.writerows(rows)
    writer.metrics_keys = sorted(header)


def train(cfg: TrainConfig) -> dict:
    """Fit; returns a summary (best checkpoint, best score, steps, run fingerprint, provenance).

    The run folder is checked first: its record (``run.json``) or ``last.ckpt`` of another run
    (another fingerprint) is refused before anything in the folder is written
    (``run_folder.decide_resume``), and so is a folder another process is training
    (``run_folder.hold_run_folder``).  The run's record, with the schedule's length resolved, is
    written once its data are read and checked, before the first step: a config whose data are
    refused leaves no record.  A resumed run's checkpoint is read once here (and once by Lightning).
    """
    settings = ModuleSettings.of(cfg)  # a bad model, stage or scst config stops here, before any data is read
    stage = settings.stage
    out = Path(cfg.output_dir)
    config = run_config(config_dict(cfg))  # the config and its store's identity
    processes = world_size(cfg.trainer)
    ckpt = out / "checkpoints" / "last.ckpt"
    rank = rank_zero_only.rank
    with hold_run_folder(out, rank):  # one process per run folder
        saved = read_resumable(ckpt)
        saved = saved if decide_resume(cfg.resume, ckpt, config, saved, read_record(out), processes) else None
        run = run_entry(config, processes)
        with run_record(out, cfg):
            pl.seed_everything(cfg.seed, workers=True)
            inputs = run_inputs(cfg.data, cfg.features_dir, cfg.encoder)  # captioning.train.inputs
            table, store, vocab = inputs.table, inputs.store, inputs.vocab
            meta = dict(store.meta)  # what the model is trained on (fine-tuning: the encoder's output)
            if stage.from_images:  # end to end from raw images (captioning.train.finetune)
                dm, meta = finetune_data(cfg, table, store, vocab)
            else:
                dm = CaptionDataModule(
                    table, store, vocab, max_length=cfg.data.max_length, batch_size=cfg.data.batch_size,
                    eval_batch_size=cfg.eval_batch_size, num_workers=cfg.data.num_workers, per_item=stage.per_item,
                    batching=cfg.data.batching, captions_per_image=cfg.data.captions_per_image, cache=cfg.data.cache,
                    seed=cfg.seed,
                )
            if rank == 0:  # temp files of checkpoint writes a killed run left behind
                for stale in ckpt.parent.glob(".*.tmp"):
                    stale.unlink(missing_ok=True)
            if saved is not None:
                check_compatible(saved["hyper_parameters"], vocab.to_dict(), meta, ckpt)
                log.info("resuming from %s (step %d)", ckpt, saved["global_step"])
            steps = schedule_length(cfg, dm.train_batches(processes), saved)
            run = {**run, **({"schedule_steps": steps} if steps is not None else {})}
            if rank == 0:  # the data checked: from here on the folder says which run it holds
                write_record(out, config, run)
            settings = settings.resolved(steps)
            model = new_module(cfg, settings, config, vocab.to_dict(), meta, initial_weights=saved is None)
            parent = None
            if cfg.init_from and saved is None:  # e.g. XE -> SCST: a new run from a finished one's weights
                parent = init_weights(model, cfg.init_from, inputs)
            model.run_record = {**run, "provenance": provenance(store=store_id(store.meta), run=run["fingerprint"]),
                                **({"parent": parent} if parent else {})}
            trainer = build_trainer(cfg, out, saved["global_step"] if saved else None)
            with as_single_run():  # DDP ranks > 0 of a sweep job: started as this job alone
                trainer.fit(model, datamodule=dm, ckpt_path=str(ckpt) if saved else None)
            return write_summary(trainer, out, ckpt, vocab, dm, model.run_record)


def new_module(cfg: TrainConfig, settings: ModuleSettings, config: dict, vocab: dict, meta: dict, *,
               initial_weights: bool) -> CaptioningModule:
    """The run's LightningModule: with the encoder when its stage trains from raw images
    (``FinetuneModule``; ``initial_weights``: the store's encoder weights, a new run), else on the
    stored features."""
    if settings.stage.from_images:
        return FinetuneModule(settings, vocab, meta, config, finetune=cfg.finetune,
                              source=f"features_dir={cfg.features_dir}", initial_weights=initial_weights)
    return CaptioningModule(settings, vocab, meta, config)


def read_resumable(ckpt: Path) -> dict | None:
    """What resuming needs of a run folder's ``last.ckpt`` (None when there is none), read once:
    its config and run entry, its hyper-parameters (vocabulary, feature meta) and its step; an
    unreadable one is refused in one line."""
    if not ckpt.is_file():
        return None
    try:
        state = load_checkpoint(ckpt)
    except CheckpointError as e:
        raise CheckpointError(f"cannot resume: {e}. To start this run afresh, move {ckpt} away") from None
    hparams = state["hyper_parameters"]
    return {"config": hparams["config"], "run": state.get("run"), "hyper_parameters": hparams,
            "global_step": int(state.get("global_step", 0))}


def schedule_length(cfg: TrainConfig, batches: int, saved: Mapping[str, Any] | None) -> int | None:
    """The cosine schedule's length in optimizer steps, resolved once before the run starts:
    ``optim.schedule_steps``, else the one a resumed run resolved when it started (its checkpoint's
    run entry), else the budget's, counted as Lightning's ``estimated_stepping_batches`` counts it
    (``batches`` per epoch on each process, limited, accumulated, times the epochs, capped by
    ``max_steps``).  The other schedules have none."""
    optim, t = cfg.optim, cfg.trainer
    if optim.scheduler != "cosine":
        return optim.schedule_steps
    if optim.schedule_steps is not None:
        return int(optim.schedule_steps)
    if saved is not None and (saved.get("run") or {}).get("schedule_steps"):
        return int(saved["run"]["schedule_steps"])
    epochs, limit = t.max_epochs, t.limit_train_batches
    if t.fast_dev_run:
        batches, epochs = min(batches, int(t.fast_dev_run)), 1  # fast_dev_run=true: 1 batch
    elif isinstance(limit, int) and not isinstance(limit, bool):
        batches = min(batches, limit)
    elif isinstance(limit, float):
        batches = int(batches * limit)
    if epochs is None or epochs < 0:
        if t.max_steps < 0:
            raise ConfigError("optim.scheduler=cosine with trainer.max_epochs=-1 and no trainer.max_steps: set "
                              "optim.schedule_steps=<steps> (or trainer.max_steps)")
        return int(t.max_steps)
    steps = math.ceil(batches / t.accumulate_grad_batches) * max(epochs, 1)
    return max(1, min(steps, t.max_steps) if t.max_steps != -1 else steps)


def build_trainer(cfg: TrainConfig, out: Path, resume_step: int | None) -> pl.Trainer:
    """The Lightning Trainer with the configured loggers and callbacks (and the job's own: the
    epoch to the data), atomic checkpoint writes."""
    loggers = build_loggers(cfg, resume_step)
    callbacks = [*build_callbacks(cfg, loggers), DataEpoch()]
    return pl.Trainer(**cfg.trainer.kwargs(
        callbacks=callbacks, logger=loggers or False, default_root_dir=str(out), plugins=[AtomicCheckpointIO()],
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),  # none: no checkpoints
    ))


def write_summary(trainer: pl.Trainer, out: Path, ckpt: Path, vocab: Any, dm: Any, run: dict) -> dict:
    """``train_summary.json`` (rank zero) and the vocabulary; returns the summary."""
    ckpt_cb = trainer.checkpoint_callback
    best = getattr(ckpt_cb, "best_model_path", "") or (str(ckpt) if ckpt.is_file() else "")
    score = getattr(ckpt_cb, "best_model_score", None)
    summary = {
        "run_dir": str(out),
        "fingerprint": run["fingerprint"],
        "schedule_steps": run.get("schedule_steps"),
        "best_checkpoint": best,
        "last_checkpoint": str(ckpt) if ckpt.is_file() else None,
        "best_val_CIDEr": float(score) if score is not None else None,
        "global_step": int(trainer.global_step),
        "epochs": int(trainer.current_epoch),
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1},
        "vocab_size": len(vocab),
        "train_samples": int(dm.items["train"].n_captions.sum()),
        "provenance": run["provenance"],
        **({"parent": run["parent"]} if "parent" in run else {}),
    }
    if trainer.is_global_zero:
        vocab.save(out / "vocab.json")
        atomic_write_json(out / "train_summary.json", summary)
        log.info("best checkpoint: %s (val CIDEr %s)", best, summary["best_val_CIDEr"])
    return summary


@contextlib.contextmanager
def run_record(out: Path, cfg: TrainConfig) -> Iterator[None]:
    """While the job runs: ``<run>/train.log`` gets the log, ``<run>/.hydra/`` the resolved config
    (and Hydra's own settings and overrides when run by Hydra).  Rank zero only.  Opened once the
    folder is known to hold this run, so a refused run leaves a folder as it was."""
    if rank_zero_only.rank != 0:
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    files = {"config.yaml": OmegaConf.to_yaml(OmegaConf.structured(cfg))}
    if HydraConfig.initialized():
        hydra_cfg = HydraConfig.get()
        files["hydra.yaml"] = OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg}))
        files["overrides.yaml"] = OmegaConf.to_yaml(hydra_cfg.overrides.task)
    for name, text in files.items():
        atomic_write_text(out / ".hydra" / name, text)
    handler = logging.FileHandler(out / "train.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def init_weights(model: pl.LightningModule, path: str, inputs: Inputs) -> dict:
    """Load a finished run's weights into ``model`` (a new run: fresh optimizer, step 0), e.g. the
    cross-entropy stage's best checkpoint before self-critical training; refused unless it was trained
    on this run's ``inputs`` (vocabulary and features).  Returns the parent run's record (checkpoint,
    fingerprint, step) for this run's provenance."""

    state = load_checkpoint(path)
    inputs.check(state["hyper_parameters"], path)
    try:
        model.load_state_dict(state["state_dict"])
    except RuntimeError as e:
        raise CheckpointError(f"init_from={path}: its weights do not fit this run's model "
                              f"({str(e).splitlines()[0][:200]}); use the same model settings as that run") from None
    parent = checkpoint_run(path, state)
    log.info("initialised from %s (its step %d)", path, parent["step"])
    return parent
