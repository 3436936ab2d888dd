"""Probes as jobs: ``probes.json`` beside an evaluation, and ``captioning-score`` on any checkpoint.

``write_probes`` runs the probes on the items a job already holds (``captioning-evaluate
probes=[binding,order,shuffle]``) and writes ``<output_dir>/probes.json``: per probe its summary
(accuracy, exact chance, items perturbed of items total, per item [questions, credit, chance
sum]) and every question (candidates, reference first, their scores and the credit).
``score_probes`` is the same for a checkpoint and an annotation file (COCO captions or MSR-VTT
format; the item ids are the FeatureStore keys, as the annotation readers make them)::

    captioning-score ckpt_path=<run>/checkpoints/best.ckpt annotations=captions_test.json \\
        probes=[binding,order,shuffle] [grounding=grounding.json] [output=probes.json]
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captioning.data.datamodule import FeatureItems
from captioning.data.records import CaptionRecord
from captioning.errors import ConfigError, DataError
from captioning.evaluation.probes import PROBES, ProbeItem
from captioning.evaluation.probes.run import run_probes
from captioning.metrics.scoring import ScoreConfig, load_annotations
from captioning.provenance import provenance
from captioning.utils.io import atomic_write_json, read_json

log = logging.getLogger("captioning.probes")

PROBES_FILE = "probes.json"


def probe_items(items: FeatureItems, grounding: str | Path | None) -> list[ProbeItem]:
    """The items with their tokenized references and, when a grounding file is given, its entries."""
    gfile: dict[str, Any] = read_json(grounding, "grounding file") if grounding and Path(grounding).is_file() else {}
    entries, classes = gfile.get("items") or {}, gfile.get("word_classes") or {}
    out = []
    for i, record in enumerate(items.records):
        key = str(record.source_id)
        refs = tuple(tuple(r.split()) for r in items.references[i])
        out.append(ProbeItem(key, refs, entries.get(key), classes))
    return out


def check_names(names: Sequence[str]) -> list[str]:
    names = list(names)
    for n in names:
        PROBES.get(n)  # one line naming the registered probes when unknown
    return names


def write_probes(path: Path, names: Sequence[str], model: Any, items: FeatureItems,
                 grounding: str | Path | None, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``names`` with ``model`` (``.decoder``, ``.vocab``) on ``items``; write them to ``path``
    (a ``probes.json``); return the summaries by probe name."""
    results = run_probes(check_names(names), model.decoder, model.vocab, probe_items(items, grounding),
                         lambda rows: items.batch(rows)[:2])
    summaries = {n: r.summary() for n, r in results.items()}
    atomic_write_json(path, {
        **(meta or {}), "score": "mean token log-likelihood (teacher-forced, fp32), reference vs perturbations",
        "probes": {n: {**summaries[n], "questions_asked": results[n].details} for n in names}}, indent=None)
    for n, s in summaries.items():
        acc = "n/a" if s["accuracy"] is None else f"{s['accuracy']:.4f} (chance {s['chance']:.4f})"
        log.info("probe %s: %s on %d of %d items, %d questions", n, acc, s["items"], s["items_total"],
                 s["questions"])
        print(f"probe {n}: accuracy {acc}, {s['items']} of {s['items_total']} items perturbed, "
              f"{s['questions']} questions", flush=True)
    return summaries


@dataclass
class ProbeScoreConfig(ScoreConfig):
    """``captioning-score``: metrics of a results file, or (``probes=``) probes of a checkpoint."""

    results: str | None = None
    ckpt_path: str | None = None
    probes: list[str] = field(default_factory=list)
    features_dir: Any = None  # default: the checkpoint's (a folder, or one per stream)
    grounding: str | None = None  # the synthetic data's grounding.json: probes from the annotations


def score_probes(cfg: ProbeScoreConfig) -> dict[str, Any]:
    """Probe ``cfg.ckpt_path`` on every item of ``cfg.annotations`` that the store holds."""
    from captioning.train.checkpoint import load_captioner
    from captioning.train.inputs import checkpoint_inputs

    if not cfg.ckpt_path:
        raise ConfigError("probes need a model: pass ckpt_path=<run>/checkpoints/best.ckpt")
    model = load_captioner(cfg.ckpt_path)
    store = checkpoint_inputs(model.hparams, cfg.ckpt_path, features_dir=cfg.features_dir).store
    refs = load_annotations(cfg.annotations)
    kind = "video" if store.meta.get("kind") == "video" else "image"
    records = [CaptionRecord(key, key, "", tuple(caps), "test", kind) for key, caps in refs.items()]
    items = FeatureItems(records, store)
    if not len(items):
        raise DataError(f"none of the {len(refs)} ids of {cfg.annotations} is in the store {store.root}: "
                        f"pass the features_dir= of this data")
    out = Path(cfg.output) if cfg.output else Path(cfg.annotations).with_name(PROBES_FILE)
    meta = {"checkpoint": str(cfg.ckpt_path), "annotations": str(cfg.annotations),
            "provenance": provenance(checkpoints=model.checkpoint_runs)}
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_probes(out, cfg.probes, model, items, cfg.grounding, meta)
