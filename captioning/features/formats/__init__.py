"""Feature formats: one module per layout of features made elsewhere, each a reader registered in
``FEATURE_FORMATS`` (``format=``; the way ``captioning.data.formats`` registers annotation formats):

- ``npz_dir`` (``npz.py``): a folder of ``<id>.npz`` holding the features [n, D] under ``key``
  (``feat``, as in ruotianluo's ``cocobu_att``); boxes from ``boxes_dir/<id>.npy`` [n, 4] when given
  (``cocobu_box``);
- ``npy_dir`` (``npy.py``): a folder of ``<id>.npy`` [n, D] (e.g. the frame features of each video);
  boxes as above;
- ``bottom_up_tsv`` (``bottom_up_tsv.py``): the original TSV (one file, a folder of them, or a glob):
  tab-separated ``image_id, image_w, image_h, num_boxes, boxes, features`` without a header,
  ``boxes`` and ``features`` base64 float32 [num_boxes, 4] and [num_boxes, D];
- ``hdf5`` (``hdf5.py``): one HDF5 file keyed by id: a dataset [n, D] per id, or a group per id
  holding the features under ``key`` (and the boxes under ``boxes_key``; the image size in
  attributes ``image_w``/``image_h``).

A reader yields ``SourceItem``s, an id and a ``load()`` that decodes that one record, so ids that
are already stored, not in the annotations or not this rank's are never decoded, and a corrupt
record costs one failure, not the import.  This module holds what every format shares: the config
the readers read (``ImportConfig``), the record they yield (``Regions``) and the checks each record
passes (``fit_regions``).  The modules of this package are imported the first time
``FEATURE_FORMATS`` is read, so a new layout is one new module.  The import job:
``captioning.features.importing``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import MISSING

from captioning.config import DataConfig
from captioning.errors import DataError
from captioning.registry import Registry

OVERFLOW = ("fail", "first", "uniform")
BOX_TOLERANCE = 1.0  # pixels a box may reach past the image border (detectors clip to W - 1)


@dataclass
class ImportConfig:
    """``captioning-import``: which features (``format``, ``source``) go into which store, and how."""

    data: DataConfig = field(default_factory=DataConfig)
    format: str = MISSING  # npz_dir | npy_dir | bottom_up_tsv | hdf5
    source: str = MISSING  # the folder, file or glob (bottom_up_tsv) to read
    name: str = "imported"  # what these features are: stores/checkpoints of other names never mix
    features_dir: str = MISSING  # conf/import.yaml: ${data.root}/features/${name}
    key: str = "feat"  # npz_dir: the array of the features; hdf5: their dataset in each id's group
    boxes_dir: str | None = None  # npz_dir / npy_dir: a folder of <id>.npy boxes [n, 4]
    boxes_key: str | None = None  # hdf5: the boxes' dataset in each id's group
    id_format: str = "{}"  # source id -> annotation id, e.g. "video{}" for keys 0, 1, ...
    max_regions: int | None = None  # N positions per item; None: the largest n of the source (one more pass)
    overflow: str = "fail"  # an item with n > N: fail | first (its first N rows) | uniform (N evenly spaced)
    grid: list[int] | None = None  # [h, w]: the rows are a row-major grid, not a set of regions
    dtype: str = "float16"  # float16 | float32 (stored features)
    shard_size: int = 256
    rank: int = 0
    world_size: int = 1
    limit: int | None = None  # only the first N items of this rank (smoke runs)
    progress: bool = True


# ------------------------------------------------------------------------------------ readers


@dataclass(frozen=True)
class Regions:
    """One decoded record: features [n, D]; boxes [n, 4] pixel (x1, y1, x2, y2) or None;
    image_size (W, H) or None."""

    features: np.ndarray
    boxes: np.ndarray | None = None
    image_size: tuple[int, int] | None = None


@dataclass(frozen=True)
class SourceItem:
    """A record of the source: its id as the source writes it, ``load()`` -> Regions (raises when
    the record is corrupt) and ``where`` (file, line or key) for the failure list."""

    source_id: str
    load: Callable[[], Regions]
    where: str


class BadRecord(ValueError):
    """One record cannot be imported; the message becomes its failure record."""


Reader = Callable[[ImportConfig], Iterator[SourceItem]]
#: format name -> reader; metadata ``kinds`` (what it can hold) and ``boxes`` (when it gives boxes)
FEATURE_FORMATS: Registry[Reader] = Registry("feature format", config_key="format", discover=__name__)


def item_folder(source: str, fmt: str) -> Path:
    """``source`` as the folder of per-item files that ``format=fmt`` reads, or a DataError."""
    path = Path(source)
    if not path.is_dir():
        raise DataError(f"source={source} is not a folder: format={fmt} reads a folder of per-item files")
    return path


def item_files(folder: Path, suffix: str) -> list[Path]:
    """The files of ``folder`` whose names end with ``suffix`` (hidden ones left out), sorted."""
    return [folder / n for n in sorted(os.listdir(folder)) if n.endswith(suffix) and not n.startswith(".")]


def load_boxes(path: Path | None) -> np.ndarray | None:
    """The boxes [n, 4] of ``path`` (None: the source gives none); a missing file is a BadRecord."""
    if path is None:
        return None
    if not path.is_file():
        raise BadRecord(f"no boxes file {path}")
    return np.load(path, allow_pickle=False)


def boxes_file(cfg: ImportConfig, stem: str) -> Path | None:
    """``boxes_dir/<stem>.npy`` when ``boxes_dir`` is set, else None."""
    return Path(cfg.boxes_dir) / f"{stem}.npy" if cfg.boxes_dir else None


def gives_boxes(cfg: ImportConfig) -> bool:
    """Whether the configured source comes with boxes (the TSV always; the others when told where)."""
    boxes = FEATURE_FORMATS.entry(cfg.format).meta.get("boxes")
    return boxes == "always" or (boxes is not None and bool(getattr(cfg, boxes)))


# ---------------------------------------------------------------------------------- checking


@dataclass(frozen=True)
class Fitted:
    """A checked item as the store takes it: features [n', D], boxes [n', 4] | None, rows kept."""

    features: np.ndarray
    boxes: np.ndarray | None
    image_size: tuple[int, int] | None
    rows: list[int]


def keep_rows(n: int, positions: int, overflow: str) -> list[int]:
    """Which of n rows an item of at most ``positions`` keeps: all, or by ``overflow`` (first |
    uniform: evenly spaced, first and last included); ``fail`` refuses the item."""
    if n <= positions:
        return list(range(n))
    if overflow == "fail":
        raise BadRecord(f"has {n} regions, more than max_regions={positions}: raise max_regions or set "
                        f"overflow=first|uniform")
    if overflow == "first":
        return list(range(positions))
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, positions)})


def check_boxes(boxes: Any, n: int, image_size: tuple[int, int] | None) -> np.ndarray:
    """[n, 4] finite pixel boxes with x1 <= x2, y1 <= y2 (inside the image when its size is known)."""
    b = np.asarray(boxes)
    if b.ndim != 2 or b.shape[1] != 4:
        raise BadRecord(f"boxes have shape {list(b.shape)}, expected [n, 4] (x1, y1, x2, y2)")
    if b.shape[0] != n:
        raise BadRecord(f"has {b.shape[0]} boxes but {n} feature rows (one box per region)")
    b = b.astype(np.float32)
    if not np.isfinite(b).all():
        raise BadRecord("boxes contain NaN/inf values")
    if (b[:, 2] < b[:, 0]).any() or (b[:, 3] < b[:, 1]).any():
        raise BadRecord("a box has x2 < x1 or y2 < y1 (boxes must be x1, y1, x2, y2 pixels)")
    if image_size is not None:
        w, h = image_size
        t = BOX_TOLERANCE
        if b[:, :2].min() < -t or b[:, 2].max() > w + t or b[:, 3].max() > h + t:
            raise BadRecord(f"a box lies outside the {w}x{h} image (boxes must be x1, y1, x2, y2 pixels)")
    return b


def fit_regions(r: Regions, dim: int | None, positions: int, overflow: str, boxes: bool) -> Fitted:
    """Check one decoded record (module docstring) and cut it to at most ``positions`` rows."""
    f = np.asarray(r.features)
    if f.ndim != 2:
        raise BadRecord(f"features have shape {list(f.shape)}, expected [regions, dim]")
    if f.dtype.kind != "f":
        raise BadRecord(f"features have dtype {f.dtype}, expected a float type")
    n, d = f.shape
    if n < 1:
        raise BadRecord("has no regions (0 feature rows)")
    if dim is not None and d != dim:
        raise BadRecord(f"has dim {d} but the store's items have dim {dim}")
    if not np.isfinite(f).all():
        raise BadRecord("features contain NaN/inf values")
    size = None
    if r.image_size is not None:
        size = (int(r.image_size[0]), int(r.image_size[1]))
        if min(size) < 1:
            raise BadRecord(f"image size {list(size)} is not positive")
    b = None
    if boxes:
        if r.boxes is None:
            raise BadRecord("has no boxes but the store keeps a box per region")
        b = check_boxes(r.boxes, n, size)
    rows = keep_rows(n, positions, overflow)
    if len(rows) < n:
        f, b = f[rows], None if b is None else b[rows]
    return Fitted(f, b, size, rows)
