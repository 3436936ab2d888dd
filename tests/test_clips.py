"""3-D CNN clip features: clip frame indices, the clip encoders (r3d_18, mc3_18, r2plus1d_18, s3d),
their weights, the extraction job with clips (boundaries, determinism, grid), the captioning-extract CLI
(1 process, DDP, SIGKILL + resume, a wrong weights file), two-stream stores and the extract-videos bench."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_bench
from test_extract import (
    REPO,
    assert_same_store,
    cli_env,
    run_extract_cli,
    store_arrays,
    write_video,
)

from captioning.errors import CheckpointError, ConfigError, DataError
from captioning.features.backbones import EncoderConfig
from captioning.features.clips import clip_frame_indices, clip_union
from captioning.features.encoders import build_encoder
from captioning.features.extract import (
    MediaDataset,
    MediaItem,
    VideoSampling,
    run_extraction,
    store_meta,
)

CPU = {"accelerator": "cpu", "devices": 1, "precision": "32-true"}
KINETICS_MEAN = (0.43216, 0.394666, 0.37645)  # torchvision's video weights (Kinetics-400)
KINETICS_STD = (0.22803, 0.22145, 0.216989)
NAMES = ("r3d_18", "mc3_18", "r2plus1d_18", "s3d")
# the cheapest clips each network accepts: (clip_length, frame_size); s3d needs >= 5 frames
CHEAP = {"r3d_18": (2, 32), "mc3_18": (2, 32), "r2plus1d_18": (2, 32), "s3d": (5, 32)}
CHANNELS = {"r3d_18": 512, "mc3_18": 512, "r2plus1d_18": 512, "s3d": 1024}


def tiny(name: str = "r2plus1d_18", **kw) -> EncoderConfig:
    length, size = CHEAP[name]
    args = {"name": name, "weights": "none", "frames": 4, "clip_length": length, "frame_size": size, **kw}
    return EncoderConfig(**args)


def make_clip_videos(root: Path, lengths: tuple[int, ...]) -> list[str]:
    """An MSR-VTT-format dataset of 64-px mp4s with the given frame counts."""
    (root / "videos").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    ids = []
    for i, n in enumerate(lengths):
        write_video(root / "videos" / f"video{i}.mp4", frames=n, size=64, seed=i)
        ids.append(f"video{i}")
    info = {"videos": [{"video_id": v, "split": ["train", "validate", "test"][i % 3], "id": i} for i, v in enumerate(ids)],
            "sentences": [{"video_id": v, "caption": f"clip {i} shows shapes", "sen_id": i} for i, v in enumerate(ids)]}
    (root / "annotations" / "videodatainfo.json").write_text(json.dumps(info))
    return ids


def items_in(root: Path, ids: list[str]) -> list[MediaItem]:
    return [MediaItem(v, str(root / "videos" / f"{v}.mp4")) for v in ids]


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict:
    """video0: 3 frames (shorter than one clip), video1: 12, video2: 20."""
    root = tmp_path_factory.mktemp("clipvids")
    ids = make_clip_videos(root, (3, 12, 20))
    return {"root": root, "ids": ids, "items": items_in(root, ids)}


@pytest.fixture(scope="module")
def r21d_store(videos, tmp_path_factory) -> dict:
    """r2plus1d_18 pooled features of ``videos``: K=4 clips of 4 frames every 2nd frame, 32 px."""
    cfg = tiny(clip_length=4, clip_stride=2)
    backbone = build_encoder(cfg)
    out = tmp_path_factory.mktemp("r21d") / "f"
    run_extraction(videos["items"], "video", backbone, out, trainer=CPU, batch_size=2, num_workers=0, progress=False)
    return {"dir": out, "backbone": backbone, "cfg": cfg}


# ---------------------------------------------------------------------------- clip indices


def test_clip_frame_indices_centre_and_clamp() -> None:
    # L=4, stride 2: offsets (j - 2) * 2 = -4, -2, 0, 2; clamped to [0, 9]
    np.testing.assert_array_equal(clip_frame_indices([0, 5, 9], 10, 4, 2), [[0, 0, 0, 2], [1, 3, 5, 7], [5, 7, 9, 9]])
    np.testing.assert_array_equal(clip_frame_indices([4], 10, 3, 1), [[3, 4, 5]])  # odd L: symmetric
    # a video shorter than one clip: its frames with the edge frames repeated
    np.testing.assert_array_equal(clip_frame_indices([0, 1], 2, 5, 1), [[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(clip_frame_indices([0, 0], 1, 3, 4), [[0, 0, 0], [0, 0, 0]])
    frames, index = clip_union(np.array([[0, 0, 1], [1, 3, 3]]))
    assert frames == [0, 1, 3]
    np.testing.assert_array_equal(index, [[0, 0, 1], [1, 2, 2]])
    with pytest.raises(ConfigError, match="clip_length"):
        clip_frame_indices([0], 5, 0, 1)


def test_dataset_decodes_the_union_of_the_clips_once(videos) -> None:
    cfg = tiny(clip_length=4, clip_stride=2)
    b = build_encoder(cfg)
    ds = MediaDataset(videos["items"], "video", b.preprocessing(), VideoSampling.from_encoder(cfg))
    d = ds[1]  # 12 frames, K=4 uniform: floor((2i+1) * 12 / 8) = 1, 4, 7, 10
    assert d["error"] is None and d["frame_indices"] == (1, 4, 7, 10)
    # clips (offsets -4, -2, 0, 2): [0,0,1,3] [0,2,4,6] [3,5,7,9] [6,8,10,11]: 16 slots, 12 frames each once
    assert d["clip_frames"].shape == (12, 3, 32, 32) and d["pixels"].shape == (4, 3, 32, 32)
    np.testing.assert_array_equal(d["clip_index"].numpy(), [[0, 0, 1, 3], [0, 2, 4, 6], [3, 5, 7, 9], [6, 8, 10, 11]])
    for k, f in enumerate((1, 4, 7, 10)):  # the centre frames are the sampled frames
        assert torch.equal(d["pixels"][k], d["clip_frames"][f])
    d = ds[0]  # 3 frames, K=4 (repeat): 0, 1, 1, 2; clips [0,0,0,2] [0,0,1,3->2] [0,0,1,2] [0,0,2,2]
    assert d["frame_indices"] == (0, 1, 1, 2) and d["clip_frames"].shape == (3, 3, 32, 32)
    np.testing.assert_array_equal(d["clip_index"].numpy(), [[0, 0, 0, 2], [0, 0, 1, 2], [0, 0, 1, 2], [0, 0, 2, 2]])


# ---------------------------------------------------------------------------- the encoders


@pytest.mark.parametrize(("name", "size", "resize"),
                         [("r3d_18", 112, 128), ("mc3_18", 112, 128), ("r2plus1d_18", 112, 128), ("s3d", 224, 256)])
def test_clip_encoder_contract(name: str, size: int, resize: int) -> None:
    """conf/encoder/<name>.yaml + the network: torchvision's resolution/normalisation, shapes, settings."""
    from test_extract import _compose

    cfg = _compose(f"encoder={name}", "data=moving_shapes", "encoder.weights=none")
    assert cfg.encoder.name == name and cfg.encoder.frame_size == size and cfg.encoder.clip_length == 16
    assert cfg.features_dir == f"data/moving_shapes/features/{name}"
    length, small = CHEAP[name]
    cfg.encoder.frame_size, cfg.encoder.clip_length, cfg.encoder.frames = small, length, 4
    b = build_encoder(cfg.encoder)
    assert b.is_clip_encoder and not any(p.requires_grad for p in b.parameters())
    assert round(size * b.resize_ratio) == resize  # 128 -> 112 and 256 -> 224, as torchvision's transforms
    pre = b.preprocessing()
    assert pre.mean == KINETICS_MEAN and pre.std == KINETICS_STD and (pre.size, pre.resize) == (small, 37)
    assert b.output_shape(size)[0] == CHANNELS[name]  # the default clips (a shape-only dry run)
    x = torch.randn(1, 3, length, small, small)
    with torch.inference_mode():
        pooled = b.clip_features(x, "pooled")
        grid = b.clip_features(x, "grid")
    c, h, w = b.output_shape(small)
    assert c == CHANNELS[name] and pooled.shape == (1, c) and grid.shape == (1, h * w, c)
    torch.testing.assert_close(grid.mean(dim=1), pooled)  # equal cells: the space-time mean is the mean of cells
    s = b.settings(video=True)
    assert s["name"] == name and s["weights"] == "none" and s["video"]["frames"] == 4
    assert s["clip"] == {"length": length, "stride": 1, "centre": length // 2, "edges": "clamp"}


def test_clip_encoder_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="too small for s3d"):
        build_encoder(tiny("s3d", clip_length=2)).output_shape()
    with pytest.raises(ConfigError, match="not a stage of r3d_18"):
        build_encoder(tiny("r3d_18", layer="layer9"))
    with pytest.raises(ConfigError, match="packaged"):
        build_encoder(tiny(weights="packaged"))
    with pytest.raises(ConfigError, match="encoder.resize=30 is smaller than encoder.frame_size=32"):
        build_encoder(tiny(resize=30))
    with pytest.raises(ConfigError, match="clip_stride"):
        build_encoder(tiny(clip_stride=0))
    with pytest.raises(ConfigError, match="needs data.kind=video"):
        store_meta(build_encoder(tiny()), "image", "float16")


