"""Features made elsewhere -> a FeatureStore: bottom-up-attention regions, per-item arrays, one HDF5 file.

Since Anderson et al. (2018) the standard image features of captioning are the bottom-up-attention
regions of a Faster R-CNN trained on Visual Genome: 10-100 boxes per image, a 2048-d vector each.
Video features circulate as one array per video or one HDF5 file.  ``captioning-import`` reads
them into a FeatureStore (the same store ``captioning-extract`` writes), so training, evaluation
and captioning from stored features run on them unchanged.  Layouts (``format=``, one reader
each, registered in ``FORMATS``: a new layout is one function):

- ``npz_dir``: a folder of ``<id>.npz`` holding the features [n, D] under ``key`` (``feat``, as in
  ruotianluo's ``cocobu_att``); boxes from ``boxes_dir/<id>.npy`` [n, 4] when given (``cocobu_box``);
- ``npy_dir``: a folder of ``<id>.npy`` [n, D] (e.g. the frame features of each video); boxes as above;
- ``bottom_up_tsv``: the original TSV (one file, a folder of them, or a glob): tab-separated
  ``image_id, image_w, image_h, num_boxes, boxes, features`` without a header, ``boxes`` and
  ``features`` base64 float32 [num_boxes, 4] and [num_boxes, D];
- ``hdf5``: one HDF5 file keyed by id: a dataset [n, D] per id, or a group per id holding the
  features under ``key`` (and the boxes under ``boxes_key``; the image size in attributes
  ``image_w``/``image_h``).

A reader yields ``SourceItem``s, an id and a ``load()`` that decodes that one record, so ids that
are already stored, not in the annotations or not this rank's are never decoded, and a corrupt
record costs one failure, not the import.

Every item is checked as an extraction is: its id must be an annotation id (after ``id_format``),
its features a finite float [n, D] with the store's D and 1 <= n <= N regions (``max_regions``;
more are refused, or cut with ``overflow=first|uniform``), its boxes [n, 4] pixel (x1, y1, x2, y2)
boxes, one per feature row, inside the image when its size is known.  A record that fails is
recorded by id in the store's failures (the others are imported; exit status 1); source ids not
in the annotations and annotation ids missing from the source are counted and reported.  The
store keeps each item's n as its valid count (padding rows are zeros) and, with boxes, the boxes
and image size.  Re-running skips the ids already stored.  Several processes (``rank`` /
``world_size``, by default torchrun's ``RANK`` / ``WORLD_SIZE``) each import the ids that hash to
them into their own shards.
"""

from __future__ import annotations

import base64
import binascii
import csv
import glob
import logging
import os
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from omegaconf import MISSING

from captioning.config import DataConfig
from captioning.data.annotations import read_dataset
from captioning.errors import ConfigError, DataError
from captioning.registry import Registry
from captioning.store.feature_store import FeatureStore
from captioning.store.layout import DTYPES
from captioning.store.writer import FeatureStoreWriter
from captioning.utils.io import read_json

log = logging.getLogger("captioning.import")

OVERFLOW = ("fail", "first", "uniform")
TSV_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
BOX_TOLERANCE = 1.0  # pixels a box may reach past the image border (detectors clip to W - 1)


@dataclass
class ImportConfig:
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
FORMATS: Registry[Reader] = Registry("feature format", config_key="format")


def _folder(source: str, fmt: str) -> Path:
    path = Path(source)
    if not path.is_dir():
        raise DataError(f"source={source} is not a folder: format={fmt} reads a folder of per-item files")
    return path


def _item_files(folder: Path, suffix: str) -> list[Path]:
    return [folder / n for n in sorted(os.listdir(folder)) if n.endswith(suffix) and not n.startswith(".")]


def _load_boxes(path: Path | None) -> np.ndarray | None:
    if path is None:
        return None
    if not path.is_file():
        raise BadRecord(f"no boxes file {path}")
    return np.load(path, allow_pickle=False)


def _boxes_file(cfg: ImportConfig, stem: str) -> Path | None:
    return Path(cfg.boxes_dir) / f"{stem}.npy" if cfg.boxes_dir else None


