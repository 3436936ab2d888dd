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


register_schema("train_schema", TrainConfig)


def build_callbacks(cfg: TrainConfig, out: Path) -> list[pl.Callback]:
    from pytorch_lightning.callbacks import (
        EarlyStopping,
        LearningRateMonitor,
        ModelCheckpoint,
        RichProgressBar,
        TQDMProgressBar,
    )

    c = cfg.callbacks
    callbacks: list[pl.Callback] = [
        ModelCheckpoint(
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


def build_loggers(cfg: TrainConfig, out: Path) -> list:
    from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

    loggers: list = []
    if cfg.logger.tensorboard:
        loggers.append(TensorBoardLogger(save_dir=str(out), name="tensorboard", version=""))
    if cfg.logger.csv:
        loggers.append(CSVLogger(save_dir=str(out), name="csv", version=""))
    return loggers or False  # type: ignore[return-value]


def make_trainer(cfg: TrainerConfig, **kwargs) -> pl.Trainer:
    """A Lightning Trainer from the trainer config (None values fall back to Lightning's defaults)."""
    args = {k: v for k, v in vars(cfg).items() if v is not None}
    args.update(kwargs)
    return pl.Trainer(**args)


def train(cfg: TrainConfig) -> dict:
    """Fit; returns a summary (best checkpoint, best score, steps)."""
    from captioning.data.annotations import read_dataset
    from captioning.data.datamodule import CaptionDataModule
    from captioning.data.store import FeatureStore
    from captioning.data.vocab import build_vocabulary
    from captioning.errors import ConfigError, DataError
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
    resume_from = str(ckpt) if cfg.resume and ckpt.is_file() else None
    if resume_from:
        from captioning.checkpoint import check_compatible, load_checkpoint

        check_compatible(load_checkpoint(resume_from), vocab.to_dict(), store.meta, resume_from)
        log.info("resuming from %s", resume_from)
    model = Captioner(config=config_dict(cfg), vocab=vocab.to_dict(), feature_meta=dict(store.meta))
    trainer = make_trainer(
        cfg.trainer, callbacks=build_callbacks(cfg, out), logger=build_loggers(cfg, out),
        default_root_dir=str(out),
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