def test_pretrained_offline_is_one_line_that_says_to_pass_a_file(monkeypatch) -> None:
    import urllib.error

    import torchvision.models._api as api

    def offline(*a, **k):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(api, "load_state_dict_from_url", offline)
    with pytest.raises(ConfigError) as e:
        build_encoder(tiny(weights="pretrained"))
    msg = str(e.value)
    assert "\n" not in msg and "encoder.weights=/path/to/r2plus1d_18-" in msg and "download.pytorch.org" in msg


@pytest.fixture(scope="module")
def weight_files(tmp_path_factory) -> dict:
    """A perturbed r2plus1d_18 state dict and an r3d_18 one (wrong architecture for r2plus1d_18)."""
    root = tmp_path_factory.mktemp("weights")
    src = build_encoder(tiny())
    with torch.no_grad():
        for p in src.classifier.parameters():
            p.add_(0.01)  # differ from the seeded init
    torch.save({"state_dict": src.classifier.state_dict()}, root / "mine.pt")
    torch.save(build_encoder(tiny("r3d_18")).classifier.state_dict(), root / "r3d.pt")
    return {"source": src, "mine": root / "mine.pt", "r3d": root / "r3d.pt"}


def test_weights_file_by_path_and_wrong_architecture(weight_files) -> None:
    b = build_encoder(tiny(weights=str(weight_files["mine"])))
    for (name, mine), theirs in zip(b.classifier.state_dict().items(), weight_files["source"].classifier.state_dict().values(),
                                    strict=True):
        assert torch.equal(mine, theirs), name
    assert b.settings()["weights"].startswith("file:mine.pt:sha256=")
    with pytest.raises(CheckpointError) as e:
        build_encoder(tiny(weights=str(weight_files["r3d"])))
    msg = str(e.value)
    assert "\n" not in msg and str(weight_files["r3d"]) in msg and "is not a r2plus1d_18 state dict" in msg
    with pytest.raises(CheckpointError, match=r"is not a mc3_18 state dict \('layer2\.0\.conv1\.0\.weight' is "
                                              r"\[128, 64, 3, 3, 3\] where mc3_18 has \[128, 64, 1, 3, 3\]\)"):
        build_encoder(tiny("mc3_18", weights=str(weight_files["r3d"])))  # same keys, 3x3x3 vs 1x3x3 kernels


