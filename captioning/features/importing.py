"""Features made elsewhere -> a FeatureStore: bottom-up-attention regions, per-item arrays, one HDF5 file.

Since Anderson et al. (2018) the standard image features of captioning are the bottom-up-attention
regions of a Faster R-CNN trained on Visual Genome: 10-100 boxes per image, a 2048-d vector each.
Video features circulate as one array per video or one HDF5 file.  ``captioning-import`` reads
them into a FeatureStore (the same store ``captioning-extract`` writes), so training, evaluation
and captioning from stored features run on them unchanged.  Layouts (``format=``: ``npz_dir``,
``npy_dir``, ``bottom_up_tsv``, ``hdf5``): one reader module each in ``captioning.features.formats``,
registered in ``FEATURE_FORMATS``; a new layout is one module.

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

import logging
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captioning.data.annotations import read_dataset
from captioning.errors import ConfigError, DataError
from captioning.features.formats import (
    FEATURE_FORMATS,
    OVERFLOW,
    BadRecord,
    ImportConfig,
    SourceItem,
    fit_regions,
    gives_boxes,
)
from captioning.store.feature_store import FeatureStore
from captioning.store.layout import DTYPES
from captioning.store.writer import FeatureStoreWriter
from captioning.utils.io import read_json

log = logging.getLogger("captioning.import")


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
    entry = FEATURE_FORMATS.entry(cfg.format)
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
    for item in FEATURE_FORMATS.get(cfg.format)(cfg):
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
        for item in FEATURE_FORMATS.get(cfg.format)(cfg):
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
