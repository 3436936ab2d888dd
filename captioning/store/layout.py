"""A FeatureStore on disk: its files, its meta and how two metas are compared.

Layout of a store at ``root``::

    root/meta.json                          settings + shape: kind, positions N, dim C, grid, dtype
    root/shards/r{rank:03d}-{seq:06d}.npy   float16 (or float32) array [n_items, N, C]
    root/shards/r{rank:03d}-{seq:06d}.index.json
                                            ids, valid counts and frame indices of those rows
    root/shards/r{rank:03d}-{seq:06d}.boxes.npy
                                            stores of boxed regions only (meta ``boxes``): float32
                                            [n_items, N, 4] pixel boxes (x1, y1, x2, y2) of the rows,
                                            zeros past ``valid``; the index adds each row's image size
    root/failures/r{rank:03d}.jsonl         one JSON line per item that could not be extracted

**A shard exists only when its index exists** (the writer's commit protocol:
``captioning.store.writer``); readers (``captioning.store.feature_store``) list the committed
shards with ``list_indexes`` and ignore everything else.  ``settings_diff`` is the one "same
feature settings?" check, ``store_id`` a store's identity in provenance records.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captioning.errors import ConfigError, DataError
from captioning.utils.io import read_json

STORE_FORMAT = "captioning.feature_store"
FORMAT_VERSION = 1
DTYPES: dict[str, type] = {"float16": np.float16, "float32": np.float32}
# meta keys that must agree between a store and a writer adding to it
COMPARED_KEYS = ("format_version", "kind", "positions", "dim", "grid", "dtype", "frames", "settings")

INDEX_RE = re.compile(r"^r(\d{3,})-(\d{6,})\.index\.json$")
DATA_RE = re.compile(r"^r(\d{3,})-(\d{6,})\.npy$")
BOXES_RE = re.compile(r"^r(\d{3,})-(\d{6,})\.boxes\.npy$")


def store_id(meta: Mapping[str, Any]) -> str:
    """Short sha256 of the meta keys that decide what a store holds (``COMPARED_KEYS``): the
    feature store's identity in provenance records."""
    keyed = {k: meta.get(k) for k in COMPARED_KEYS}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()[:10]


def shard_name(rank: int, seq: int) -> str:
    """The stem of shard ``seq`` of ``rank``: ``r{rank:03d}-{seq:06d}``."""
    return f"r{rank:03d}-{seq:06d}"


NPY_ALIGN = 64  # numpy pads a .npy header so that the data starts at a multiple of 64 bytes


def npy_header(shape: Sequence[int], dtype: str, length: int | None = None) -> bytes:
    """The .npy (format 1.0) header of a C-ordered array of ``shape`` and store ``dtype``: the bytes
    ``np.save`` writes before the data, padded with spaces to ``length`` bytes (a multiple of 64;
    default: numpy's own length).  A shard's rows are streamed before its row count is known
    (``captioning.store.write_behind``) under a header of the full shard's length, which any
    smaller count fits."""
    text = f"{{'descr': '{np.dtype(DTYPES[dtype]).str}', 'fortran_order': False, 'shape': {tuple(shape)}, }}"
    magic = b"\x93NUMPY\x01\x00"
    need = len(magic) + 2 + len(text) + 1
    length = -(-need // NPY_ALIGN) * NPY_ALIGN if length is None else length
    if length < need or length % NPY_ALIGN or length - len(magic) - 2 > 0xFFFF:
        raise ValueError(f"a .npy header of shape {tuple(shape)} needs {need} bytes, not {length}")
    return magic + (length - len(magic) - 2).to_bytes(2, "little") + (text.ljust(length - len(magic) - 3) + "\n").encode()


# ------------------------------------------------------------------------------------ meta


def _normalize(obj: Any) -> Any:
    """JSON round trip: tuples -> lists, numpy scalars refused early with a clear error."""
    try:
        return json.loads(json.dumps(obj))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"feature store meta must be plain JSON data (str/int/float/bool/list/dict): {e}") from e


def _diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the keys whose values differ between two JSON-like values."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            path = f"{prefix}.{k}" if prefix else str(k)
            if k not in a or k not in b:
                out.append(path)
            else:
                out.extend(_diff_keys(a[k], b[k], path))
        return out
    return [] if a == b else [prefix or "<root>"]


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def settings_diff(theirs: Mapping[str, Any], mine: Mapping[str, Any],
                  keys: Sequence[str] = COMPARED_KEYS) -> dict[str, tuple[Any, Any]]:
    """How two feature metas differ: ``{dotted key: (theirs, mine)}``, empty when they agree.

    The one "same feature settings?" check (store writers, extraction, checkpoints, the caption
    job's rebuilt backbone).  Only ``keys`` are compared, as plain JSON (a tuple equals a list);
    a missing ``format_version`` or ``dtype`` counts as its default (1, float16).
    """
    defaults = {"format_version": 1, "dtype": "float16"}  # what a meta without them was written as
    a = json.loads(json.dumps({k: theirs.get(k, defaults.get(k)) for k in keys}, default=str))
    b = json.loads(json.dumps({k: mine.get(k, defaults.get(k)) for k in keys}, default=str))
    return {path: (_at(a, path), _at(b, path)) for path in _diff_keys(a, b)}


