"""``captioning-evaluate``: decode a split with a checkpoint and write numbers a paper can quote.

    captioning-evaluate ckpt_path=outputs/train/<run>/checkpoints/last.ckpt split=test decode.beam_size=5

Writes into ``output_dir`` (default ``<run>/eval/<split>-beam<k>``): ``results.json`` (COCO
results format; ``video_id`` for video), ``metrics.json`` (toolkit key names),
``predictions.json`` (tokens + per-token attention), and ``report.md``/``report.json`` with
metrics by reference length (plot), vocabulary usage and, on the synthetic data, grounding.
Under ``trainer=ddp`` every rank decodes a shard and rank 0 writes one results file.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from omegaconf import MISSING, DictConfig

from captioning.config import (
    CONF_DIR,
    DataConfig,
    TrainerConfig,
    cli_errors,
    register_schema,
    to_config,
)
from captioning.models.search import BeamConfig

log = logging.getLogger("captioning.evaluate")


@dataclass
class EvaluateConfig:
    ckpt_path: str = MISSING
    split: str = "test"
    decode: BeamConfig = field(default_factory=BeamConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    features_dir: str | None = None  # default: the checkpoint's
    data_root: str | None = None  # default: the checkpoint's data.root (move a dataset without retraining)
    output_dir: str | None = None  # default: <run>/eval/<split>-beam<k>
    metrics: list[str] = field(default_factory=lambda: ["bleu", "meteor", "rouge", "cider"])
    batch_size: int = 64
    num_workers: int = 2
    grounding: bool = True
    max_items: int | None = None


register_schema("evaluate_schema", EvaluateConfig)


def _data_config(train_cfg: dict, data_root: str | None) -> DataConfig:
    data = dict(train_cfg["data"])
    if data_root is not None:
        old = data["root"]
        data = {k: (v.replace(old, data_root, 1) if isinstance(v, str) and v.startswith(old) else v)
                for k, v in data.items()}
        data["annotations"] = {k: v.replace(old, data_root, 1) for k, v in data["annotations"].items()}
        data["root"] = data_root
    return DataConfig(**data)


def evaluate(cfg: EvaluateConfig) -> dict | None:
    """Decode, gather, score, report.  Returns the metrics on rank 0 (None on other ranks)."""
    import numpy as np
    from torch.utils.data import DataLoader

    from captioning.checkpoint import check_compatible, load_captioner, load_checkpoint
    from captioning.cli.train import make_trainer
    from captioning.data.annotations import read_dataset
    from captioning.data.datamodule import CaptionEvalDataset, FeatureItems, collate
    from captioning.data.store import FeatureStore
    from captioning.errors import ConfigError
    from captioning.evaluation.metrics import compute_metrics
    from captioning.evaluation.report import metrics_by_length, vocabulary_usage, write_report
    from captioning.models.captioner import gather_objects
    from captioning.utils.io import atomic_write_json, read_json

    ckpt = load_checkpoint(cfg.ckpt_path)
    hp = ckpt["hyper_parameters"]
    train_cfg = hp["config"]
    data_cfg = _data_config(train_cfg, cfg.data_root)
    features_dir = cfg.features_dir or train_cfg["features_dir"]
    if cfg.data_root and not cfg.features_dir:
        features_dir = features_dir.replace(train_cfg["data"]["root"], cfg.data_root, 1)
    store = FeatureStore.open(features_dir)
    check_compatible(ckpt, hp["vocab"], dict(store.meta), cfg.ckpt_path)
    del ckpt
    model = load_captioner(cfg.ckpt_path)
    model.decode_cfg = cfg.decode

    dataset = read_dataset(data_cfg)
    records = dataset.split(cfg.split)
    if not records:
        raise ConfigError(f"split={cfg.split!r} has no items in data '{data_cfg.name}': use train, val or test")
    if cfg.max_items:
        records = records[: cfg.max_items]
    items = FeatureItems(records, store)
    loader = DataLoader(CaptionEvalDataset(items), batch_size=cfg.batch_size, shuffle=False,
                        num_workers=cfg.num_workers, collate_fn=collate)
    trainer = make_trainer(cfg.trainer, logger=False, callbacks=[], enable_checkpointing=False,
                           enable_model_summary=False)
    outputs = trainer.predict(model, loader) or []
    local = [p for batch in outputs for p in batch]
    predictions: dict[int, dict] = {}
    for part in gather_objects(local):
        for p in part:
            predictions.setdefault(p["index"], p)
    if not trainer.is_global_zero:
        return None

    out = Path(cfg.output_dir) if cfg.output_dir else (
        Path(cfg.ckpt_path).resolve().parent.parent / "eval" / f"{cfg.split}-beam{cfg.decode.beam_size}")
    out.mkdir(parents=True, exist_ok=True)
    order = sorted(predictions)
    id_key = "video_id" if data_cfg.kind == "video" else "image_id"
    hyps = {i: " ".join(predictions[i]["tokens"]) for i in order}
    refs = {i: items.references[i] for i in order}
    metric_names = list(cfg.metrics)
    if "meteor" in metric_names and shutil.which("java") is None:
        log.warning("METEOR needs Java (the toolkit's jar): not found on PATH, METEOR skipped")
        metric_names.remove("meteor")
    result = compute_metrics(refs, hyps, metrics=tuple(metric_names), tokenize=False)
    scores = {k: float(v) for k, v in result.scores.items()}

    results = [{id_key: items.records[i].source_id, "caption": hyps[i]} for i in order]
    atomic_write_json(out / "results.json", results)
    atomic_write_json(out / "metrics.json", scores)
    atomic_write_json(out / "predictions.json", [
        {id_key: items.records[i].source_id, "caption": hyps[i], "tokens": predictions[i]["tokens"],
         "score": predictions[i]["score"],
         "attention": None if predictions[i]["attention"] is None
         else np.round(predictions[i]["attention"].astype(float), 5).tolist()}
        for i in order
    ], indent=None)

    grounding = None
    if cfg.grounding and data_cfg.grounding and Path(data_cfg.grounding).is_file():
        from captioning.evaluation.grounding import evaluate_grounding

        gfile = read_json(data_cfg.grounding, "grounding file")
        preds = {str(items.records[i].source_id): (predictions[i]["tokens"], predictions[i]["attention"])
                 for i in order if predictions[i]["attention"] is not None}
        frame_indices: dict[str, list[int]] | None = {} if data_cfg.kind == "video" else None
        valid: dict[str, int] = {}
        for i in order:
            rec = items.records[i]
            item = store[rec.item_id]
            valid[str(rec.source_id)] = int(item.valid)
            if frame_indices is not None:
                frame_indices[str(rec.source_id)] = list(item.frame_indices or [])
        grid = store.meta.get("grid")
        grounding = evaluate_grounding(preds, gfile, kind=data_cfg.kind, grid=tuple(grid) if grid else None,
                                       frame_indices=frame_indices, geometry=dict(store.meta), valid=valid)
    by_length = metrics_by_length(refs, hyps)
    vocab_use = vocabulary_usage(hyps, refs, len(model.vocab))
    meta = {"checkpoint": str(cfg.ckpt_path), "split": cfg.split, "items": len(order),
            "decode": vars(cfg.decode), "data": data_cfg.name, "model": train_cfg["model"]["variant"],
            "bleu_stats": getattr(result, "bleu_stats", None)}
    write_report(out, scores, by_length, vocab_use, grounding, meta)
    summary = {"output_dir": str(out), "metrics": scores, "grounding": grounding, "items": len(order)}
    _print_table(scores, grounding, out)
    return summary


def _print_table(scores: dict, grounding: dict | None, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="evaluation")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in scores.items():
        table.add_row(k, f"{v:.4f}")
    if grounding:
        for k in ("attention_in_object", "chance_attention_in_object", "pointing_accuracy", "chance_pointing_accuracy"):
            if k in grounding:  # None: the model has no attention (mean_pool, show_tell)
                v = grounding[k]
                table.add_row(f"grounding/{k}", "n/a (no attention)" if v is None else f"{v:.4f}")
    Console().print(table)
    print(f"results written to {out}", flush=True)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="evaluate")
@cli_errors
def main(raw: DictConfig) -> None:
    evaluate(to_config(raw, EvaluateConfig))


if __name__ == "__main__":
    main()
