"""``bottom_up_tsv``: the bottom-up-attention TSV of Anderson et al. (2018): one file, a folder of them
or a glob; tab-separated ``image_id, image_w, image_h, num_boxes, boxes, features`` without a header,
``boxes`` and ``features`` base64 float32 [num_boxes, 4] and [num_boxes, D]."""

from __future__ import annotations

import base64
import binascii
import csv
import glob
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np

from captioning.errors import DataError
from captioning.features.formats import (
    FEATURE_FORMATS,
    BadRecord,
    ImportConfig,
    Regions,
    SourceItem,
    item_files,
)

TSV_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")


def tsv_files(source: str) -> list[Path]:
    """The TSV files of ``source``: a file, a folder (its ``*.tsv*`` files) or a glob pattern; sorted."""
    path = Path(source)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = [f for f in item_files(path, "") if ".tsv" in f.name and f.is_file()]
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


@FEATURE_FORMATS.register("bottom_up_tsv", kinds=("image",), boxes="always")
def read_bottom_up_tsv(cfg: ImportConfig) -> Iterator[SourceItem]:
    """Rows of the bottom-up-attention TSV files (``TSV_FIELDS``, base64 float32 arrays)."""
    csv.field_size_limit(2**31 - 1)  # a row of 100 x 2048 base64 floats is ~1.1 MB
    for path in tsv_files(cfg.source):
        with open(path, newline="", encoding="ascii", errors="replace") as f:
            for line, row in enumerate(csv.reader(f, delimiter="\t"), 1):
                if row:
                    yield SourceItem(row[0].strip(), partial(parse_tsv_row, row), f"{path}:{line}")