def _load_npz(path: Path, key: str, boxes: Path | None) -> Regions:
    with np.load(path, allow_pickle=False) as z:
        if key not in z.files:
            raise BadRecord(f"{path.name} has no array {key!r} (it has {', '.join(z.files) or 'none'}): set key=")
        features = z[key]
    return Regions(features, _load_boxes(boxes))


def _load_npy(path: Path, boxes: Path | None) -> Regions:
    return Regions(np.load(path, allow_pickle=False), _load_boxes(boxes))


@FORMATS.register("npz_dir", kinds=("image", "video"), boxes="boxes_dir")
def read_npz_dir(cfg: ImportConfig) -> Iterator[SourceItem]:
    """``<id>.npz`` files with the features under ``cfg.key`` (+ ``boxes_dir/<id>.npy``)."""
    for path in _item_files(_folder(cfg.source, "npz_dir"), ".npz"):
        stem = path.name[: -len(".npz")]
        yield SourceItem(stem, partial(_load_npz, path, cfg.key, _boxes_file(cfg, stem)), str(path))


@FORMATS.register("npy_dir", kinds=("image", "video"), boxes="boxes_dir")
def read_npy_dir(cfg: ImportConfig) -> Iterator[SourceItem]:
    """``<id>.npy`` files holding the features [n, D] (+ ``boxes_dir/<id>.npy``)."""
    for path in _item_files(_folder(cfg.source, "npy_dir"), ".npy"):
        stem = path.name[: -len(".npy")]
        yield SourceItem(stem, partial(_load_npy, path, _boxes_file(cfg, stem)), str(path))


def tsv_files(source: str) -> list[Path]:
    """The TSV files of ``source``: a file, a folder (its ``*.tsv*`` files) or a glob pattern; sorted."""
    path = Path(source)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = [f for f in _item_files(path, "") if ".tsv" in f.name and f.is_file()]
    else:
        files = [Path(f) for f in sorted(glob.glob(source)) if Path(f).is_file()]
    if not files:
        raise DataError(f"source={source}: no TSV file there (a .tsv file, a folder of them, or a glob)")
    return files


def _b64_floats(text: str, what: str) -> np.ndarray:
    """A base64 field of float32 values (a Python-3 ``b'...'`` wrapper tolerated) -> [k] float32."""
    text = text.strip()
    if text.startswith(("b'", 'b"')) and text[-1:] == text[1]:
        text = text[2:-1]
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadRecord(f"field {what} is not valid base64 ({e})") from None
    if len(raw) % 4:
        raise BadRecord(f"field {what} holds {len(raw)} bytes, not whole float32 values")
    return np.frombuffer(raw, dtype=np.float32)


