"""Several FeatureStores of the same items read as one: two-stream (appearance + motion) features.

Every video peer (SA-LSTM, RecNet, ...) describes a frame by its appearance (a 2-D CNN on the
frame) and its motion (a 3-D CNN on the clip around it).  Here each is its own FeatureStore,
extracted with the same frame sampling (``encoder.frames`` / ``frame_strategy`` / ...), and
``FeatureStreams`` joins them position by position:

    features(item) = [ f_1(item) ; f_2(item) ; ... ]   [N, C_1 + C_2 + ...]

The streams must agree on ``kind``, the number of positions N and of frames K (and the grid),
and, for every item, on its ``frame_indices`` and ``valid`` count: otherwise the positions would
not describe the same frames, and opening refuses with one line naming both stores.  Items are the
ids present in every stream (in the first stream's order).

``open_features(dirs)``: one folder -> a plain ``FeatureStore``; several -> ``FeatureStreams``.
Both offer what the data module and the trainer use: ``meta``, ``root``, ``ids``, ``len``, ``in``,
``[id] -> FeatureItem``, ``read(id)`` (the same, read by ``pread``), ``failures``; both are picklable
(DataLoader workers).
``stream_metas(meta)``: the streams' own metas (each records its encoder), for captioning raw media.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from captioning.errors import ConfigError, DataError
from captioning.store.feature_store import FeatureItem, FeatureStore

log = logging.getLogger(__name__)


def open_features(dirs: str | Path | Sequence[str | Path]) -> FeatureStore | FeatureStreams:
    """A FeatureStore for one folder (a str/Path or a one-element list); FeatureStreams for several."""
    if isinstance(dirs, (str, Path)):
        return FeatureStore.open(dirs)
    dirs = list(dirs)
    if not dirs:
        raise ConfigError("features_dir is an empty list: give one feature store folder or several")
    if len(dirs) == 1:
        return FeatureStore.open(dirs[0])
    return FeatureStreams([FeatureStore.open(d) for d in dirs])


def stream_metas(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each stream's own meta, in channel order: a FeatureStreams meta's ``streams``, or ``[meta]``
    for one store (what rebuilds the encoders of a checkpoint's features)."""
    return [dict(s) for s in meta["streams"]] if meta.get("streams") else [dict(meta)]


def _geometry(meta: dict[str, Any]) -> dict[str, Any]:
    return {"kind": meta.get("kind"), "positions": int(meta["positions"]), "frames": meta.get("frames"),
            "grid": list(meta["grid"]) if meta.get("grid") else None}


class FeatureStreams:
    """FeatureStores of the same items, concatenated along the channel axis (see the module docstring).

    ``meta``: the first stream's geometry (kind, positions N, frames K, grid) with ``dim`` = the sum of
    the streams' dims, ``dtype`` float32 when any stream is float32, ``settings`` = {"streams": [each
    stream's settings]} and ``streams``: each stream's own meta with its ``root`` and channel ``offset``.
    """

    def __init__(self, stores: Sequence[FeatureStore]) -> None:
        if len(stores) < 2:
            raise ConfigError("FeatureStreams needs at least two feature stores (use FeatureStore for one)")
        self.stores = list(stores)
        first = self.stores[0]
        mine = _geometry(first.meta)
        for other in self.stores[1:]:
            theirs = _geometry(other.meta)
            for key in ("kind", "frames", "positions", "grid"):
                if mine[key] != theirs[key]:
                    raise DataError(
                        f"feature streams {first.root} and {other.root} disagree on {key} ({mine[key]} vs "
                        f"{theirs[key]}): extract both with the same data and encoder.frames / "
                        f"encoder.video_features"
                    )
        self._ids = [i for i in first.ids if all(i in s for s in self.stores[1:])]
        dropped = len(set().union(*(s.ids for s in self.stores))) - len(self._ids)
        if dropped:
            log.warning("feature streams: %d item(s) are not in every stream and are left out", dropped)
        self._check_items()
        self.root = " + ".join(str(s.root) for s in self.stores)
        self.dims = [int(s.meta["dim"]) for s in self.stores]
        self.grid = first.grid
        self.positions = first.positions
        self.dim = sum(self.dims)
        dtypes = [str(s.meta.get("dtype", "float16")) for s in self.stores]
        self.dtype = np.dtype("float32" if "float32" in dtypes else "float16")
        offsets = np.cumsum([0, *self.dims[:-1]]).tolist()
        self.meta: dict[str, Any] = {
            **mine, "dim": self.dim, "dtype": str(self.dtype), "boxes": bool(first.meta.get("boxes")),
            "regions": bool(first.meta.get("regions")),
            "settings": {"streams": [s.meta.get("settings") for s in self.stores]},
            "streams": [{**s.meta, "root": str(s.root), "offset": int(o)}
                        for s, o in zip(self.stores, offsets, strict=True)],
        }
        ids = set(self._ids)
        self.failures = [f for s in self.stores for f in s.failures if str(f.get("id")) not in ids]

    def _check_items(self) -> None:
        """Every common item has the same frame indices and valid count in every stream."""
        first = self.stores[0]
        for other in self.stores[1:]:
            for item_id in self._ids:
                a, b = first[item_id], other[item_id]
                if a.frame_indices != b.frame_indices or a.valid != b.valid:
                    what = ("frame indices" if a.frame_indices != b.frame_indices else "valid counts")
                    left = a.frame_indices if what == "frame indices" else a.valid
                    right = b.frame_indices if what == "frame indices" else b.valid
                    raise DataError(
                        f"feature streams {first.root} and {other.root} disagree on the {what} of item "
                        f"{item_id!r} ({left} vs {right}): extract both with the same encoder.frames / "
                        f"frame_strategy / target_fps / short_video"
                    )

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, item_id: object) -> bool:
        return all(item_id in s for s in self.stores)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __getitem__(self, item_id: str) -> FeatureItem:
        """[N, sum C] features (a new array in the streams' common dtype), the first stream's valid/frames."""
        return self._join([s[item_id] for s in self.stores])  # KeyError naming the store when absent

    def read(self, item_id: str, out: np.ndarray | None = None) -> FeatureItem:
        """``self[item_id]``, each stream's part read by ``FeatureStore.read`` (one ``pread``, no memory
        map); copied into ``out`` ([N, sum C] of the streams' dtype) when given."""
        item = self._join([s.read(item_id) for s in self.stores])
        if out is None:
            return item
        out[...] = item.features
        return replace(item, features=out)

    def _join(self, parts: list[FeatureItem]) -> FeatureItem:
        features = np.concatenate([np.asarray(p.features, dtype=self.dtype) for p in parts], axis=1)
        first = parts[0]  # positions agree across streams: the first stream's boxes are every stream's
        return FeatureItem(features, first.valid, first.grid, first.frame_indices, first.boxes, first.image_size)

    def get(self, item_id: str, default: Any = None) -> FeatureItem | Any:
        return self[item_id] if item_id in self else default

    def summary(self) -> dict[str, Any]:
        return {"root": self.root, "kind": self.meta.get("kind"), "items": len(self), "streams": len(self.stores),
                "failures": len(self.failures), "positions": self.positions, "dim": self.dim, "dims": self.dims,
                "grid": list(self.grid) if self.grid else None, "dtype": str(self.dtype)}

    def __repr__(self) -> str:
        return (f"FeatureStreams({self.root!r}, items={len(self)}, [N, C]=[{self.positions}, {self.dim}] "
                f"= {' + '.join(map(str, self.dims))}, dtype={self.dtype})")
