"""COCO captions: one file per split (``annotations.train/val/test``), indexed with pycocotools."""

from __future__ import annotations

import contextlib
import io

from pycocotools.coco import COCO

from captioning.config import DataConfig
from captioning.data.annotations import (
    ANNOTATION_FORMATS,
    SPLITS,
    Problems,
    Sourced,
    load_json,
    require_annotations,
    safe_path,
    text_problem,
    valid_id,
)
from captioning.data.records import CaptionRecord
from captioning.errors import ConfigError, DataError


@ANNOTATION_FORMATS.register("coco", kind="image")
def read_coco(cfg: DataConfig, problems: Problems) -> list[Sourced]:
    """COCO captions files, one per split in ``cfg.annotations`` (``train``/``val``/``test``)."""
    unknown = sorted(set(cfg.annotations) - set(SPLITS))
    if unknown:
        raise ConfigError(
            f"data.annotations.{unknown[0]} is not valid for format=coco: give one COCO captions file "
            f"per split as annotations.train / annotations.val / annotations.test"
        )
    require_annotations(cfg, SPLITS, "data.annotations.train=data/coco/annotations/captions_train2014.json")
    records = []
    for split in SPLITS:
        if cfg.annotations.get(split):
            records += _read_coco_file(cfg.annotations[split], split, cfg, problems)
    return records


def _read_coco_file(file: str, split: str, cfg: DataConfig, problems: Problems) -> list[Sourced]:

    data = load_json(file, "COCO captions file")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f"COCO captions file {file} has no 'images' list: is it a COCO captions json?")
    anns = data.get("annotations", [])
    if not isinstance(anns, list):
        raise DataError(f"COCO captions file {file}: 'annotations' is not a list")

    images, order, seen = [], [], set()
    rejected = set()  # ids of reported image entries: their captions go without a second report
    for k, img in enumerate(data["images"]):
        record = f"images[{k}]"
        if not isinstance(img, dict) or not valid_id(img.get("id")):
            problems.bad(file, record, "image entry without a valid 'id'")
            continue
        record = f"image id {img['id']}"
        path = safe_path(cfg.media_dir, img.get("file_name"), file, record, problems)
        if path is None:
            rejected.add(img["id"])
            continue
        if img["id"] in seen:
            problems.bad(file, record, "duplicate image id (another entry of 'images' has it)")
            continue
        seen.add(img["id"])
        order.append(img["id"])
        images.append({"id": img["id"], "file_name": path})
    known = seen
    rejected -= known
    clean_anns = []
    for k, ann in enumerate(anns):
        record = f"annotations[{k}]"
        if not isinstance(ann, dict) or "image_id" not in ann:
            problems.bad(file, record, "annotation without an 'image_id'")
            continue
        record = f"annotations[{k}] (image id {ann['image_id']})"
        if valid_id(ann["image_id"]) and ann["image_id"] in rejected:
            continue
        if not valid_id(ann["image_id"]) or ann["image_id"] not in known:
            problems.bad(file, record, "image id has no entry (file_name) in 'images'")
            continue
        bad = text_problem(ann.get("caption"))
        if bad:
            problems.bad(file, record, bad)
            continue
        clean_anns.append({"id": len(clean_anns), "image_id": ann["image_id"], "caption": ann["caption"]})

    coco = COCO()
    coco.dataset = {"images": images, "annotations": clean_anns}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            coco.createIndex()
    except Exception as e:  # pycocotools reports bad structure as KeyError/TypeError/...
        raise DataError(f"pycocotools could not index {file}: {type(e).__name__}: {e}") from None

    records = []
    for image_id in order:
        caps = [" ".join(a["caption"].split()) for a in coco.imgToAnns.get(image_id, [])]
        if not caps:
            problems.dropped(file, f"image id {image_id}")
            continue
        records.append((file, CaptionRecord(
            item_id=str(image_id), source_id=image_id, path=coco.imgs[image_id]["file_name"],
            captions=tuple(caps), split=split, kind="image",
        )))
    return records
