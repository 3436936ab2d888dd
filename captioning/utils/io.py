"""Small I/O helpers: atomic writes, JSON with file-naming errors, safe paths."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from captioning.errors import DataError


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)``, fsync the temp file, then atomically rename it onto ``path``.

    A crash (or a full disk) during ``write`` leaves any previous ``path`` intact and
    no partial file under the final name.  The temp file sits beside ``path`` as
    ``.<name>.<host>-<pid>.<random>.tmp``; one that a killed process of this host left for the
    same ``path`` is deleted by the next write of ``path``.  An ``OSError`` names ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_writer()}.", suffix=".tmp", dir=path.parent)
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
        if isinstance(e, OSError) and (e.filename is None or str(e.filename) == tmp):
            e.filename = str(path)  # name the file for the error message, not its temp file
        raise
    return path


def _writer() -> str:
    """``<host>-<pid>`` of this process, for temp file names (host reduced to [A-Za-z0-9_])."""
    return f"{re.sub(r'[^A-Za-z0-9]', '_', socket.gethostname())}-{os.getpid()}"


def remove_stale_temps(path: str | Path) -> list[Path]:
    """Delete the temp files of ``path`` (see ``atomic_write``) whose writer, a process of this
    host, is gone; temp files of live processes or of other hosts are left alone.  Returns them."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.([A-Za-z0-9_]+)-(\d+)\.[^.]+\.tmp")
    host = _writer().rsplit("-", 1)[0]
    removed = []
    try:
        entries = os.scandir(path.parent)
    except OSError:
        return removed
    with entries:
        for entry in entries:
            m = pattern.fullmatch(entry.name)
            if m and m.group(1) == host and not _alive(int(m.group(2))):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 1) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False))


def read_json(path: str | Path, what: str = "JSON file", *, hint: str = "check the path in your config",
              errors: str = "strict", object_hook: Callable[[dict], Any] | None = None) -> Any:
    """Load a JSON file; a missing, unreadable, non-UTF-8 or malformed file raises a DataError naming it.

    hint: the fix suggested for a missing file.  A leading byte-order mark is ignored.
    ``errors="surrogateescape"`` keeps bytes that are not UTF-8 as lone surrogates, so that a
    reader can report (and skip) the record holding them instead of failing the whole file.
    ``object_hook`` (as ``json.loads``'s) replaces each object as soon as it is parsed.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} not found: {path} ({hint})")
    try:
        text = path.read_bytes().decode("utf-8", errors=errors).removeprefix("\ufeff")
    except OSError as e:
        raise DataError(f"cannot read {what} {path}: {e}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{what} {path} is not UTF-8 text: {e}") from None
    try:
        return json.loads(text, object_hook=object_hook)
    except json.JSONDecodeError as e:
        raise DataError(f"{what} {path} is malformed JSON at line {e.lineno} col {e.colno}: {e.msg}") from None


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


def stream_sha256(f: IO[bytes]) -> str:
    """sha256 (hex) of the rest of an open binary file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes."""
    with open(path, "rb") as f:
        return stream_sha256(f)
