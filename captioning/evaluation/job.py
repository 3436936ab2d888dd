"""The evaluation job: decode a split with a checkpoint and write numbers a paper can quote.

``evaluate(EvaluateConfig)`` writes into ``output_dir`` (default ``<run>/eval/<split>-beam<k>``):
``results.json`` (COCO results format; ``video_id`` for video), ``metrics.json`` (toolkit key
names), ``predictions.json`` + ``attention.npy`` (tokens, each word's log-prob, per-token attention:
``captioning.predictions``), and ``report.md``/``report.json`` with metrics by reference length (plot),
vocabulary usage and, on the synthetic data, grounding.  Decoding is fp32 unless ``precision=bf16``
(or ``fp16``) asks for autocast, whatever ``trainer.precision`` says: a reported number must not move
with a card's autocast; the precision is recorded in ``report.json`` and ``provenance.json``.
Under DDP every rank decodes a shard (Lightning ``predict``) and rank 0 writes one results file.
``ckpt_path=[a,b,c]`` decodes with the checkpoints' test-time ensemble (``captioning.models.ensemble``;
default folder ``<first run>/eval/ensemble<M>-<split>-beam<k>``); ``server=coco`` also writes the
COCO evaluation server's file and zip (``captioning.evaluation.server``); ``probes=[binding,order,shuffle]``
also scores each reference against its perturbations (``probes.json``: ``captioning.evaluation.probes``).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
from omegaconf import MISSING
from torch.utils.data import DataLoader

from captioning.config import TrainerConfig
from captioning.data.annotations import SPLITS
from captioning.data.caption_table import caption_table
from captioning.data.datamodule import CaptionEvalDataset, FeatureItems, collate
from captioning.errors import ConfigError, DataError
from captioning.evaluation.grounding import evaluate_grounding
from captioning.evaluation.probes.job import PROBES_FILE, check_names, write_probes
from captioning.evaluation.report import metrics_by_length, vocabulary_usage, write_report
from captioning.evaluation.server import (
    check_image_set,
    check_request,
    coco_image_set,
    write_coco_results,
)
from captioning.evaluation.structure import evaluate_structure
from captioning.evaluation.viewer import write_viewer
from captioning.metrics import compute_metrics, default_metrics
from captioning.models.decoders import run_tag
from captioning.models.search import DecodeConfig
from captioning.predictions import ATTENTION_FILE, write_predictions
from captioning.provenance import provenance, write_provenance
from captioning.store.layout import store_id
from captioning.train.checkpoint import (
    load_captioner,
    load_ensemble,
)
from captioning.train.inputs import checkpoint_inputs
from captioning.train.module import Decoding, gather_objects
from captioning.utils.io import atomic_write_json, read_json
from captioning.viz.viewer import ViewerConfig

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

log = logging.getLogger("captioning.evaluate")

#: ``precision`` -> the Lightning precision the evaluation's Trainer decodes with
PRECISIONS = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
LOW_PRECISION_NOTE = ("decoded with {p} autocast: captions and metrics can differ from fp32 decoding (the default, "
                      "which reported numbers use); evaluate with precision=fp32 for numbers to compare")


@dataclass
class EvaluateConfig:
    ckpt_path: Any = MISSING  # a checkpoint, or a list of them: a test-time ensemble (captioning.models.ensemble)
    split: str = "test"
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    features_dir: Any = None  # default: the checkpoint's (a folder, or one per stream: captioning.train.inputs)
    data_root: str | None = None  # default: the checkpoint's data.root (move a dataset without retraining)
    output_dir: str | None = None  # default: <run>/eval/<split>-beam<k>
    metrics: list[str] = field(default_factory=default_metrics)  # registered names (captioning.metrics)
    batch_size: int | None = None  # items decoded together; default 64 on a CPU, 500 on a GPU (launch-bound)
    num_workers: int = 2
    precision: str = "fp32"  # fp32 | bf16 | fp16: the decoding's arithmetic (trainer.precision is not used)
    grounding: bool = True
    max_items: int | None = None
    server: str | None = None  # coco: also write the evaluation server's file (captioning.evaluation.server)
    server_alg: str | None = None  # <alg> of its name; default: the run's folder name
    viewer: ViewerConfig = field(default_factory=ViewerConfig)  # viewer=true: <output_dir>/viewer/ (docs/viewer.md)
    probes: list[str] = field(default_factory=list)  # forced-choice probes (captioning.evaluation.probes)


def checkpoint_paths(ckpt_path: Any) -> list[str]:
    """``ckpt_path`` as a list: one checkpoint, or the members of an ensemble."""
    paths = [ckpt_path] if isinstance(ckpt_path, (str, Path)) else list(ckpt_path or [])
    if not paths or not all(isinstance(p, (str, Path)) for p in paths):
        raise ConfigError(f"ckpt_path={ckpt_path!r}: pass a checkpoint (ckpt_path=<run>/checkpoints/best.ckpt) "
                          f"or a list of them for an ensemble (ckpt_path=[a.ckpt,b.ckpt])")
    return [str(p) for p in paths]


def run_name(paths: list[str]) -> str:
    """The first checkpoint's run folder name (``<run>/checkpoints/x.ckpt``), ``-ensemble<M>`` added."""
    name = Path(paths[0]).resolve().parent.parent.name
    return name if len(paths) == 1 else f"{name}-ensemble{len(paths)}"