def _int_field(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BadRecord(f"field {what}={text[:20]!r} is not an integer") from None


def parse_tsv_row(row: list[str]) -> Regions:
    """One bottom-up TSV row (``TSV_FIELDS``) -> Regions; BadRecord names what is wrong."""
    if len(row) != len(TSV_FIELDS):
        raise BadRecord(f"has {len(row)} tab-separated fields, expected {len(TSV_FIELDS)} ({', '.join(TSV_FIELDS)})")
    w, h, n = (_int_field(row[i], TSV_FIELDS[i]) for i in (1, 2, 3))
    boxes, features = _b64_floats(row[4], "boxes"), _b64_floats(row[5], "features")
    if n < 1:
        raise BadRecord(f"num_boxes={n}: an item needs at least one region")
    if boxes.size != 4 * n:
        raise BadRecord(f"num_boxes={n} but the boxes field holds {boxes.size / 4:g} boxes")
    if features.size % n:
        raise BadRecord(f"num_boxes={n} but the features field holds {features.size} values, not {n} rows")
    return Regions(features.reshape(n, -1), boxes.reshape(n, 4), (w, h))


@FORMATS.register("bottom_up_tsv", kinds=("image",), boxes="always")
def read_bottom_up_tsv(cfg: ImportConfig) -> Iterator[SourceItem]:
    """Rows of the bottom-up-attention TSV files (``TSV_FIELDS``, base64 float32 arrays)."""
    csv.field_size_limit(2**31 - 1)  # a row of 100 x 2048 base64 floats is ~1.1 MB
    for path in tsv_files(cfg.source):
        with open(path, newline="", encoding="ascii", errors="replace") as f:
            for line, row in enumerate(csv.reader(f, delimiter="\t"), 1):
                if row:
                    yield SourceItem(row[0].strip(), partial(parse_tsv_row, row), f"{path}:{line}")


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


@FORMATS.register("hdf5", kinds=("image", "video"), boxes="boxes_key")
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


def gives_boxes(cfg: ImportConfig) -> bool:
    """Whether the configured source comes with boxes (the TSV always; the others when told where)."""
    boxes = FORMATS.entry(cfg.format).meta.get("boxes")
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


# ------------------------------------------------------------------------------------- the job


@dataclass
class ImportSummary:
    """What one import run did (this rank's share of the ids)."""

    imported: int = 0
    skipped_done: int = 0  # already in the store before this run
    failed: int = 0  # corrupt or inconsistent records, recorded in the store's failures
    unknown: int = 0  # source ids that are no annotation id (not imported)
    duplicates: int = 0  # source records of an id seen before in this run (ignored)
    missing: int = 0  # annotation ids (this rank's) that the source does not hold
    positions: int = 0
    dim: int | None = None
    seconds: float = 0.0
    features_dir: str = ""
    failures: list[str] = field(default_factory=list)  # "<id>: <where>: <error>" (first 20)
    unknown_ids: list[str] = field(default_factory=list)  # the first 10
    missing_ids: list[str] = field(default_factory=list)  # the first 10

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank_of(item_id: str, world_size: int) -> int:
    """The process that imports ``item_id``: crc32 of the id modulo ``world_size`` (stable across runs)."""
    return zlib.crc32(item_id.encode("utf-8")) % world_size if world_size > 1 else 0


def validate(cfg: ImportConfig) -> None:
    """Config errors as one line each, before anything is read."""
    entry = FORMATS.entry(cfg.format)
    if cfg.data.kind not in entry.meta["kinds"]:
        raise ConfigError(f"format={cfg.format} holds {' | '.join(entry.meta['kinds'])} features but data="
                          f"{cfg.data.name} is a '{cfg.data.kind}' dataset")
    if cfg.overflow not in OVERFLOW:
        raise ConfigError(f"overflow={cfg.overflow!r} is not valid: use {' | '.join(OVERFLOW)}")
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"dtype={cfg.dtype!r} is not valid: use float16 | float32")
    if cfg.max_regions is not None and cfg.max_regions < 1:
        raise ConfigError(f"max_regions={cfg.max_regions} must be >= 1 (or null: the source's largest count)")
    if not 0 <= cfg.rank < cfg.world_size:
        raise ConfigError(f"rank={cfg.rank} world_size={cfg.world_size}: need 0 <= rank < world_size")
    if cfg.shard_size < 1:
        raise ConfigError(f"shard_size={cfg.shard_size} must be >= 1")
    if "{}" not in cfg.id_format:
        raise ConfigError(f"id_format={cfg.id_format!r} must contain {{}} (where the source id goes)")
    if cfg.grid is not None:
        if len(cfg.grid) != 2 or min(cfg.grid) < 1 or cfg.data.kind != "image" or gives_boxes(cfg):
            raise ConfigError(f"grid={cfg.grid}: an image grid is [h, w] (positive), for image features "
                              f"without boxes")
        if cfg.max_regions not in (None, cfg.grid[0] * cfg.grid[1]):
            raise ConfigError(f"grid={cfg.grid} has {cfg.grid[0] * cfg.grid[1]} cells but max_regions="
                              f"{cfg.max_regions}: leave max_regions=null")
    if gives_boxes(cfg) and cfg.data.kind != "image":
        raise ConfigError("boxes are image regions: drop boxes_dir/boxes_key for video features")


def store_meta(cfg: ImportConfig, positions: int, dim: int) -> dict[str, Any]:
    """The FeatureStore meta of imported features (``imported`` says from where and how)."""
    boxes = gives_boxes(cfg)
    video = cfg.data.kind == "video"
    meta: dict[str, Any] = {
        "settings": {"backbone": "imported", "name": cfg.name, "boxes": boxes},
        "kind": cfg.data.kind, "positions": positions, "dim": dim, "dtype": cfg.dtype,
        "grid": list(cfg.grid) if cfg.grid else None, "boxes": boxes,
        "regions": not video and cfg.grid is None,  # an unordered set: no position code applies
        "imported": {"format": cfg.format, "source": str(Path(cfg.source).resolve()), "key": cfg.key,
                     "boxes_dir": cfg.boxes_dir, "boxes_key": cfg.boxes_key, "id_format": cfg.id_format,
                     "max_regions": positions, "overflow": cfg.overflow},
    }
    if video:
        meta["frames"] = positions
    return meta


