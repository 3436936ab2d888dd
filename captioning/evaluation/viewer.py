"""The evaluation's attention viewer (``captioning-evaluate ... viewer=true``): a decoded split as
``captioning.viz.viewer`` items, with what only the evaluation knows: each item's CIDEr and BLEU-4
and, on data with a grounding file, each grounded word's object and whether its attention points
into it (the same test as the report's pointing accuracy, ``captioning.evaluation.grounding``).

``viewer.compare=<other run's predictions.json>`` adds that run's captions and attention per item
(matched by id), scored against the same references.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captioning.errors import CaptioningError
from captioning.evaluation.grounding import class_of_word, owners_in_context, word_classes_of
from captioning.evaluation.object_regions import (
    AttentionPositions,
    Geometry,
    box_in_input,
    frames_in_span,
)
from captioning.features.featurize import display_crop
from captioning.metrics import compute_metrics
from captioning.utils.io import read_json
from captioning.viz.gallery import error_line
from captioning.viz.viewer import (
    Layout,
    RunInfo,
    ViewerConfig,
    ViewerItem,
    ViewerRun,
    ViewerWriter,
    infer_layout,
    layout_of_meta,
    read_compare,
)
from captioning.viz.viewer.items import width_of
from captioning.viz.viewer.results import stream_names

log = logging.getLogger("captioning.evaluate")

SHOWN_METRICS = ("CIDEr", "Bleu_4")  # per-item scores the viewer lists, filters and sorts by


class WordGrounding:
    """Per caption, each class word that names exactly one observable object (event) of its item:
    ``{"t", "hit", "mass"}`` and the object's ``box`` (fractions of the image the model saw) or the
    event's ``frames`` (positions k of the sampled frames in its span)."""

    def __init__(self, grounding: Mapping[str, Any], kind: str, meta: Mapping[str, Any]) -> None:
        self.items, self.kind = grounding.get("items") or {}, kind
        self.word_class = class_of_word(word_classes_of(grounding))
        self.geometry = Geometry.from_store_meta(meta)
        self.boxes = bool(meta.get("boxes"))

    def __call__(self, key: str, tokens: Sequence[str], alpha: np.ndarray | None, layout: Layout,
                 store_item: Any) -> list[dict[str, Any]]:
        entry = self.items.get(key)
        if entry is None or alpha is None or layout.type == "positions":
            return []
        if layout.type == "regions" and not (self.boxes and store_item.boxes is not None):
            return []  # regions without boxes: nowhere to place them in the image
        objects = entry.get("objects" if self.kind == "image" else "events") or []
        valid = int(store_item.valid)
        frames = list(store_item.frame_indices or [])
        boxes = {key: np.array(store_item.boxes[:valid])} if self.boxes and store_item.boxes is not None else None
        sizes = {key: store_item.image_size} if store_item.image_size is not None else {}
        positions = AttentionPositions(self.kind, layout.grid, self.geometry, boxes, sizes, {key: frames}, {key: valid})
        try:
            regions = positions.regions(key, entry, objects, alpha.shape[1])
        except CaptioningError as e:  # e.g. the other run's grid does not tile this data
            log.debug("viewer: no grounding for item %s: %s", key, e)
            return []
        named = owners_in_context(tokens, [{j for j, o in enumerate(objects) if w in o.get("words", ())}
                                           for w in tokens])
        out = []
        for t, word in enumerate(tokens):
            owners = sorted(named[t])
            if word not in self.word_class or len(owners) != 1 or regions[owners[0]] is None:
                continue
            mass, hit = regions[owners[0]].score(alpha[t])
            out.append({"t": t, "hit": bool(hit), "mass": round(float(mass), 4),
                        **self._where(entry, objects[owners[0]], frames, boxes is not None)})
        return out

    def _where(self, entry: Mapping[str, Any], obj: Mapping[str, Any], frames: list[int], regions: bool) -> dict:
        if self.kind == "video":
            return {"frames": np.flatnonzero(frames_in_span(frames, obj["span"])).tolist()}
        size = entry["size"]
        if regions:  # the viewer shows the whole image: the box as fractions of it
            x0, y0, x1, y1 = (float(v) for v in obj["box"])
            return {"box": [round(x0 / size[0], 4), round(y0 / size[1], 4), round(x1 / size[0], 4), round(y1 / size[1], 4)]}
        x0, y0, x1, y1, w, h = box_in_input(size, obj["box"], self.geometry)
        return {"box": [round(x0 / w, 4), round(y0 / h, 4), round(x1 / w, 4), round(y1 / h, 4)]}


