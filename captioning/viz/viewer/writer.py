"""``ViewerWriter``: items in, a self-contained ``viewer/`` folder out (the format: the package docstring).

Items are written as they are added (their JPEGs at once, their data a page at a time), so a
5,000-item split never holds more than one page of attention in memory.  The folder is built
under ``viewer.partial/`` and renamed to ``viewer/`` when complete: an interrupted job leaves the
previous viewer as it was.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.viz.viewer.config import ViewerConfig
from captioning.viz.viewer.items import Layout, ViewerItem, ViewerRun

__all__ = ["ViewerWriter", "RunInfo", "encode_attention", "relative_source", "STATIC_FILES"]

STATIC_FILES = ("index.html", "viewer.js", "viewer.css")
FORMAT_VERSION = 1


class RunInfo(dict):
    """What the page says about a run: ``name``, ``source`` (its file), ``layout``, ``hard`` (argmax
    attention), ``streams`` (the feature streams joined per position) and a ``note``.  The writer
    shows ``source`` relative to the viewer's folder (``relative_source``)."""

    def __init__(self, name: str, source: str, layout: Layout, *, hard: bool = False,
                 streams: Sequence[str] | None = None, note: str | None = None) -> None:
        super().__init__(name=name, source=source, layout=layout.to_dict(), hard=bool(hard),
                         streams=list(streams) if streams else None, note=note)


def relative_source(source: str, folder: Path) -> str:
    """``source`` as the page names it: relative to the viewer's ``folder`` (``../predictions.json``),
    so the page shows no path of the machine it was written on and still names the run's files when
    its output folder is copied or moved; a file on another drive (Windows): its name alone."""
    try:
        return Path(os.path.relpath(Path(source).resolve(), Path(folder).resolve())).as_posix()
    except ValueError:
        return Path(source).name


def encode_attention(rows: np.ndarray) -> str:
    """``[T, N]`` weights -> base64 of their little-endian float16 bytes (row-major): the values
    of ``attention.npy`` exactly, 2 bytes each."""
    return base64.b64encode(np.ascontiguousarray(rows, dtype="<f2").tobytes()).decode("ascii")


def _fit(frame: np.ndarray, side: int) -> Image.Image:
    img = Image.fromarray(np.ascontiguousarray(frame[..., :3], dtype=np.uint8))
    scale = side / max(img.size)
    if scale < 1.0:
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.BILINEAR)
    return img


def write_jpeg(pixels: np.ndarray, path: Path, side: int, quality: int) -> list[int]:
    """An image ``[H, W, 3]`` (or the frames ``[K, H, W, 3]`` side by side, one sprite) as a JPEG of at
    most ``side`` pixels a side (a frame); returns [w, h] of the image (of one frame)."""
    frames = [pixels] if pixels.ndim == 3 else list(pixels)
    fitted = [_fit(f, side) for f in frames]
    w, h = fitted[0].size
    sheet = Image.new("RGB", (w * len(fitted), h))
    for k, f in enumerate(fitted):
        sheet.paste(f.resize((w, h)) if f.size != (w, h) else f, (k * w, 0))
    sheet.save(path, format="JPEG", quality=quality)
    return [w, h]


def _round(x: Any, digits: int = 4) -> float | None:
    """A number for the page (None for a missing or non-finite one)."""
    return None if x is None or not np.isfinite(float(x)) else round(float(x), digits)


def run_record(run: ViewerRun | None) -> dict[str, Any] | None:
    """One run's caption of one item as the page reads it (attention as base64 float16)."""
    if run is None:
        return None
    att = None if run.attention is None else np.asarray(run.attention, dtype=np.float32)[: len(run.tokens)]
    return {"tok": run.tokens, "att": None if att is None else encode_attention(att),
            "n": None if att is None else int(att.shape[1]), "sc": _round(run.score),
            "lp": None if run.log_probs is None else [_round(v) for v in run.log_probs[: len(run.tokens)]],
            "nb": [[c, _round(s)] for c, s in run.nbest], "g": run.grounding,
            "m": {k: _round(v) for k, v in run.metrics.items()}}


