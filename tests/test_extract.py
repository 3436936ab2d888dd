"""The extraction job: MediaDataset, FeatureExtractor, StoreWriter, the captioning-extract CLI (1 process
and DDP over gloo), resuming, bad inputs, and bounded memory (SIGKILL and full-disk faults: faults/)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from captioning.errors import ConfigError
from captioning.features.backbones import EncoderConfig, build_backbone
from captioning.features.extract import MediaDataset, MediaItem, collate_media, run_extraction

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("train", "val", "test")
ENC = ["encoder=efficientnet_lite0", "encoder.weights=none", "encoder.image_size=64"]


# ------------------------------------------------------------------------------------ data


def _photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([np.sin(xx * rng.uniform(0.05, 0.3) + c) * np.cos(yy * rng.uniform(0.05, 0.3)) for c in range(3)], -1)
    return (base * 100 + 128 + rng.normal(0, 10, (h, w, 3))).clip(0, 255).astype(np.uint8)


def make_images(root: Path, n: int, seed: int = 0, size: tuple[int, int] = (48, 64),
                extra: dict[str, bytes | None] | None = None) -> list[str]:
    """A COCO-format dataset of ``n`` JPEGs (3 splits); ``extra`` adds file_name -> bytes (None: missing)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    names = []
    for i in range(n):
        h, w = size[0] + (i % 5) * 4, size[1] - (i % 3) * 4  # different aspect ratios
        Image.fromarray(_photo(rng, h, w)).save(root / "images" / f"{i:06d}.jpg", quality=90)
        names.append(f"{i:06d}.jpg")
    for name, data in (extra or {}).items():
        if data is not None:
            (root / "images" / name).write_bytes(data)
        names.append(name)
    images = {s: [] for s in SPLITS}
    anns = {s: [] for s in SPLITS}
    for i, name in enumerate(names):
        split = SPLITS[i % 3]
        images[split].append({"id": i + 1, "file_name": name, "width": size[1], "height": size[0]})
        anns[split].append({"id": i + 1, "image_id": i + 1, "caption": f"a picture number {i}"})
    for s in SPLITS:
        (root / "annotations" / f"captions_{s}.json").write_text(json.dumps({"images": images[s], "annotations": anns[s]}))
    return [str(i + 1) for i in range(len(names))]


def write_video(path: Path, frames: int, size: int = 32, seed: int = 0) -> None:
    import av

    rng = np.random.default_rng(seed)
    with av.open(str(path), "w") as c:
        s = c.add_stream("mpeg4", rate=10)
        s.width = s.height = size
        s.pix_fmt = "yuv420p"
        for _ in range(frames):
            frame = av.VideoFrame.from_ndarray(_photo(rng, size, size), format="rgb24")
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def make_videos(root: Path, n: int, extra: dict[str, bytes | None] | None = None) -> list[str]:
    """An MSR-VTT-format dataset of ``n`` tiny mp4s; ``extra`` adds video_id -> mp4 bytes (None: missing)."""
    (root / "videos").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    ids = []
    for i in range(n):
        write_video(root / "videos" / f"video{i}.mp4", frames=6 + 3 * i, seed=i)
        ids.append(f"video{i}")
    for vid, data in (extra or {}).items():
        if data is not None:
            (root / "videos" / f"{vid}.mp4").write_bytes(data)
        ids.append(vid)
    info = {"videos": [{"video_id": v, "split": ["train", "validate", "test"][i % 3], "id": i} for i, v in enumerate(ids)],
            "sentences": [{"video_id": v, "caption": f"clip {i} shows shapes", "sen_id": i} for i, v in enumerate(ids)]}
    (root / "annotations" / "videodatainfo.json").write_text(json.dumps(info))
    return ids


def image_cli_args(root: Path, features: Path, *extra: str) -> list[str]:
    return ["data=shapes", "data.name=tiny", f"data.root={root}", "data.synthetic=null", "data.grounding=null",
            f"features_dir={features}", f"hydra.run.dir={root}/hydra", "num_workers=0", "batch_size=4",
            "shard_size=8", *ENC, *extra]


