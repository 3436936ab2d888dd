"""``captioning-bench extract-videos``: the video extraction job against the slowest of its parts.

The job (video decode + frame sampling + resize/crop in DataLoader workers, host->device copy,
forward, FeatureStore writes on the writer's thread) and, on the same videos, each part alone:
``decode`` (the job's loader: its workers, nothing after them), ``forward`` (normalise + forward +
pooling + the copy to the host on a decoded batch already on the device, ``predict_step``) and
``write`` (``FeatureStoreWriter`` of as many items of the store's shape).  ``extract_videos/ratio`` =
the job's videos/s over the slowest part's; ``over_forward`` the job over the forward alone (what
this benchmark reported before).  The job's rate at steady state, from the times its batches
reached the store's writer after ``--warmup`` batches (no host wait per batch).  2-D encoders run
on the K sampled frames; 3-D encoders (``--encoder r2plus1d_18`` ...) on the K clips of
``--clip-length`` frames centred on them (the union of the clips' frames is decoded once per
video).  The videos are moving_shapes videos (H.264, ``--video-frames`` frames of ``--src-size``
px) generated into a temporary folder.  Also reported: decoding in one process and peak RSS.
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

import torch

from captioning.data.synthetic import generate_moving_shapes
from captioning.features.backbones import EncoderConfig
from captioning.features.encoders import build_encoder, is_clip_encoder
from captioning.features.extract import (
    FeatureExtractor,
    MediaDataset,
    MediaItem,
    VideoSampling,
    collate_media,
    run_extraction,
)
from captioning.store.feature_store import FeatureStore
from captioning_bench.extract_images import _sync, steady_rate
from captioning_bench.scale import write as write_bench


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-videos", type=int, default=32)
    parser.add_argument("--video-frames", type=int, default=48, help="frames per generated video")
    parser.add_argument("--src-size", type=int, default=96, help="side of the generated square videos (even)")
    parser.add_argument("--encoder", default="efficientnet_lite0", help="2-D or 3-D registry key (r2plus1d_18 ...)")
    parser.add_argument("--weights", default=None, help="default: packaged for efficientnet_lite0, else none")
    parser.add_argument("--frames", type=int, default=16, help="K sampled frames (= clips) per video")
    parser.add_argument("--frame-size", type=int, default=None, help="default: 224 (2-D), 112 (r3d/mc3/r2plus1d)")
    parser.add_argument("--clip-length", type=int, default=16, help="3-D encoders: frames per clip")
    parser.add_argument("--clip-stride", type=int, default=1, help="3-D encoders: step between a clip's frames")
    parser.add_argument("--batch-size", type=int, default=4, help="videos per batch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1, help="batches before the steady state")
    parser.add_argument("--precision", default=None, help="Lightning precision (default: bf16-mixed on cuda, 32-true on cpu)")


def encoder_config(args: argparse.Namespace) -> Any:

    clip = is_clip_encoder(args.encoder)
    weights = args.weights or ("packaged" if args.encoder == "efficientnet_lite0" else "none")
    size = args.frame_size or (224 if not clip or args.encoder == "s3d" else 112)
    return EncoderConfig(name=args.encoder, weights=weights, frames=args.frames, frame_size=size,
                         clip_length=args.clip_length, clip_stride=args.clip_stride)


def forward_throughput(module: Any, batch: dict[str, Any], videos: int, device: torch.device, precision: str,
                       num_videos: int) -> float:
    """Videos/s of ``FeatureExtractor.predict_step`` on a decoded batch already on the device."""
    on_device = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    if on_device.get("clip_index") is not None:
        on_device["clip_index"] = [t.to(device) for t in on_device["clip_index"]]
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    steps = max(1, num_videos // videos)

    def once() -> None:
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            module.predict_step(on_device, 0)

    once()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        once()
    _sync(device)
    return steps * videos / (time.perf_counter() - t0)


def _sig(x: float, digits: int = 3) -> float:
    """``x`` to ``digits`` significant digits (slow 3-D encoders run at a few hundredths of a video/s)."""
    return float(f"{x:.{digits}g}")


def decode_throughput(dataset: MediaDataset, batch_size: int, workers: int, warmup: int) -> float:
    """Videos/s of the job's loader alone (its workers decode, sample and resize), at steady state."""
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate_media,
                        prefetch_factor=4 if workers else None)
    times, t0 = [], time.perf_counter()
    for batch in loader:
        times.append((time.perf_counter() - t0, int(batch["num_items"])))
    return steady_rate(times, warmup)[0]


