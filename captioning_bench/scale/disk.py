"""The disk's own limits, measured where the store lives, and control of the page cache.

- ``sequential_write``: dd-like: ``nbytes`` of random data in 8 MiB writes, then ``fsync``.
- ``random_read``: fio-like: ``threads`` readers ``pread`` item-sized blocks at item offsets of the
  store's shards (the loader's access pattern, without its Python, numpy and torch work).
- ``evict``: drop files from the page cache, by ``posix_fadvise(POSIX_FADV_DONTNEED)`` on each
  file (only these files; other work on the machine keeps its cache) or by writing 3 to
  ``/proc/sys/vm/drop_caches`` (the whole machine; needs root).  ``resident_fraction`` checks the
  result with ``mincore``.
- ``read_bytes``: bytes a process and its children (DataLoader workers) made the kernel read
  from the device (``/proc/<pid>/io``), to measure read amplification.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import platform
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil

BLOCK = 8 << 20  # sequential write size


def machine(path: Path) -> dict[str, Any]:
    """Cores, RAM, free disk where ``path`` lives, CPU model (what every figure was measured on)."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cores": cores, "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "disk_free_gb": round(shutil.disk_usage(path).free / 2**30, 1), "cpu": cpu}


def sequential_write(folder: Path, nbytes: int, seed: int = 0) -> dict[str, Any]:
    """Write ``nbytes`` to a new file in ``folder`` (8 MiB writes, fsync), delete it; MB/s."""
    block = np.random.default_rng(seed).integers(0, 256, size=BLOCK, dtype=np.uint8).tobytes()
    path = folder / ".seq_write_probe"
    written = 0
    t0 = time.perf_counter()
    try:
        with open(path, "wb", buffering=0) as f:
            while written < nbytes:
                written += f.write(block[: min(BLOCK, nbytes - written)])
            os.fsync(f.fileno())
        seconds = time.perf_counter() - t0
    finally:
        path.unlink(missing_ok=True)
    return {"bytes": written, "seconds": seconds, "mb_per_s": written / 1e6 / seconds}


def _read_blocks(blocks: Sequence[tuple[str, int]], size: int) -> int:
    buf = np.empty(size, dtype=np.uint8)
    fds: dict[str, int] = {}
    try:
        for path, offset in blocks:
            fd = fds.get(path)
            if fd is None:
                fd = fds[path] = os.open(path, os.O_RDONLY)
            if os.preadv(fd, [buf], offset) != size:
                raise OSError(f"short read of {size} bytes at {offset} in {path}")
    finally:
        for fd in fds.values():
            os.close(fd)
    return len(blocks) * size


def random_read(blocks: Sequence[tuple[str, int]], size: int, threads: int = 1) -> dict[str, Any]:
    """``pread`` every (file, offset) block of ``size`` bytes with ``threads`` concurrent readers."""
    parts = [blocks[k::threads] for k in range(threads)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        nbytes = sum(pool.map(lambda p: _read_blocks(p, size), parts))
    seconds = time.perf_counter() - t0
    return {"blocks": len(blocks), "bytes": nbytes, "seconds": seconds, "items_per_s": len(blocks) / seconds,
            "mb_per_s": nbytes / 1e6 / seconds}


def evict(paths: Sequence[Path], method: str = "fadvise") -> str:
    """Drop ``paths`` from the page cache; returns the method that was used.

    ``drop_caches`` falls back to ``fadvise`` when /proc/sys/vm/drop_caches is not writable.
    """
    if method == "drop_caches":
        try:
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            return "drop_caches"
        except OSError:
            method = "fadvise"
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_fraction(paths: Sequence[Path]) -> float:
    """Fraction of the pages of ``paths`` that are in the page cache (``mincore``)."""
    libc, page = _libc(), mmap.PAGESIZE
    resident = total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        fd = os.open(p, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap of {p} failed")
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            try:
                if libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore of {p} failed")
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        resident += int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1))
        total += pages
    return resident / total if total else 0.0


def read_bytes(pid: int | None = None, children: bool = True) -> int:
    """Bytes the process ``pid`` (default: this one) and its live children read from the device."""
    proc = psutil.Process(pid)
    procs = [proc, *(proc.children(recursive=True) if children else [])]
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.io_counters().read_bytes
    return total