def video_cli_args(root: Path, features: Path, *extra: str) -> list[str]:
    return ["data=moving_shapes", "data.name=tinyvid", f"data.root={root}", "data.synthetic=null",
            "data.grounding=null", f"features_dir={features}", f"hydra.run.dir={root}/hydra", "num_workers=0",
            "batch_size=2", "shard_size=4", *ENC, "encoder.frames=4", "encoder.frame_size=64", *extra]


def cli_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run_extract_cli(*args: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "captioning.cli.extract", *args], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def store_arrays(root: Path) -> dict[str, np.ndarray]:
    from captioning.store.feature_store import FeatureStore

    store = FeatureStore.open(root)
    return {i: np.asarray(store[i].features, dtype=np.float32) for i in store.ids}


def assert_same_store(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=2e-2, atol=2e-3, err_msg=k)


@pytest.fixture(scope="module")
def lite0():
    return build_backbone(EncoderConfig(weights="none", image_size=64))


def items_of(root: Path, ids: list[str], folder: str = "images") -> list[MediaItem]:
    ann = {}
    for s in SPLITS:
        for im in json.loads((root / "annotations" / f"captions_{s}.json").read_text())["images"]:
            ann[str(im["id"])] = str(root / folder / im["file_name"])
    return [MediaItem(i, ann[i]) for i in ids]


CPU = {"accelerator": "cpu", "devices": 1, "precision": "32-true"}


# ----------------------------------------------------------------------------- in process


def test_images_alone_equal_batched(tmp_path: Path, lite0) -> None:
    from captioning.store.feature_store import FeatureStore

    ids = make_images(tmp_path / "d", 10)
    items = items_of(tmp_path / "d", ids)
    s = run_extraction(items, "image", lite0, tmp_path / "f", trainer=CPU, batch_size=4, num_workers=0,
                       shard_size=3, progress=False)
    assert (s.processed, s.failed, s.skipped_done, s.total) == (10, 0, 0, 10)
    store = FeatureStore.open(tmp_path / "f")
    assert sorted(store.ids) == sorted(ids)
    assert store.meta["positions"] == 4 and store.meta["dim"] == 1280 and list(store.meta["grid"]) == [2, 2]
    assert store.meta["settings"]["weights"] == "none" and store.meta["kind"] == "image"
    # one image through the backbone on its own == the same image inside a batch of 4
    ds = MediaDataset(items, "image", lite0.preprocessing())
    pre = lite0.preprocessing()
    for k in (0, 5, 9):
        with torch.inference_mode():
            alone = lite0(pre.normalize(ds[k]["pixels"][None]))[0].flatten(1).T.numpy()
        np.testing.assert_allclose(np.asarray(store[ids[k]].features, np.float32), alone, rtol=1e-2, atol=2e-3)


@pytest.mark.parametrize(("overrides", "dim"), [({"image_size": 448}, 1280), ({"layer": "-2"}, 112)])
def test_finer_image_grid_14x14(tmp_path: Path, overrides: dict, dim: int) -> None:
    """EfficientNet-Lite0: 448 px input (last stage, stride 32) or the stride-16 stage at 224 px -> 14x14."""
    from captioning.store.feature_store import FeatureStore

    ids = make_images(tmp_path / "d", 2)
    b = build_backbone(EncoderConfig(weights="none", **overrides))
    run_extraction(items_of(tmp_path / "d", ids), "image", b, tmp_path / "f", trainer=CPU, num_workers=0,
                   progress=False)
    store = FeatureStore.open(tmp_path / "f")
    assert store.meta["grid"] == [14, 14] and store.meta["positions"] == 196 and store.meta["dim"] == dim
    assert store.grid == (14, 14) and store[ids[1]].features.shape == (196, dim)


