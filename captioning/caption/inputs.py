"""Input discovery: image/video files and folders named by a user -> the media files to caption.

Every input becomes one ``MediaInput`` (in the order given; a folder's files sorted by path):
a media file of the kind the checkpoint captions, or an input that already failed (a missing
path, a file named explicitly that is not of that kind, a folder holding none).  Files in
folders that are not of that kind are skipped and described in notes; hidden files and the
output folder are ignored; a file reached twice is captioned once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from captioning.data.media import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, media_kind


@dataclass
class MediaInput:
    """One input to caption: a media file (``path``), or one that failed (``error``, one line)."""

    input: str  # as the user named it (files found in a folder: their path)
    kind: str  # image | video
    path: str | None = None
    error: str | None = None


def _extensions(kind: str) -> str:
    return " ".join(sorted(IMAGE_EXTENSIONS if kind == "image" else VIDEO_EXTENSIONS))


def collect_inputs(inputs: Sequence[str | Path], kind: str, *, recursive: bool = True,
                   exclude: str | Path | None = None) -> tuple[list[MediaInput], list[str]]:
    """Expand files and folders into ``MediaInput``s; returns them and the notes on skipped files.

    ``kind``: what the checkpoint captions (image | video); ``recursive``: look into sub-folders;
    ``exclude``: a folder whose files are never inputs (the output folder).
    """
    found: list[MediaInput] = []
    notes: list[str] = []
    seen: set[str] = set()
    excl = Path(exclude).resolve() if exclude is not None else None

    def add(display: str, p: Path) -> None:
        key = str(p.resolve())
        if key not in seen:
            seen.add(key)
            found.append(MediaInput(display, kind, path=str(p)))

    for raw in inputs:
        p = Path(os.path.expanduser(str(raw)))
        if not p.exists():
            found.append(MediaInput(str(raw), media_kind(p) or kind,
                                    error=f"input not found: {raw} (check the path; inputs=[file_or_folder,...])"))
            continue
        if p.is_dir():
            walk = p.rglob("*") if recursive else p.iterdir()
            skipped: dict[str, list[str]] = {}
            count = 0
            for f in sorted(f for f in walk if f.is_file()):
                rel = f.relative_to(p)
                if any(part.startswith(".") for part in rel.parts):
                    continue
                if excl is not None and (excl == f.resolve() or excl in f.resolve().parents):
                    continue
                fk = media_kind(f)
                if fk == kind:
                    count += 1
                    add(str(f), f)
                else:
                    why = "unsupported type" if fk is None else f"{fk} (this checkpoint captions {kind}s)"
                    skipped.setdefault(why, []).append(str(rel))
            for why, names in skipped.items():
                shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                notes.append(f"{raw}: skipped {len(names)} file(s), {why}: {shown}")
            if not count:
                where = "or its sub-folders " if recursive else ""
                found.append(MediaInput(str(raw), kind, error=f"folder {raw} {where}holds no {kind} files "
                                                              f"({_extensions(kind)})"))
            continue
        fk = media_kind(p)
        if fk is None:
            found.append(MediaInput(str(raw), kind, error=f"unsupported file type '{p.suffix or '(none)'}': "
                                                          f"{raw}; this checkpoint captions {kind}s "
                                                          f"({_extensions(kind)})"))
        elif fk != kind:
            found.append(MediaInput(str(raw), fk, error=f"{raw} is a {fk} but this checkpoint captions {kind}s; "
                                                        f"use a checkpoint trained on {fk}s"))
        else:
            add(str(raw), p)
    return found, notes


def limit_media(found: list[MediaInput], max_items: int | None) -> list[MediaInput]:
    """Keep at most ``max_items`` media files (failed inputs are all kept, in place)."""
    if max_items is None:
        return found
    kept, n = [], 0
    for s in found:
        if s.error is None:
            n += 1
            if n > max_items:
                continue
        kept.append(s)
    return kept
