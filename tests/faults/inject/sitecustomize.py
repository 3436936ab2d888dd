"""Fault injection for CLI subprocesses of the fault suite (never imported by the package).

Python imports ``sitecustomize`` at start-up from ``sys.path``; the fault tests put this folder
on ``PYTHONPATH`` of the CLI they launch and choose a fault with environment variables.  Both
faults trigger on files opened for writing (``open``/``io.open``, which is how ``np.save``,
``Path.write_bytes`` and the JSON writers reach the disk) whose path contains ``<substring>``:

CAPTIONING_FAULT_ENOSPC="<substring>:<n>"
    after ``n`` such opens succeed, every later one gets a file that writes half of the first
    chunk and then fails with ``OSError(ENOSPC)``: a disk that fills up in the middle of a write.
CAPTIONING_FAULT_KILL="<substring>:<n>"
    the ``n+1``-th such open writes half of its first chunk and then SIGKILLs the whole process:
    a job killed (OOM killer, pre-emption) at the worst moment, mid-write.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import signal

_real_open = builtins.open


def _parse(name: str) -> tuple[str, int] | None:
    spec = os.environ.get(name)
    if not spec:
        return None
    match, _, after = spec.rpartition(":")
    return match, int(after)


_ENOSPC = _parse("CAPTIONING_FAULT_ENOSPC")
_KILL = _parse("CAPTIONING_FAULT_KILL")
_counts = {"enospc": 0, "kill": 0}


class _FaultyFile:
    """Wraps a real file; the first write does half its work, then the fault happens."""

    def __init__(self, f, fault: str) -> None:
        self._f = f
        self._fault = fault

    def write(self, data):
        view = memoryview(data) if not isinstance(data, str) else data
        self._f.write(view[: max(1, len(view) // 2)])
        self._f.flush()
        if self._fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()
        return False


def _open(file, mode="r", *args, **kwargs):
    f = _real_open(file, mode, *args, **kwargs)
    if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+"):
        path = os.fsdecode(os.fspath(file))
        for fault, spec in (("kill", _KILL), ("enospc", _ENOSPC)):
            if spec and spec[0] in path:
                _counts[fault] += 1
                if _counts[fault] > spec[1]:
                    return _FaultyFile(f, fault)
    return f


if _ENOSPC or _KILL:
    builtins.open = _open
    io.open = _open