# ------------------------------------------------------------------------------ extraction


def test_clip_features_at_the_video_boundaries(videos, r21d_store) -> None:
    """Stored rows == the network on clips built here by hand (clamped at both ends of each video)."""
    from captioning.data.video import read_frames
    from captioning.store.feature_store import FeatureStore

    store = FeatureStore.open(r21d_store["dir"])
    b = r21d_store["backbone"]
    pre = b.preprocessing()
    assert store.meta["positions"] == 4 and store.meta["dim"] == 512 and store.meta["grid"] is None
    assert store.meta["frames"] == 4 and store.meta["settings"]["clip"]["length"] == 4
    assert store.meta["encoder"]["clip_length"] == 4 and store.meta["encoder"]["clip_stride"] == 2
    # sampled frame -> its clip (offsets -4, -2, 0, 2), written out by hand
    cases = {
        "video0": ((0, 1, 1, 2), {0: [0, 0, 0, 2], 3: [0, 0, 2, 2]}),  # 3 frames: shorter than one clip
        "video1": ((1, 4, 7, 10), {0: [0, 0, 1, 3], 3: [6, 8, 10, 11]}),
        "video2": ((2, 7, 12, 17), {0: [0, 0, 2, 4], 3: [13, 15, 17, 19]}),
    }
    for vid, (sampled, clips) in cases.items():
        item = store[vid]
        assert item.frame_indices == sampled and item.valid == 4
        path = str(videos["root"] / "videos" / f"{vid}.mp4")
        for k, frames in clips.items():
            x = pre(torch.from_numpy(read_frames(path, frames)).permute(0, 3, 1, 2))  # [L, 3, S, S]
            clip = pre.normalize(x).permute(1, 0, 2, 3)[None]  # [1, 3, L, S, S]
            with torch.inference_mode():
                want = b.clip_features(clip)[0].numpy()
            np.testing.assert_allclose(np.asarray(item.features[k], np.float32), want, rtol=1e-2, atol=2e-3)


