"""MSR-VTT: ``train_val_videodatainfo.json`` / ``test_videodatainfo.json`` (``annotations``, merged)."""

from __future__ import annotations

from typing import Any

from captioning.config import DataConfig
from captioning.data.annotations import (
    ANNOTATION_FORMATS,
    Problems,
    Sourced,
    clean_captions,
    load_json,
    require_annotations,
    valid_id,
    video_path,
)
from captioning.data.media import video_files_by_id
from captioning.data.records import CaptionRecord
from captioning.errors import DataError

MSRVTT_SPLITS = {"train": "train", "validate": "val", "val": "val", "test": "test"}


@ANNOTATION_FORMATS.register("msrvtt", kind="video")
def read_msrvtt(cfg: DataConfig, problems: Problems) -> list[Sourced]:
    """MSR-VTT ``*_videodatainfo.json`` files (every file in ``annotations``, merged)."""
    if not cfg.annotations or not any(cfg.annotations.values()):
        require_annotations(cfg, ["all"], "data.annotations.all=data/msrvtt/train_val_videodatainfo.json")
    files = video_files_by_id(cfg.media_dir)
    videos: dict[str, dict] = {}
    rejected: set[str] = set()  # reported video entries: their sentences go without a second report
    sentences: list[tuple[str, str, Any]] = []  # (file, record, sentence)
    for key, file in cfg.annotations.items():
        if not file:
            continue
        data = load_json(file, "MSR-VTT videodatainfo file")
        if not isinstance(data, dict) or not isinstance(data.get("videos"), list):
            raise DataError(f"MSR-VTT file {file} (annotations.{key}) has no 'videos' list: is it a *_videodatainfo.json?")
        sents = data.get("sentences", [])
        if not isinstance(sents, list):
            raise DataError(f"MSR-VTT file {file}: 'sentences' is not a list")
        for k, v in enumerate(data["videos"]):
            record = f"videos[{k}]"
            vid = v.get("video_id") if isinstance(v, dict) else None
            if not isinstance(vid, str) or not valid_id(vid):
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
            path = video_path(cfg.media_dir, files, vid, ".mp4", file, record, problems)
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
        videos[vid]["captions"] += clean_captions([(f"{record} (video_id {vid})", s.get("caption"))], file, problems)

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