def cpu_time() -> float:
    """CPU seconds of this process (all threads) and of its children that have ended (DataLoader
    workers, METEOR's Java)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN) if resource is not None else None
    return time.process_time() + (children.ru_utime + children.ru_stime if children is not None else 0.0)


class Laps:
    """Seconds per step of a job (``lap(step)`` closes the step that started at the last lap): wall
    ``seconds`` and ``cpu_seconds`` (``cpu_time``: on a shared machine the CPU time is what the step
    cost, the wall time what it waited too)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}
        self._clock, self._cpu = time.perf_counter(), cpu_time()

    def lap(self, step: str) -> None:
        now, cpu = time.perf_counter(), cpu_time()
        self.seconds[step] = self.seconds.get(step, 0.0) + now - self._clock
        self.cpu_seconds[step] = self.cpu_seconds.get(step, 0.0) + cpu - self._cpu
        self._clock, self._cpu = now, cpu


@dataclass
class Decoded:
    """A decoded split (rank zero): its items in order, each one's prediction (``tokens``, ``score``,
    ``attention`` [T, N] or None, ``nbest``) and caption, and what was decoded with what."""

    items: FeatureItems
    predictions: dict[int, dict]
    order: list[int]
    store: Any
    data_cfg: Any
    train_cfg: dict
    model: Any
    paths: list[str]

    @property
    def id_key(self) -> str:
        return "video_id" if self.data_cfg.kind == "video" else "image_id"

    def source_id(self, i: int) -> Any:
        return self.items.records[i].source_id

    @property
    def hypotheses(self) -> dict[int, str]:
        return {i: " ".join(self.predictions[i]["tokens"]) for i in self.order}

    @property
    def references(self) -> dict[int, list[str]]:
        return {i: self.items.references[i] for i in self.order}