def run(args: argparse.Namespace) -> list[dict[str, Any]]:

    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    precision = args.precision or ("bf16-mixed" if device.type == "cuda" else "32-true")
    cfg = encoder_config(args)
    backbone = build_encoder(cfg)
    tmp = Path(tempfile.mkdtemp(prefix="bench-extract-videos-"))
    try:
        t0 = time.perf_counter()
        generate_moving_shapes(tmp / "data", num_videos=args.num_videos, frames=args.video_frames,
                               size=args.src_size, workers=max(1, min(4, args.workers)))
        gen_s = time.perf_counter() - t0
        paths = sorted((tmp / "data" / "videos").glob("*.mp4"))
        items = [MediaItem(p.stem, str(p)) for p in paths]
        pre = backbone.preprocessing(video=True)
        dataset = MediaDataset(items, "video", pre, VideoSampling.from_encoder(cfg))
        t0 = time.perf_counter()
        decoded = [dataset[i] for i in range(len(items))]
        one_process = len(items) / (time.perf_counter() - t0)
        errors = [d["error"] for d in decoded if d["error"]]
        if errors:
            raise RuntimeError(f"{len(errors)} generated videos failed to decode: {errors[:3]}")
        summary = run_extraction(
            items, "video", backbone, tmp / "features",
            trainer={"accelerator": "gpu" if device.type == "cuda" else "cpu", "devices": 1, "precision": precision},
            batch_size=args.batch_size, num_workers=args.workers, progress=False,
        )
        if summary.failed:
            raise RuntimeError(f"{summary.failed} generated videos failed: {summary.failures[:3]}")
        job, job_s = steady_rate(summary.written, args.warmup)
        meta = FeatureStore.open(tmp / "features").meta
        decode = decode_throughput(dataset, args.batch_size, args.workers, args.warmup)
        pool = write_bench.item_pool(min(len(items), 256), meta["positions"], meta["dim"], seed=0)
        write = len(items) / write_bench.store_write(tmp / "write-alone", pool, len(items), copy=False)["seconds"]
        n = min(args.batch_size, len(decoded))
        module = FeatureExtractor(backbone, pre, kind="video", video_features=cfg.video_features).to(device)
        fwd = forward_throughput(module, collate_media(decoded[:n]), n, device, precision, args.num_videos)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    parts = {"decode": decode, "forward": fwd, "write": write}
    slowest = min(parts, key=parts.__getitem__)
    scale = 1024 if sys.platform != "darwin" else 1024 * 1024  # ru_maxrss: KiB on Linux, bytes on macOS
    rss_self = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
    rss_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / scale
    common = {"device": args.device, "encoder": cfg.name, "clip_encoder": backbone.is_clip_encoder,
              "frames": cfg.frames, "frame_size": cfg.frame_size,
              "clip_length": cfg.clip_length if backbone.is_clip_encoder else None,
              "clip_stride": cfg.clip_stride if backbone.is_clip_encoder else None,
              "batch_size": args.batch_size, "workers": args.workers, "num_videos": args.num_videos,
              "video_frames": args.video_frames, "src_size": args.src_size, "precision": precision,
              "warmup_batches": args.warmup}
    k = cfg.frames  # features (frames or clips) per video
    return [
        {"name": "extract_videos/ratio", "unit": "x", "value": round(job / parts[slowest], 3), "slowest": slowest,
         "job_videos_per_s": _sig(job), **{f"{p}_videos_per_s": _sig(v) for p, v in parts.items()},
         "job_seconds": round(job_s, 1), **common},
        {"name": "extract_videos/over_forward", "unit": "x", "value": round(job / fwd, 3),
         "job_videos_per_s": _sig(job), "forward_videos_per_s": _sig(fwd), **common},
        {"name": "extract_videos/ratio_wall", "unit": "x", "value": round(summary.items_per_second / parts[slowest], 3),
         "job_videos_per_s": _sig(summary.items_per_second), "note": "includes Trainer and worker start-up", **common},
        {"name": "extract_videos/job_throughput", "unit": "videos/s", "value": _sig(job),
         "features_per_s": _sig(job * k), **common},
        {"name": "extract_videos/forward_throughput", "unit": "videos/s", "value": _sig(fwd),
         "features_per_s": _sig(fwd * k), **common},
        {"name": "extract_videos/decode_throughput", "unit": "videos/s", "value": _sig(decode),
         "note": "the job's loader alone (its workers: decode + sample + resize/crop)", **common},
        {"name": "extract_videos/decode_one_process", "unit": "videos/s", "value": _sig(one_process),
         "note": "MediaDataset alone in one process", **common},
        {"name": "extract_videos/write_throughput", "unit": "videos/s", "value": _sig(write), **common},
        {"name": "extract_videos/peak_rss_main", "unit": "MiB", "value": round(rss_self, 1), **common},
        {"name": "extract_videos/peak_rss_worker", "unit": "MiB", "value": round(rss_children, 1), **common},
        {"name": "extract_videos/video_generation", "unit": "s", "value": round(gen_s, 2), **common},
    ]