def test_resume_skips_done_ids_and_refuses_other_settings(tmp_path: Path, lite0) -> None:
    ids = make_images(tmp_path / "d", 9)
    items = items_of(tmp_path / "d", ids)
    s1 = run_extraction(items[:4], "image", lite0, tmp_path / "f", trainer=CPU, batch_size=2, num_workers=0,
                        progress=False)
    assert s1.processed == 4
    s2 = run_extraction(items, "image", lite0, tmp_path / "f", trainer=CPU, batch_size=2, num_workers=2,
                        progress=False)
    assert (s2.processed, s2.skipped_done, s2.failed) == (5, 4, 0)
    other = build_backbone(EncoderConfig(weights="none", image_size=64, grid_size=1))
    with pytest.raises(ConfigError, match="other settings"):
        run_extraction(items, "image", other, tmp_path / "f", trainer=CPU, num_workers=0, progress=False)


def test_bad_images_become_failures_never_worker_errors(tmp_path: Path, lite0) -> None:
    from captioning.store.feature_store import FeatureStore

    make_images(tmp_path / "d", 1)
    good = (tmp_path / "d" / "images" / "000000.jpg").read_bytes()
    ids = make_images(tmp_path / "d", 3, extra={"truncated.jpg": good[: len(good) // 3], "empty.jpg": b"",
                                                 "missing.jpg": None, "text.jpg": b"hello, not a jpeg\n"})
    items = items_of(tmp_path / "d", ids)
    ds = MediaDataset(items, "image", lite0.preprocessing())
    errors = {it.item_id: ds[k]["error"] for k, it in enumerate(items)}
    assert all(errors[i] is None for i in ids[:3])
    assert all(errors[i] for i in ids[3:]), errors
    batch = collate_media([ds[k] for k in range(len(items))])
    assert batch["pixels"].shape[0] == 3 and len(batch["failures"]) == 4
    s = run_extraction(items, "image", lite0, tmp_path / "f", trainer=CPU, batch_size=3, num_workers=2,
                       progress=False)
    assert (s.processed, s.failed) == (3, 4)
    store = FeatureStore.open(tmp_path / "f")
    assert sorted(store.ids) == sorted(ids[:3])
    failed = json.dumps(list(store.failures))
    for name in ("truncated.jpg", "empty.jpg", "missing.jpg", "text.jpg"):
        assert name in failed


@pytest.mark.parametrize("mode", ["pooled", "grid"])
def test_videos(tmp_path: Path, mode: str) -> None:
    from captioning.store.feature_store import FeatureStore

    ids = make_videos(tmp_path / "v", 3)
    items = [MediaItem(v, str(tmp_path / "v" / "videos" / f"{v}.mp4")) for v in ids]
    b = build_backbone(EncoderConfig(weights="none", image_size=64, frame_size=64, frames=4, video_features=mode))
    s = run_extraction(items, "video", b, tmp_path / "f", trainer=CPU, batch_size=2, num_workers=0, progress=False)
    assert (s.processed, s.failed) == (3, 0)
    store = FeatureStore.open(tmp_path / "f")
    n = 4 if mode == "pooled" else 4 * 2 * 2
    assert store.meta["kind"] == "video" and store.meta["positions"] == n and store.meta["dim"] == 1280
    for v in ids:
        item = store[v]
        assert np.asarray(item.features).shape == (n, 1280)
        assert item.frame_indices is not None and len(item.frame_indices) == 4
        assert list(item.frame_indices) == sorted(item.frame_indices)


def test_video_short_pad_and_all_frames(tmp_path: Path) -> None:
    from captioning.store.feature_store import FeatureStore

    ids = make_videos(tmp_path / "v", 2)  # 6 and 9 frames
    items = [MediaItem(v, str(tmp_path / "v" / "videos" / f"{v}.mp4")) for v in ids]
    pad = build_backbone(EncoderConfig(weights="none", image_size=64, frame_size=64, frames=8, short_video="pad"))
    run_extraction(items, "video", pad, tmp_path / "pad", trainer=CPU, num_workers=0, progress=False)
    store = FeatureStore.open(tmp_path / "pad")
    short, full = store["video0"], store["video1"]
    assert short.valid == 6 and full.valid == 8
    assert not np.asarray(short.features[6:]).any() and np.asarray(short.features[:6]).any()
    every = build_backbone(EncoderConfig(weights="none", image_size=64, frame_size=64, frames=8, frame_strategy="all"))
    s = run_extraction(items, "video", every, tmp_path / "all", trainer=CPU, num_workers=0, progress=False)
    assert (s.processed, s.failed) == (1, 1)  # the 9-frame video does not fit 8 positions
    assert FeatureStore.open(tmp_path / "all")["video0"].frame_indices[:6] == (0, 1, 2, 3, 4, 5)


def test_bad_videos_become_failures(tmp_path: Path) -> None:
    import av

    empty = tmp_path / "empty.mp4"
    with av.open(str(empty), "w") as c:  # a container with a video stream and no frames
        s = c.add_stream("mpeg4", rate=10)
        s.width = s.height = 32
        s.pix_fmt = "yuv420p"
        c.start_encoding()  # write the header although no frame follows
        for p in s.encode():
            c.mux(p)
    ids = make_videos(tmp_path / "v", 2, extra={"textvid": b"this is not a video\n", "zerolen": empty.read_bytes(),
                                                "zerobyte": b"", "gone": None})
    items = [MediaItem(v, str(tmp_path / "v" / "videos" / f"{v}.mp4")) for v in ids]
    b = build_backbone(EncoderConfig(weights="none", image_size=64, frame_size=64, frames=4))
    s = run_extraction(items, "video", b, tmp_path / "f", trainer=CPU, batch_size=3, num_workers=2, progress=False)
    assert (s.processed, s.failed) == (2, 4)


# --------------------------------------------------------------------------------- config


def _compose(*overrides: str):
    from hydra import compose, initialize_config_dir

    from captioning.cli.extract import CONF_DIR, ExtractConfig
    from captioning.config import to_config

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        raw = compose("extract", overrides=list(overrides))
    return to_config(raw, ExtractConfig)


@pytest.mark.parametrize("encoder", ["efficientnet_lite0", "resnet50", "resnet101", "resnet152", "vgg16", "timm"])
def test_extract_config_composes(encoder: str) -> None:
    from captioning.features.backbones import validate_encoder_config

    cfg = _compose(f"encoder={encoder}", "data=moving_shapes", "trainer=ddp_cpu")
    validate_encoder_config(cfg.encoder)
    assert cfg.features_dir == f"data/moving_shapes/features/{cfg.encoder.name}"
    assert cfg.trainer.devices == 2 and cfg.trainer.strategy == "ddp"
    assert cfg.encoder.name.startswith("timm:") if encoder == "timm" else cfg.encoder.name == encoder


def test_extract_config_errors() -> None:
    from captioning.features.backbones import validate_encoder_config

    with pytest.raises(ConfigError, match="encoder.crop"):
        validate_encoder_config(_compose("encoder.crop=sideways").encoder)
    with pytest.raises(ConfigError, match="unknown config key"):
        _compose("+encoder.colour=red")


# ------------------------------------------------------------------------- the real CLI


@pytest.mark.slow
def test_cli_one_process_and_ddp_cover_every_id_once(tmp_path: Path) -> None:
    from captioning.store.feature_store import FeatureStore

    ids = make_images(tmp_path / "d", 13)  # odd: DistributedSampler pads with a repeated item
    run_extract_cli(*image_cli_args(tmp_path / "d", tmp_path / "f1", "trainer=cpu"))
    proc = run_extract_cli(*image_cli_args(tmp_path / "d", tmp_path / "f2", "trainer=ddp_cpu", "batch_size=3"))
    one, two = store_arrays(tmp_path / "f1"), store_arrays(tmp_path / "f2")
    assert sorted(one) == sorted(ids)
    assert_same_store(one, two)
    store = FeatureStore.open(tmp_path / "f2")
    assert len(store) == len(ids) == len(set(store.ids))
    assert "13 processed" in proc.stdout + proc.stderr  # the summary counts each id once over both ranks
    again = run_extract_cli(*image_cli_args(tmp_path / "d", tmp_path / "f2", "trainer=ddp_cpu"))
    assert "13 skipped as done" in again.stdout + again.stderr


# A killed or out-of-disk extraction, resumed by the same command: faults/test_interrupted_jobs.py
# kills it at every commit step of a shard (deterministically, no polling) and compares the
# resumed store with an uninterrupted run byte for byte.


@pytest.mark.slow
def test_cli_bad_inputs_exit_1_and_are_recorded(tmp_path: Path) -> None:
    from captioning.store.feature_store import FeatureStore

    make_images(tmp_path / "d", 1)
    good = (tmp_path / "d" / "images" / "000000.jpg").read_bytes()
    make_images(tmp_path / "d", 2, extra={"truncated.jpg": good[:200], "zero.jpg": b"", "missing.jpg": None})
    proc = run_extract_cli(*image_cli_args(tmp_path / "d", tmp_path / "f"), check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    store = FeatureStore.open(tmp_path / "f")
    assert len(store) == 2
    failed = json.dumps(list(store.failures))
    assert all(n in failed for n in ("truncated.jpg", "zero.jpg", "missing.jpg"))

    make_videos(tmp_path / "v", 2, extra={"notavideo": b"plain text\n", "gone": None})
    proc = run_extract_cli(*video_cli_args(tmp_path / "v", tmp_path / "fv"), check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    store = FeatureStore.open(tmp_path / "fv")
    assert sorted(store.ids) == ["video0", "video1"]
    assert len(store.failures) == 2



def _peak_rss_kib(args: list[str]) -> int:
    """Max RSS (KiB) over the CLI process and its workers, measured in a fresh wrapper process."""
    code = ("import resource, subprocess, sys; "
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "sys.exit(r.returncode)")
    proc = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "captioning.cli.extract", *args],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_peak_rss_does_not_grow_with_the_number_of_images(tmp_path: Path) -> None:
    make_images(tmp_path / "small", 30, size=(24, 32))
    make_images(tmp_path / "large", 300, size=(24, 32))
    common = ["encoder.image_size=32", "num_workers=2", "batch_size=8", "shard_size=16", "trainer.enable_progress_bar=false"]
    small = _peak_rss_kib(image_cli_args(tmp_path / "small", tmp_path / "fs", *common))
    large = _peak_rss_kib(image_cli_args(tmp_path / "large", tmp_path / "fl", *common))
    assert large <= 1.10 * small, (small, large)


KILL_AFTER_BATCH = """
import os, signal, sys, time
import pytorch_lightning as pl
from captioning.features.backbones import EncoderConfig, build_backbone
from captioning.features.extract import MediaItem, run_extraction
from captioning.store import write_behind
real = write_behind.atomic_write_json
def slow(path, obj, indent=1):  # a slow disk: every shard's commit point comes late
    time.sleep(0.3)
    return real(path, obj, indent=indent)
write_behind.atomic_write_json = slow
class Kill(pl.Callback):  # after the StoreWriter was handed batch k
    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == int(sys.argv[3]):
            os.kill(os.getpid(), signal.SIGKILL)
paths = sorted(os.listdir(sys.argv[1]))
items = [MediaItem(str(i), os.path.join(sys.argv[1], p)) for i, p in enumerate(paths)]
run_extraction(items, "image", build_backbone(EncoderConfig(weights="none", image_size=32)), sys.argv[2],
               trainer={"accelerator": "cpu", "devices": 1}, batch_size=2, shard_size=4, num_workers=0,
               progress=False, callbacks=[Kill()])
"""


@pytest.mark.parametrize("batch", [3, 8])
def test_a_killed_extraction_loses_at_most_its_unfinished_shard_and_the_batches_on_their_way(tmp_path: Path,
                                                                                            batch: int) -> None:
    """SIGKILL after the forward of batch k, the shards slow to commit: every item forwarded is in the
    store except at most the writer's unfinished shard (4 items) and the batches handed to its thread
    and not yet in that shard (the 2 queued, the one being added: 3 x 2 items), and the run resumes."""
    make_images(tmp_path / "d", 24)
    images = tmp_path / "d" / "images"
    proc = subprocess.run([sys.executable, "-c", KILL_AFTER_BATCH, str(images), str(tmp_path / "f"), str(batch)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -9, proc.stderr[-3000:]
    from captioning.store.feature_store import FeatureStore

    forwarded = 2 * (batch + 1)
    stored = FeatureStore.open(tmp_path / "f")
    assert forwarded - len(stored) <= 4 + 3 * 2 and len(stored) % 4 == 0, (forwarded, len(stored))
    assert sorted(stored.ids, key=int) == [str(i) for i in range(len(stored))]


def test_the_steady_state_rate_leaves_the_warm_up_batches_out() -> None:
    """Hand-computed: batches ending at 10, 11, 12, 14 s with 4 items each; warm-up 2 leaves the last
    two batches, 8 items over the 3 s from the end of the second."""
    from captioning_bench.extract_images import steady_rate

    assert steady_rate([(10.0, 4), (11.0, 4), (12.0, 4), (14.0, 4)], 2) == (8 / 3, 3.0)
    assert steady_rate([(10.0, 4), (11.0, 4), (12.0, 4), (14.0, 4)], 0) == (16 / 14, 14.0)
    assert steady_rate([(1.0, 2), (2.0, 2)], 5) == (2.0, 2.0)  # too few batches: all of them


def test_the_extraction_benchmark_measures_the_job_against_its_slowest_part(tmp_path: Path) -> None:
    from conftest import run_bench

    records = {r["name"]: r for r in run_bench("extract_images", (
        f"--num-images 12 --batch-size 4 --image-size 32 --weights none --workers 0 --src-size 40x30 --warmup 1 "
        f"--skip-fold --jpeg-cache {tmp_path}"))}
    ratio = records["extract_images/ratio"]
    parts = {p: ratio[f"{p}_items_per_s"] for p in ("decode", "forward", "write")}
    assert ratio["slowest"] == min(parts, key=parts.__getitem__)
    assert ratio["value"] == pytest.approx(ratio["job_items_per_s"] / parts[ratio["slowest"]], rel=0.01, abs=0.002)
    for p, rate in parts.items():
        assert records[f"extract_images/{p}_throughput"]["value"] == rate
    over = records["extract_images/over_forward"]
    assert over["value"] == pytest.approx(ratio["job_items_per_s"] / parts["forward"], rel=0.01, abs=0.002)
    assert "extract_images/fold_speedup" not in records and ratio["distinct_images"] == 12
    assert sorted(p.name for p in (tmp_path / "40x30-12").iterdir()) == [".complete", *(f"{i:06d}.jpg" for i in range(12))]


def test_without_a_size_the_job_lasts_min_seconds_at_the_slowest_parts_rate(tmp_path: Path) -> None:
    from conftest import run_bench

    records = {r["name"]: r for r in run_bench("extract_images", (
        f"--batch-size 4 --image-size 32 --weights none --workers 0 --src-size 40x30 --warmup 1 --skip-fold "
        f"--part-seconds 0.3 --min-seconds 1 --distinct-images 6 --jpeg-cache {tmp_path}"))}
    ratio = records["extract_images/ratio"]
    slowest = ratio[f"{ratio['slowest']}_items_per_s"]
    expected = 4 * (max(math.ceil(1.5 * slowest / 4), 2) + 1)  # the warm-up batch on top; the rate rounded
    assert ratio["num_images"] % 4 == 0 and abs(ratio["num_images"] - expected) <= 4 and ratio["distinct_images"] == 6