def evaluate(cfg: EvaluateConfig) -> dict | None:
    """Decode -> score -> write -> ground -> report.  Returns the summary on rank 0 (None on other
    ranks); its ``seconds`` say where the time went (set-up, decode, score and each metric, write,
    report)."""
    laps = Laps()
    if cfg.viewer.wanted:
        cfg.viewer.validate()  # before the decoding, not after it
    check_names(cfg.probes)  # an unknown probe fails before decoding
    decoded = decode_split(cfg, laps)
    if decoded is None:
        return None
    out = output_folder(cfg, decoded.paths)
    out.mkdir(parents=True, exist_ok=True)
    hyps, refs = decoded.hypotheses, decoded.references
    laps.lap("decode")  # incl. gathering the ranks' predictions
    result = compute_metrics(refs, hyps, metrics=tuple(metric_names(cfg.metrics)), tokenize=False)
    scores = {k: float(v) for k, v in result.scores.items()}
    laps.lap("score")
    laps.seconds.update({f"score/{k}": v for k, v in result.seconds.items()})
    write_results(cfg, decoded, out, scores)
    laps.lap("write")  # results, metrics, predictions (with attention) files
    structure, grounding = ground(cfg, decoded)
    meta = {"checkpoint": decoded.paths[0] if len(decoded.paths) == 1 else decoded.paths, "split": cfg.split,
            "items": len(decoded.order), "decode": vars(cfg.decode), "precision": cfg.precision,
            **({"precision_note": LOW_PRECISION_NOTE.format(p=cfg.precision)} if cfg.precision != "fp32" else {}),
            "data": decoded.data_cfg.name, "model": run_tag(decoded.train_cfg["model"]),
            "bleu_stats": getattr(result, "bleu_stats", None),
            "provenance": evaluation_provenance(decoded, precision=cfg.precision)}
    write_report(out, scores, metrics_by_length(refs, hyps), vocabulary_usage(hyps, refs, len(decoded.model.vocab)),
                 grounding, meta, structure=structure)
    probes = write_probes(out / PROBES_FILE, cfg.probes, decoded.model, decoded.items,
                          decoded.data_cfg.grounding) if cfg.probes else None
    files = ("results.json", "metrics.json", "predictions.json") + ((ATTENTION_FILE,) if (out / ATTENTION_FILE).is_file() else ())
    files += (PROBES_FILE,) if probes else ()
    write_provenance(out, meta["provenance"], files)
    laps.lap("report")  # grounding, structure, metrics by length, vocabulary usage, report files
    viewer = None
    if cfg.viewer.wanted:  # the attention viewer (captioning.evaluation.viewer)
        viewer = write_viewer(cfg.viewer, decoded, out, result.per_item, grounding=cfg.grounding,
                              title=f"{run_name(decoded.paths)}: {decoded.data_cfg.name} {cfg.split}")
        laps.lap("viewer")
    log.info("evaluation seconds: %s", ", ".join(f"{k} {v:.1f}" for k, v in laps.seconds.items()))
    print_table(scores, grounding, out, structure)
    if viewer is not None:
        print(f"attention viewer: {viewer} (open it in a browser)", flush=True)
    if cfg.precision != "fp32":
        log.warning(LOW_PRECISION_NOTE.format(p=cfg.precision))
    return {"output_dir": str(out), "metrics": scores, "grounding": grounding, "structure": structure,
            "probes": probes, "items": len(decoded.order), "precision": cfg.precision,
            "seconds": {k: round(v, 3) for k, v in laps.seconds.items()},
            "cpu_seconds": {k: round(v, 3) for k, v in laps.cpu_seconds.items()}}


def decode_split(cfg: EvaluateConfig, laps: Laps) -> Decoded | None:
    """The split decoded by the checkpoint (or ensemble) with Lightning ``predict`` on every rank,
    gathered; None on the ranks other than zero."""
    paths = checkpoint_paths(cfg.ckpt_path)
    model = load_captioner(paths[0]) if len(paths) == 1 else load_ensemble(paths)
    hp = model.hparams  # the (first) checkpoint's hyper_parameters: config, vocab, feature_meta
    train_cfg = hp["config"]
    # its data and store(s), moved or not (the other members of an ensemble: as the first)
    inputs = checkpoint_inputs(hp, paths[0], data_root=cfg.data_root, features_dir=cfg.features_dir)
    data_cfg, store = inputs.data, inputs.store
    check_request(cfg.server, data_cfg.kind, cfg.max_items)
    items = split_items(cfg, data_cfg, store)
    trainer = pl.Trainer(**cfg.trainer.kwargs(logger=False, callbacks=[], enable_checkpointing=False,
                                              enable_model_summary=False, precision=decoding_precision(cfg)))
    loader = DataLoader(CaptionEvalDataset(items), batch_size=decode_batch_size(cfg, trainer), shuffle=False,
                        num_workers=cfg.num_workers, collate_fn=collate)
    laps.lap("setup")  # checkpoint, store, annotations (the caption table), Trainer
    outputs = trainer.predict(Decoding(model, cfg.decode), loader) or []
    predictions: dict[int, dict] = {}
    for part in gather_objects([p for batch in outputs for p in batch]):
        for p in part:
            predictions.setdefault(p["index"], p)
    if not trainer.is_global_zero:
        return None
    return Decoded(items, predictions, sorted(predictions), store, data_cfg, train_cfg, model, paths)