def existing_shape(features_dir: str) -> tuple[int, int] | None:
    """(positions, dim) of the store already at ``features_dir``, or None."""
    path = Path(features_dir) / "meta.json"
    if not path.is_file():
        return None
    meta = read_json(path, "feature store meta")
    return int(meta["positions"]), int(meta["dim"])


def scan_shape(cfg: ImportConfig, wanted: set[str]) -> tuple[int, int | None]:
    """(the largest region count, the most common dim) of the source's annotation ids: one pass."""
    counts: Counter[int] = Counter()
    largest = 0
    for item in FORMATS.get(cfg.format)(cfg):
        if cfg.id_format.format(item.source_id) not in wanted:
            continue
        try:
            f = np.asarray(item.load().features)
        except Exception:  # a corrupt record is reported by the import pass itself
            continue
        if f.ndim == 2:
            largest = max(largest, f.shape[0])
            counts[f.shape[1]] += 1
    if not largest:
        raise DataError(f"source={cfg.source} holds no readable item of data={cfg.data.name}: check source, "
                        f"format={cfg.format}, key and id_format")
    return largest, counts.most_common(1)[0][0]


def plan_shape(cfg: ImportConfig, wanted: set[str]) -> tuple[int, int | None]:
    """(positions N, dim or None: the first record's) from the grid, the store, max_regions or a scan."""
    if cfg.grid is not None:
        positions = cfg.grid[0] * cfg.grid[1]
    else:
        positions = cfg.max_regions or 0
    existing = existing_shape(cfg.features_dir)
    if existing is not None:
        if positions and positions != existing[0]:
            raise ConfigError(f"{cfg.features_dir} holds items of {existing[0]} positions but max_regions/grid "
                              f"give {positions}: use that (or max_regions=null) or another features_dir")
        return existing
    if positions:
        return positions, None
    log.info("max_regions=null: reading %s once to find the largest region count (set max_regions to skip this)",
             cfg.source)
    return scan_shape(cfg, wanted)


class _Importer:
    """Writes checked items to this rank's shards; the writer is opened with the first item (its dim)."""

    def __init__(self, cfg: ImportConfig, positions: int, dim: int | None, summary: ImportSummary) -> None:
        self.cfg, self.positions, self.dim, self.summary = cfg, positions, dim, summary
        self.boxes = gives_boxes(cfg)
        self.video = cfg.data.kind == "video"
        self.writer: FeatureStoreWriter | None = None
        self.pending: list[tuple[str, str, str]] = []  # failures before the writer exists
        if dim is not None:
            self._open(dim)

    def _open(self, dim: int) -> None:
        self.dim = self.summary.dim = dim
        meta = store_meta(self.cfg, self.positions, dim)  # the writer refuses a store of other settings
        self.writer = FeatureStoreWriter(self.cfg.features_dir, meta, rank=self.cfg.rank,
                                         shard_size=self.cfg.shard_size, dtype=self.cfg.dtype)
        for failure in self.pending:
            self.writer.add_failure(*failure)
        self.pending = []

    def fail(self, item_id: str, where: str, error: str) -> None:
        self.summary.failed += 1
        if len(self.summary.failures) < 20:
            self.summary.failures.append(f"{item_id}: {where}: {error}")
        log.warning("failed %s (%s): %s", item_id, where, error)
        if self.writer is None:
            self.pending.append((item_id, where, error))
        else:
            self.writer.add_failure(item_id, where, error)

    def add(self, item_id: str, item: SourceItem) -> None:
        """Decode, check and store one record; any failure of it becomes its failure record."""
        try:
            fitted = fit_regions(item.load(), self.dim, self.positions, self.cfg.overflow, self.boxes)
        except Exception as e:  # bad base64, a truncated zip, an HDF5 read error, a failed check: this record's
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.fail(item_id, item.where, text if isinstance(e, BadRecord) else f"{type(e).__name__}: {text}")
            return
        if self.writer is None:
            log.info("dim %d taken from item %s", fitted.features.shape[1], item_id)
            self._open(int(fitted.features.shape[1]))
        assert self.writer is not None
        n = fitted.features.shape[0]
        padded = np.zeros((self.positions, self.dim or 0), dtype=np.float32)
        padded[:n] = fitted.features
        frames = None
        if self.video:  # the kept rows, the last repeated over the padding (as extraction pads)
            frames = fitted.rows + [fitted.rows[-1]] * (self.positions - n)
        before = self.writer.skipped
        if self.writer.add(item_id, padded, valid=n, frame_indices=frames, boxes=fitted.boxes,
                           image_size=fitted.image_size):
            self.summary.imported += 1
        elif self.writer.skipped == before:  # not finite in the store dtype: the store recorded it
            self.summary.failed += 1
            if len(self.summary.failures) < 20:
                self.summary.failures.append(f"{item_id}: {item.where}: values beyond the {self.cfg.dtype} range")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def annotation_ids(cfg: ImportConfig) -> list[str]:
    """The dataset's item ids (every split, in order): what the source's ids must match."""
    dataset = read_dataset(cfg.data)
    seen: dict[str, None] = {}
    for r in dataset.records:
        seen.setdefault(r.item_id, None)
    return list(seen)


