"""Score a caption results file against an annotation file, as the COCO toolkit does.

Results: COCO results format ``[{"image_id": id, "caption": str}, ...]`` (``video_id`` is
accepted in place of ``image_id``).  Annotations: COCO captions format
(``{"annotations": [{"image_id", "caption"}, ...], ...}``) or MSR-VTT format
(``{"videos": [{"video_id", ...}], "sentences": [{"video_id", "caption"}, ...]}``).

Only the ids present in the results are scored (the toolkit's ``loadRes`` +
``params['image_id']``), so CIDEr's document frequencies come from those ids' references.
Ids are matched by value; an integer id also matches the same number written as a string.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from captioning.errors import ConfigError, DataError
from captioning.metrics import METRICS, MetricResult, compute_metrics, default_metrics
from captioning.utils.io import atomic_write_json, read_json

__all__ = ["load_annotations", "load_results", "score_files"]

Id = Hashable


def _norm_id(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DataError(f"{where}: id {value!r} must be an integer or a string")
    return str(value)


def load_results(path: str | Path) -> dict[Id, str]:
    """``{id: caption}`` from a COCO-format results file; refuses duplicates and non-strings."""
    data = read_json(path, "results file")
    if not isinstance(data, list):
        raise DataError(
            f"results file {path}: expected a JSON list of {{\"image_id\", \"caption\"}} objects, "
            f"got {type(data).__name__}"
        )
    if not data:
        raise DataError(f"results file {path} is empty: nothing to score")
    out: dict[Id, str] = {}
    seen: dict[str, Id] = {}
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise DataError(f"results file {path}: entry {i} is {type(entry).__name__}, not an object")
        key = "image_id" if "image_id" in entry else "video_id" if "video_id" in entry else None
        if key is None:
            raise DataError(f"results file {path}: entry {i} has no 'image_id' (or 'video_id')")
        raw_id = entry[key]
        norm = _norm_id(raw_id, f"results file {path}, entry {i}")
        if "caption" not in entry:
            raise DataError(f"results file {path}: entry {i} (id {raw_id!r}) has no 'caption'")
        caption = entry["caption"]
        if not isinstance(caption, str):
            raise DataError(
                f"results file {path}: caption of id {raw_id!r} is {type(caption).__name__} "
                f"({caption!r}), not a string"
            )
        if norm in seen:
            raise DataError(
                f"results file {path}: duplicate id {raw_id!r} (entries {list(out).index(seen[norm])} "
                f"and {i}); keep one caption per id"
            )
        seen[norm] = raw_id
        out[raw_id] = caption
    return out


def load_annotations(path: str | Path) -> dict[str, list[str]]:
    """``{str(id): [reference, ...]}`` from a COCO captions or MSR-VTT annotation file."""
    data = read_json(path, "annotation file")
    if isinstance(data, dict) and isinstance(data.get("annotations"), list):
        entries, id_key, fmt = data["annotations"], "image_id", "COCO"
    elif isinstance(data, dict) and isinstance(data.get("sentences"), list):
        entries, id_key, fmt = data["sentences"], "video_id", "MSR-VTT"
    else:
        raise DataError(
            f"annotation file {path}: expected COCO captions format (an 'annotations' list) or "
            f"MSR-VTT format (a 'sentences' list)"
        )
    refs: dict[str, list[str]] = {}
    for i, entry in enumerate(entries):
        where = f"annotation file {path} ({fmt}), entry {i}"
        if not isinstance(entry, dict) or id_key not in entry or "caption" not in entry:
            raise DataError(f"{where}: expected an object with '{id_key}' and 'caption'")
        norm = _norm_id(entry[id_key], where)
        caption = entry["caption"]
        if not isinstance(caption, str):
            raise DataError(f"{where}: caption of id {entry[id_key]!r} is {type(caption).__name__}, not a string")
        refs.setdefault(norm, []).append(caption)
    if not refs:
        raise DataError(f"annotation file {path} has no captions")
    return refs


def score_files(
    results: str | Path,
    annotations: str | Path,
    metrics: Sequence[str] | None = None,
    tokenize: bool = True,
) -> MetricResult:
    """Score every id of ``results`` against its references in ``annotations``.

    Raises DataError naming the file and id for ids missing from the annotations, duplicate
    ids, non-string captions and malformed files.  ``per_item`` is keyed by the results' ids.
    """
    hyps = load_results(results)
    refs_by_norm = load_annotations(annotations)
    refs: dict[Id, list[str]] = {}
    for raw_id in hyps:
        norm = str(raw_id)
        if norm not in refs_by_norm:
            raise DataError(
                f"results file {results}: id {raw_id!r} is not in annotation file {annotations} "
                f"(wrong annotation file or split?)"
            )
        refs[raw_id] = refs_by_norm[norm]
    return compute_metrics(refs, hyps, metrics=metrics, tokenize=tokenize)


@dataclass
class ScoreConfig:
    results: str = MISSING
    annotations: str = MISSING
    metrics: list[str] = field(default_factory=default_metrics)  # registered names (captioning.metrics)
    tokenize: bool = True
    output: str | None = None
    per_item: bool = False


def score(cfg: ScoreConfig) -> dict:
    """Score, print, optionally write; returns the JSON-ready dict."""
    from rich.console import Console
    from rich.table import Table


    unknown = [m for m in cfg.metrics if m not in METRICS]
    if unknown or not cfg.metrics:
        what = f"unknown metric {unknown[0]!r}" if unknown else "no metric"
        raise ConfigError(f"metrics: {what}; choose from {', '.join(METRICS.names())}, e.g. metrics=[bleu,cider]")
    result = score_files(cfg.results, cfg.annotations, metrics=cfg.metrics, tokenize=cfg.tokenize)
    out: dict = dict(result.scores)
    if cfg.per_item:
        out["per_item"] = {str(k): v for k, v in result.per_item.items()}

    table = Table(title=f"{len(result.per_item)} items - {cfg.results}")
    table.add_column("metric")
    table.add_column("score", justify="right")
    for name, value in result.scores.items():
        table.add_row(name, f"{value:.4f}")
    console = Console(soft_wrap=True)
    console.print(table)
    if result.bleu_stats is not None:
        s = result.bleu_stats
        console.print(
            f"BLEU: testlen {s['testlen']}, reflen {s['reflen']}, ratio {s['ratio']:.6f}, "
            f"guess {s['guess']}, correct {s['correct']}",
            highlight=False,
        )
    if cfg.output:
        atomic_write_json(cfg.output, out)
        console.print(f"wrote {cfg.output}", highlight=False)
    return out
