"""``hdf5``: one HDF5 file keyed by id: a dataset [n, D] per id, or a group per id holding the features
under ``key`` (and the boxes under ``boxes_key``; the image size in attributes ``image_w``/``image_h``)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import h5py
import numpy as np

from captioning.errors import DataError
from captioning.features.formats import (
    FEATURE_FORMATS,
    BadRecord,
    ImportConfig,
    Regions,
    SourceItem,
)


def _load_h5(file: h5py.File, name: str, key: str, boxes_key: str | None) -> Regions:
    node = file[name]
    if isinstance(node, h5py.Dataset):
        features, boxes = node[()], None
    else:
        if key not in node:
            raise BadRecord(f"group {name!r} has no dataset {key!r} (it has {', '.join(node.keys()) or 'none'}): "
                            f"set key=")
        if boxes_key and boxes_key not in node:
            raise BadRecord(f"group {name!r} has no boxes dataset {boxes_key!r}")
        features = node[key][()]
        boxes = node[boxes_key][()] if boxes_key else None
    attrs = node.attrs
    size = (int(attrs["image_w"]), int(attrs["image_h"])) if "image_w" in attrs and "image_h" in attrs else None
    return Regions(np.asarray(features), None if boxes is None else np.asarray(boxes), size)


@FEATURE_FORMATS.register("hdf5", kinds=("image", "video"), boxes="boxes_key")
def read_hdf5(cfg: ImportConfig) -> Iterator[SourceItem]:
    """One HDF5 file: per id a dataset [n, D], or a group with ``cfg.key`` (and ``cfg.boxes_key``)."""
    path = Path(cfg.source)
    if not path.is_file():
        raise DataError(f"source={cfg.source} is not a file: format=hdf5 reads one HDF5 file keyed by id")
    try:
        file = h5py.File(path, "r")
    except OSError as e:
        raise DataError(f"source={path} is not a readable HDF5 file ({e})") from None
    with file:
        for name in file.keys():
            yield SourceItem(name, partial(_load_h5, file, name, cfg.key, cfg.boxes_key), f"{path}:{name}")
