"""``captioning-train``: fit a caption decoder on a FeatureStore (Lightning; CPU, GPU, DDP, SLURM).

    captioning-train data=shapes model=soft_attention trainer=cpu
    captioning-train experiment=yao2015_temporal trainer=ddp
    captioning-train -m model=soft_attention,mean_pool seed=0,1,2

The run directory is ``outputs/train/<run_name>``; running the same command again resumes
from its ``checkpoints/last.ckpt`` (``resume=false`` starts over in a new ``run_name``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import pytorch_lightning as pl
from omegaconf import MISSING, DictConfig, OmegaConf
from pytorch_lightning.utilities import rank_zero_only

from captioning.config import (
    CONF_DIR,
    DataConfig,
    TrainerConfig,
    cli_errors,
    register_schema,
    to_config,
)
from captioning.models.captioner import OptimConfig
from captioning.models.decoder import DecoderConfig
from captioning.models.search import BeamConfig

log = logging.getLogger("captioning.train")


@dataclass
class CallbacksConfig:
    monitor: str = "val/CIDEr"
    mode: str = "max"
    save_top_k: int = 1
    save_last: bool = True
    early_stopping: bool = True
    patience: int = 5
    progress_bar: str = "rich"  # rich | tqdm | none


@dataclass
class LoggerConfig:
    tensorboard: bool = True
    csv: bool = True


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: DecoderConfig = field(default_factory=DecoderConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    decode: BeamConfig = field(default_factory=BeamConfig)
    callbacks: CallbacksConfig = field(default_factory=CallbacksConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    encoder: str = "efficientnet_lite0"  # which extracted features to train on
    features_dir: str = MISSING  # FeatureStore written by captioning-extract
    run_name: str = MISSING
    output_dir: str = MISSING  # the run directory (set by Hydra)
    seed: int = 0
    resume: bool = True
    eval_batch_size: int = 128
    test_after_fit: bool = False
    compile: bool = False  # torch.compile the fixed-shape loss (CUDA graphs on a GPU)


register_schema("train_schema", TrainConfig)


def build_callbacks(cfg: TrainConfig, out: Path) -> list[pl.Callback]:
    from pytorch_lightning.callbacks import (
        EarlyStopping,
        LearningRateMonitor,
        RichProgressBar,
        TQDMProgressBar,
    )

    from captioning.checkpoint import ResumableCheckpoint

    c = cfg.callbacks
    callbacks: list[pl.Callback] = [
        ResumableCheckpoint(
            dirpath=out / "checkpoints",
            filename="epoch{epoch:03d}-cider{val/CIDEr:.4f}",
            auto_insert_metric_name=False,
            monitor=c.monitor if c.save_top_k else None,
            mode=c.mode,
            save_top_k=c.save_top_k,
            save_last=c.save_last,
        )
    ]
    if c.early_stopping:
        callbacks.append(EarlyStopping(monitor=c.monitor, mode=c.mode, patience=c.patience))
    if cfg.logger.tensorboard or cfg.logger.csv:
        callbacks.append(LearningRateMonitor(logging_interval="step"))
    if c.progress_bar == "rich":
        callbacks.append(RichProgressBar())
    elif c.progress_bar == "tqdm":
        callbacks.append(TQDMProgressBar())
    return callbacks


def build_loggers(cfg: TrainConfig, out: Path, resume_step: int | None = None) -> list:
    """TensorBoard/CSV loggers under the run dir. On resume, CSV rows of the steps before the
    checkpoint are kept (Lightning's CSVLogger would delete them); the killed tail is re-logged."""
    from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

    loggers: list = []
    if cfg.logger.tensorboard:
        loggers.append(TensorBoardLogger(save_dir=str(out), name="tensorboard", version=""))
    if cfg.logger.csv:
        csv_path = out / "csv" / "metrics.csv"
        history = read_csv_history(csv_path, resume_step) if resume_step is not None else None
        logger = CSVLogger(save_dir=str(out), name="csv", version="")
        if history is not None:
            restore_csv_history(logger, csv_path, *history)
        loggers.append(logger)
    return loggers or False  # type: ignore[return-value]


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


def make_trainer(cfg: TrainerConfig, **kwargs) -> pl.Trainer:
    """A Lightning Trainer from the trainer config (None values fall back to Lightning's defaults)."""
    args = {k: v for k, v in vars(cfg).items() if v is not None}
    args.update(kwargs)
    return pl.Trainer(**args)


def train(cfg: TrainConfig) -> dict:
    """Fit; returns a summary (best checkpoint, best score, steps)."""
    from captioning.checkpoint import AtomicCheckpointIO
    from captioning.data.annotations import read_dataset
    from captioning.data.datamodule import CaptionDataModule
    from captioning.data.store import FeatureStore
    from captioning.data.vocab import build_vocabulary
    from captioning.errors import CheckpointError, ConfigError, DataError
    from captioning.models.captioner import Captioner, config_dict
    from captioning.utils.io import atomic_write_json

    pl.seed_everything(cfg.seed, workers=True)
    out = Path(cfg.output_dir)
    dataset = read_dataset(cfg.data)
    splits = {s: dataset.split(s) for s in ("train", "val", "test")}
    if not Path(cfg.features_dir, "meta.json").is_file():
        raise DataError(
            f"no feature store at {cfg.features_dir}: run `captioning-extract data={cfg.data.name} "
            f"encoder={cfg.encoder}` first (or set features_dir=...)"
        )
    store = FeatureStore.open(cfg.features_dir)
    if store.meta.get("kind", cfg.data.kind) != cfg.data.kind:
        raise ConfigError(
            f"features in {cfg.features_dir} are '{store.meta.get('kind')}' features but data={cfg.data.name} "
            f"is a '{cfg.data.kind}' dataset: point features_dir at this dataset's features"
        )
    vocab = build_vocabulary(splits["train"], min_count=cfg.data.min_count)
    dm = CaptionDataModule(
        splits, store, vocab, max_length=cfg.data.max_length, batch_size=cfg.data.batch_size,
        eval_batch_size=cfg.eval_batch_size, num_workers=cfg.data.num_workers,
    )
    ckpt = out / "checkpoints" / "last.ckpt"
    if rank_zero_only.rank == 0:  # temp files of checkpoint writes a killed run left behind
        for stale in ckpt.parent.glob(".*.tmp"):
            stale.unlink(missing_ok=True)
    resume_from = str(ckpt) if cfg.resume and ckpt.is_file() else None
    resume_step = None
    if resume_from:
        from captioning.checkpoint import check_compatible, load_checkpoint

        try:
            state = load_checkpoint(resume_from)
        except CheckpointError as e:
            raise CheckpointError(f"cannot resume: {e}. To start this run afresh, move {resume_from} away "
                                  f"(or pass resume=false)") from None
        check_compatible(state, vocab.to_dict(), store.meta, resume_from)
        resume_step = int(state.get("global_step", 0))
        del state
        log.info("resuming from %s (step %d)", resume_from, resume_step)
    model = Captioner(config=config_dict(cfg), vocab=vocab.to_dict(), feature_meta=dict(store.meta))
    trainer = make_trainer(
        cfg.trainer, callbacks=build_callbacks(cfg, out), logger=build_loggers(cfg, out, resume_step),
        default_root_dir=str(out), plugins=[AtomicCheckpointIO()],
    )
    trainer.fit(model, datamodule=dm, ckpt_path=resume_from)
    ckpt_cb = trainer.checkpoint_callback
    best = getattr(ckpt_cb, "best_model_path", "") or (str(ckpt) if ckpt.is_file() else "")
    score = getattr(ckpt_cb, "best_model_score", None)
    summary = {
        "run_dir": str(out),
        "best_checkpoint": best,
        "last_checkpoint": str(ckpt) if ckpt.is_file() else None,
        "best_val_CIDEr": float(score) if score is not None else None,
        "global_step": int(trainer.global_step),
        "epochs": int(trainer.current_epoch),
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1},
        "vocab_size": len(vocab),
        "train_samples": sum(len(r) for r in dm.items["train"].references),
    }
    if trainer.is_global_zero:
        vocab.save(out / "vocab.json")
        atomic_write_json(out / "train_summary.json", summary)
        log.info("best checkpoint: %s (val CIDEr %s)", best, summary["best_val_CIDEr"])
    return summary


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
@cli_errors
def main(raw: DictConfig) -> float | None:
    cfg = to_config(raw, TrainConfig)
    log.info("config:\n%s", OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    summary = train(cfg)
    return summary["best_val_CIDEr"]  # for Hydra sweepers


if __name__ == "__main__":
    main()