def test_clip_extraction_is_deterministic_and_grid_pools_to_pooled(videos, r21d_store, tmp_path: Path) -> None:
    from captioning.store.feature_store import FeatureStore

    again = build_encoder(r21d_store["cfg"])  # a second, independently built network
    run_extraction(videos["items"], "video", again, tmp_path / "again", trainer=CPU, batch_size=3, num_workers=0,
                   progress=False)
    one, two = FeatureStore.open(r21d_store["dir"]), FeatureStore.open(tmp_path / "again")
    for vid in videos["ids"]:
        assert np.asarray(one[vid].features).tobytes() == np.asarray(two[vid].features).tobytes(), vid
    grid = build_encoder(EncoderConfig(**{**r21d_store["cfg"].__dict__, "video_features": "grid"}))
    run_extraction(videos["items"][1:2], "video", grid, tmp_path / "grid", trainer=CPU, num_workers=0,
                   progress=False, dtype="float32")
    g = FeatureStore.open(tmp_path / "grid")
    assert g.meta["grid"] == [2, 2] and g.meta["positions"] == 16  # K=4 clips x 2x2 cells
    item = g["video1"]
    assert item.valid == 16 and item.features.shape == (16, 512)
    per_frame = np.asarray(item.features).reshape(4, 4, 512).mean(axis=1)  # frame-major [K, h*w, C]
    np.testing.assert_allclose(per_frame, np.asarray(one["video1"].features, np.float32), rtol=1e-2, atol=2e-3)


def test_short_video_pad_zeroes_the_missing_clips(videos, tmp_path: Path) -> None:
    from captioning.store.feature_store import FeatureStore

    b = build_encoder(tiny(short_video="pad"))
    run_extraction(videos["items"][:1], "video", b, tmp_path / "pad", trainer=CPU, num_workers=0, progress=False)
    item = FeatureStore.open(tmp_path / "pad")["video0"]  # 3 frames, K=4
    assert item.valid == 3 and item.frame_indices == (0, 1, 2, 2)
    assert not np.asarray(item.features[3]).any() and np.asarray(item.features[:3]).any()


@pytest.mark.parametrize("name", ["r3d_18", "mc3_18", "s3d"])
def test_extract_job_runs_every_clip_encoder(name: str, videos, tmp_path: Path) -> None:
    """``captioning-extract``'s job (Hydra config -> ``extract``) with each other encoder, cheapest clips."""
    from test_extract import _compose

    from captioning.cli.extract import extract
    from captioning.store.feature_store import FeatureStore

    length, size = CHEAP[name]
    cfg = _compose("data=moving_shapes", "data.name=clips", f"data.root={videos['root']}", "data.synthetic=null",
                   "data.grounding=null", f"features_dir={tmp_path / 'f'}", "num_workers=0", "batch_size=3",
                   f"encoder={name}", "encoder.weights=none", "encoder.frames=2", f"encoder.clip_length={length}",
                   f"encoder.frame_size={size}", "trainer.enable_progress_bar=false", "limit=1")
    summary = extract(cfg)
    assert (summary["processed"], summary["failed"]) == (1, 0)
    store = FeatureStore.open(tmp_path / "f")
    assert store.meta["settings"]["name"] == name and store.meta["dim"] == CHANNELS[name]
    assert store["video0"].features.shape == (2, CHANNELS[name])