def _stored(features_dir: str) -> set[str]:
    return set(FeatureStore.open(features_dir).ids) if (Path(features_dir) / "meta.json").is_file() else set()


def import_features(cfg: ImportConfig) -> ImportSummary:
    """Import ``cfg.source`` into the FeatureStore at ``cfg.features_dir`` (module docstring)."""
    from tqdm import tqdm

    start = time.perf_counter()
    validate(cfg)
    ids = annotation_ids(cfg)
    wanted = set(ids)
    mine = [i for i in ids if rank_of(i, cfg.world_size) == cfg.rank]
    positions, dim = plan_shape(cfg, wanted)
    summary = ImportSummary(positions=positions, dim=dim, features_dir=str(cfg.features_dir))
    done = _stored(cfg.features_dir)
    importer = _Importer(cfg, positions, dim, summary)
    seen: set[str] = set()
    complete = True
    bar = tqdm(total=len(mine), desc="import", unit="item", disable=not cfg.progress, dynamic_ncols=True)
    try:
        for item in FORMATS.get(cfg.format)(cfg):
            item_id = cfg.id_format.format(item.source_id)
            if item_id not in wanted:
                summary.unknown += 1
                if len(summary.unknown_ids) < 10:
                    summary.unknown_ids.append(item_id)
                continue
            if rank_of(item_id, cfg.world_size) != cfg.rank:
                continue
            if item_id in seen:
                summary.duplicates += 1
                continue
            seen.add(item_id)
            bar.update(1)
            if item_id in done:
                summary.skipped_done += 1
                continue
            importer.add(item_id, item)
            if cfg.limit is not None and summary.imported + summary.failed >= cfg.limit:
                complete = False
                break
    finally:
        bar.close()
        importer.close()
    if complete:  # annotation ids the source does not hold (failed ids are counted as failed)
        stored = _stored(cfg.features_dir)
        missing = [i for i in mine if i not in stored and i not in seen]
        summary.missing, summary.missing_ids = len(missing), missing[:10]
    summary.seconds = time.perf_counter() - start
    report(summary, cfg)
    return summary


def report(s: ImportSummary, cfg: ImportConfig) -> None:
    """The run's counts, and examples of what went wrong, in the log."""
    log.info("import done: %d imported, %d already in the store, %d failed in %.1fs -> %s ([N, D] = [%d, %s])",
             s.imported, s.skipped_done, s.failed, s.seconds, s.features_dir, s.positions, s.dim)
    for line in s.failures:
        log.error("failed: %s", line)
    if s.unknown:
        log.warning("%d source id(s) are no id of data=%s and were not imported, e.g. %s (check id_format=%r)",
                    s.unknown, cfg.data.name, ", ".join(s.unknown_ids[:5]), cfg.id_format)
    if s.duplicates:
        log.warning("%d source record(s) repeat an id read before; the first was used", s.duplicates)
    if s.missing:
        log.warning("%d annotation id(s) have no features (training and evaluation skip them), e.g. %s",
                    s.missing, ", ".join(s.missing_ids[:5]))
