"""Annotation readers: COCO captions, Karpathy splits, MSVD and MSR-VTT -> ``CaptionRecord``s.

``read_dataset(cfg)`` dispatches on ``cfg.format``:

- ``coco``: one COCO captions json per split (``annotations.train/val/test``), indexed with
  pycocotools.  item_id = ``str(image_id)``, source_id = ``image_id``, path = ``file_name``.
- ``karpathy``: ``dataset_{coco,flickr8k,flickr30k}.json`` (``annotations.all``).  Karpathy's
  ``restval`` images are mapped to ``train`` (the usual "Karpathy split" training set of
  113,287 COCO images).  source_id = ``cocoid`` when present, else ``imgid``;
  path = ``filepath/filename`` (``filename`` alone when there is no ``filepath``).
- ``msvd``: ``AllVideoDescriptions.txt`` (``<vid>_<start>_<end> caption`` lines, ``#`` header
  lines ignored) or the MSR Video Description Corpus csv (English rows only), as
  ``annotations.all``.  item_id = ``<VideoID>_<Start>_<End>``; path = the clip's video file in
  ``media_dir`` (see "Video files" below; ``<item_id>.avi`` when there is none).
  Splits: optional split files ``annotations.train/val/test`` (one clip id per line; clips in no
  file are left out); otherwise the standard split of Venugopalan et al. / Yao et al. by the
  order in which clips first appear: the first 1200 clips train, the next 100 val, the
  remaining 670 test (for a file with another number of clips than 1970 the same fractions are
  used, with a warning).  ``AllVideoDescriptions.txt`` lists clips in the standard order; for the
  csv, give split files to reproduce the standard split exactly.
- ``msrvtt``: ``train_val_videodatainfo.json`` / ``test_videodatainfo.json`` (one or several
  files in ``annotations``, merged).  ``validate`` -> ``val``.  item_id = source_id = ``video_id``,
  path = the video's file in ``media_dir`` (see below; ``<video_id>.mp4`` when there is none).

Video files (every video format, one lookup: ``captioning.data.media.video_files_by_id``): an id's
file is ``<id>.<ext>`` directly in ``media_dir`` with any container the video backends read (mp4, webm,
mkv, avi, mov, m4v, mpg, ...; the extension in any case, e.g. ``.MP4``).  An id with two or more
such files (``video1.mp4`` and ``video1.webm``) is a bad record: which one is meant is unknown.

Bad input (a caption that is empty, not a string or not UTF-8; a caption for an id without a
media entry; duplicate ids; a path escaping the media root; an unknown split; a video id with
several video files; with ``check_files=True`` a missing media file) raises a ``DataError``
naming the file and the record when ``cfg.on_error == "raise"``; with ``"skip"`` it is logged,
skipped and described in ``DatasetRecords.skipped``.  Items left with no caption are dropped (and
counted there).  A file that is missing or unreadable as a whole always raises.
"""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captioning.config import DataConfig
from captioning.data.media import video_files_by_id
from captioning.data.records import CaptionRecord
from captioning.errors import ConfigError, DataError
from captioning.utils.io import read_json, safe_join

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
FORMATS = ("coco", "karpathy", "msvd", "msrvtt")
FORMAT_KIND = {"coco": "image", "karpathy": "image", "msvd": "video", "msrvtt": "video"}
KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}
MSRVTT_SPLITS = {"train": "train", "validate": "val", "val": "val", "test": "test"}
MSVD_STANDARD = (1200, 100, 670)  # train / val / test clips of the 1970-clip MSVD
MAX_LOGGED_SKIPS = 20

_SURROGATE = re.compile("[\udc80-\udcff]")
_CLIP_ID = re.compile(r"^(?P<vid>.+)_(?P<start>\d+)_(?P<end>\d+)$")

Sourced = tuple[str, CaptionRecord]  # (annotation file, record)


