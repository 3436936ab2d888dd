"""The store writer against a plain sequential write of the same bytes, in the same folder.

``store_write``: ``items`` items of [positions, dim] fp16 through ``FeatureStoreWriter`` (``add`` of
each, shard commits with their fsyncs, ``close``), timed from the first ``add`` to the end of
``close``; the items cycle through a pool of one shard of distinct random items drawn before the
clock starts.  Twice: with ``add(copy=False)`` (the writer keeps the caller's array, as extraction
adds its batches) and with ``add``'s default copy of each item.  ``plain_write``: the same number of bytes from the same pool written to one file in
8 MiB writes, then one ``fsync``: what the disk (or, on tmpfs, the kernel's page cache) takes
without the store.  The two alternate ``repeats`` times (so that a change of the machine's load
hits both) and each ratio is store / plain of one round: of their wall times (``ratio``) and of the
CPU seconds they took (``cpu_ratio``: plain / store, the writer's own cost whatever else runs; the
writer's two threads overlap only where a core is free).  On tmpfs (``/dev/shm``) the disk does not
hide the writer's own cost; on a disk the ratio says how close the store comes to the disk.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from captioning.store.writer import FeatureStoreWriter
from captioning_bench.scale import synthetic

BLOCK = 8 << 20  # bytes per write of the plain write


def filesystem(path: Path) -> str:
    """The filesystem type of the mount that holds ``path`` (``/proc/mounts``; ``unknown`` elsewhere)."""
    best, kind = "", "unknown"
    target = str(Path(path).resolve())
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and (target == fields[1] or target.startswith(fields[1].rstrip("/") + "/")) \
                and len(fields[1]) > len(best):
            best, kind = fields[1], fields[2]
    return kind


def item_pool(n: int, positions: int, dim: int, seed: int) -> np.ndarray:
    """``n`` distinct items [n, positions, dim] float16, N(0, 1)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, positions, dim), dtype=np.float32).astype(np.float16)


def store_write(folder: Path, pool: np.ndarray, items: int, copy: bool = False,
                seconds: float | None = None) -> dict[str, Any]:
    """``items`` items (cycling through ``pool``; fewer when ``seconds`` have passed) into a new store in
    ``folder``: the seconds from the first ``add`` to the end of ``close``, the items and the bytes."""
    shutil.rmtree(folder, ignore_errors=True)
    n, positions, dim = pool.shape
    meta = {"settings": {"backbone": "synthetic-random", "weights": "none"}, "kind": "image",
            "positions": positions, "dim": dim, "grid": None, "dtype": "float16"}
    t, cpu = time.perf_counter(), _cpu()
    with FeatureStoreWriter(folder, meta, shard_size=synthetic.SHARD_SIZE) as writer:
        for i in range(items):
            writer.add(str(i), pool[i % n], copy=copy)
            if seconds is not None and i % 64 == 63 and time.perf_counter() - t >= seconds:
                items = i + 1
                break
    elapsed, cpu = time.perf_counter() - t, _cpu() - cpu
    data = sum(p.stat().st_size for p in (folder / "shards").glob("*.npy"))
    shutil.rmtree(folder, ignore_errors=True)
    return {"seconds": elapsed, "cpu_seconds": cpu, "data_bytes": data, "items": items}


def plain_write(folder: Path, pool: np.ndarray, nbytes: int) -> dict[str, Any]:
    """``nbytes`` of ``pool``'s bytes (cycling) to one new file in 8 MiB writes, then ``fsync``."""
    source = memoryview(pool.reshape(-1).view(np.uint8))
    path = folder / ".plain_write_probe"
    folder.mkdir(parents=True, exist_ok=True)
    written, offset = 0, 0
    t, cpu = time.perf_counter(), _cpu()
    try:
        with open(path, "wb", buffering=0) as f:
            while written < nbytes:
                size = min(BLOCK, nbytes - written, len(source) - offset)
                written += f.write(source[offset: offset + size])
                offset = (offset + size) % len(source)
            os.fsync(f.fileno())
        seconds, cpu = time.perf_counter() - t, _cpu() - cpu
    finally:
        path.unlink(missing_ok=True)
    return {"seconds": seconds, "cpu_seconds": cpu, "bytes": written}


def _cpu() -> float:
    """CPU seconds of this process so far, all its threads, user and kernel."""
    return time.process_time()


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > 0 else None


def compare(folder: Path, items: int, positions: int, dim: int, repeats: int = 3, seed: int = 0) -> dict[str, Any]:
    """The store writer (``add(copy=False)``, as extraction calls it, and ``add`` copying each item) vs
    the plain write of its bytes, alternated ``repeats`` times: MB/s of each round and, for each way
    of adding, the round of the median ratio."""
    pool = item_pool(min(items, synthetic.SHARD_SIZE), positions, dim, seed)
    rounds: list[dict[str, Any]] = []
    for _ in range(repeats):
        kept = store_write(folder / "store", pool, items, copy=False)
        copied = store_write(folder / "store", pool, items, copy=True)
        plain = plain_write(folder, pool, kept["data_bytes"])
        rounds.append({"data_bytes": kept["data_bytes"], "plain_mb_per_s": _mb_per_s(plain),
                       "store_mb_per_s": _mb_per_s(kept), "copied_mb_per_s": _mb_per_s(copied),
                       "ratio": _ratio(plain["seconds"], kept["seconds"]),
                       "copied_ratio": _ratio(plain["seconds"], copied["seconds"]),
                       "cpu_ratio": _ratio(plain["cpu_seconds"], kept["cpu_seconds"]),
                       "copied_cpu_ratio": _ratio(plain["cpu_seconds"], copied["cpu_seconds"])})
    return {"store": _median(rounds, "ratio"), "copied": _median(rounds, "copied_ratio"), "rounds": rounds,
            "filesystem": filesystem(folder)}


def _mb_per_s(run: dict[str, Any]) -> float:
    """MB/s to 4 significant digits."""
    return float(f"{run.get('data_bytes', run.get('bytes', 0)) / 1e6 / run['seconds']:.4g}")


def _median(rounds: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The round whose ``key`` is the median (the upper one of an even count)."""
    return sorted(rounds, key=lambda r: r[key])[len(rounds) // 2]