def describe_diff(diff: Mapping[str, Any], limit: int = 8) -> str:
    """``"settings.weights, dim"`` (at most ``limit`` keys, then ``(+n more)``)."""
    keys = list(diff)
    return ", ".join(keys[:limit]) + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def build_meta(meta: Mapping[str, Any], dtype: str | None = None) -> dict[str, Any]:
    """Validate a writer's meta and complete it (dtype, format); returns a plain JSON dict."""
    if not isinstance(meta, Mapping):
        raise ConfigError(f"feature store meta must be a dict, got {type(meta).__name__}")
    m = _normalize(dict(meta))
    if dtype is not None and m.get("dtype") not in (None, dtype):
        raise ConfigError(f"feature store dtype={dtype!r} but meta says dtype={m['dtype']!r}: pass one of them")
    m["dtype"] = dtype or m.get("dtype") or "float16"
    if m["dtype"] not in DTYPES:
        raise ConfigError(f"feature store dtype={m['dtype']!r} is not valid: use float16 | float32")
    if not isinstance(m.get("settings"), dict):
        raise ConfigError("feature store meta needs 'settings': a dict (backbone, weights, preprocessing, ...)")
    if m.get("kind") not in ("image", "video"):
        raise ConfigError(f"feature store meta 'kind'={m.get('kind')!r} is not valid: use image | video")
    for key in ("positions", "dim"):
        v = m.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"feature store meta '{key}' must be a positive int, got {v!r}")
    grid = m.get("grid")
    if grid is not None:
        if (not isinstance(grid, list) or len(grid) != 2
                or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in grid)):
            raise ConfigError(f"feature store meta 'grid' must be [H, W] (positive ints) or null, got {grid!r}")
        cells = grid[0] * grid[1]
        if m["kind"] == "image" and cells != m["positions"]:
            raise ConfigError(f"feature store meta: grid {grid} has {cells} cells but positions={m['positions']}")
        if m["kind"] == "video" and m["positions"] % cells:
            raise ConfigError(f"feature store meta: positions={m['positions']} is not a multiple of grid {grid}")
    frames = m.get("frames")
    if frames is not None and (not isinstance(frames, int) or frames < 1):
        raise ConfigError(f"feature store meta 'frames' must be a positive int or null, got {frames!r}")
    m["boxes"] = m.get("boxes", False)
    if not isinstance(m["boxes"], bool):
        raise ConfigError(f"feature store meta 'boxes' must be true or false, got {m['boxes']!r}")
    if m["boxes"] and (m["kind"] != "image" or grid is not None):
        raise ConfigError("feature store meta 'boxes': boxes belong to image regions (kind image, grid null)")
    m["format"] = STORE_FORMAT
    m["format_version"] = FORMAT_VERSION
    return m


def read_meta(root: Path) -> dict[str, Any]:
    """The store's ``meta.json`` with its defaults filled in; a DataError naming the fix when it is
    missing, foreign or newer than this code."""
    path = root / "meta.json"
    if not path.is_file():
        raise DataError(f"no feature store at {root} ({path.name} missing): run captioning-extract first "
                        f"or fix features_dir")
    meta = read_json(path, "feature store meta")
    if not isinstance(meta, dict) or not all(k in meta for k in ("kind", "positions", "dim")):
        raise DataError(f"feature store meta {path} lacks kind/positions/dim; it was not written by this "
                        f"code: delete {root} and re-extract")
    if int(meta.get("format_version", 1)) > FORMAT_VERSION:
        raise DataError(f"feature store {root} has format version {meta['format_version']}, newer than this "
                        f"code reads ({FORMAT_VERSION}): update the captioning package")
    meta.setdefault("dtype", "float16")
    meta.setdefault("grid", None)
    meta.setdefault("boxes", False)
    return meta


def check_compatible(root: Path, stored: Mapping[str, Any], mine: Mapping[str, Any]) -> None:
    """Refuse (DataError) to add features of other settings (``settings_diff``, boxes too) to a store."""
    diff = settings_diff(stored, mine, (*COMPARED_KEYS, "boxes"))
    if diff:
        raise DataError(
            f"feature store {root} was written with other settings ({describe_diff(diff)} differ); it refuses "
            f"to mix features from different settings: use a new output dir or delete {root}"
        )


# ------------------------------------------------------------------------------- scanning


def list_indexes(shards_dir: Path) -> list[tuple[int, int, Path]]:
    """(rank, seq, index path) of every committed shard, sorted by rank then seq."""
    out = []
    try:
        names = os.listdir(shards_dir)
    except FileNotFoundError:
        return []
    for name in names:
        m = INDEX_RE.match(name)
        if m:
            out.append((int(m.group(1)), int(m.group(2)), shards_dir / name))
    out.sort(key=lambda t: (t[0], t[1]))
    return out


def read_index(path: Path) -> dict[str, Any]:
    """A shard's index (ids, valid counts, frame indices of its rows), checked for consistency."""
    idx = read_json(path, "feature shard index")
    try:
        rows = int(idx["rows"])
        ids, valid, frames = idx["ids"], idx["valid"], idx["frame_indices"]
        ok = isinstance(ids, list) and len(ids) == rows and len(valid) == rows and len(frames) == rows
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise DataError(f"feature shard index {path} is inconsistent (ids/valid/frame_indices/rows); delete it "
                        f"and its .npy file and re-run extraction to redo those items")
    return idx