class ViewerWriter:
    """Write ``<out>/viewer/``: ``index.html``, ``viewer.js``, ``viewer.css``, ``data/index.js`` (the
    list of items), ``data/page-NNNN.js`` (``page_size`` items each) and ``images/*.jpg``."""

    def __init__(self, out_dir: str | Path, cfg: ViewerConfig, runs: Sequence[RunInfo], *, kind: str,
                 title: str) -> None:
        self.cfg = cfg.validate()
        self.final = Path(out_dir) / "viewer"
        self.root = Path(out_dir) / "viewer.partial"
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "data").mkdir(parents=True)
        (self.root / "images").mkdir()
        self.runs = [{**r, "source": relative_source(r["source"], self.final)} for r in runs]
        self.kind, self.title = kind, title
        self.index: list[dict[str, Any]] = []
        self.page: list[dict[str, Any]] = []
        self.pages = 0

    @property
    def full(self) -> bool:
        return self.cfg.max_items is not None and len(self.index) >= self.cfg.max_items

    def add(self, item: ViewerItem) -> None:
        """Write the item's JPEG now and its data with its page."""
        if self.full:
            return
        n = len(self.index)
        record: dict[str, Any] = {"k": item.key, "img": None, "wh": None, "fi": item.frame_indices,
                                  "refs": list(item.references), "note": item.note,
                                  "r": [run_record(r) for r in item.runs]}
        if item.pixels is not None:
            name = f"images/{n:06d}.jpg"
            record["wh"] = write_jpeg(np.asarray(item.pixels), self.root / name, self.cfg.image_side,
                                      self.cfg.jpeg_quality)
            record["img"] = name
        if item.boxes is not None:
            size = item.image_size
            if size is None and item.pixels is not None:
                size = (item.pixels.shape[1], item.pixels.shape[0])
            if size:
                b = np.asarray(item.boxes, dtype=np.float64).reshape(-1, 4) / np.array([*size, *size], dtype=np.float64)
                record["bx"] = np.round(b, 4).tolist()
        self.index.append({"k": item.key, "c": [None if r is None else r.caption for r in item.runs],
                           "m": [{} if r is None else {k: _round(v) for k, v in r.metrics.items()} for r in item.runs],
                           "g": [_pointing(r) for r in item.runs]})
        self.page.append(record)
        if len(self.page) >= self.cfg.page_size:
            self._flush()

    def add_all(self, items: Iterable[ViewerItem]) -> None:
        for item in items:
            self.add(item)

    def tap(self, results: Iterable[Any], convert: Any) -> Iterator[Any]:
        """Yield ``results`` unchanged, adding ``convert(result)`` (a ViewerItem or None) on the way:
        the viewer is written from a stream another writer consumes (the caption gallery)."""
        for r in results:
            item = convert(r)
            if item is not None:
                self.add(item)
            yield r

    def _flush(self) -> None:
        if not self.page:
            return
        _write_js(self.root / "data" / f"page-{self.pages:04d}.js", "Viewer.page", self.pages, self.page)
        self.pages += 1
        self.page = []

    def close(self) -> Path:
        """Write the last page, the index and the page's files; put the folder in place.  Returns
        the path of ``viewer/index.html``."""
        self._flush()
        index = {"version": FORMAT_VERSION, "title": self.title, "kind": self.kind, "count": len(self.index),
                 "page_size": self.cfg.page_size, "pages": self.pages, "runs": self.runs,
                 "metrics": list(dict.fromkeys(k for e in self.index for m in e["m"] for k in m)), "items": self.index}
        _write_js(self.root / "data" / "index.js", "Viewer.index", None, index)
        static = resources.files("captioning.viz.viewer") / "static"
        for name in STATIC_FILES:
            (self.root / name).write_bytes((static / name).read_bytes())
        old = self.final.with_name("viewer.old")
        shutil.rmtree(old, ignore_errors=True)
        if self.final.exists():
            os.replace(self.final, old)
        os.replace(self.root, self.final)
        shutil.rmtree(old, ignore_errors=True)
        return self.final / "index.html"


def _pointing(run: ViewerRun | None) -> list[int] | None:
    """[hits, misses] of a run's grounded words on one item (None: nothing grounded)."""
    if run is None or not run.grounding:
        return None
    hits = sum(bool(g.get("hit")) for g in run.grounding)
    return [hits, len(run.grounding) - hits]


def _write_js(path: Path, call: str, number: int | None, data: Any) -> None:
    """``<call>([number, ]<JSON>);``: a data file a ``<script>`` element loads (pages opened from disk
    may not fetch() files beside them, but may load scripts)."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    head = f"{call}(" if number is None else f"{call}({number},"
    path.write_text(f"{head}{body});\n", encoding="utf-8")
