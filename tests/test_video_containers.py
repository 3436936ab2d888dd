"""Bring-your-own video in any container: real encoded mp4 / webm / mkv / avi / mov / m4v / mpg files
(and ``.MP4``, an odd frame size, a 1-frame video) are found by id by every video annotation reader,
decoded by every installed backend (torchcodec, decord, PyAV; the others skipped with the reason),
and all extracted by ``captioning-extract data=msrvtt_format``.

Frame ``i`` of every generated video has red level ``level(i)`` on its whole area, so the mean red
of a decoded frame tells which frame it is (lossy codecs stay well within half a step).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_extract import ENC, run_extract_cli
from test_video import backend_params

from captioning.config import DataConfig
from captioning.data import video as video_mod
from captioning.data.annotations import read_dataset
from captioning.data.video import read_frames, video_info
from captioning.errors import DataError

av = pytest.importorskip("av")
BACKENDS = backend_params()  # auto, torchcodec, decord, pyav

# id, file name, codec, pixel format, (width, height), frames, frame rate.
# libx264 refuses odd sizes in 4:2:0 (yuv420p needs even width and height: avcodec_open2 fails), so
# the odd-size H.264 .mov is 4:4:4 (legal H.264, High 4:4:4 profile); the 4:2:0 .mov has the
# nearest size a camera or an editor really writes: even, but not a multiple of 16.
VIDEOS = [
    ("h264mp4_0_12", "h264mp4_0_12.mp4", "libx264", "yuv420p", (64, 48), 12, 10),
    ("vp9webm_0_12", "vp9webm_0_12.webm", "libvpx-vp9", "yuv420p", (64, 48), 12, 10),
    ("mpeg4mkv_0_10", "mpeg4mkv_0_10.mkv", "mpeg4", "yuv420p", (64, 48), 10, 10),
    ("mjpegavi_0_9", "mjpegavi_0_9.avi", "mjpeg", "yuvj420p", (64, 48), 9, 10),
    ("h264mov_0_11", "h264mov_0_11.mov", "libx264", "yuv444p", (97, 71), 11, 10),
    ("h264mov420_0_8", "h264mov420_0_8.mov", "libx264", "yuv420p", (98, 70), 8, 10),
    ("h264m4v_0_8", "h264m4v_0_8.m4v", "libx264", "yuv420p", (64, 48), 8, 10),
    ("mpeg2mpg_0_10", "mpeg2mpg_0_10.mpg", "mpeg2video", "yuv420p", (64, 48), 10, 25),
    ("upper_0_9", "upper_0_9.MP4", "libx264", "yuv420p", (64, 48), 9, 10),
    ("oneframe_0_1", "oneframe_0_1.mp4", "libx264", "yuv420p", (64, 48), 1, 10),
]
K = 4  # frames per video at extraction
# uniform sampling takes the centre frame of each of K equal segments, floor((2i + 1) * F / 2K):
CENTRES = {12: [1, 4, 7, 10], 11: [1, 4, 6, 9], 10: [1, 3, 6, 8], 9: [1, 3, 5, 7], 8: [1, 3, 5, 7],
           1: [0, 0, 0, 0]}


def level(i: int) -> int:
    return 30 + 16 * i


def write_video(path: Path, codec: str, pix_fmt: str, size: tuple[int, int], frames: int, rate: int) -> None:
    w, h = size
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=rate)
        s.width, s.height, s.pix_fmt = w, h, pix_fmt
        for i in range(frames):
            arr = np.zeros((h, w, 3), np.uint8)
            arr[..., 0] = level(i)
            arr[:, : w // 2, 1] = 200  # some structure for the encoder
            for pkt in s.encode(av.VideoFrame.from_ndarray(arr, format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)


def frame_ids(frames: np.ndarray) -> list[int]:
    return [int(round((f[..., 0].mean() - 30) / 16)) for f in frames]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """``root/videos`` with one file per VIDEOS row; MSR-VTT json and MSVD descriptions for them."""
    missing = [codec for _, _, codec, *_ in VIDEOS if not _has_encoder(codec)]
    if missing:
        pytest.skip(f"this PyAV has no encoder for {missing}")
    root = tmp_path_factory.mktemp("byo")
    (root / "videos").mkdir()
    (root / "annotations").mkdir()
    for _, name, codec, pix, size, frames, rate in VIDEOS:
        write_video(root / "videos" / name, codec, pix, size, frames, rate)
    splits = ["train", "validate", "test"]
    info = {"videos": [{"video_id": v[0], "split": splits[i % 3], "id": i} for i, v in enumerate(VIDEOS)],
            "sentences": [{"video_id": v[0], "caption": f"a red clip number {i}", "sen_id": i}
                          for i, v in enumerate(VIDEOS)]}
    (root / "annotations" / "videodatainfo.json").write_text(json.dumps(info))
    (root / "AllVideoDescriptions.txt").write_text("".join(f"{v[0]} a red clip number {i}\n"
                                                           for i, v in enumerate(VIDEOS)))
    return root


def _has_encoder(codec: str) -> bool:
    try:
        av.codec.Codec(codec, "w")
    except Exception:
        return False
    return True


@pytest.mark.parametrize("fmt", ["msrvtt", "msvd"])
def test_every_video_reader_finds_each_container(dataset: Path, fmt: str) -> None:
    ann = dataset / ("annotations/videodatainfo.json" if fmt == "msrvtt" else "AllVideoDescriptions.txt")
    cfg = DataConfig(name="byo", kind="video", format=fmt, root=str(dataset), media_dir=str(dataset / "videos"),
                     annotations={"all": str(ann)}, on_error="raise")
    ds = read_dataset(cfg, check_files=True)  # a file not found would raise
    assert {r.item_id: r.path for r in ds.records} == {v[0]: v[1] for v in VIDEOS}
    assert ds.skipped == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("row", VIDEOS, ids=[v[1] for v in VIDEOS])
def test_each_container_decodes_the_right_frames(dataset: Path, row: tuple, backend: str) -> None:
    """Every frame in order, and sparse indices out of order (what extraction asks for: random access)."""
    _, name, codec, _, (w, h), frames, rate = row
    p = dataset / "videos" / name
    if backend in video_mod.SEEKING and name.endswith(".mpg"):  # their seek returns wrong frames
        with pytest.raises(DataError, match=r"mpeg2mpg_0_10\.mpg is an MPEG program/transport stream"):
            read_frames(p, [3], backend=backend)
        return
    info = video_info(p, backend=backend)
    assert (info.num_frames, info.width, info.height) == (frames, w, h)
    assert info.fps == pytest.approx(rate)
    got = read_frames(p, list(range(frames)), backend=backend)
    assert got.shape == (frames, h, w, 3) and got.dtype == np.uint8
    assert frame_ids(got) == list(range(frames))
    sparse = [frames - 1, frames // 2, 0, frames // 2]
    assert frame_ids(read_frames(p, sparse, backend=backend)) == sparse


@pytest.mark.slow
def test_extract_cli_extracts_every_container(dataset: Path, tmp_path: Path) -> None:
    """``captioning-extract data=msrvtt_format`` with the default backend (auto: the first installed
    of torchcodec, decord, PyAV, and PyAV for the .mpg): every video extracted (exit 0, no failure,
    nothing "not found"), K sampled frames each at the hand-computed indices, finite features; the
    store records the backend."""
    from captioning.store.feature_store import FeatureStore

    out = tmp_path / "features"
    proc = run_extract_cli(
        "data=msrvtt_format", "data.name=byo", f"data.root={dataset}", "data.on_error=raise",
        f"features_dir={out}", f"hydra.run.dir={tmp_path}/hydra", "num_workers=0", "batch_size=5", *ENC,
        f"encoder.frames={K}", "encoder.frame_size=64", "trainer.enable_progress_bar=false")
    log = proc.stdout + proc.stderr
    assert f"{len(VIDEOS)} processed" in log and "0 failed" in log and "not found" not in log, log[-3000:]
    store = FeatureStore.open(out)
    assert list(store.failures) == []
    assert store.meta["video_backend"] == video_mod.installed_backends()[0]
    assert sorted(store.ids) == sorted(v[0] for v in VIDEOS)
    for vid, _, _, _, _, frames, _ in VIDEOS:
        item = store[vid]
        feats = np.asarray(item.features, np.float32)
        assert feats.shape == (K, 1280) and np.isfinite(feats).all(), vid
        assert item.valid == K and list(item.frame_indices) == CENTRES[frames], vid
        if frames == 1:  # the one frame, four times
            assert np.array_equal(feats, np.repeat(feats[:1], K, 0))
        else:  # four different frames (decord's seek in the .mpg gave frame 0 four times)
            assert len({row.tobytes() for row in feats}) == K, vid
