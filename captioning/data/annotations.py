"""Annotations -> ``CaptionRecord``s: the registered formats, what they check, and ``read_dataset``.

``read_dataset(cfg)`` reads ``cfg.format`` with its registered reader (``ANNOTATION_FORMATS``; one
module per format in ``captioning.data.formats``: a new format is one module that registers itself
there, plus one ``conf/data/<name>.yaml``), then drops duplicate ids and, if asked, items whose file
is missing:

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

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captioning.config import DataConfig
from captioning.data.records import CaptionRecord
from captioning.errors import ConfigError, DataError
from captioning.registry import Registry
from captioning.utils.io import read_json, safe_join

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
MAX_LOGGED_SKIPS = 20

SURROGATE = re.compile("[\udc80-\udcff]")

Sourced = tuple[str, CaptionRecord]  # (annotation file, record)
Reader = Callable[[DataConfig, "Problems"], list[Sourced]]
#: data.format -> reader (metadata: kind image | video); one module each in captioning.data.formats
ANNOTATION_FORMATS: Registry[Reader] = Registry("annotation format", config_key="data.format", discover="captioning.data.formats")


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


class Problems:
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
def load_json(path: str | Path, what: str, object_hook: Callable[[dict], Any] | None = None) -> Any:
    """Annotation JSON; bytes that are not UTF-8 are kept (as lone surrogates) so that the record
    holding them can be reported and skipped on its own rather than failing the whole file.
    ``object_hook``: see ``read_json``."""
    return read_json(path, what, hint="check data.annotations in your config or the data/ layout",
                     errors="surrogateescape", object_hook=object_hook)


def read_text(path: str | Path, what: str) -> str:
    """A text file decoded as UTF-8 (invalid bytes become lone surrogates, reported per line)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} not found: {path} (check data.annotations in your config or the data/ layout)")
    try:
        return path.read_bytes().decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")
    except OSError as e:
        raise DataError(f"cannot read {what} {path}: {e}") from None


def text_problem(value: Any, what: str = "caption") -> str | None:
    """Why ``value`` is not a usable caption/string (None when it is)."""
    if not isinstance(value, str):
        return f"{what} is not a string (got {type(value).__name__}: {str(value)[:40]!r})"
    if SURROGATE.search(value):
        return f"{what} is not valid UTF-8 text ({value.encode('utf-8', 'surrogateescape')[:60]!r})"
    if not value.strip():
        return f"{what} is empty"
    return None


def safe_path(media_dir: str, rel: Any, file: str | Path, record: str, problems: Problems) -> str | None:
    """``rel`` checked to stay under the media root (None, after reporting, when it does not)."""
    bad = text_problem(rel, "file path")
    if bad:
        problems.bad(file, record, bad)
        return None
    try:
        safe_join(media_dir, rel, source="file path")
    except DataError as e:
        problems.bad(file, record, str(e).removeprefix("file path: "))
        return None
    return rel


def valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and bool(value.strip()) and not SURROGATE.search(value)


def clean_captions(captions: Iterable[tuple[str, Any]], file: str | Path, problems: Problems) -> list[str]:
    """Keep the usable captions of ``(record description, caption)`` pairs, stripped."""
    kept = []
    for record, cap in captions:
        bad = text_problem(cap)
        if bad:
            problems.bad(file, record, bad)
        else:
            kept.append(" ".join(cap.split()))
    return kept


def require_annotations(cfg: DataConfig, keys: Iterable[str], example: str) -> None:
    if not any(k in cfg.annotations and cfg.annotations[k] for k in keys):
        raise ConfigError(
            f"data '{cfg.name}' (format {cfg.format}) needs data.annotations.{'/'.join(keys)}: "
            f"set it, e.g. {example}"
        )


def video_path(media_dir: str, files: dict[str, list[str]], video_id: str, default_ext: str,
                file: str | Path, record: str, problems: Problems) -> str | None:
    """The file name of ``video_id``'s video (``files``: ``video_files_by_id(media_dir)``).

    ``<video_id><default_ext>`` when no file exists (it is then reported missing where it is
    read); None, after reporting, when several files claim the id or the path escapes the root.
    """
    names = files.get(video_id, [])
    if len(names) > 1:
        problems.bad(file, record, f"{len(names)} video files for this id in {media_dir}: {', '.join(names)}; "
                                   f"keep one of them (move the others out of data.media_dir)")
        return None
    return safe_path(media_dir, names[0] if names else video_id + default_ext, file, record, problems)


# --------------------------------------------------------------------------- entry point


def read_dataset(cfg: DataConfig, check_files: bool = False) -> DatasetRecords:
    """Read every split of ``cfg`` into ``DatasetRecords`` (see the module docstring).

    check_files: also require each item's media file to exist under ``cfg.media_dir``
    (a missing one is an error, or skipped with ``on_error=skip``).
    """
    fmt = ANNOTATION_FORMATS.entry(cfg.format)
    kind = fmt.meta["kind"]
    if cfg.kind != kind:
        raise ConfigError(f"data.kind={cfg.kind!r} does not match data.format={cfg.format} (a {kind} format): "
                          f"set data.kind={kind}")
    problems = Problems(cfg.on_error)
    records = fmt.obj(cfg, problems)

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
