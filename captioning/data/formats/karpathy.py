"""Karpathy splits: ``dataset_{coco,flickr8k,flickr30k}.json`` (``annotations.all``); ``restval`` -> train."""

from __future__ import annotations

from typing import Any

from captioning.config import DataConfig
from captioning.data.annotations import (
    ANNOTATION_FORMATS,
    Problems,
    Sourced,
    clean_captions,
    load_json,
    require_annotations,
    safe_path,
    text_problem,
    valid_id,
)
from captioning.data.records import CaptionRecord
from captioning.errors import DataError

KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def raw_sentence(obj: dict) -> Any:
    """A sentence entry (it has a ``sentid``) becomes its ``raw`` caption as soon as it is parsed;
    other objects stay.  The file's per-sentence token lists and ids are never read, and held at
    once they triple the parse's memory (a COCO-sized file, 616k sentences: Python's peak 851 ->
    288 MiB, traced; docs/at_scale.md)."""
    if "sentid" in obj and "sentences" not in obj and isinstance(obj.get("raw"), str):
        return obj["raw"]
    return obj


@ANNOTATION_FORMATS.register("karpathy", kind="image")
def read_karpathy(cfg: DataConfig, problems: Problems) -> list[Sourced]:
    """A Karpathy split file (``annotations.all``); ``restval`` becomes ``train``."""
    require_annotations(cfg, ["all"], "data.annotations.all=data/coco/dataset_coco.json")
    file = cfg.annotations["all"]
    data = load_json(file, "Karpathy split file", object_hook=raw_sentence)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f"Karpathy split file {file} has no 'images' list: is it a dataset_*.json of Karpathy's splits?")
    records = []
    for k, img in enumerate(data["images"]):
        record = f"images[{k}]"
        if not isinstance(img, dict):
            problems.bad(file, record, "image entry is not an object")
            continue
        source_id = img.get("cocoid", img.get("imgid"))
        if not valid_id(source_id):
            problems.bad(file, record, "image entry without a valid 'cocoid' or 'imgid'")
            continue
        record = f"images[{k}] (id {source_id})"
        split = KARPATHY_SPLITS.get(img["split"]) if isinstance(img.get("split"), str) else None
        if split is None:
            problems.bad(file, record, f"unknown split {img.get('split')!r} (expected train|val|test|restval)")
            continue
        name = img.get("filename")
        bad = text_problem(name, "filename")
        if bad:
            problems.bad(file, record, bad)
            continue
        rel = f"{img['filepath']}/{name}" if img.get("filepath") else name
        path = safe_path(cfg.media_dir, rel, file, record, problems)
        if path is None:
            continue
        sentences = img.get("sentences")
        if not isinstance(sentences, list):
            problems.bad(file, record, "no 'sentences' list")
            continue
        pairs = []
        for j, s in enumerate(sentences):
            cap = s.get("raw") if isinstance(s, dict) else s
            if isinstance(s, dict) and cap is None and isinstance(s.get("tokens"), list):
                cap = " ".join(t for t in s["tokens"] if isinstance(t, str))
            pairs.append((f"{record} sentences[{j}]", cap))
        caps = clean_captions(pairs, file, problems)
        if not caps:
            problems.dropped(file, record)
            continue
        extra = {"imgid": img.get("imgid"), "karpathy_split": img.get("split")}
        records.append((file, CaptionRecord(
            item_id=str(source_id), source_id=source_id, path=path, captions=tuple(caps),
            split=split, kind="image", extra=extra,
        )))
    return records
