"""Small I/O helpers: atomic writes, JSON with file-naming errors, safe paths."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from captioning.errors import DataError


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)`` then atomically rename the temp file onto ``path``.

    A crash (or a full disk) during ``write`` leaves any previous ``path`` intact and
    no partial file under the final name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        with open(tmp_path, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp_path, path)
    except BaseException as e:
        tmp_path.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(path)  # name the file for the error message (f.write errors carry none)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 1) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False))


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    """Load JSON, turning a missing file or a syntax error into a DataError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} not found: {path} (check the path in your config)")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except UnicodeDecodeError as e:
        raise DataError(f"{what} {path} is not UTF-8 text: {e}") from e
    except json.JSONDecodeError as e:
        raise DataError(f"{what} {path} is malformed JSON at line {e.lineno} col {e.colno}: {e.msg}") from e


def safe_join(root: str | Path, relative: str, source: str = "annotation") -> Path:
    """Join ``relative`` under ``root``, refusing absolute paths and ``..`` escapes."""
    if not isinstance(relative, str) or not relative:
        raise DataError(f"{source}: empty or non-string file path {relative!r}")
    rel = Path(relative)
    if rel.is_absolute() or relative.startswith(("/", "\\")):
        raise DataError(f"{source}: absolute path {relative!r} refused; paths must be relative to {root}")
    if ".." in rel.parts:
        raise DataError(f"{source}: path {relative!r} escapes the data root {root}; '..' is refused")
    return Path(root) / rel