def test_store_meta_rebuilds_the_extractor(videos, r21d_store) -> None:
    """What a checkpoint keeps (the store meta) rebuilds the same clip extractor and features."""
    from conftest import featurize_files

    from captioning.features.featurize import rebuild_backbone
    from captioning.store.feature_store import FeatureStore

    store = FeatureStore.open(r21d_store["dir"])
    meta = json.loads(json.dumps(store.meta))  # as saved in a checkpoint
    b = rebuild_backbone(meta, "ckpt")
    assert b.is_clip_encoder and b.settings(video=True) == meta["settings"]
    got = featurize_files(b, [videos["items"][2].path], "video")
    for f, vid in zip(got, videos["ids"][2:], strict=True):
        assert f.error is None and f.frame_indices == store[vid].frame_indices
        assert f.pixels.shape == (4, 3, 32, 32)  # the centre frames, for the figures
        np.testing.assert_allclose(f.features.float().numpy(), np.asarray(store[vid].features, np.float32),
                                   rtol=1e-2, atol=2e-3)


# ---------------------------------------------------------------------------- two streams


def test_two_stream_store_end_to_end(videos, r21d_store, tmp_path: Path) -> None:
    """2-D appearance + 3-D motion features of the same sampled frames, read as one store."""
    from captioning.store.feature_store import FeatureStore
    from captioning.store.streams import FeatureStreams, open_features

    lite0 = build_encoder(EncoderConfig(weights="none", frame_size=32, frames=4))  # same K and strategy
    run_extraction(videos["items"], "video", lite0, tmp_path / "app", trainer=CPU, num_workers=0, progress=False)
    both = open_features([tmp_path / "app", r21d_store["dir"]])
    assert isinstance(both, FeatureStreams) and isinstance(open_features(str(tmp_path / "app")), FeatureStore)
    app, mot = FeatureStore.open(tmp_path / "app"), FeatureStore.open(r21d_store["dir"])
    assert both.meta["dim"] == 1280 + 512 and both.meta["kind"] == "video" and both.meta["frames"] == 4
    assert [s["settings"]["name"] for s in both.meta["streams"]] == ["efficientnet_lite0", "r2plus1d_18"]
    assert sorted(both.ids) == sorted(videos["ids"])
    for vid in videos["ids"]:
        assert app[vid].frame_indices == mot[vid].frame_indices == both[vid].frame_indices
        f = both[vid].features
        assert f.shape == (4, 1792)
        assert np.array_equal(f[:, :1280], app[vid].features) and np.array_equal(f[:, 1280:], mot[vid].features)
    other = build_encoder(EncoderConfig(weights="none", frame_size=32, frames=3))
    run_extraction(videos["items"][:1], "video", other, tmp_path / "k3", trainer=CPU, num_workers=0, progress=False)
    with pytest.raises(DataError, match="disagree on frames"):
        open_features([tmp_path / "k3", r21d_store["dir"]])


# ------------------------------------------------------------------------- the real CLI


def clip_cli_args(root: Path, features: Path, *extra: str) -> list[str]:
    return ["data=moving_shapes", "data.name=clips", f"data.root={root}", "data.synthetic=null", "data.grounding=null",
            f"features_dir={features}", f"hydra.run.dir={root}/hydra", "num_workers=0", "encoder=r2plus1d_18",
            "encoder.weights=none", "encoder.frames=3", "encoder.clip_length=2", "encoder.frame_size=32", *extra]


