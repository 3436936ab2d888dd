"""The evaluation job: decode a split with a checkpoint and write numbers a paper can quote.

``evaluate(EvaluateConfig)`` writes into ``output_dir`` (default ``<run>/eval/<split>-beam<k>``):
``results.json`` (COCO results format; ``video_id`` for video), ``metrics.json`` (toolkit key
names), ``predictions.json`` (tokens + per-token attention), and ``report.md``/``report.json``
with metrics by reference length (plot), vocabulary usage and, on the synthetic data, grounding.
Under DDP every rank decodes a shard (Lightning ``predict``) and rank 0 writes one results file.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import MISSING

from captioning.config import TrainerConfig, checkpoint_data_config
from captioning.data.annotations import read_dataset
from captioning.data.datamodule import CaptionEvalDataset, FeatureItems, collate
from captioning.errors import ConfigError, DataError
from captioning.evaluation.grounding import evaluate_grounding
from captioning.evaluation.report import metrics_by_length, vocabulary_usage, write_report
from captioning.evaluation.structure import evaluate_structure
from captioning.metrics.coco import compute_metrics
from captioning.models.decoders import run_tag
from captioning.models.search import BeamConfig
from captioning.store.streams import open_features
from captioning.train.checkpoint import check_compatible, load_captioner, load_checkpoint
from captioning.train.module import gather_objects
from captioning.utils.io import atomic_write_json, read_json

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


def evaluate(cfg: EvaluateConfig) -> dict | None:
    """Decode, gather, score, report.  Returns the summary on rank 0 (None on other ranks)."""
    import numpy as np
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader


    hp = load_checkpoint(cfg.ckpt_path)["hyper_parameters"]
    train_cfg = hp["config"]
    data_cfg = checkpoint_data_config(train_cfg, cfg.data_root)
    features_dir = cfg.features_dir or train_cfg["features_dir"]
    if cfg.data_root and not cfg.features_dir:
        features_dir = features_dir.replace(train_cfg["data"]["root"], cfg.data_root, 1)
    store = open_features(features_dir)  # one store, or several streams joined
    check_compatible(hp, hp["vocab"], dict(store.meta), cfg.ckpt_path)
    model = load_captioner(cfg.ckpt_path)
    model.decode_cfg = cfg.decode

    records = read_dataset(data_cfg).split(cfg.split)
    if not records:
        raise ConfigError(f"split={cfg.split!r} has no items in data '{data_cfg.name}': use train, val or test")
    if cfg.max_items:
        records = records[: cfg.max_items]
    items = FeatureItems(records, store)
    loader = DataLoader(CaptionEvalDataset(items), batch_size=cfg.batch_size, shuffle=False,
                        num_workers=cfg.num_workers, collate_fn=collate)
    trainer = pl.Trainer(**cfg.trainer.kwargs(logger=False, callbacks=[], enable_checkpointing=False,
                                              enable_model_summary=False))
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
    if cfg.decode.per_item > 1:  # every hypothesis of each item, best first (n-best / n samples)
        atomic_write_json(out / "nbest.json", [
            {id_key: items.records[i].source_id, "captions": [
                {"caption": " ".join(t), "score": s} for t, s in predictions[i]["nbest"]]}
            for i in order
        ], indent=None)

    grounding = structure = None
    gfile = None
    if cfg.grounding and data_cfg.grounding and Path(data_cfg.grounding).is_file():

        gfile = read_json(data_cfg.grounding, "grounding file")
        try:
            structure = evaluate_structure({str(items.records[i].source_id): predictions[i]["tokens"]
                                            for i in order}, gfile)
        except DataError as e:  # e.g. data generated by an older generator: the results stand
            log.warning("structured accuracy and grounding skipped: %s", e)
            gfile = None
    if gfile is not None:
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
            "decode": vars(cfg.decode), "data": data_cfg.name, "model": run_tag(train_cfg["model"]),
            "bleu_stats": getattr(result, "bleu_stats", None)}
    write_report(out, scores, by_length, vocab_use, grounding, meta, structure=structure)
    summary = {"output_dir": str(out), "metrics": scores, "grounding": grounding, "structure": structure,
               "items": len(order)}
    print_table(scores, grounding, out, structure)
    return summary


def print_table(scores: dict, grounding: dict | None, out: Path, structure: dict | None = None) -> None:
    """The metrics (and grounding / structure scores) as a table on the console, then where they
    were written."""
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
    for k, v in (structure or {}).items():
        if ("accuracy" in k or "recall" in k) and isinstance(v, float):
            table.add_row(f"structure/{k}", f"{v:.4f}")
    Console().print(table)
    print(f"results written to {out}", flush=True)
