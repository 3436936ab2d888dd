"""MSVD (Youtube2Text): ``AllVideoDescriptions.txt`` or the corpus csv (``annotations.all``), the standard split."""

from __future__ import annotations

import csv
import io
import logging
import re

from captioning.config import DataConfig
from captioning.data.annotations import (
    ANNOTATION_FORMATS,
    SPLITS,
    SURROGATE,
    Problems,
    Sourced,
    clean_captions,
    read_text,
    require_annotations,
    video_path,
)
from captioning.data.media import video_files_by_id
from captioning.data.records import CaptionRecord
from captioning.errors import ConfigError, DataError

log = logging.getLogger("captioning.data.annotations")
MSVD_STANDARD = (1200, 100, 670)  # train / val / test clips of the 1970-clip MSVD
_CLIP_ID = re.compile(r"^(?P<vid>.+)_(?P<start>\d+)_(?P<end>\d+)$")


@ANNOTATION_FORMATS.register("msvd", kind="video")
def read_msvd(cfg: DataConfig, problems: Problems) -> list[Sourced]:
    """MSVD (Youtube2Text) from ``AllVideoDescriptions.txt`` or the corpus csv (``annotations.all``)."""
    unknown = sorted(set(cfg.annotations) - {"all", *SPLITS})
    if unknown:
        raise ConfigError(
            f"data.annotations.{unknown[0]} is not valid for format=msvd: use annotations.all (the "
            f"descriptions file) and optionally annotations.train/val/test (split files of clip ids)"
        )
    require_annotations(cfg, ["all"], "data.annotations.all=data/msvd/AllVideoDescriptions.txt")
    file = cfg.annotations["all"]
    text = read_text(file, "MSVD descriptions file")
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if str(file).lower().endswith(".csv") or first.startswith("VideoID,"):
        clips = _parse_msvd_csv(text, file, problems)
    else:
        clips = _parse_msvd_txt(text, file, problems)

    splits = _msvd_splits(cfg, list(clips), file, problems)
    videos = video_files_by_id(cfg.media_dir)
    records = []
    for clip_id, caps in clips.items():
        split = splits.get(clip_id)
        if split is None:
            continue
        if not caps:
            problems.dropped(file, f"clip {clip_id}")
            continue
        path = video_path(cfg.media_dir, videos, clip_id, ".avi", file, f"clip {clip_id}", problems)
        if path is None:
            continue
        m = _CLIP_ID.match(clip_id)
        extra = {"video": m["vid"], "start": int(m["start"]), "end": int(m["end"])} if m else {}
        records.append((file, CaptionRecord(
            item_id=clip_id, source_id=clip_id, path=path, captions=tuple(caps), split=split,
            kind="video", extra=extra,
        )))
    return records


def _parse_msvd_txt(text: str, file: str, problems: Problems) -> dict[str, list[str]]:
    """``<vid>_<start>_<end> caption`` lines -> clip id -> captions, in order of first appearance."""
    clips: dict[str, list[str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(maxsplit=1)
        clip_id = parts[0]
        record = f"line {n} (clip {clip_id})"
        if not _CLIP_ID.match(clip_id) or SURROGATE.search(clip_id):
            problems.bad(file, f"line {n}", f"{clip_id[:40]!r} is not a clip id of the form <video>_<start>_<end>")
            continue
        clips.setdefault(clip_id, [])
        clips[clip_id] += clean_captions([(record, parts[1] if len(parts) > 1 else "")], file, problems)
    return clips


def _parse_msvd_csv(text: str, file: str, problems: Problems) -> dict[str, list[str]]:
    """MSR Video Description Corpus csv -> clip id -> English captions, in order of first appearance.

    Unquoted commas inside the last column (Description) are kept as part of the caption.
    """
    rows = csv.reader(io.StringIO(text, newline=""))
    header = [h.strip() for h in next(rows, [])]
    need = ("VideoID", "Start", "End", "Language", "Description")
    missing = [c for c in need if c not in header]
    if missing:
        raise DataError(
            f"MSVD corpus csv {file} lacks column(s) {', '.join(missing)}: expected the header "
            f"VideoID,Start,End,WorkerID,Source,AnnotationTime,Language,Description"
        )
    col = {c: header.index(c) for c in need}
    desc_last = col["Description"] == len(header) - 1
    clips: dict[str, list[str]] = {}
    for n, row in enumerate(rows, 2):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) < len(header):
            problems.bad(file, f"line {n}", f"{len(row)} columns, expected {len(header)}")
            continue
        vid, start, end = (row[col[c]].strip() for c in ("VideoID", "Start", "End"))
        clip_id = f"{vid}_{start}_{end}"
        record = f"line {n} (clip {clip_id})"
        if not _CLIP_ID.match(clip_id) or SURROGATE.search(clip_id):
            problems.bad(file, f"line {n}", f"{clip_id[:60]!r} is not a clip id: VideoID, integer Start and End expected")
            continue
        if row[col["Language"]].strip().lower() != "english":
            continue
        desc = ",".join(row[col["Description"]:]) if desc_last else row[col["Description"]]
        clips.setdefault(clip_id, [])
        clips[clip_id] += clean_captions([(record, desc)], file, problems)
    return clips


def _msvd_splits(cfg: DataConfig, order: list[str], file: str, problems: Problems) -> dict[str, str]:
    """clip id -> split, from split files when given, else by the standard ordering rule."""
    split_files = {s: cfg.annotations[s] for s in SPLITS if cfg.annotations.get(s)}
    if split_files:
        known = set(order)
        out: dict[str, str] = {}
        for split, sfile in split_files.items():
            text = read_text(sfile, f"MSVD {split} split file")
            for n, line in enumerate(text.splitlines(), 1):
                clip_id = line.strip()
                if not clip_id or clip_id.startswith("#"):
                    continue
                record = f"line {n} (clip {clip_id})"
                if clip_id not in known:
                    problems.bad(sfile, record, f"clip id has no descriptions in {file}")
                elif clip_id in out:
                    problems.bad(sfile, record, f"duplicate clip id (already in the {out[clip_id]} split)")
                else:
                    out[clip_id] = split
        left = len(order) - len(out)
        if left:
            log.info("MSVD: %d clips of %s are in no split file and are left out", left, file)
        return out
    n = len(order)
    if n == sum(MSVD_STANDARD):
        n_train, n_val = MSVD_STANDARD[0], MSVD_STANDARD[1]
    else:
        total = sum(MSVD_STANDARD)
        n_train = round(n * MSVD_STANDARD[0] / total)
        n_val = round(n * MSVD_STANDARD[1] / total)
        if n >= 3:  # tiny files: keep every split non-empty
            n_val = max(1, n_val)
            n_train = max(1, min(n_train, n - n_val - 1))
        log.warning(
            "MSVD: %s has %d clips, not the standard 1970: splitting by order with the standard fractions "
            "(%d train, %d val, %d test); give annotations.train/val/test split files for an exact split",
            file, n, n_train, n_val, n - n_train - n_val,
        )
    return {c: ("train" if i < n_train else "val" if i < n_train + n_val else "test") for i, c in enumerate(order)}
