"""The stages of ``captioning-bench scale`` (see the package docstring): each a generator of records.

``memory`` and ``ddp``, which measure in new processes, are in ``captioning_bench.scale.process_stages``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from captioning.config import CONF_DIR, TrainerConfig
from captioning.data.caption_table import build_table, caption_table, table_path
from captioning.data.datamodule import CaptionDataModule, CaptionTrainDataset
from captioning.errors import ConfigError
from captioning.evaluation.job import EvaluateConfig, evaluate
from captioning.models.search import DecodeConfig
from captioning.store.feature_store import FeatureStore
from captioning.train.module import CaptioningModule
from captioning.utils.io import atomic_write_json, read_json
from captioning_bench import train as train_bench
from captioning_bench.scale import disk, loading, synthetic, write
from captioning_bench.scale.process_stages import ProcessStages

GB = 1e9
INDEX_BYTES_PER_ITEM = 64  # shard index json per item, generous (ids, valid, null frame indices)
CAPTION_FILE_BYTES = 200  # split-file bytes per caption, generous


def fit_shape(items: int, grid: int, dim: int, available: float) -> tuple[int, int]:
    """The largest [grid, dim] whose fp16 store of ``items`` fits in ``available`` bytes: the grid
    side halved first (14x14x2048 -> 7x7x2048), then the dim."""
    while items * (grid * grid * dim * 2 + INDEX_BYTES_PER_ITEM) > available and (grid > 1 or dim > 1):
        if grid > 1:
            grid //= 2
        else:
            dim //= 2
    return grid, dim


def _rate(n: float, seconds: float) -> float:
    return round(n / seconds, 1) if seconds > 0 else float("inf")


@dataclass
class Scale(ProcessStages):
    """One run: where its files are, the shape it runs at, the limits measured so far."""

    args: argparse.Namespace
    root: Path
    grid: int
    dim: int
    requested: tuple[int, int]
    machine: dict[str, Any]
    limits: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    decoder_rate: float | None = None
    _data: dict[str, Any] | None = None

    # ------------------------------------------------------------------ set-up
    @classmethod
    def prepare(cls, args: argparse.Namespace) -> Scale:
        root = Path(args.root or Path(tempfile.gettempdir()) / "captioning-bench-scale")
        root.mkdir(parents=True, exist_ok=True)
        total = args.items + 2 * args.eval_items
        ours = root / "build.json"
        reclaimable = sum(p.stat().st_size for p in (root / "store").rglob("*") if p.is_file()) if ours.is_file() else 0
        free = shutil.disk_usage(root).free + reclaimable
        overhead = args.disk_write_gb * GB + total * args.captions_per_item * CAPTION_FILE_BYTES
        grid, dim = fit_shape(total, args.grid, args.dim, free - args.keep_free_gb * GB - overhead)
        return cls(args, root, grid, dim, (args.grid, args.dim), disk.machine(root))

    @property
    def total(self) -> int:
        return self.args.items + 2 * self.args.eval_items

    @property
    def positions(self) -> int:
        return self.grid * self.grid

    @property
    def item_bytes(self) -> int:
        return self.positions * self.dim * 2

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def annotations_path(self) -> Path:
        return self.root / "annotations" / "dataset_coco.json"

    @property
    def shards(self) -> list[Path]:
        return sorted((self.store / "shards").glob("*.npy"))

    def record(self, name: str, unit: str, value: Any, **fields: Any) -> dict[str, Any]:
        limit = fields.get("limit")
        if isinstance(limit, (int, float)) and limit and "ratio" not in fields and isinstance(value, (int, float)):
            fields["ratio"] = round(value / limit, 3)
        return {"name": f"scale/{name}", "unit": unit, "value": value, **fields, "items": self.total,
                "shape": f"{self.grid}x{self.grid}x{self.dim}", "item_bytes": self.item_bytes,
                "device": self.args.device, "machine": self.machine, "load_1m": round(os.getloadavg()[0], 2)}

    def fit_record(self) -> Iterator[dict[str, Any]]:
        g, d = self.requested
        if (g, d) != (self.grid, self.dim):
            need = self.total * g * g * d * 2 / GB
            yield self.record("fit", "GB", round(need, 1), requested=f"{g}x{g}x{d}",
                              note=f"a {g}x{g}x{d} store of {self.total} items ({need:.1f} GB) would leave less than "
                                   f"{self.args.keep_free_gb:g} GB free: running at {self.grid}x{self.grid}x{self.dim}")

    # ------------------------------------------------------------------ build
    def _spec(self) -> dict[str, Any]:
        a = self.args
        return {"items": a.items, "eval_items": a.eval_items, "grid": self.grid, "dim": self.dim,
                "captions_per_item": a.captions_per_item, "vocab": a.vocab, "seed": a.seed}

    def build(self) -> Iterator[dict[str, Any]]:
        """Write the store and the split file (or reuse them); store write rate vs dd-like writes."""
        saved = self.root / "build.json"
        if saved.is_file() and not self.args.rebuild and self.store.is_dir():
            previous = read_json(saved, "scale benchmark build record")
            if previous.get("spec") == self._spec():
                for r in previous["records"]:
                    yield {**r, "reused": True}
                return
        if (self.store.exists() or self.annotations_path.exists()) and not saved.is_file():
            raise ConfigError(f"{self.root} holds a store or split file this benchmark did not write: "
                              f"choose another --root")
        saved.unlink(missing_ok=True)
        for folder in (self.store, self.root / "store-small", self.annotations_path.parent):
            shutil.rmtree(folder, ignore_errors=True)
        seq = disk.sequential_write(self.root, int(self.args.disk_write_gb * GB), self.args.seed)
        written = synthetic.write_store(self.store, self.total, self.grid, self.dim, self.args.seed)
        ann = synthetic.write_annotations(self.annotations_path, self.total, self.args.eval_items,
                                          self.args.captions_per_item, self.args.vocab, self.args.seed)
        records = [
            self.record("disk_sequential_write", "MB/s", round(seq["mb_per_s"], 1), bytes=seq["bytes"],
                        seconds=round(seq["seconds"], 2), note="8 MiB writes of random data, then fsync"),
            self.record("store_build", "MB/s", round(written["data_bytes"] / 1e6 / written["seconds"], 1),
                        items_per_s=_rate(self.total, written["seconds"]), data_bytes=written["data_bytes"],
                        expected_data_bytes=self.total * self.item_bytes, index_bytes=written["index_bytes"],
                        shards=written["shards"], seconds=round(written["seconds"], 1),
                        random_draw_s=round(written["draw_s"], 1),
                        note="the store built: random fp16 drawn (draw_s) and written by FeatureStoreWriter, whose "
                             "thread writes while the next items are drawn; the writer alone: store_write"),
            self.record("split_file", "captions", ann["captions"], **ann),
        ]
        atomic_write_json(saved, {"spec": self._spec(), "records": records})
        yield from records

    # ------------------------------------------------------------------ write
    def write(self) -> Iterator[dict[str, Any]]:
        """The store writer vs a plain sequential write of the same bytes in ``--write-root`` (alternated;
        fewer items than ``--write-items`` where the folder has not the room for them: ``requested``)."""
        a = self.args
        folder = Path(a.write_root) if a.write_root else self.root / "write"
        folder.mkdir(parents=True, exist_ok=True)
        items = max(1, min(a.write_items, int(0.8 * shutil.disk_usage(folder).free / self.item_bytes)))
        r = write.compare(folder, items, self.positions, self.dim, a.write_repeats, a.seed)
        common = {"write_items": items, "requested": a.write_items, "folder": str(folder),
                  "filesystem": r["filesystem"], "tmpfs": r["filesystem"] == "tmpfs", "repeats": a.write_repeats,
                  "rounds": r["rounds"]}
        for name, key, speed, how in (("store_write", "ratio", "store_mb_per_s", "add(copy=False), as extraction"),
                                      ("store_write_copied", "copied_ratio", "copied_mb_per_s", "add copying each item")):
            m = r["store" if key == "ratio" else "copied"]
            yield self.record(name, "MB/s", m[speed], limit=m["plain_mb_per_s"], ratio=m[key], **common,
                              note=f"FeatureStoreWriter, {how}, shard commits with their fsyncs, close; limit: the "
                                   f"same bytes in 8 MiB writes + fsync, same folder; the round of the median ratio")

    # ------------------------------------------------------------------ disk
    def _blocks(self, n: int, seed: int) -> list[tuple[str, int]]:
        """(shard path, byte offset) of ``n`` distinct random items."""
        layout = []
        for path in self.shards:
            header = np.load(path, mmap_mode="r")  # maps, reads nothing but the .npy header
            layout.append((str(path), header.offset, header.shape[0]))
            del header
        where = [(p, off + r * self.item_bytes) for p, off, rows in layout for r in range(rows)]
        pick = np.random.default_rng(seed).choice(len(where), size=min(n, len(where)), replace=False)
        return [where[i] for i in pick]

    def _evict(self) -> dict[str, Any]:
        method = disk.evict(self.shards, self.args.cold)
        return {"cold_method": method, "resident_after_evict": round(disk.resident_fraction(self.shards), 4)}

    def disk(self) -> Iterator[dict[str, Any]]:
        """The random-read limit: ``pread`` of item-sized blocks by 1..max(workers) readers."""
        blocks = self._blocks(self.args.read_items, self.args.seed + 7)
        for readers in sorted({max(1, w) for w in self.args.workers}):
            cold_info = self._evict()
            for cache in ("cold", "warm"):  # warm: the same blocks again, now in the page cache
                r = disk.random_read(blocks, self.item_bytes, readers)
                self.limits[(cache, readers)] = r
                yield self.record("random_read_limit", "items/s", round(r["items_per_s"], 1), cache=cache,
                                  readers=readers, mb_per_s=round(r["mb_per_s"], 1), blocks=r["blocks"],
                                  bytes=r["bytes"], **(cold_info if cache == "cold" else {}))

    # ------------------------------------------------------------------ annotations
    def _load_data(self, clock: dict[str, float] | None = None) -> dict[str, Any]:
        clock = {} if clock is None else clock
        cfg = synthetic.data_config(self.annotations_path)
        t = time.perf_counter()
        build_table(cfg, table_path(cfg))  # timed here, in this process (training builds it in a child)
        clock["read"] = time.perf_counter() - t
        t = time.perf_counter()
        table = caption_table(cfg)
        clock["table_open"] = time.perf_counter() - t
        t = time.perf_counter()
        vocab = table.vocabulary(min_count=cfg.min_count)
        clock["vocabulary"] = time.perf_counter() - t
        t = time.perf_counter()
        dm = CaptionDataModule(table, FeatureStore.open(self.store), vocab, batch_size=self.args.batch_size,
                               num_workers=0, batching="caption")
        clock["datamodule"] = time.perf_counter() - t
        t = time.perf_counter()
        train = CaptionTrainDataset(dm.items["train"], vocab, dm.max_length)
        clock["train_dataset"] = time.perf_counter() - t
        return {"table": table, "vocab": vocab, "dm": dm, "train": train, "cfg": cfg}

    @property
    def data(self) -> dict[str, Any]:
        if self._data is None:
            self._data = self._load_data()
        return self._data

    def annotations(self) -> Iterator[dict[str, Any]]:
        """Split file -> records -> vocabulary -> data module (references tokenized) -> train samples."""
        clock: dict[str, float] = {}
        self._data = self._load_data(clock)
        captions = len(self._data["table"].caption_offsets) - 1
        train_captions = len(self._data["train"])
        notes = {"read": "build_table: read_dataset (json + records), every caption tokenized, the table written "
                         "(once per annotation file)",
                 "table_open": "caption_table: the inputs hashed, the table's checksum verified, mapped",
                 "vocabulary": "CaptionTable.vocabulary (from the table's train counts)",
                 "datamodule": "CaptionDataModule: FeatureStore.open + each split's rows",
                 "train_dataset": "CaptionTrainDataset: each sample's item and caption index"}
        for step, seconds in clock.items():
            yield self.record(f"annotations/{step}", "s", round(seconds, 2), captions=captions,
                              train_captions=train_captions, vocabulary=len(self._data["vocab"]), note=notes[step])
        yield self.record("annotations/total", "s", round(sum(clock.values()), 2), captions=captions,
                          captions_per_s=_rate(captions, sum(clock.values())))

    # ------------------------------------------------------------------ decoder
    def decoder(self) -> Iterator[dict[str, Any]]:
        """Training steps of the default soft-attention LSTM decoder at the loader's batch and shape."""
        model = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "model" / "soft_attention.yaml"))
        a = argparse.Namespace(
            device=self.args.device, batch_size=self.args.batch_size, regions=self.positions,
            feature_dim=self.dim, hidden=model["hidden_dim"], attention_dim=model["attention_dim"],
            embed=model["embed_dim"], vocab=self.args.vocab + 4, length=14, steps=5, warmup=1, amp="auto",
            compile=False, deep_output=model["deep_output"], threads=0, seed=self.args.seed, skip_baseline=True)
        r = train_bench.run(a)[0]
        self.decoder_rate = r["value"]
        yield self.record("decoder_step", "items/s", r["value"], best=r["best"], batch_size=self.args.batch_size,
                          amp=r["amp"], note="forward + backward + Adam, default soft_attention model, "
                                             "captions of 7-14 words (COCO-like)")

    # ------------------------------------------------------------------ loader
    def _time_loader(self, workers: int, cache: str) -> dict[str, Any]:
        dm, train = self.data["dm"], self.data["train"]
        dm.num_workers = workers
        train.items.store = FeatureStore.open(self.store)  # a new process's store: no shard mapped yet
        info = self._evict() if cache == "cold" else {}
        torch.manual_seed(self.args.seed)  # the same shuffle: warm reads what cold read
        loader = dm._loader(train, self.args.batch_size, shuffle=True)
        before = disk.read_bytes()
        r = loading.drain(loader, min(self.args.steps, len(loader)))
        r["device_read_bytes"] = disk.read_bytes() - before  # workers still alive: their reads count
        del loader
        gc.collect()
        return {**r, **info}

    def _limit(self, cache: str, workers: int, transfer: dict[str, Any]) -> dict[str, Any]:
        """The lower of the random-read limit at as many readers and the transfer limit."""
        read = self.limits.get((cache, max(1, workers)))
        options = {"transfer_limit": transfer["items_per_s"]}
        if read:
            options["random_read_limit"] = round(read["items_per_s"], 1)
        name = min(options, key=options.__getitem__)
        return {"limit": options[name], "limit_name": name, **options}

    def loader(self) -> Iterator[dict[str, Any]]:
        """The training loader, shuffled, per worker count, cold then warm page cache, every batch
        touched; against the lower of the random-read and the transfer limit."""
        for workers in self.args.workers:
            transfer = loading.transfer_limit(len(self.data["train"]), self.positions, self.dim,
                                              self.args.batch_size, workers, self.args.steps)
            yield self.record("transfer_limit", "items/s", transfer["items_per_s"], workers=workers,
                              batch_size=self.args.batch_size, ms_per_batch=round(1e3 * self.args.batch_size
                                                                                  / transfer["items_per_s"], 2),
                              note="empty batches of this shape (shared memory in workers), touched: no reads")
            for cache in ("cold", "warm"):
                r = self._time_loader(workers, cache)
                extra = self._limit(cache, workers, transfer)
                if self.decoder_rate:
                    extra["decoder_items_per_s"] = self.decoder_rate
                    extra["vs_decoder"] = round(r["items_per_s"] / self.decoder_rate, 2)
                read_amp = r["device_read_bytes"] / max(1, r["bytes"])
                yield self.record("loader", "items/s", r.pop("items_per_s"), workers=workers, cache=cache,
                                  batch_size=self.args.batch_size, steps=self.args.steps, **extra, **r,
                                  device_read_per_byte=round(read_amp, 2), threads=torch.get_num_threads(),
                                  pin_memory=torch.cuda.is_available())

    # ------------------------------------------------------------------ evaluate
    def _checkpoint(self, path: Path) -> Path:
        """A random-weight decoder of the default size (conf/model/soft_attention.yaml) for this store."""
        model = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "model" / "soft_attention.yaml"))
        model.pop("defaults", None)
        torch.manual_seed(self.args.seed)
        config = {"model": model, "data": asdict(self.data["cfg"]), "features_dir": str(self.store),
                  "decode": {"beam_size": self.args.eval_beam}}
        module = CaptioningModule.from_hparams(config, self.data["vocab"].to_dict(),
                                               dict(FeatureStore.open(self.store).meta))
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, path)
        return path

    def evaluate(self) -> Iterator[dict[str, Any]]:
        """``captioning.evaluation.job.evaluate`` on the test split: where its time goes (files: ``eval/<precision>``)."""
        a, ckpt = self.args, self._checkpoint(self.root / "eval" / "random.ckpt")
        cfg = EvaluateConfig(ckpt_path=str(ckpt), split="test", decode=DecodeConfig(beam_size=a.eval_beam),
                             trainer=TrainerConfig(accelerator="gpu" if a.device == "cuda" else "cpu",
                                                   enable_progress_bar=False),
                             output_dir=str(self.root / "eval" / a.eval_precision), num_workers=2, grounding=False,
                             metrics=list(a.eval_metrics), batch_size=a.eval_batch_size, precision=a.eval_precision)
        t, summary = time.perf_counter(), evaluate(cfg)
        wall, seconds = time.perf_counter() - t, summary["seconds"]  # "score" is the sum of its parts "score/<step>"
        longest = max((kv for kv in seconds.items() if kv[0] != "score"), key=lambda kv: kv[1])
        results = read_json(Path(summary["output_dir"]) / "results.json", "evaluation results") or [{"caption": ""}]
        words = statistics.mean(len(r["caption"].split()) for r in results)
        common = {"eval_items": summary["items"], "beam": a.eval_beam, "metrics": list(cfg.metrics), "threads":
                  torch.get_num_threads(), "precision": a.eval_precision, "batch_size": a.eval_batch_size or "auto"}
        for step, value in seconds.items():
            yield self.record(f"evaluate/{step}", "s", round(value, 2), share=round(value / wall, 3),
                              cpu_s=summary["cpu_seconds"].get(step), **common)
        yield self.record("evaluate/total", "s", round(wall, 2), items_per_s=_rate(summary["items"], wall),
                          longest_step=longest[0], longest_step_s=round(longest[1], 2), mean_caption_words=round(words, 2),
                          write_over_decode=round(seconds.get("write", 0.0) / max(seconds.get("decode", 0.0), 1e-9), 4),
                          note="random-weight decoder (the default soft_attention size): its captions are not "
                               "a trained model's, their lengths are given", **common)

    # ------------------------------------------------------------------ extract
    def extract(self) -> Iterator[dict[str, Any]]:
        """``bench extract-images`` (JPEG decode + backbone + store writes) projected to this store's items."""
        # imported here: the backbones (timm) serve this stage only
        from captioning_bench import extract_images as extract_bench

        parser = argparse.ArgumentParser()
        parser.add_argument("--device")
        extract_bench.add_arguments(parser)
        a = parser.parse_args(["--device", self.args.device, "--num-images", str(self.args.extract_images),
                               "--batch-size", "32", "--workers", "2", "--skip-fold"])
        r = {x["name"]: x for x in extract_bench.run(a)}
        job = r["extract_images/job_throughput"]["value"]
        fwd = r["extract_images/forward_throughput"]["value"]
        yield self.record("extract_projection", "h", round(self.total / job / 3600, 2), job_items_per_s=job,
                          forward_items_per_s=fwd, images=self.args.extract_images, encoder=a.encoder,
                          note=f"{self.total} images at the job's rate; the backbone alone: "
                               f"{self.total / fwd / 3600:.2f} h")