def _scores(per_item: Mapping[Any, Mapping[str, float]], i: Any) -> dict[str, float]:
    scores = per_item.get(i) or {}
    return {k: float(scores[k]) for k in SHOWN_METRICS if k in scores}


def _other_scores(d: Any, other: Mapping[str, ViewerRun]) -> dict[Any, dict[str, float]]:
    """Per-item CIDEr and BLEU of the compared run's captions, against this split's references."""
    both = [i for i in d.order if str(d.source_id(i)) in other]
    if not both:
        return {}
    refs = {i: d.items.references[i] for i in both}
    hyps = {i: other[str(d.source_id(i))].caption for i in both}
    return compute_metrics(refs, hyps, metrics=("bleu", "cider"), tokenize=False).per_item


def _pixels(d: Any, i: int, store_item: Any) -> tuple[np.ndarray | None, str | None]:
    """What the model saw of item i (uint8 [S, S, 3] / [K, S, S, 3]) or (None, why not)."""
    path = os.path.join(d.data_cfg.media_dir, d.items.records[i].path)
    try:
        x = display_crop(d.store.meta, path, store_item.frame_indices).numpy()
    except Exception as e:  # the captions and attention stand without the pixels
        return None, f"no image: {error_line(e)}"
    return np.ascontiguousarray(np.moveaxis(x, -3, -1)), None


def write_viewer(cfg: ViewerConfig, d: Any, out: Path, per_item: Mapping[Any, Mapping[str, float]], *,
                 title: str, grounding: bool = True) -> Path:
    """``<out>/viewer/`` of a decoded split ``d`` (``captioning.evaluation.job.Decoded``) with its
    per-item scores ``per_item`` (item index -> metric -> value); returns its ``index.html``."""
    meta = dict(d.store.meta)
    layouts = [layout_of_meta(meta)]
    hard = bool(getattr(getattr(d.model, "decoder", None), "hard_attention", False))
    runs = [RunInfo(Path(d.paths[0]).resolve().parent.parent.name, str(out / "predictions.json"), layouts[0],
                    hard=hard, streams=stream_names(meta))]
    other: dict[str, ViewerRun] = {}
    if cfg.compare:
        path, other = read_compare(cfg.compare)
        width = width_of(list(other.values()))
        layouts.append(infer_layout(width, layouts[0]) if width else Layout("positions"))
        runs.append(RunInfo(path.parent.name or path.name, str(path), layouts[1]))
    other_scores = _other_scores(d, other)
    gpath = d.data_cfg.grounding
    ground = (WordGrounding(read_json(gpath, "grounding file"), d.data_cfg.kind, meta)
              if grounding and gpath and Path(gpath).is_file() else None)
    writer = ViewerWriter(out, cfg, runs, kind=d.data_cfg.kind, title=title)
    for i in d.order[: cfg.max_items]:
        key, store_item = str(d.source_id(i)), d.store[d.items.records[i].item_id]
        item_runs = [_run(d.predictions[i], _scores(per_item, i))]
        if cfg.compare:
            theirs = other.get(key)
            if theirs is not None:
                theirs.metrics = _scores(other_scores, i)
            item_runs.append(theirs)
        for run, layout in zip(item_runs, layouts, strict=True):
            if ground is not None and run is not None and run.attention is not None:
                run.grounding = ground(key, run.tokens, np.asarray(run.attention, dtype=np.float64), layout, store_item)
        pixels, note = _pixels(d, i, store_item)
        frames = None if store_item.frame_indices is None else [int(f) for f in store_item.frame_indices]
        boxes = None if store_item.boxes is None else np.array(store_item.boxes[: store_item.valid])
        writer.add(ViewerItem(key, item_runs, pixels=pixels, frame_indices=frames, boxes=boxes,
                              image_size=store_item.image_size, references=list(d.items.references[i]), note=note))
    return writer.close()


def _run(pred: Mapping[str, Any], metrics: dict[str, float]) -> ViewerRun:
    """The evaluated model's caption of one item (its prediction: tokens, attention, score, n-best,
    and the per-word log-probabilities when the decoder recorded them)."""
    lp, nbest = pred.get("token_log_probs"), pred.get("nbest") or []
    return ViewerRun(list(pred["tokens"]), pred["attention"], score=pred.get("score"),
                     log_probs=None if lp is None else [float(v) for v in lp],
                     nbest=[(" ".join(t), float(s)) for t, s in nbest] if len(nbest) > 1 else [], metrics=metrics)