def split_items(cfg: EvaluateConfig, data_cfg: Any, store: Any) -> FeatureItems:
    """The split's items with features, from the dataset's caption table (built once per annotation
    file, as training reads it: no JSON parse per evaluation); the first ``max_items`` if set."""
    if cfg.split not in SPLITS:
        raise ConfigError(f"split={cfg.split!r} is not a split: use train, val or test")
    table = caption_table(data_cfg)
    rows = table.rows(cfg.split)
    if not len(rows):
        raise ConfigError(f"split={cfg.split!r} has no items in data '{data_cfg.name}': use train, val or test")
    if cfg.server is not None:  # a file the server would not take: before decoding
        check_image_set(cfg.server, [table.record(r) for r in table.rows().tolist()], cfg.split)
    if cfg.max_items:
        return FeatureItems([table.record(r) for r in rows[: cfg.max_items].tolist()], store)
    return FeatureItems(table, store, cfg.split)


def decoding_precision(cfg: EvaluateConfig) -> str:
    """The Lightning precision of ``cfg.precision`` (fp32 unless asked: reported metrics must not move
    with a card's autocast); a mixed ``trainer.precision`` (e.g. ``trainer=gpu``'s) is not used."""
    if cfg.precision not in PRECISIONS:
        raise ConfigError(f"precision={cfg.precision!r}: use fp32 (the default), bf16 or fp16")
    if cfg.trainer.precision not in ("32-true", "32", PRECISIONS[cfg.precision]):
        log.info("decoding in precision=%s (trainer.precision=%s is for training; set precision=bf16 to decode "
                 "in bf16)", cfg.precision, cfg.trainer.precision)
    return PRECISIONS[cfg.precision]


def decode_batch_size(cfg: EvaluateConfig, trainer: pl.Trainer) -> int:
    """``batch_size``, or by default 64 items on a CPU and 500 on a GPU, where a decoding step of 64
    items costs little more than its kernel launches."""
    if cfg.batch_size is not None:
        if cfg.batch_size < 1:
            raise ConfigError(f"batch_size={cfg.batch_size}: use a positive number of items (or null: automatic)")
        return cfg.batch_size
    return 500 if trainer.strategy.root_device.type == "cuda" else 64


def output_folder(cfg: EvaluateConfig, paths: list[str]) -> Path:
    """``output_dir``, or ``<run>/eval/[ensemble<M>-]<split>-beam<k>`` of the first checkpoint."""
    if cfg.output_dir:
        return Path(cfg.output_dir)
    ensemble = f"ensemble{len(paths)}-" if len(paths) > 1 else ""
    return Path(paths[0]).resolve().parent.parent / "eval" / f"{ensemble}{cfg.split}-beam{cfg.decode.beam_size}"


def metric_names(names: list[str]) -> list[str]:
    """The metrics to score: METEOR left out (with a warning) when there is no Java to run its jar."""
    names = list(names)
    if "meteor" in names and shutil.which("java") is None:
        log.warning("METEOR needs Java (the toolkit's jar): not found on PATH, METEOR skipped")
        names.remove("meteor")
    return names


