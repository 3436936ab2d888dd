"""Prediction files: the captions of a decoded split (or set of inputs) and the attention behind them.

One format for everything that decodes (``captioning-evaluate``, ``captioning-caption``) and
everything that reads decoded captions back (the evaluation report, the figures, the reproduction
records, the attention viewer):

- ``<name>.json``: a JSON list, one entry per item, with whatever keys the writer gives it
  (``image_id``/``video_id`` or ``input``, ``caption``, ``tokens``, ``score``, ...) and
  ``attention``: ``[start, stop]``, the rows of the attention file that hold the item's weights
  (row ``start + t`` emitted ``tokens[t]``), or ``null`` for a model without attention.
- ``attention.npy``: one float16 array ``[sum_i T_i, N]`` (``N``: the widest item's annotation
  vectors; narrower items are zero-padded, and their ``attention_width`` says how many are real).

Writing 5,000 captions of 20 words over a 14x14 grid is one ``np.save`` of 37 MiB and a JSON file
of the tokens, instead of four million floats printed as text; reading maps the array
(``np.load(mmap_mode="r")``), so a reader pays only for the items it looks at.  float16 keeps
attention weights to ~3 significant digits (relative error <= 2^-11), which is what a figure, a
pointing test or a coverage statistic can see; the weights stay non-negative and each row's sum
stays within ~1e-3 of 1.  A file with the attention inline (a ``[T, N]`` list per entry, as
before this format) reads the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captioning.errors import DataError
from captioning.utils.io import atomic_write, atomic_write_json, read_json

__all__ = ["ATTENTION_FILE", "read_predictions", "stack_attention", "write_predictions"]

ATTENTION_FILE = "attention.npy"


def stack_attention(maps: Sequence[np.ndarray | None]) -> tuple[np.ndarray, list[list[int] | None], list[int | None]]:
    """Per-item attention ``[T_i, N_i]`` (or None) -> ``(rows [sum T_i, max N_i] float16, spans, widths)``:
    ``spans[i] = [start, stop]`` into ``rows`` (None where ``maps[i]`` is None), ``widths[i] = N_i``."""
    arrays = [None if m is None else np.asarray(m, dtype=np.float32).reshape(len(m), -1) for m in maps]
    width = max((a.shape[1] for a in arrays if a is not None), default=0)
    total = sum(a.shape[0] for a in arrays if a is not None)
    rows = np.zeros((total, width), dtype=np.float16)
    spans: list[list[int] | None] = []
    widths: list[int | None] = []
    start = 0
    for a in arrays:
        if a is None:
            spans.append(None)
            widths.append(None)
            continue
        rows[start : start + a.shape[0], : a.shape[1]] = a
        spans.append([start, start + a.shape[0]])
        widths.append(int(a.shape[1]))
        start += a.shape[0]
    return rows, spans, widths


def write_predictions(folder: str | Path, entries: Sequence[Mapping[str, Any]],
                      attention: Sequence[np.ndarray | None], name: str = "predictions.json") -> Path:
    """Write ``<folder>/<name>`` (``entries``, each given its ``attention`` row span and, when the
    items' widths differ, its ``attention_width``) and ``<folder>/attention.npy``; returns the JSON
    path.  ``attention[i]``: item i's ``[T_i, N_i]`` weights or None.  The array is written first,
    so a JSON file never points into an attention file older than itself."""
    if len(entries) != len(attention):
        raise ValueError(f"{len(entries)} entries but {len(attention)} attention maps")
    folder = Path(folder)
    rows, spans, widths = stack_attention(attention)
    ragged = len({w for w in widths if w is not None}) > 1
    out = []
    for entry, span, width in zip(entries, spans, widths, strict=True):
        item = {k: v for k, v in entry.items() if k not in ("attention", "attention_width")}
        item["attention"] = span
        if ragged and width is not None:
            item["attention_width"] = width
        out.append(item)
    if any(s is not None for s in spans):
        atomic_write(folder / ATTENTION_FILE, lambda p: _save_npy(p, rows))
    else:
        (folder / ATTENTION_FILE).unlink(missing_ok=True)
    return atomic_write_json(folder / name, out, indent=None)


def _save_npy(path: Path, rows: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, rows)


def read_predictions(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a predictions file, each ``attention`` an ``[T, N]`` float32 array (or None).

    ``path``: the JSON file (its ``attention.npy`` beside it).  The array is memory-mapped and an
    item's rows are read only when its entry is built.  A bad file raises ``DataError`` naming it."""
    path = Path(path)
    entries = read_json(path, "predictions file")
    if not isinstance(entries, list):
        raise DataError(f"{path} is not a predictions file: expected a JSON list of entries")
    rows = None
    out = []
    for k, e in enumerate(entries):
        e = dict(e)
        span = e.get("attention")
        if span is None:
            out.append(e)
            continue
        if _is_span(span):
            if rows is None:
                rows = _open_rows(path.parent / ATTENTION_FILE, path)
            start, stop = int(span[0]), int(span[1])
            if not 0 <= start <= stop <= rows.shape[0]:
                raise DataError(f"{path}: entry {k} points at attention rows {start}:{stop} but "
                                f"{path.parent / ATTENTION_FILE} has {rows.shape[0]}; the two files are from "
                                f"different runs: decode again to write both")
            width = int(e.get("attention_width") or rows.shape[1])
            e["attention"] = np.asarray(rows[start:stop, :width], dtype=np.float32)
        else:  # the attention inline, [T, N] lists
            e["attention"] = np.asarray(span, dtype=np.float32)
        out.append(e)
    return out


def _is_span(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))


def _open_rows(path: Path, owner: Path) -> np.ndarray:
    if not path.is_file():
        raise DataError(f"{owner} points into {path}, which is missing: keep the two files together "
                        f"(or decode again to write both)")
    try:
        rows = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise DataError(f"{path} is not a readable attention file ({e}); decode again to rewrite it") from None
    if rows.ndim != 2:
        raise DataError(f"{path}: attention rows must be a 2-D array, got shape {list(rows.shape)}")
    return rows
