"""``captioning-bench extract-images``: the full extraction job vs the backbone's forward alone.

The job (file reads and JPEG decode + resize/crop in DataLoader workers, or on a GPU the workers'
bytes decoded and resized by nvjpeg on the device; host->device copy, forward, FeatureStore writes)
should run close to the speed of the forward pass on an already prepared device batch:
``ratio = job items/s / forward items/s`` (target >= 0.8 on a GPU, >= 0.9 on a CPU).  The JPEGs
(``--src-size``, COCO-like 640x480 by default) are generated into a temporary folder.
Also reports the peak RSS of this process and of its (worker) children, and ``fold_speedup``: the
forward with its batch norms folded into the convolutions (what the job runs) over the forward of
the network as built.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioning.features.backbones import EncoderConfig, build_backbone
from captioning.features.extract import MediaItem, default_workers, run_extraction
from captioning.store.feature_store import FeatureStore


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: the job's, one per core)")
    parser.add_argument("--jpeg-decoder", default="auto", choices=["auto", "pil", "nvjpeg"],
                        help="where the job decodes JPEGs (auto: nvjpeg on cuda, PIL in the workers on cpu)")
    parser.add_argument("--encoder", default="efficientnet_lite0", help="registry key or timm:<name>")
    parser.add_argument("--weights", default="packaged", help="packaged | pretrained | none | path")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--layer", default=None,
                        help="encoder.layer (EfficientNet-Lite0: -2, the stride-16 stage; default: the last stage)")
    parser.add_argument("--src-size", default="640x480", help="WxH of the generated JPEGs")
    parser.add_argument("--precision", default=None, help="Lightning precision (default: bf16-mixed on cuda, 32-true on cpu)")


def make_jpegs(folder: Path, n: int, width: int, height: int, seed: int = 0) -> list[Path]:
    """``n`` photo-like JPEGs (smooth colour fields + noise, so they compress like photos)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    paths = []
    for i in range(n):
        fx, fy, ph = rng.uniform(0.005, 0.03, size=3)
        base = np.stack([np.sin(xx * fx + ph * c) * np.cos(yy * fy + c) for c in range(3)], axis=-1)
        img = (base * 90 + 128 + rng.normal(0, 12, size=(height, width, 3))).clip(0, 255).astype(np.uint8)
        p = folder / f"{i:06d}.jpg"
        Image.fromarray(img).save(p, quality=90)
        paths.append(p)
    return paths


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_throughput(backbone: Any, pre: Any, device: torch.device, batch_size: int, num_images: int,
                       precision: str) -> float:
    """Images/s of normalise + forward on a device-resident uint8 batch (no decode, no copies, no writes)."""
    x = torch.randint(0, 256, (batch_size, 3, pre.size, pre.size), dtype=torch.uint8, device=device)
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    steps = max(1, num_images // batch_size)

    def once() -> None:
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            f = backbone(pre.normalize(x))
            f.flatten(2).transpose(1, 2).to(torch.float16).cpu()

    for _ in range(3):
        once()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        once()
    _sync(device)
    return steps * batch_size / (time.perf_counter() - t0)


def _batch_clock() -> Any:
    """A Lightning callback timing from the end of the first predict batch to the end of the last."""
    import pytorch_lightning as pl

    class BatchClock(pl.Callback):
        def __init__(self) -> None:
            self.first: float | None = None
            self.last = 0.0
            self.items_after_first = 0

        def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            _sync(pl_module.device)
            now = time.perf_counter()
            if self.first is None:
                self.first = now
            else:
                self.items_after_first += int(batch["num_items"])
            self.last = now

    return BatchClock()


def run(args: argparse.Namespace) -> list[dict[str, Any]]:

    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    precision = args.precision or ("bf16-mixed" if device.type == "cuda" else "32-true")
    w, h = (int(v) for v in args.src_size.lower().split("x"))
    encoder = EncoderConfig(name=args.encoder, weights=args.weights, image_size=args.image_size, layer=args.layer)
    backbone = build_backbone(encoder)  # the job folds its batch norms (Backbone.for_inference)
    tmp = Path(tempfile.mkdtemp(prefix="bench-extract-"))
    try:
        t0 = time.perf_counter()
        paths = make_jpegs(tmp / "images", args.num_images, w, h)
        gen_s = time.perf_counter() - t0
        items = [MediaItem(str(i), str(p)) for i, p in enumerate(paths)]
        clock = _batch_clock()
        summary = run_extraction(
            items, "image", backbone, tmp / "features",
            trainer={"accelerator": "gpu" if device.type == "cuda" else "cpu", "devices": 1, "precision": precision},
            batch_size=args.batch_size, num_workers=args.workers, progress=False, callbacks=[clock],
            jpeg_decoder=args.jpeg_decoder,
        )
        meta = FeatureStore.open(tmp / "features").meta
        decoder = meta.get("image_decoder")
        if summary.failed:
            raise RuntimeError(f"{summary.failed} generated images failed: {summary.failures[:3]}")
        job_wall = summary.processed / summary.seconds
        job_steady = clock.items_after_first / (clock.last - clock.first) if clock.first and clock.last > clock.first else job_wall
        backbone.to(device)
        unfolded = build_backbone(encoder).to(device)  # as built: batch norms as layers
        rates: dict[str, list[float]] = {"folded": [], "unfolded": []}
        for _ in range(2):  # alternated, so a change of load hits both
            for name, net in (("unfolded", unfolded), ("folded", backbone)):
                rates[name].append(forward_throughput(net, net.preprocessing(), device, args.batch_size,
                                                      max(args.batch_size, args.num_images // 2), precision))
        fwd, fwd_unfolded = max(rates["folded"]), max(rates["unfolded"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    scale = 1024 if sys.platform != "darwin" else 1024 * 1024  # ru_maxrss: KiB on Linux, bytes on macOS
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
    rss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / scale
    common = {"device": args.device, "encoder": args.encoder, "batch_size": args.batch_size,
              "workers": default_workers() if args.workers is None else args.workers, "num_images": args.num_images,
              "image_size": args.image_size, "layer": args.layer, "grid": meta.get("grid"), "dim": meta.get("dim"),
              "src_size": args.src_size, "precision": precision,
              "jpeg_decoder": decoder}
    return [
        {"name": "extract_images/ratio", "unit": "x", "value": round(job_steady / fwd, 3),
         "job_items_per_s": round(job_steady, 1), "forward_items_per_s": round(fwd, 1), **common},
        {"name": "extract_images/ratio_wall", "unit": "x", "value": round(job_wall / fwd, 3),
         "job_items_per_s": round(job_wall, 1), "note": "includes Trainer and worker start-up", **common},
        {"name": "extract_images/fold_speedup", "unit": "x", "value": round(fwd / fwd_unfolded, 3),
         "folded_norms": backbone.folded_norms, "forward_items_per_s": round(fwd, 1),
         "unfolded_items_per_s": round(fwd_unfolded, 1), **common},
        {"name": "extract_images/job_throughput", "unit": "items/s", "value": round(job_steady, 1), **common},
        {"name": "extract_images/forward_throughput", "unit": "items/s", "value": round(fwd, 1), **common},
        {"name": "extract_images/peak_rss_main", "unit": "MiB", "value": round(rss_self, 1), **common},
        {"name": "extract_images/peak_rss_worker", "unit": "MiB", "value": round(rss_children, 1), **common},
        {"name": "extract_images/jpeg_generation", "unit": "s", "value": round(gen_s, 2), **common},
    ]