@dataclass
class DatasetRecords:
    """All records of a dataset and why some input was skipped.

    records: every kept item (each ``item_id`` once), in file order.
    skipped: human-readable reasons (file, record, problem) for each skipped caption or item.
    """

    records: list[CaptionRecord] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def split(self, name: str) -> list[CaptionRecord]:
        """The records of split ``name`` (``train`` | ``val`` | ``test``), in file order."""
        return [r for r in self.records if r.split == name]

    def counts(self) -> dict[str, int]:
        """Number of items per split."""
        return {s: sum(1 for r in self.records if r.split == s) for s in SPLITS}

    def __len__(self) -> int:
        return len(self.records)


class _Problems:
    """Raise or record-and-skip bad input, depending on ``on_error``."""

    def __init__(self, on_error: str) -> None:
        if on_error not in ("skip", "raise"):
            raise ConfigError(f"data.on_error={on_error!r} is not valid: use skip | raise")
        self.on_error = on_error
        self.skipped: list[str] = []

    def bad(self, file: str | Path, record: str, problem: str) -> None:
        """Report one bad caption/record: raise DataError, or log a warning and count it."""
        where = f"{file}: {record}: {problem}"
        if self.on_error == "raise":
            raise DataError(f"{where} (fix the annotation, or set data.on_error=skip to skip such records)")
        self.skipped.append(where)
        if len(self.skipped) <= MAX_LOGGED_SKIPS:
            log.warning("skipping bad annotation: %s", where)
        elif len(self.skipped) == MAX_LOGGED_SKIPS + 1:
            log.warning("more bad annotations are being skipped; see DatasetRecords.skipped for all of them")

    def dropped(self, file: str | Path, record: str) -> None:
        """An item left with no caption: always skipped (never an error), but counted."""
        where = f"{file}: {record}: no valid caption left, item dropped"
        self.skipped.append(where)
        if len(self.skipped) <= MAX_LOGGED_SKIPS:
            log.warning("%s", where)


# --------------------------------------------------------------------------- helpers
def _load_json(path: str | Path, what: str) -> Any:
    """Annotation JSON; bytes that are not UTF-8 are kept (as lone surrogates) so that the record
    holding them can be reported and skipped on its own rather than failing the whole file."""
    return read_json(path, what, hint="check data.annotations in your config or the data/ layout",
                     errors="surrogateescape")