def write_results(cfg: EvaluateConfig, d: Decoded, out: Path, scores: dict[str, float]) -> None:
    """``results.json`` (COCO results format), ``metrics.json``, ``predictions.json`` (tokens, score,
    rows of ``attention.npy``: ``captioning.predictions``), ``nbest.json`` when several hypotheses per item were asked for, and the
    evaluation server's file (``server=``) last: a failed check of it loses no decoded caption."""
    hyps = d.hypotheses
    atomic_write_json(out / "results.json", [{d.id_key: d.source_id(i), "caption": hyps[i]} for i in d.order])
    atomic_write_json(out / "metrics.json", scores)
    write_predictions(out, [{d.id_key: d.source_id(i), "caption": hyps[i], "tokens": d.predictions[i]["tokens"],
                             "score": d.predictions[i]["score"],
                             "token_log_probs": d.predictions[i]["token_log_probs"]} for i in d.order],
                      [d.predictions[i]["attention"] for i in d.order])
    if cfg.decode.per_item > 1:  # every hypothesis of each item, best first (n-best / n samples)
        atomic_write_json(out / "nbest.json", [
            {d.id_key: d.source_id(i), "captions": [{"caption": " ".join(t), "score": s}
                                                   for t, s in d.predictions[i]["nbest"]]}
            for i in d.order
        ], indent=None)
    if cfg.server:
        records = d.items.records
        server_file = write_coco_results({d.source_id(i): hyps[i] for i in d.order},
                                         [r.source_id for r in records], out,
                                         coco_image_set([r.path for r in records], cfg.split),
                                         cfg.server_alg or run_name(d.paths))
        log.info("%s server file: %s (the upload zips it with the other set's: captioning.evaluation.server.pack)",
                 cfg.server, server_file)


def ground(cfg: EvaluateConfig, d: Decoded) -> tuple[dict | None, dict | None]:
    """(structured accuracy, attention grounding) on data with a grounding file (the synthetic
    data); (None, None) elsewhere or when the file does not fit the data."""
    path = d.data_cfg.grounding
    if not (cfg.grounding and path and Path(path).is_file()):
        return None, None
    gfile = read_json(path, "grounding file")
    try:
        structure = evaluate_structure({str(d.source_id(i)): d.predictions[i]["tokens"] for i in d.order}, gfile)
    except DataError as e:  # e.g. data generated by an older generator: the results stand
        log.warning("structured accuracy and grounding skipped: %s", e)
        return None, None
    meta = d.store.meta
    if meta.get("regions") and not meta.get("boxes"):
        log.warning("grounding skipped: the regions in %s have no boxes to place them in the image", d.store.root)
        return structure, None
    preds = {str(d.source_id(i)): (d.predictions[i]["tokens"], d.predictions[i]["attention"])
             for i in d.order if d.predictions[i]["attention"] is not None}
    frame_indices: dict[str, list[int]] | None = {} if d.data_cfg.kind == "video" else None
    valid: dict[str, int] = {}
    boxes: dict[str, np.ndarray] | None = {} if meta.get("boxes") else None  # image regions
    sizes: dict[str, tuple[int, int]] = {}
    for i in d.order:
        key, item = str(d.source_id(i)), d.store[d.items.records[i].item_id]
        valid[key] = int(item.valid)
        if boxes is not None and item.boxes is not None:
            boxes[key] = np.array(item.boxes[: item.valid])
            if item.image_size is not None:
                sizes[key] = item.image_size
        if frame_indices is not None:
            frame_indices[key] = list(item.frame_indices or [])
    grid = meta.get("grid")
    grounding = evaluate_grounding(preds, gfile, kind=d.data_cfg.kind, grid=tuple(grid) if grid else None,
                                   frame_indices=frame_indices, geometry=dict(meta), valid=valid,
                                   boxes=boxes, image_sizes=sizes)
    return structure, grounding


def evaluation_provenance(d: Decoded, **extra: Any) -> dict[str, Any]:
    """Where the numbers came from: the checkpoints' runs (fingerprints), the store, the code, ``extra``
    (the decoding's precision)."""
    runs = d.model.checkpoint_runs
    return provenance(store=store_id(d.store.meta), run=runs[0]["fingerprint"] if len(runs) == 1 else None,
                      checkpoints=runs, **extra)


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