@pytest.fixture(scope="module")
def cli_videos(tmp_path_factory) -> dict:
    """9 videos (odd: DistributedSampler pads) and their features from an uninterrupted in-process run."""
    root = tmp_path_factory.mktemp("clipcli")
    ids = make_clip_videos(root, (12, 14, 16, 18, 20, 13, 15, 17, 19))
    cfg = EncoderConfig(name="r2plus1d_18", weights="none", frames=3, clip_length=2, frame_size=32)
    run_extraction(items_in(root, ids), "video", build_encoder(cfg), root / "clean", trainer=CPU, batch_size=3,
                   num_workers=0, progress=False)
    return {"root": root, "ids": ids, "clean": store_arrays(root / "clean")}


@pytest.mark.slow
def test_cli_clip_encoder_ddp(cli_videos, tmp_path: Path) -> None:
    """``captioning-extract encoder=r2plus1d_18 trainer=ddp_cpu``: 2 ranks, every id once, = 1 process."""
    from captioning.store.feature_store import FeatureStore

    root, ids = cli_videos["root"], cli_videos["ids"]
    proc = run_extract_cli(*clip_cli_args(root, tmp_path / "f2", "trainer=ddp_cpu", "batch_size=2", "shard_size=2"))
    one, two = cli_videos["clean"], store_arrays(tmp_path / "f2")
    assert sorted(one) == sorted(ids)
    assert_same_store(one, two)
    store = FeatureStore.open(tmp_path / "f2")
    assert len(store) == len(ids) == len(set(store.ids)) and store.meta["settings"]["name"] == "r2plus1d_18"
    assert {p.name[:4] for p in (tmp_path / "f2" / "shards").glob("*.npy")} == {"r000", "r001"}  # both ranks wrote
    assert f"{len(ids)} processed" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_cli_clip_sigkill_then_resume_equals_uninterrupted(cli_videos, tmp_path: Path) -> None:
    from captioning.store.feature_store import FeatureStore

    root, ids = cli_videos["root"], cli_videos["ids"]
    args = clip_cli_args(root, tmp_path / "killed", "batch_size=1", "shard_size=1")
    p = subprocess.Popen([sys.executable, "-m", "captioning.cli.extract", *args], cwd=REPO, env=cli_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    partial = 0
    while time.monotonic() < deadline and p.poll() is None:
        try:
            partial = len(FeatureStore.open(tmp_path / "killed"))
        except Exception:
            partial = 0
        if partial > 0:
            break
        time.sleep(0.02)
    alive = p.poll() is None
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert alive and 0 < partial < len(ids), f"not killed mid-way (alive={alive}, items={partial})"
    again = run_extract_cli(*args)  # resume
    skipped = int(re.search(r"(\d+) skipped as done", again.stdout + again.stderr).group(1))
    assert partial <= skipped < len(ids)
    assert_same_store(store_arrays(tmp_path / "killed"), cli_videos["clean"])
    assert len(FeatureStore.open(tmp_path / "killed")) == len(ids)


@pytest.mark.slow
def test_cli_wrong_architecture_weights_is_one_line(cli_videos, weight_files, tmp_path: Path) -> None:
    proc = run_extract_cli(*clip_cli_args(cli_videos["root"], tmp_path / "f", f"encoder.weights={weight_files['r3d']}"),
                           check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert str(weight_files["r3d"]) in errors[0] and "is not a r2plus1d_18 state dict" in errors[0]
    assert not (tmp_path / "f").exists()


# ------------------------------------------------------------------------------ benchmark


def test_extract_videos_bench_smoke() -> None:
    encoder = "r2plus1d_18"  # the clip path; the 2-D path differs only in the extraction job's branch
    results = run_bench("extract_videos", f"--encoder {encoder} --weights none --num-videos 2 --video-frames 16 "
                                          f"--src-size 32 --frames 2 --frame-size 32 --clip-length 2 "
                                          f"--batch-size 1 --workers 0")
    by_name = {r["name"]: r for r in results}
    ratio = by_name["extract_videos/ratio"]
    assert ratio["unit"] == "x" and ratio["value"] > 0 and ratio["encoder"] == encoder
    assert by_name["extract_videos/job_throughput"]["unit"] == "videos/s"
    assert by_name["extract_videos/forward_throughput"]["value"] > 0
    assert all({"name", "unit", "value"} <= set(r) for r in results)
