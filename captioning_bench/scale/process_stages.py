"""The ``memory`` and ``ddp`` stages of ``captioning-bench scale``: the input path measured in new processes.

Each probe is ``python -m captioning_bench.scale.memory`` on a store (``memory``: a small store
of whole shards, then the full one; ``ddp``: ranks reading their shares of the full store at once).
``ProcessStages`` is a base of ``captioning_bench.scale.stages.Scale``, whose fields and
``record``/``_evict``/``shards`` it uses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from captioning.utils.io import atomic_write_json, read_json
from captioning_bench.scale import memory, synthetic

MB = 2**20


class ProcessStages:
    """The stages that run the memory probe in child processes (a base of ``Scale``)."""

    def _small(self) -> tuple[Path, Path, int]:
        """A store of the first ``--memory-items`` items (rounded up to whole shards: hard links to the
        full store's shards) and its split file."""
        shards = self.shards
        rows = [len(read_json(p.with_suffix("").with_suffix(".index.json"), "index")["ids"]) for p in shards]
        keep = int(np.searchsorted(np.cumsum(rows), self.args.memory_items) + 1)
        n = int(sum(rows[:keep]))
        small = self.root / "store-small"
        ann = small / "annotations" / "dataset_coco.json"
        if not (small / "n.json").is_file() or read_json(small / "n.json", "n").get("items") != n:
            shutil.rmtree(small, ignore_errors=True)
            (small / "store" / "shards").mkdir(parents=True)
            shutil.copy(self.store / "meta.json", small / "store" / "meta.json")
            for p in shards[:keep]:
                for f in (p, p.with_suffix("").with_suffix(".index.json")):
                    os.link(f, small / "store" / "shards" / f.name)
            full = json.loads(self.annotations_path.read_text())
            kept = {synthetic.item_id(i) for i in range(n)}
            full["images"] = [im for im in full["images"] if str(im["cocoid"]) in kept]
            ann.parent.mkdir(parents=True)
            ann.write_text(json.dumps(full))
            atomic_write_json(small / "n.json", {"items": n})
        return small / "store", ann, n

    def _probe(self, store: Path, ann: Path, batches: int, workers: int, *extra: str) -> list[str]:
        return [sys.executable, "-m", "captioning_bench.scale.memory", "--store", str(store),
                "--annotations", str(ann), "--batches", str(batches), "--workers", str(workers),
                "--batch-size", str(self.args.batch_size), *extra]

    def memory(self) -> Iterator[dict[str, Any]]:
        """Peak RSS / PSS of the input path at ``--memory-items`` and at full size, each in a new process."""
        small, small_ann, n_small = self._small()
        runs = {}
        for label, store, ann, n in (("small", small, small_ann, n_small),
                                     ("full", self.store, self.annotations_path, self.total)):
            self._evict()
            cmd = self._probe(store, ann, self.args.memory_batches, self.args.memory_workers)
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"memory probe {' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
            runs[label] = {**json.loads(out.stdout.strip().splitlines()[-1]), "store_items": n}
        s, f = runs["small"], runs["full"]
        common = {"workers": self.args.memory_workers, "items_small": s["store_items"],
                  "batches": self.args.memory_batches or "epoch", "ratio_limit": 1.10}
        figures = {
            "peak_rss_main": (lambda r: r["main"]["VmHWM"], "VmHWM of the main process"),
            "pss_total": (lambda r: r["pss_total_mb"], "PSS of main + workers after the last batch"),
            "uss_workers": (lambda r: round(sum(p["Uss"] for p in r["processes"][1:]), 1),
                            "private memory (USS) of the workers after the last batch"),
            "store_mapped": (lambda r: r["store_rss_total_mb"],
                             "RSS of memory-mapped shard pages, main + workers, after the last batch"),
        }
        for name, (get, note) in figures.items():
            ratio = round(get(f) / max(get(s), 1e-9), 3)
            yield self.record(f"memory/{name}", "MiB", get(f), at_small=get(s), ratio=ratio,
                              samples_small=s["samples"], samples_full=f["samples"],
                              seconds_small=s["batches_s"], seconds_full=f["batches_s"], note=note, **common)

    def ddp(self) -> Iterator[dict[str, Any]]:
        """``--ddp-pss`` ranks read their shares of the same store; each one's RSS and PSS while all live."""
        world = self.args.ddp_pss
        if world < 2:
            return
        self._evict()
        procs = [subprocess.Popen(self._probe(self.store, self.annotations_path, self.args.ddp_batches, 0, "--rank",
                                              str(r), "--world", str(world), "--hold"),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for r in range(world)]
        try:
            results = [json.loads(p.stdout.readline()) for p in procs]
            mems = [memory.rollup(p.pid) | memory.status(p.pid) | memory.mapped(p.pid, self.store) for p in procs]
        finally:
            for p in procs:  # let them go
                if p.stdin:
                    p.stdin.write("\n")
                    p.stdin.close()
                p.wait(timeout=120)
        rss, pss = sum(m["Rss"] for m in mems), sum(m["Pss"] for m in mems)
        ranks = [{"rss": m["Rss"], "pss": m["Pss"], "uss": m["Uss"], "rss_anon": m["RssAnon"],
                  "store_rss": m["store_rss"], "store_pss": m["store_pss"], "feature_mb": round(r["feature_bytes"] / MB, 1)}
                 for m, r in zip(mems, results, strict=True)]
        store_rss, store_pss = sum(r["store_rss"] for r in ranks), sum(r["store_pss"] for r in ranks)
        yield self.record("ddp_pss", "MiB", round(pss, 1), rss_sum=round(rss, 1), pss_over_rss=round(pss / rss, 3),
                          store_rss_sum=round(store_rss, 1), store_pss_sum=round(store_pss, 1), ranks=ranks,
                          batches_per_rank=self.args.ddp_batches, world=world,
                          note="PSS counts a page mapped by k processes 1/k in each; store_*: the mapped shard pages; "
                               "feature_mb: feature bytes each rank read")
