"""``captioning-bench extract-images``: the extraction job against the slowest of its parts, at steady state.

The job (``run_extraction``: DataLoader workers read the JPEGs and decode + resize/crop them, or on
a GPU read their bytes for nvJPEG to decode and resize on the device a batch ahead; the forward; the
FeatureStore writes on the writer's thread) and, on the same images, each part alone:

- ``decode``: the job's own loader (its workers, and on a GPU its decoding thread) with nothing after it;
- ``forward``: normalise + backbone + the features' copy to the host, on a batch already on the device;
- ``write``: ``FeatureStoreWriter`` of as many items of the job's shape as the job adds them
  (``add(copy=False)``), in a folder beside the job's store.

``extract_images/ratio`` = the job's items/s over the slowest part's (the figure of merit; target 0.8
on a GPU); ``over_forward`` the job over the forward alone (what this benchmark reported before).
Rates at steady state, without a host wait per batch: the job's from the times its batches reached
the store's writer, after ``--warmup`` batches; the parts from their first batch after the warm-up
to their end (one device synchronisation).  The parts run first, ``--part-seconds`` each, and the
job then gets enough items for 1.5 x ``--min-seconds`` (20 s) of steady state at the slowest part's
rate (the job cannot beat that part, but the part may have met a busier machine), after its warm-up batches (or, with ``--num-images``, the job and each part that many).  The items cycle through ``--distinct-images``
photo-like JPEGs (``--src-size``, COCO-like 640x480) generated once into ``--jpeg-cache`` and reused.  Also reported:
the peak RSS of this process and of its (worker) children, and ``fold_speedup``: the forward with
its batch norms folded into the convolutions (what the job runs) over the network as built.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioning.features.backbones import EncoderConfig, build_backbone
from captioning.features.decode_ahead import DecodeAhead, wait_for
from captioning.features.device_decode import resolve_jpeg_decoder
from captioning.features.extract import MediaItem, default_workers, run_extraction
from captioning.features.extractor import to_host
from captioning.features.media_dataset import MediaDataset, collate_media
from captioning.store.feature_store import FeatureStore
from captioning_bench.scale import write as write_bench


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-images", type=int, default=None,
                        help="the job's items, and each part's (default: --min-seconds' worth, parts --part-seconds)")
    parser.add_argument("--min-seconds", type=float, default=20.0,
                        help="without --num-images: the job's items last this long at the slowest part's rate")
    parser.add_argument("--part-seconds", type=float, default=5.0, help="without --num-images: each part's time")
    parser.add_argument("--distinct-images", type=int, default=1000, help="JPEG files the items cycle through")
    parser.add_argument("--jpeg-cache", default=None, help="where the JPEGs are kept (default: <tmp>/captioning-bench-jpegs)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: the job's, one per core)")
    parser.add_argument("--warmup", type=int, default=2, help="batches before the steady state")
    parser.add_argument("--jpeg-decoder", default="auto", choices=["auto", "pil", "nvjpeg"],
                        help="where the job decodes JPEGs (auto: nvjpeg on cuda, PIL in the workers on cpu)")
    parser.add_argument("--jpeg-library", default="auto", choices=["auto", "torchcodec", "torchvision"],
                        help="whose batched nvjpeg decode the device path calls (auto: torchcodec where it works)")
    parser.add_argument("--encoder", default="efficientnet_lite0", help="registry key or timm:<name>")
    parser.add_argument("--weights", default="packaged", help="packaged | pretrained | none | path")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--layer", default=None,
                        help="encoder.layer (EfficientNet-Lite0: -2, the stride-16 stage; default: the last stage)")
    parser.add_argument("--src-size", default="640x480", help="WxH of the generated JPEGs")
    parser.add_argument("--precision", default=None, help="Lightning precision (default: bf16-mixed on cuda, 32-true on cpu)")
    parser.add_argument("--skip-fold", action="store_true", help="no fold_speedup (the unfolded network's forward)")


def _make_jpeg(job: tuple[Path, int, int, int]) -> Path:
    """One photo-like JPEG (smooth colour fields + noise, so that it compresses like a photo)."""
    from PIL import Image

    path, width, height, seed = job
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    fx, fy, ph = rng.uniform(0.005, 0.03, size=3)
    base = np.stack([np.sin(xx * fx + ph * c) * np.cos(yy * fy + c) for c in range(3)], axis=-1)
    img = (base * 90 + 128 + rng.normal(0, 12, size=(height, width, 3))).clip(0, 255).astype(np.uint8)
    Image.fromarray(img).save(path, quality=90)
    return path


def make_jpegs(cache: Path, n: int, width: int, height: int, workers: int = 1) -> list[Path]:
    """``n`` photo-like JPEGs of ``width`` x ``height`` in ``cache``, made once (in a temporary folder
    renamed into place, so that a run beside this one never reads a half-written set) and reused."""
    folder = cache / f"{width}x{height}-{n}"
    paths = [folder / f"{i:06d}.jpg" for i in range(n)]
    if (folder / ".complete").is_file():
        return paths
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=cache))
    with Pool(max(1, workers)) as pool:
        pool.map(_make_jpeg, [(tmp / p.name, width, height, i) for i, p in enumerate(paths)], chunksize=8)
    (tmp / ".complete").write_text("")
    if folder.exists() and not (folder / ".complete").is_file():
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete set left by a killed run
    try:
        os.rename(tmp, folder)
    except OSError:  # made meanwhile by a run beside this one
        shutil.rmtree(tmp, ignore_errors=True)
    return paths


PART_ITEMS = 200_000  # items a part alone may go through in --part-seconds (a GPU decodes ~10k/s)
MARGIN = 1.5  # the job's steady state: --min-seconds at the slowest part's rate, times this


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def steady_rate(times: list[tuple[float, int]], warmup: int) -> tuple[float, float]:
    """Items/s and seconds from the end of batch ``warmup`` to the end of the last: ``times`` holds
    (seconds, items) at the end of each batch (all of them when there are no more than ``warmup``)."""
    warmup = min(warmup, len(times) - 2) if len(times) > 2 else 0
    start = times[warmup - 1][0] if warmup else 0.0
    seconds = times[-1][0] - start
    items = sum(n for _, n in times[warmup:])
    return (items / seconds if seconds > 0 else 0.0), seconds


def decode_throughput(paths: list[Path], pre: Any, device: torch.device, args: argparse.Namespace, workers: int,
                      library: str | None) -> float:
    """Items/s of the job's loader alone (workers; on a GPU its decoding thread) over ``paths`` cycled:
    ``--num-images`` items, or for ``--part-seconds`` after the warm-up."""
    items = [MediaItem(str(i), str(paths[i % len(paths)])) for i in range(args.num_images or PART_ITEMS)]
    ds = MediaDataset(items, "image", pre, encoded_jpegs=library is not None)
    loader: Any = DataLoader(ds, batch_size=args.batch_size, num_workers=workers, collate_fn=collate_media,
                             pin_memory=device.type == "cuda", prefetch_factor=4 if workers else None)
    if library is not None:
        loader = DecodeAhead(loader, pre, device, library=library)
    times: list[tuple[float, int]] = []
    t0 = time.perf_counter()
    for batch in loader:
        if library is not None:
            wait_for(batch, device)
        times.append((time.perf_counter() - t0, len(batch["ids"])))
        if (not args.num_images and len(times) > args.warmup + 1
                and times[-1][0] - times[args.warmup - 1][0] >= args.part_seconds):
            break
    _sync(device)
    times[-1] = (time.perf_counter() - t0, times[-1][1])
    return steady_rate(times, args.warmup)[0]


def forward_throughput(backbone: Any, pre: Any, device: torch.device, batch_size: int, seconds: float,
                       precision: str, images: int = 0) -> float:
    """Images/s of normalise + forward + the features' copy to the host on a device-resident uint8
    batch (no decode, no writes), for ``images`` (or ``seconds``) and at least 3 batches; synchronised
    once at the end."""
    x = torch.randint(0, 256, (batch_size, 3, pre.size, pre.size), dtype=torch.uint8, device=device)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)

    def once() -> Any:
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            f = backbone(pre.normalize(x))
            return to_host(f.flatten(2).transpose(1, 2).to(torch.float16).contiguous())

    for _ in range(3):
        once()
    _sync(device)
    steps, t0 = 0, time.perf_counter()
    while steps < 3 or (steps * batch_size < images if images else time.perf_counter() - t0 < seconds):
        once()
        steps += 1
    _sync(device)
    return steps * batch_size / (time.perf_counter() - t0)


def _defaults(args: argparse.Namespace, device: torch.device) -> tuple[int, str]:
    workers = default_workers() if args.workers is None else args.workers
    precision = args.precision or ("bf16-mixed" if device.type == "cuda" else "32-true")
    return workers, precision


def parts_alone(args: argparse.Namespace, backbone: Any, encoder: EncoderConfig, paths: list[Path],
                device: torch.device, workers: int, precision: str, folder: Path) -> dict[str, Any]:
    """Each part alone on the job's images and shapes: items/s of ``decode``, ``forward`` (the folded
    network, what the job runs; ``unfolded`` too unless ``--skip-fold``, alternated) and ``write``."""
    accelerator = "gpu" if device.type == "cuda" else "cpu"
    library = resolve_jpeg_decoder(args.jpeg_decoder, "image", accelerator, args.jpeg_library)
    pre = backbone.preprocessing()
    decode = decode_throughput(paths, pre, device, args, workers, library)
    channels, h, w = backbone.output_shape()
    pool = write_bench.item_pool(256, h * w, channels, seed=0)
    written = write_bench.store_write(folder, pool, args.num_images or PART_ITEMS, copy=False,
                                      seconds=None if args.num_images else args.part_seconds)
    backbone.to(device)
    unfolded = None if args.skip_fold else build_backbone(encoder).to(device)  # batch norms as layers
    rates: dict[str, list[float]] = {"folded": [], "unfolded": []}
    for _ in range(1 if unfolded is None else 2):  # alternated, so that a change of load hits both
        for name, net in (("unfolded", unfolded), ("folded", backbone)):
            if net is not None:
                rates[name].append(forward_throughput(net, net.preprocessing(), device, args.batch_size,
                                                      args.part_seconds, precision, args.num_images or 0))
    return {"decode": decode, "forward": max(rates["folded"]), "write": written["items"] / written["seconds"],
            "unfolded": max(rates["unfolded"]) if unfolded is not None else None}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    workers, precision = _defaults(args, device)
    w, h = (int(v) for v in args.src_size.lower().split("x"))
    encoder = EncoderConfig(name=args.encoder, weights=args.weights, image_size=args.image_size, layer=args.layer)
    backbone = build_backbone(encoder).for_inference()  # batch norms folded, as the job runs it
    cache = Path(args.jpeg_cache or Path(tempfile.gettempdir()) / "captioning-bench-jpegs")
    t0 = time.perf_counter()
    distinct = min(args.distinct_images, args.num_images or args.distinct_images)
    paths = make_jpegs(cache, distinct, w, h, workers=max(1, os.cpu_count() or 1))
    gen_s = time.perf_counter() - t0
    tmp = Path(tempfile.mkdtemp(prefix="bench-extract-"))
    try:
        parts = parts_alone(args, backbone, encoder, paths, device, workers, precision, tmp / "write-alone")
        rates = {k: parts[k] for k in ("decode", "forward", "write")}
        slowest = min(rates, key=rates.__getitem__)
        # batches of steady state: the job may run faster than a part measured on a busier machine
        steady = max(math.ceil(args.min_seconds * rates[slowest] * MARGIN / args.batch_size), 2)
        n = args.num_images or args.batch_size * (args.warmup + steady)  # the warm-up batches on top
        items = [MediaItem(str(i), str(paths[i % len(paths)])) for i in range(n)]
        trainer = {"accelerator": "gpu" if device.type == "cuda" else "cpu", "devices": 1, "precision": precision}
        summary = run_extraction(items, "image", backbone, tmp / "features", trainer=trainer,
                                 batch_size=args.batch_size, num_workers=workers, progress=False,
                                 jpeg_decoder=args.jpeg_decoder, jpeg_library=args.jpeg_library)
        meta = FeatureStore.open(tmp / "features").meta
        if summary.failed:
            raise RuntimeError(f"{summary.failed} generated images failed: {summary.failures[:3]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    job, job_s = steady_rate(summary.written, args.warmup)
    return _records(args, parts, slowest, job, job_s, summary.items_per_second, backbone, {
        "device": args.device, "encoder": args.encoder, "batch_size": args.batch_size, "workers": workers,
        "num_images": n, "distinct_images": len(paths), "image_size": args.image_size, "layer": args.layer,
        "grid": meta.get("grid"), "dim": meta.get("dim"), "src_size": args.src_size, "precision": precision,
        "jpeg_decoder": meta.get("image_decoder"), "warmup_batches": args.warmup, "part_seconds": args.part_seconds},
        gen_s)


def _records(args: argparse.Namespace, parts: dict[str, Any], slowest: str, job: float, job_s: float, wall: float,
             backbone: Any, common: dict[str, Any], gen_s: float) -> list[dict[str, Any]]:
    rates = {k: parts[k] for k in ("decode", "forward", "write")}
    fwd = rates["forward"]
    per_s = {f"{k}_items_per_s": round(v, 1) for k, v in rates.items()}
    scale = 1024 if sys.platform != "darwin" else 1024 * 1024  # ru_maxrss: KiB on Linux, bytes on macOS
    records = [
        {"name": "extract_images/ratio", "unit": "x", "value": round(job / rates[slowest], 3), "slowest": slowest,
         "job_items_per_s": round(job, 1), **per_s, "job_seconds": round(job_s, 1), **common},
        {"name": "extract_images/over_forward", "unit": "x", "value": round(job / fwd, 3),
         "job_items_per_s": round(job, 1), "forward_items_per_s": round(fwd, 1), **common},
        {"name": "extract_images/ratio_wall", "unit": "x", "value": round(wall / rates[slowest], 3),
         "job_items_per_s": round(wall, 1), "note": "includes Trainer and worker start-up", **common},
        {"name": "extract_images/job_throughput", "unit": "items/s", "value": round(job, 1), **common},
        *({"name": f"extract_images/{k}_throughput", "unit": "items/s", "value": round(v, 1), **common}
          for k, v in rates.items()),
        {"name": "extract_images/peak_rss_main", "unit": "MiB",
         "value": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale, 1), **common},
        {"name": "extract_images/peak_rss_worker", "unit": "MiB",
         "value": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / scale, 1), **common},
        {"name": "extract_images/jpeg_generation", "unit": "s", "value": round(gen_s, 2), **common},
    ]
    if parts["unfolded"]:
        records.insert(2, {"name": "extract_images/fold_speedup", "unit": "x", "value": round(fwd / parts["unfolded"], 3),
                           "folded_norms": backbone.folded_norms, "forward_items_per_s": round(fwd, 1),
                           "unfolded_items_per_s": round(parts["unfolded"], 1), **common})
    return records
