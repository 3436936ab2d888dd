"""``npy_dir``: a folder of ``<id>.npy`` files holding the features [n, D] (e.g. the frame features of
each video); boxes from ``boxes_dir/<id>.npy`` [n, 4] when given."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np

from captioning.features.formats import (
    FEATURE_FORMATS,
    ImportConfig,
    Regions,
    SourceItem,
    boxes_file,
    item_files,
    item_folder,
    load_boxes,
)


def _load_npy(path: Path, boxes: Path | None) -> Regions:
    return Regions(np.load(path, allow_pickle=False), load_boxes(boxes))



@FEATURE_FORMATS.register("npy_dir", kinds=("image", "video"), boxes="boxes_dir")
def read_npy_dir(cfg: ImportConfig) -> Iterator[SourceItem]:
    """``<id>.npy`` files holding the features [n, D] (+ ``boxes_dir/<id>.npy``)."""
    for path in item_files(item_folder(cfg.source, "npy_dir"), ".npy"):
        stem = path.name[: -len(".npy")]
        yield SourceItem(stem, partial(_load_npy, path, boxes_file(cfg, stem)), str(path))
