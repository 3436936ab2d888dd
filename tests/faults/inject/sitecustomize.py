"""Fault injection and probes for the CLI processes of the fault suite (never imported by the package).

Python imports ``sitecustomize`` at start-up from ``sys.path``: the fault tests put this folder on
``PYTHONPATH`` of the CLI they launch (the DDP ranks Lightning relaunches inherit it) and choose
what happens with environment variables.  Nothing happens unless one of them is set.

``CAPTIONING_FAULT="<action>:<point>:<substring>:<n>"`` -- one fault, at a chosen commit step.

  ``action``   ``kill``: SIGKILL this process (the OOM killer, a pre-emption);
               ``enospc``: the operation fails with ``OSError(ENOSPC)`` (a full disk), and the
               disk stays full: from then on the first non-empty ``write()`` to any file opened
               for writing fails the same way (files opened before, such as log files, still
               work).
  ``substring`` only files whose path contains it count (a temp file of an atomic write is named
               ``.<final name>.<host>-<pid>.<random>.tmp`` beside its target, so ``last.ckpt``
               also matches the checkpoint's temp file, ``r000-000002.npy`` one feature shard's
               data file).
  ``n``        the first ``n`` matching events pass; the fault hits the ``n+1``-th.

  The points, in the order an atomic write (``captioning.utils.io.atomic_write``) meets them:

  ``write@K``   a file opened for writing (``open``/``io.open``: ``np.save``, ``Path.write_bytes``,
                the JSON and CSV writers): once exactly ``K`` bytes (characters, in text mode)
                are written to it, i.e. the ``write()`` that would cross byte ``K`` writes the
                bytes before it, flushes them and then the fault happens (``K=0``: before the
                first byte).  The tests draw ``K`` with a seeded generator below the size of
                the file in an uninterrupted run.
  ``fsync``     ``os.fsync`` of a descriptor of a matching file (its path read from
                ``/proc/self/fd``), before it runs (the write is complete; ``enospc``: fsync
                reports the full disk, as delayed allocation does).
  ``fsynced``   the same ``os.fsync``, after it returned (``kill`` only).
  ``replace``   ``os.replace``/``os.rename`` with a matching source or destination, before it
                runs (``enospc``: the directory cannot grow; the error names both paths, as a
                failed rename's does).
  ``replaced``  the same rename, after it returned (``kill`` only): the file is committed, what
                follows is not; for a feature shard's ``.npy`` this is the window between the
                data file and its index, the store's commit point.
  ``step``      the ``n+1``-th optimizer step, after it ran (``kill`` only; ``substring`` is
                ignored): a training job killed mid-epoch, at a chosen step.

``CAPTIONING_PROBE_DIR=<folder>`` -- what a process did, for the tests to check.
  Every process (each DDP rank too) appends JSON lines to ``<folder>/<pid>.jsonl``, written with
  ``os.write`` right away so that a killed process leaves its record:
  ``{"event": "start", "pid", "rank", "world_size", "argv"}`` (``rank``/``world_size`` from the
  environment Lightning sets for its ranks, ``null`` in a launching process);
  ``{"event": "optimizer_step"}`` after every optimizer step (``torch.optim`` global hook);
  ``{"event": "all_gather_object", "rank", "world_size", "payload"}`` for every
  ``torch.distributed.all_gather_object`` call, ``payload`` being what this rank contributed
  (tuples as lists, arrays as their shape, other objects as ``repr``).
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import signal
import sys

_real_open = builtins.open
_real_fsync = os.fsync
_real_replace = os.replace
_real_rename = os.rename

POINTS = {"write", "fsync", "fsynced", "replace", "replaced", "step"}
KILL_ONLY = {"fsynced", "replaced", "step"}


class _Fault:
    """The parsed ``CAPTIONING_FAULT`` and its event counter."""

    def __init__(self, spec: str) -> None:
        try:
            action, point, rest = spec.split(":", 2)
            substring, _, n = rest.rpartition(":")
            self.n = int(n)
        except ValueError:
            raise SystemExit(f"CAPTIONING_FAULT={spec!r}: expected <action>:<point>:<substring>:<n>") from None
        self.offset = None
        if point.startswith("write@"):
            point, self.offset = "write", int(point[len("write@"):])
        if action not in ("kill", "enospc") or point not in POINTS or (action == "enospc" and point in KILL_ONLY):
            raise SystemExit(f"CAPTIONING_FAULT={spec!r}: unknown action/point (see {__file__})")
        self.action, self.point, self.substring = action, point, substring
        self.seen = 0
        self.disk_full = False

    def hits(self, point: str, *paths: object) -> bool:
        """Count a matching event at ``point``; True for the one that faults."""
        if point != self.point:
            return False
        if point != "step":
            names = [os.fsdecode(os.fspath(p)) for p in paths if isinstance(p, (str, bytes, os.PathLike))]
            if not any(self.substring in name for name in names):
                return False
        self.seen += 1
        return self.seen == self.n + 1

    def fire(self, src=None, dst=None) -> None:
        """SIGKILL, or the ``OSError`` a full disk gives (a failed rename names both of its paths)."""
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        self.disk_full = True
        if src is not None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src, None, dst)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _CountingFile:
    """A file opened for writing whose ``K``-th byte is where the fault happens."""

    def __init__(self, f, fault: _Fault, offset: int) -> None:
        self._f = f
        self._fault = fault
        self._left = offset

    def write(self, data):
        view = data if isinstance(data, str) else memoryview(data).cast("B")
        if len(view) > self._left:
            self._f.write(view[: self._left])
            self._f.flush()
            self._left = 0
            self._fault.fire()
        self._left -= len(view)
        return self._f.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __iter__(self):
        return iter(self._f)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()
        return False


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def install_fault(fault: _Fault) -> None:
    """Wrap the library calls the chosen point needs."""
    if fault.point == "write" or fault.action == "enospc":
        def _open(file, mode="r", *args, **kwargs):
            f = _real_open(file, mode, *args, **kwargs)
            if any(c in mode for c in "wax+"):
                if fault.disk_full:
                    return _CountingFile(f, fault, 0)
                if fault.point == "write" and fault.hits("write", file):
                    return _CountingFile(f, fault, fault.offset)
            return f

        builtins.open = _open
        io.open = _open
    if fault.point in ("fsync", "fsynced"):
        def _fsync(fd):
            fileno = fd if isinstance(fd, int) else fd.fileno()
            hit = fault.hits(fault.point, _fd_path(fileno))
            if hit and fault.point == "fsync":
                fault.fire()
            _real_fsync(fd)
            if hit:
                fault.fire()

        os.fsync = _fsync
    elif fault.point in ("replace", "replaced"):
        def _wrap(real):
            def _rename(src, dst, *args, **kwargs):
                hit = fault.hits(fault.point, src, dst)
                if hit and fault.point == "replace":
                    fault.fire(src, dst)
                real(src, dst, *args, **kwargs)
                if hit:
                    fault.fire()
            return _rename

        os.replace = _wrap(_real_replace)
        os.rename = _wrap(_real_rename)
    elif fault.point == "step":
        _after_import("torch.optim.optimizer", lambda m: m.register_optimizer_step_post_hook(
            lambda *a: fault.fire() if fault.hits("step") else None))


# --------------------------------------------------------------------------------- probes


def _jsonable(obj, depth: int = 0):
    if depth > 6:
        return repr(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [_jsonable(x, depth + 1) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in obj.items()}
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):
        return {"shape": list(obj.shape)}
    return repr(obj)


class _Probe:
    def __init__(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"{os.getpid()}.jsonl")

    def record(self, **event) -> None:
        line = (json.dumps(event) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def _env_int(name: str):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def install_probe(probe: _Probe) -> None:
    probe.record(event="start", pid=os.getpid(), rank=_env_int("RANK"), world_size=_env_int("WORLD_SIZE"),
                 argv=sys.argv)

    def optimizer_hooks(module) -> None:
        module.register_optimizer_step_post_hook(lambda *a: probe.record(event="optimizer_step"))

    def gather_hooks(dist) -> None:
        real = dist.all_gather_object

        def all_gather_object(object_list, obj, group=None):
            probe.record(event="all_gather_object", rank=dist.get_rank(), world_size=dist.get_world_size(),
                         payload=_jsonable(obj))
            return real(object_list, obj, group=group)

        dist.all_gather_object = all_gather_object

    _after_import("torch.optim.optimizer", optimizer_hooks)
    _after_import("torch.distributed", gather_hooks)


# ------------------------------------------------------------------- post-import hooks


_pending: dict[str, list] = {}


class _AfterImport:
    """A meta-path finder that runs callbacks once a module is imported (torch is not imported
    here eagerly: most faulted processes would pay for it before the CLI even parses its args)."""

    def find_spec(self, name, path=None, target=None):
        if name not in _pending:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            for callback in _pending.pop(name, []):
                callback(module)

        spec.loader.exec_module = exec_module
        return spec


def _after_import(name: str, callback) -> None:
    if name in sys.modules:
        callback(sys.modules[name])
        return
    _pending.setdefault(name, []).append(callback)
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


def install_from_environment() -> None:
    """Install what the environment asks for (at start-up; ``forkserver.py`` calls it again in a
    forked child, after setting the child's environment)."""
    if os.environ.get("CAPTIONING_PROBE_DIR"):  # first: it records a step before a fault kills there
        install_probe(_Probe(os.environ["CAPTIONING_PROBE_DIR"]))
    if os.environ.get("CAPTIONING_FAULT"):
        install_fault(_Fault(os.environ["CAPTIONING_FAULT"]))


install_from_environment()
