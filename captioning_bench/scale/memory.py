"""Memory of the training input path, read from /proc: peak RSS, PSS and private (USS) memory.

RSS counts every page a process maps, shared or not; PSS divides each shared page among the
processes that map it (a page mapped by two processes counts half in each), so the PSS of a
set of processes sums to the memory they really use; USS (private clean + dirty) is what a
process alone holds.  DataLoader workers are forked: their RSS starts as a copy of the parent's
page table and says nothing; their USS is what they copied (copy-on-write) or allocated.

``python -m captioning_bench.scale.memory --store S --annotations A ...`` is the probe the
benchmark starts in a fresh process: the real input path (caption table, built in a child process
when the annotations are new -> vocabulary -> ``CaptionDataModule`` -> training ``DataLoader``) for ``--batches`` batches, then one JSON line
with the main process's peak RSS and every process's PSS/USS.  With ``--world 2 --rank r`` it
reads rank r's share of the samples (``DistributedSampler``, as Lightning does under DDP) and,
with ``--hold``, waits for a line on stdin after printing, so that the parent can read the PSS of
both ranks while both are alive.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from torch.utils.data import DataLoader, DistributedSampler

from captioning.data.caption_table import caption_table, table_path
from captioning.data.datamodule import CaptionDataModule, CaptionTrainDataset, collate
from captioning.store.feature_store import FeatureStore
from captioning_bench.scale.synthetic import data_config

MB = 2**20
ROLLUP_KEYS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Shared_Clean", "Shared_Dirty", "Private_Clean",
               "Private_Dirty", "Anonymous")
STATUS_KEYS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")


def _kb_fields(text: str, keys: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in keys:
            out[name] = int(rest.split()[0]) * 1024 / MB
    return out


def rollup(pid: int) -> dict[str, float]:
    """MiB of ``/proc/<pid>/smaps_rollup`` (Rss, Pss, Pss_Anon, Pss_File, private/shared) + ``Uss``."""
    m = _kb_fields(Path(f"/proc/{pid}/smaps_rollup").read_text(), ROLLUP_KEYS)
    m["Uss"] = m.get("Private_Clean", 0.0) + m.get("Private_Dirty", 0.0)
    return {k: round(v, 1) for k, v in m.items()}


def mapped(pid: int, under: str | Path) -> dict[str, float]:
    """MiB of ``Rss`` and ``Pss`` of the mappings of files under ``under`` (``/proc/<pid>/smaps``):
    the feature shards a process has memory-mapped and touched."""
    prefix = str(Path(under).resolve())
    rss = pss = 0
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(None, 5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
            inside = len(head) == 6 and head[5].startswith(prefix)
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1])
        elif inside and line.startswith("Pss:"):
            pss += int(line.split()[1])
    return {"store_rss": round(rss * 1024 / MB, 1), "store_pss": round(pss * 1024 / MB, 1)}


def status(pid: int) -> dict[str, float]:
    """MiB of ``/proc/<pid>/status``: VmHWM (peak RSS), VmRSS, RssAnon, RssFile, RssShmem."""
    return {k: round(v, 1) for k, v in _kb_fields(Path(f"/proc/{pid}/status").read_text(), STATUS_KEYS).items()}


def tree(pid: int, store: str | Path) -> dict[str, Any]:
    """The process ``pid`` and its live children: each one's rollup, status and mapped ``store``
    pages, and the sums of PSS, USS and mapped store pages."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    each = []
    for p in procs:
        with contextlib.suppress(OSError, psutil.Error):
            each.append({"pid": p.pid, **rollup(p.pid), **status(p.pid), **mapped(p.pid, store)})
    return {"processes": each, "pss_total_mb": round(sum(e.get("Pss", 0) for e in each), 1),
            "uss_total_mb": round(sum(e.get("Uss", 0) for e in each), 1),
            "store_rss_total_mb": round(sum(e.get("store_rss", 0) for e in each), 1)}


def _loader(args: argparse.Namespace) -> tuple[DataLoader, dict[str, float]]:
    clock = {}
    t = time.perf_counter()
    cfg = data_config(Path(args.annotations))
    built = not table_path(cfg).is_file()
    table = caption_table(cfg)  # built first (in a child process) when its inputs are new
    clock["annotations_s"] = time.perf_counter() - t
    clock["table_built"] = built
    vocab = table.vocabulary(min_count=cfg.min_count)
    store = FeatureStore.open(args.store)
    dm = CaptionDataModule(table, store, vocab, batch_size=args.batch_size, num_workers=args.workers,
                           batching="caption")  # one sample per caption, as the figures of docs/at_scale.md
    clock["setup_s"] = time.perf_counter() - t
    if args.world == 1:
        return dm.train_dataloader(), clock
    ds = CaptionTrainDataset(dm.items["train"], vocab, dm.max_length)
    sampler = DistributedSampler(ds, num_replicas=args.world, rank=args.rank, shuffle=True, seed=0)
    return DataLoader(ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                      collate_fn=collate, persistent_workers=args.workers > 0), clock


def probe(args: argparse.Namespace) -> tuple[dict[str, Any], DataLoader]:
    """Run the input path for ``args.batches`` batches (0: one epoch); memory and timings, and the
    loader (whose store keeps its shards mapped while it lives)."""
    loader, clock = _loader(args)
    rss_before = status(psutil.Process().pid)["VmRSS"]
    t = time.perf_counter()
    samples = nbytes = 0
    it = iter(loader)
    for k, batch in enumerate(it):
        samples += batch.features.shape[0]
        nbytes += batch.features.numel() * batch.features.element_size()
        if args.batches and k + 1 >= args.batches:
            break
    clock["batches_s"] = time.perf_counter() - t
    mem = tree(psutil.Process().pid, args.store)  # workers still alive (the iterator holds them)
    main = status(psutil.Process().pid)
    del it
    return {"samples": samples, "feature_bytes": nbytes, "rss_before_loop_mb": rss_before, "main": main, **mem,
            **{k: round(v, 2) if isinstance(v, float) else v for k, v in clock.items()}}, loader


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m captioning_bench.scale.memory")
    p.add_argument("--store", required=True)
    p.add_argument("--annotations", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=0, help="0: one epoch")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--hold", action="store_true", help="after printing, wait for a line on stdin")
    args = p.parse_args(argv)
    result, loader = probe(args)
    print(json.dumps(result), flush=True)
    if args.hold:  # the loader (and what its store maps) lives until the parent has measured
        sys.stdin.readline()
    del loader
    return 0


if __name__ == "__main__":
    sys.exit(main())