def _read_text(path: str | Path, what: str) -> str:
    """A text file decoded as UTF-8 (invalid bytes become lone surrogates, reported per line)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} not found: {path} (check data.annotations in your config or the data/ layout)")
    try:
        return path.read_bytes().decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")
    except OSError as e:
        raise DataError(f"cannot read {what} {path}: {e}") from None


def _text_problem(value: Any, what: str = "caption") -> str | None:
    """Why ``value`` is not a usable caption/string (None when it is)."""
    if not isinstance(value, str):
        return f"{what} is not a string (got {type(value).__name__}: {str(value)[:40]!r})"
    if _SURROGATE.search(value):
        return f"{what} is not valid UTF-8 text ({value.encode('utf-8', 'surrogateescape')[:60]!r})"
    if not value.strip():
        return f"{what} is empty"
    return None


def _safe_path(media_dir: str, rel: Any, file: str | Path, record: str, problems: _Problems) -> str | None:
    """``rel`` checked to stay under the media root (None, after reporting, when it does not)."""
    bad = _text_problem(rel, "file path")
    if bad:
        problems.bad(file, record, bad)
        return None
    try:
        safe_join(media_dir, rel, source="file path")
    except DataError as e:
        problems.bad(file, record, str(e).removeprefix("file path: "))
        return None
    return rel


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and bool(value.strip()) and not _SURROGATE.search(value)


def _clean_captions(captions: Iterable[tuple[str, Any]], file: str | Path, problems: _Problems) -> list[str]:
    """Keep the usable captions of ``(record description, caption)`` pairs, stripped."""
    kept = []
    for record, cap in captions:
        bad = _text_problem(cap)
        if bad:
            problems.bad(file, record, bad)
        else:
            kept.append(" ".join(cap.split()))
    return kept


def _require(cfg: DataConfig, keys: Iterable[str], example: str) -> None:
    if not any(k in cfg.annotations and cfg.annotations[k] for k in keys):
        raise ConfigError(
            f"data '{cfg.name}' (format {cfg.format}) needs data.annotations.{'/'.join(keys)}: "
            f"set it, e.g. {example}"
        )


# --------------------------------------------------------------------------- COCO
def read_coco(cfg: DataConfig, problems: _Problems) -> list[Sourced]:
    """COCO captions files, one per split in ``cfg.annotations`` (``train``/``val``/``test``)."""
    unknown = sorted(set(cfg.annotations) - set(SPLITS))
    if unknown:
        raise ConfigError(
            f"data.annotations.{unknown[0]} is not valid for format=coco: give one COCO captions file "
            f"per split as annotations.train / annotations.val / annotations.test"
        )
    _require(cfg, SPLITS, "data.annotations.train=data/coco/annotations/captions_train2014.json")
    records = []
    for split in SPLITS:
        if cfg.annotations.get(split):
            records += _read_coco_file(cfg.annotations[split], split, cfg, problems)
    return records


def _read_coco_file(file: str, split: str, cfg: DataConfig, problems: _Problems) -> list[Sourced]:
    from pycocotools.coco import COCO

    data = _load_json(file, "COCO captions file")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f"COCO captions file {file} has no 'images' list: is it a COCO captions json?")
    anns = data.get("annotations", [])
    if not isinstance(anns, list):
        raise DataError(f"COCO captions file {file}: 'annotations' is not a list")

    images, order, seen = [], [], set()
    rejected = set()  # ids of reported image entries: their captions go without a second report
    for k, img in enumerate(data["images"]):
        record = f"images[{k}]"
        if not isinstance(img, dict) or not _valid_id(img.get("id")):
            problems.bad(file, record, "image entry without a valid 'id'")
            continue
        record = f"image id {img['id']}"
        path = _safe_path(cfg.media_dir, img.get("file_name"), file, record, problems)
        if path is None:
            rejected.add(img["id"])
            continue
        if img["id"] in seen:
            problems.bad(file, record, "duplicate image id (another entry of 'images' has it)")
            continue
        seen.add(img["id"])
        order.append(img["id"])
        images.append({"id": img["id"], "file_name": path})
    known = seen
    rejected -= known
    clean_anns = []
    for k, ann in enumerate(anns):
        record = f"annotations[{k}]"
        if not isinstance(ann, dict) or "image_id" not in ann:
            problems.bad(file, record, "annotation without an 'image_id'")
            continue
        record = f"annotations[{k}] (image id {ann['image_id']})"
        if _valid_id(ann["image_id"]) and ann["image_id"] in rejected:
            continue
        if not _valid_id(ann["image_id"]) or ann["image_id"] not in known:
            problems.bad(file, record, "image id has no entry (file_name) in 'images'")
            continue
        bad = _text_problem(ann.get("caption"))
        if bad:
            problems.bad(file, record, bad)
            continue
        clean_anns.append({"id": len(clean_anns), "image_id": ann["image_id"], "caption": ann["caption"]})

    coco = COCO()
    coco.dataset = {"images": images, "annotations": clean_anns}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            coco.createIndex()
    except Exception as e:  # pycocotools reports bad structure as KeyError/TypeError/...
        raise DataError(f"pycocotools could not index {file}: {type(e).__name__}: {e}") from None

    records = []
    for image_id in order:
        caps = [" ".join(a["caption"].split()) for a in coco.imgToAnns.get(image_id, [])]
        if not caps:
            problems.dropped(file, f"image id {image_id}")
            continue
        records.append((file, CaptionRecord(
            item_id=str(image_id), source_id=image_id, path=coco.imgs[image_id]["file_name"],
            captions=tuple(caps), split=split, kind="image",
        )))
    return records


# --------------------------------------------------------------------------- Karpathy
def read_karpathy(cfg: DataConfig, problems: _Problems) -> list[Sourced]:
    """A Karpathy split file (``annotations.all``); ``restval`` becomes ``train``."""
    _require(cfg, ["all"], "data.annotations.all=data/coco/dataset_coco.json")
    file = cfg.annotations["all"]
    data = _load_json(file, "Karpathy split file")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DataError(f"Karpathy split file {file} has no 'images' list: is it a dataset_*.json of Karpathy's splits?")
    records = []
    for k, img in enumerate(data["images"]):
        record = f"images[{k}]"
        if not isinstance(img, dict):
            problems.bad(file, record, "image entry is not an object")
            continue
        source_id = img.get("cocoid", img.get("imgid"))
        if not _valid_id(source_id):
            problems.bad(file, record, "image entry without a valid 'cocoid' or 'imgid'")
            continue
        record = f"images[{k}] (id {source_id})"
        split = KARPATHY_SPLITS.get(img["split"]) if isinstance(img.get("split"), str) else None
        if split is None:
            problems.bad(file, record, f"unknown split {img.get('split')!r} (expected train|val|test|restval)")
            continue
        name = img.get("filename")
        bad = _text_problem(name, "filename")
        if bad:
            problems.bad(file, record, bad)
            continue
        rel = f"{img['filepath']}/{name}" if img.get("filepath") else name
        path = _safe_path(cfg.media_dir, rel, file, record, problems)
        if path is None:
            continue
        sentences = img.get("sentences")
        if not isinstance(sentences, list):
            problems.bad(file, record, "no 'sentences' list")
            continue
        pairs = []
        for j, s in enumerate(sentences):
            cap = s.get("raw") if isinstance(s, dict) else s
            if isinstance(s, dict) and cap is None and isinstance(s.get("tokens"), list):
                cap = " ".join(t for t in s["tokens"] if isinstance(t, str))
            pairs.append((f"{record} sentences[{j}]", cap))
        caps = _clean_captions(pairs, file, problems)
        if not caps:
            problems.dropped(file, record)
            continue
        extra = {"imgid": img.get("imgid"), "karpathy_split": img.get("split")}
        records.append((file, CaptionRecord(
            item_id=str(source_id), source_id=source_id, path=path, captions=tuple(caps),
            split=split, kind="image", extra=extra,
        )))
    return records


# --------------------------------------------------------------------------- MSVD
def read_msvd(cfg: DataConfig, problems: _Problems) -> list[Sourced]:
    """MSVD (Youtube2Text) from ``AllVideoDescriptions.txt`` or the corpus csv (``annotations.all``)."""
    unknown = sorted(set(cfg.annotations) - {"all", *SPLITS})
    if unknown:
        raise ConfigError(
            f"data.annotations.{unknown[0]} is not valid for format=msvd: use annotations.all (the "
            f"descriptions file) and optionally annotations.train/val/test (split files of clip ids)"
        )
    _require(cfg, ["all"], "data.annotations.all=data/msvd/AllVideoDescriptions.txt")
    file = cfg.annotations["all"]
    text = _read_text(file, "MSVD descriptions file")
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
        path = _video_path(cfg.media_dir, videos, clip_id, ".avi", file, f"clip {clip_id}", problems)
        if path is None:
            continue
        m = _CLIP_ID.match(clip_id)
        extra = {"video": m["vid"], "start": int(m["start"]), "end": int(m["end"])} if m else {}
        records.append((file, CaptionRecord(
            item_id=clip_id, source_id=clip_id, path=path, captions=tuple(caps), split=split,
            kind="video", extra=extra,
        )))
    return records


def _parse_msvd_txt(text: str, file: str, problems: _Problems) -> dict[str, list[str]]:
    """``<vid>_<start>_<end> caption`` lines -> clip id -> captions, in order of first appearance."""
    clips: dict[str, list[str]] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(maxsplit=1)
        clip_id = parts[0]
        record = f"line {n} (clip {clip_id})"
        if not _CLIP_ID.match(clip_id) or _SURROGATE.search(clip_id):
            problems.bad(file, f"line {n}", f"{clip_id[:40]!r} is not a clip id of the form <video>_<start>_<end>")
            continue
        clips.setdefault(clip_id, [])
        clips[clip_id] += _clean_captions([(record, parts[1] if len(parts) > 1 else "")], file, problems)
    return clips


def _parse_msvd_csv(text: str, file: str, problems: _Problems) -> dict[str, list[str]]:
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
        if not _CLIP_ID.match(clip_id) or _SURROGATE.search(clip_id):
            problems.bad(file, f"line {n}", f"{clip_id[:60]!r} is not a clip id: VideoID, integer Start and End expected")
            continue
        if row[col["Language"]].strip().lower() != "english":
            continue
        desc = ",".join(row[col["Description"]:]) if desc_last else row[col["Description"]]
        clips.setdefault(clip_id, [])
        clips[clip_id] += _clean_captions([(record, desc)], file, problems)
    return clips


def _msvd_splits(cfg: DataConfig, order: list[str], file: str, problems: _Problems) -> dict[str, str]:
    """clip id -> split, from split files when given, else by the standard ordering rule."""
    split_files = {s: cfg.annotations[s] for s in SPLITS if cfg.annotations.get(s)}
    if split_files:
        known = set(order)
        out: dict[str, str] = {}
        for split, sfile in split_files.items():
            text = _read_text(sfile, f"MSVD {split} split file")
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


def _video_path(media_dir: str, files: dict[str, list[str]], video_id: str, default_ext: str,
                file: str | Path, record: str, problems: _Problems) -> str | None:
    """The file name of ``video_id``'s video (``files``: ``video_files_by_id(media_dir)``).

    ``<video_id><default_ext>`` when no file exists (it is then reported missing where it is
    read); None, after reporting, when several files claim the id or the path escapes the root.
    """
    names = files.get(video_id, [])
    if len(names) > 1:
        problems.bad(file, record, f"{len(names)} video files for this id in {media_dir}: {', '.join(names)}; "
                                   f"keep one of them (move the others out of data.media_dir)")
        return None
    return _safe_path(media_dir, names[0] if names else video_id + default_ext, file, record, problems)


# --------------------------------------------------------------------------- MSR-VTT
def read_msrvtt(cfg: DataConfig, problems: _Problems) -> list[Sourced]:
    """MSR-VTT ``*_videodatainfo.json`` files (every file in ``annotations``, merged)."""
    if not cfg.annotations or not any(cfg.annotations.values()):
        _require(cfg, ["all"], "data.annotations.all=data/msrvtt/train_val_videodatainfo.json")
    files = video_files_by_id(cfg.media_dir)
    videos: dict[str, dict] = {}
    rejected: set[str] = set()  # reported video entries: their sentences go without a second report
    sentences: list[tuple[str, str, Any]] = []  # (file, record, sentence)
    for key, file in cfg.annotations.items():
        if not file:
            continue
        data = _load_json(file, "MSR-VTT videodatainfo file")
        if not isinstance(data, dict) or not isinstance(data.get("videos"), list):
            raise DataError(f"MSR-VTT file {file} (annotations.{key}) has no 'videos' list: is it a *_videodatainfo.json?")
        sents = data.get("sentences", [])
        if not isinstance(sents, list):
            raise DataError(f"MSR-VTT file {file}: 'sentences' is not a list")
        for k, v in enumerate(data["videos"]):
            record = f"videos[{k}]"
            vid = v.get("video_id") if isinstance(v, dict) else None
            if not isinstance(vid, str) or not _valid_id(vid):
                problems.bad(file, record, "video entry without a valid string 'video_id'")
                continue
            record = f"videos[{k}] (video_id {vid})"
            split = MSRVTT_SPLITS.get(v["split"]) if isinstance(v.get("split"), str) else None
            if split is None:
                problems.bad(file, record, f"unknown split {v.get('split')!r} (expected train|validate|test)")
                rejected.add(vid)
                continue
            if vid in videos:
                problems.bad(file, record, f"duplicate video_id (already in {videos[vid]['file']})")
                continue
            path = _video_path(cfg.media_dir, files, vid, ".mp4", file, record, problems)
            if path is None:
                rejected.add(vid)
                continue
            extra = {k2: v[k2] for k2 in ("id", "category", "start time", "end time") if k2 in v}
            videos[vid] = {"file": file, "split": split, "path": path, "captions": [], "extra": extra}
        sentences += [(file, f"sentences[{k}]", s) for k, s in enumerate(sents)]

    for file, record, s in sentences:
        vid = s.get("video_id") if isinstance(s, dict) else None
        if isinstance(vid, str) and vid in rejected and vid not in videos:
            continue
        if not isinstance(vid, str) or vid not in videos:
            problems.bad(file, f"{record} (video_id {vid})", "video_id has no entry in 'videos'")
            continue
        videos[vid]["captions"] += _clean_captions([(f"{record} (video_id {vid})", s.get("caption"))], file, problems)

    records = []
    for vid, v in videos.items():
        if not v["captions"]:
            problems.dropped(v["file"], f"video_id {vid}")
            continue
        records.append((v["file"], CaptionRecord(
            item_id=vid, source_id=vid, path=v["path"], captions=tuple(v["captions"]), split=v["split"],
            kind="video", extra=v["extra"],
        )))
    return records


# --------------------------------------------------------------------------- entry point
READERS = {"coco": read_coco, "karpathy": read_karpathy, "msvd": read_msvd, "msrvtt": read_msrvtt}


def read_dataset(cfg: DataConfig, check_files: bool = False) -> DatasetRecords:
    """Read every split of ``cfg`` into ``DatasetRecords`` (see the module docstring).

    check_files: also require each item's media file to exist under ``cfg.media_dir``
    (a missing one is an error, or skipped with ``on_error=skip``).
    """
    if cfg.format not in READERS:
        raise ConfigError(f"data.format={cfg.format!r} is not valid: use {' | '.join(FORMATS)}")
    if cfg.kind != FORMAT_KIND[cfg.format]:
        raise ConfigError(
            f"data.kind={cfg.kind!r} does not match data.format={cfg.format} (a {FORMAT_KIND[cfg.format]} "
            f"format): set data.kind={FORMAT_KIND[cfg.format]}"
        )
    problems = _Problems(cfg.on_error)
    records = READERS[cfg.format](cfg, problems)

    kept: list[CaptionRecord] = []
    seen: dict[str, str] = {}
    for file, r in records:
        if r.item_id in seen:
            problems.bad(file, f"id {r.source_id}", f"duplicate id (already read from {seen[r.item_id]})")
            continue
        if check_files and not safe_join(cfg.media_dir, r.path).is_file():
            problems.bad(file, f"id {r.source_id}",
                         f"media file {Path(cfg.media_dir, r.path)} not found (check data.media_dir)")
            continue
        seen[r.item_id] = str(file)
        kept.append(r)
    if problems.skipped:
        log.warning("%s: %d annotation problems skipped (DatasetRecords.skipped lists them)",
                    cfg.name, len(problems.skipped))
    if not kept:
        raise DataError(f"no usable records in {_files(cfg)}: check the annotation files and data.format={cfg.format}")
    out = DatasetRecords(kept, problems.skipped)
    log.info("%s: %s items per split", cfg.name, out.counts())
    return out


def _files(cfg: DataConfig) -> str:
    files = [str(f) for f in cfg.annotations.values() if f]
    return files[0] if len(files) == 1 else "{" + ", ".join(files) + "}"
