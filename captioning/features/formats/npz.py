"""``npz_dir``: a folder of ``<id>.npz`` files holding the features [n, D] under ``key`` (``feat``, as
in ruotianluo's ``cocobu_att``); boxes from ``boxes_dir/<id>.npy`` [n, 4] when given (``cocobu_box``)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np

from captioning.features.formats import (
    FEATURE_FORMATS,
    BadRecord,
    ImportConfig,
    Regions,
    SourceItem,
    boxes_file,
    item_files,
    item_folder,
    load_boxes,
)


def _load_npz(path: Path, key: str, boxes: Path | None) -> Regions:
    with np.load(path, allow_pickle=False) as z:
        if key not in z.files:
            raise BadRecord(f"{path.name} has no array {key!r} (it has {', '.join(z.files) or 'none'}): set key=")
        features = z[key]
    return Regions(features, load_boxes(boxes))



@FEATURE_FORMATS.register("npz_dir", kinds=("image", "video"), boxes="boxes_dir")
def read_npz_dir(cfg: ImportConfig) -> Iterator[SourceItem]:
    """``<id>.npz`` files with the features under ``cfg.key`` (+ ``boxes_dir/<id>.npy``)."""
    for path in item_files(item_folder(cfg.source, "npz_dir"), ".npz"):
        stem = path.name[: -len(".npz")]
        yield SourceItem(stem, partial(_load_npz, path, cfg.key, boxes_file(cfg, stem)), str(path))
