"""Timing a DataLoader as the training loop sees it, and the cost of moving a batch at all.

``drain`` takes ``steps`` batches and touches every page of each batch's features once (as the
copy to the device does): a batch built in a worker lives in shared memory, and its pages are
faulted into the main process only when something reads them.  ``EmptyBatches`` yields batches
of the store's shape with nothing read into them (allocated in shared memory inside a worker,
like the data module's): a loader over it runs at the transfer limit, what allocating, passing
and touching batches costs with that many workers on this machine, whatever the reads cost.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

PAGE = 4096


def touch(t: torch.Tensor) -> int:
    """Read one byte of every page of ``t`` (faults its pages in, reads almost nothing)."""
    return int(t.reshape(-1).view(torch.uint8)[::PAGE].sum())


def features_of(batch: Any) -> torch.Tensor:
    return batch if isinstance(batch, torch.Tensor) else batch.features


def scheduler_seconds() -> dict[int, tuple[float, float]]:
    """(seconds on a CPU, seconds runnable but waiting for one) so far, summed over the threads of
    this process and of each live child, by pid (``/proc/<pid>/task/*/schedstat``)."""
    out = {}
    for p in (psutil.Process(), *psutil.Process().children(recursive=True)):
        run = wait = 0
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p.pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError):
                    on_cpu, waiting, _ = Path(task, "schedstat").read_text().split()
                    run, wait = run + int(on_cpu), wait + int(waiting)
            out[p.pid] = (run / 1e9, wait / 1e9)
    return out


def drain(loader: DataLoader, steps: int) -> dict[str, Any]:
    """Items/s and MB/s over ``steps - 1`` batches after the first (which pays for starting the
    workers), every batch touched; the first batch's latency apart; per batch, the milliseconds
    the main process and the workers ran on a CPU and waited for one (other work on the machine)."""
    t0 = time.perf_counter()
    it = iter(loader)
    touch(features_of(next(it)))
    t1 = time.perf_counter()
    sched0 = scheduler_seconds()
    samples = nbytes = 0
    for _ in range(steps - 1):
        feats = features_of(next(it))
        touch(feats)
        samples += feats.shape[0]
        nbytes += feats.numel() * feats.element_size()
    t2 = time.perf_counter()
    sched1 = scheduler_seconds()
    del it
    batches, main = max(1, steps - 1), os.getpid()

    def ms(pids: list[int], k: int) -> float:
        return round(1e3 * sum(sched1[p][k] - sched0.get(p, (0.0, 0.0))[k] for p in pids) / batches, 1)

    workers = [p for p in sched1 if p != main]
    return {"items_per_s": round(samples / (t2 - t1), 1), "mb_per_s": round(nbytes / 1e6 / (t2 - t1), 1),
            "samples": samples, "bytes": nbytes, "first_batch_s": round(t1 - t0, 2),
            "ms_per_batch": round(1e3 * (t2 - t1) / batches, 1), "cpu_main_ms": ms([main], 0),
            "wait_main_ms": ms([main], 1), "cpu_workers_ms": ms(workers, 0), "wait_workers_ms": ms(workers, 1)}


class EmptyBatches(Dataset):
    """``items`` items of [positions, dim] ``dtype`` features in batches, nothing read into them."""

    def __init__(self, items: int, positions: int, dim: int, dtype: torch.dtype = torch.float16) -> None:
        self.items, self.shape, self.dtype = items, (positions, dim), dtype

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, k: int) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype)

    def __getitems__(self, ks: list[int]) -> torch.Tensor:
        feats = torch.empty((len(ks), *self.shape), dtype=self.dtype)
        if get_worker_info() is not None:
            feats.share_memory_()  # where FeatureItems.batch puts a worker's batch
        else:
            touch(feats)  # as the reads into it would
        return feats


def _as_is(batch: Any) -> Any:
    return batch


def transfer_limit(items: int, positions: int, dim: int, batch_size: int, workers: int, steps: int) -> dict[str, Any]:
    """``drain`` of a shuffled loader over ``EmptyBatches`` with ``workers`` workers."""
    loader = DataLoader(EmptyBatches(items, positions, dim), batch_size=batch_size, shuffle=True,
                        num_workers=workers, collate_fn=_as_is)
    return drain(loader, min(steps, len(loader)))
