"""Frame sampling (hand-computed indices) and decoding with every installed backend (torchcodec,
decord, PyAV, and ``auto``) on generated videos; a backend that is not installed is skipped with
the reason.

Every generated video's frame i is a flat grey of level ``20 + 18 * i``, so the mean of a decoded
frame tells which frame it is.
"""

from __future__ import annotations

import fractions
from pathlib import Path

import numpy as np
import pytest

from captioning.data import video as video_mod
from captioning.data.video import VideoInfo, read_frames, sample_frame_indices, video_info
from captioning.errors import ConfigError, DataError

av = pytest.importorskip("av")


def backend_params(names: tuple[str, ...] = video_mod.BACKENDS) -> list:
    """``names`` as pytest params; a backend this process cannot decode with is skipped with the reason."""
    return [pytest.param(b, id=b, marks=pytest.mark.skipif(b != "auto" and video_mod.unavailable(b) is not None,
                                                           reason=str(video_mod.unavailable(b))))
            for b in names]


BACKENDS = backend_params()  # auto, torchcodec, decord, pyav
SEEKING = backend_params(video_mod.SEEKING)  # torchcodec, decord: random access by frame index
SIZE = (64, 48)  # W, H


def level(i: int) -> int:
    return 20 + 18 * i


def frame_ids(frames: np.ndarray) -> list[int]:
    """Which generated frame each decoded frame is (by its mean grey level)."""
    means = frames.reshape(len(frames), -1).mean(axis=1)
    return [int(round((m - 20) / 18)) for m in means]


def has_encoder(codec: str) -> bool:
    try:
        av.codec.Codec(codec, "w")
    except Exception:
        return False
    return True


def write_video(path: Path, codec: str = "libx264", n: int = 12, fps: int = 10, vfr_ms: list[int] | None = None,
                fmt: str | None = None) -> Path:
    """n frames of flat grey ``level(i)``; ``vfr_ms``: frame durations (ms) cycled -> variable frame rate."""
    with av.open(str(path), "w", format=fmt) as c:
        s = c.add_stream(codec, rate=fps)
        s.width, s.height = SIZE
        s.pix_fmt = "yuv420p"
        if vfr_ms:
            s.codec_context.time_base = fractions.Fraction(1, 1000)
            s.time_base = fractions.Fraction(1, 1000)
        t = 0
        for i in range(n):
            arr = np.full((SIZE[1], SIZE[0], 3), level(i), np.uint8)
            frame = av.VideoFrame.from_ndarray(arr, format="rgb24")
            if vfr_ms:
                frame.pts, frame.time_base = t, fractions.Fraction(1, 1000)
                t += vfr_ms[i % len(vfr_ms)]
            for pkt in s.encode(frame):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)
    return path


# ------------------------------------------------------------------------------------ sampling


def test_uniform_segment_centres() -> None:
    # F=100, k=4: segments of 25 frames, centres floor(12.5), floor(37.5), ...
    assert sample_frame_indices(100, 4) == ([12, 37, 62, 87], 4)
    assert sample_frame_indices(10, 10) == (list(range(10)), 10)
    idx, valid = sample_frame_indices(300, 28)
    assert valid == 28 and len(idx) == 28 and idx == sorted(idx) and len(set(idx)) == 28
    assert idx[0] == 5 and idx[-1] == 294  # floor(0.5 * 300 / 28), floor(27.5 * 300 / 28)


def test_short_video_repeat_and_pad() -> None:
    # F=3 < k=6: repeat -> each frame twice (centres 0.25, 0.75, 1.25, ... of 3 frames / 6)
    assert sample_frame_indices(3, 6, short="repeat") == ([0, 0, 1, 1, 2, 2], 6)
    idx, valid = sample_frame_indices(3, 6, short="pad")
    assert valid == 3 and idx[:3] == [0, 1, 2] and len(idx) == 6 and idx[3:] == [2, 2, 2]
    assert sample_frame_indices(1, 4, short="repeat") == ([0, 0, 0, 0], 4)
    assert sample_frame_indices(1, 4, short="pad") == ([0, 0, 0, 0], 1)


def test_fps_and_all_strategies() -> None:
    # 30 fps -> 5 fps: every 6th frame of 60 -> 0, 6, ..., 54 (10 frames)
    assert sample_frame_indices(60, 10, "fps", fps=30, target_fps=5) == (list(range(0, 60, 6)), 10)
    # 20 candidates capped at k=4: centres of 4 segments of the candidates (2, 7, 12, 17 -> x6)
    assert sample_frame_indices(120, 4, "fps", fps=30, target_fps=5) == ([12, 42, 72, 102], 4)
    # fewer candidates than k
    assert sample_frame_indices(12, 4, "fps", fps=30, target_fps=5, short="pad") == ([0, 6, 6, 6], 2)
    assert sample_frame_indices(12, 4, "fps", fps=30, target_fps=5, short="repeat") == ([0, 0, 6, 6], 4)
    assert sample_frame_indices(5, 2, "all") == ([0, 1, 2, 3, 4], 5)
    assert sample_frame_indices(5, None, "all") == ([0, 1, 2, 3, 4], 5)


def test_sampling_errors() -> None:
    with pytest.raises(DataError):
        sample_frame_indices(0, 4)
    with pytest.raises(ConfigError):
        sample_frame_indices(10, 0)
    with pytest.raises(ConfigError):
        sample_frame_indices(10, 4, strategy="random")
    with pytest.raises(ConfigError):
        sample_frame_indices(10, 4, short="loop")
    with pytest.raises(DataError, match="frame rate"):
        sample_frame_indices(10, 4, "fps", fps=None, target_fps=1)
    with pytest.raises(ConfigError, match="target_fps"):
        sample_frame_indices(10, 4, "fps", fps=25, target_fps=0)


@pytest.mark.parametrize("n", [1, 2, 7, 28, 29, 1000])
@pytest.mark.parametrize("k", [1, 5, 28])
def test_sampling_invariants(n: int, k: int) -> None:
    for short in ("repeat", "pad"):
        idx, valid = sample_frame_indices(n, k, short=short)
        assert len(idx) == k and all(0 <= i < n for i in idx) and idx == sorted(idx)
        assert valid == (k if short == "repeat" or n >= k else n)


# ------------------------------------------------------------------------------------ decoding

CONTAINERS = [
    ("mp4", "libx264", None),
    ("webm", "libvpx-vp9", None),
    ("webm", "libvpx", None),
    ("mkv", "libx264", None),
    ("avi", "mpeg4", None),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("ext", "codec", "fmt"), CONTAINERS, ids=[f"{e}-{c}" for e, c, _ in CONTAINERS])
def test_containers_and_backends_agree(tmp_path: Path, ext: str, codec: str, fmt: str | None, backend: str) -> None:
    """Each backend: the frame count, rate and size, the frames asked for (any order, repeats) and
    the pixels of PyAV's decoding of them, within 8 grey levels (0 measured: the same FFmpeg code)."""
    if not has_encoder(codec):
        pytest.skip(f"PyAV has no {codec} encoder here")
    p = write_video(tmp_path / f"clip.{ext}", codec, n=12, fps=10, fmt=fmt)
    assert video_info(p, backend=backend) == VideoInfo(num_frames=12, fps=pytest.approx(10.0), width=64, height=48)
    wanted = [7, 0, 3, 3, 11]
    f = read_frames(p, wanted, backend=backend)
    assert f.shape == (5, 48, 64, 3) and f.dtype == np.uint8
    assert frame_ids(f) == wanted
    assert np.abs(f.astype(int) - read_frames(p, wanted, backend="pyav").astype(int)).max() <= 8


MPEG_STREAMS = [  # (file name, codec, container format): program streams (.mpg/.vob) and transport streams
    ("clip.mpg", "mpeg1video", None),
    ("clip.vob", "mpeg2video", None),
    ("clip.ts", "libx264", None),
    ("clip.m2ts", "mpeg2video", None),
    ("mislabelled.mp4", "mpeg2video", "mpeg"),  # a program stream whatever its name says
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "codec", "fmt"), MPEG_STREAMS, ids=[m[0] for m in MPEG_STREAMS])
def test_mpeg_streams_are_read_by_pyav_never_by_a_seeking_backend(tmp_path: Path, name: str, codec: str,
                                                                   fmt: str | None, backend: str) -> None:
    """Seeking in an MPEG program stream returns wrong frames (decord: frame 0 for every index,
    torchcodec: the frame before) and transport streams fail in both: ``auto`` reads them with
    PyAV, ``decord`` and ``torchcodec`` refuse them by name."""
    p = write_video(tmp_path / name, codec, n=12, fps=25, fmt=fmt)
    wanted = [9, 2, 6, 6, 11]
    if backend in video_mod.SEEKING:
        for call in (lambda: video_info(p, backend=backend), lambda: read_frames(p, wanted, backend=backend)):
            with pytest.raises(DataError, match=rf"{p.name.replace('.', r'[.]')} is an MPEG program/transport "
                                                rf"stream, in which {backend} cannot seek.*use backend=pyav or auto"):
                call()
        return
    assert video_info(p, backend=backend).num_frames == 12
    assert frame_ids(read_frames(p, wanted, backend=backend)) == wanted


@pytest.mark.parametrize("backend", BACKENDS)
def test_variable_frame_rate(tmp_path: Path, backend: str) -> None:
    p = write_video(tmp_path / "vfr.mp4", vfr_ms=[40, 100, 20, 200], n=12)
    with av.open(str(p)) as c:  # really variable: the frame gaps differ
        pts = [f.pts for f in c.decode(video=0)]
    assert len(set(np.diff(pts))) > 1
    assert video_info(p, backend=backend).num_frames == 12
    assert frame_ids(read_frames(p, list(range(12)), backend=backend)) == list(range(12))


def test_short_video_end_to_end(tmp_path: Path) -> None:
    p = write_video(tmp_path / "short.mp4", n=3)
    info = video_info(p)
    idx, valid = sample_frame_indices(info.num_frames, 8, short="repeat")
    assert valid == 8 and frame_ids(read_frames(p, idx)) == idx
    idx, valid = sample_frame_indices(info.num_frames, 8, short="pad")
    assert valid == 3 and frame_ids(read_frames(p, idx[:valid])) == [0, 1, 2]


def test_pyav_clamps_indices_past_a_wrong_frame_count(tmp_path: Path) -> None:
    p = write_video(tmp_path / "c.mp4", n=5)
    f = video_mod._pyav_frames(p, [4, 9])
    assert frame_ids(f) == [4, 4]


def _audio_only(path: Path) -> Path:
    with av.open(str(path), "w") as c:
        s = c.add_stream("aac", rate=16000)
        s.layout = "mono"
        for i in range(5):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            for pkt in s.encode(frame):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)
    return path


def _no_frames(path: Path) -> Path:
    with av.open(str(path), "w") as c:  # a video track without a single frame
        s = c.add_stream("libx264", rate=10)
        s.width, s.height = SIZE
        s.pix_fmt = "yuv420p"
        c.start_encoding()
    return path


@pytest.mark.parametrize("kind", ["text", "empty", "audio", "no_frames", "missing"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_videos_raise_data_error_naming_the_file(tmp_path: Path, kind: str, backend: str) -> None:
    if kind == "text":
        p = tmp_path / "notes.mp4"
        p.write_text("this is not a video\n" * 20)
    elif kind == "empty":
        p = tmp_path / "empty.mp4"
        p.write_bytes(b"")
    elif kind == "audio":
        if not has_encoder("aac"):
            pytest.skip("no aac encoder")
        p = _audio_only(tmp_path / "audio.mp4")
    elif kind == "no_frames":
        p = _no_frames(tmp_path / "noframes.mkv")
    else:
        p = tmp_path / "missing.mp4"
    for call in (lambda: video_info(p, backend=backend), lambda: read_frames(p, [0], backend=backend)):
        with pytest.raises(DataError, match=p.name.replace(".", r"\.")):
            call()
    if kind == "audio" and backend not in video_mod.SEEKING:  # PyAV's words (auto ends with PyAV)
        with pytest.raises(DataError, match="no video stream"):
            video_info(p, backend=backend)


READERS = {"torchcodec": "_torchcodec_decoder", "decord": "_decord_reader"}  # a seeking backend's file opener


@pytest.mark.parametrize("backend", SEEKING)
def test_auto_falls_back_when_a_backend_fails_or_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            backend: str) -> None:
    """A backend that cannot read a file hands it to the next one (auto) or names itself (chosen
    explicitly); one that is not installed is left out of auto and refused by name."""
    p = write_video(tmp_path / "a.mp4", n=6)
    if backend == "decord":  # auto's first choice, for this test
        monkeypatch.setattr(video_mod, "_torchcodec", lambda: (None, "torchcodec hidden by the test"))
    assert video_mod.resolve_backend("auto") == backend

    def broken(path: Path) -> None:
        raise RuntimeError(f"{backend} exploded")

    monkeypatch.setattr(video_mod, READERS[backend], broken)
    assert video_info(p, backend="auto").num_frames == 6
    assert frame_ids(read_frames(p, [5, 1], backend="auto")) == [5, 1]
    with pytest.raises(DataError, match=rf"cannot decode video .*a\.mp4 with {backend} \(RuntimeError: {backend} "
                                        r"exploded\); try backend=pyav"):
        read_frames(p, [0], backend=backend)
    missing = {"torchcodec": ("_torchcodec", lambda: (None, "torchcodec is not installed: pip install torchcodec")),
               "decord": ("_decord", lambda: None)}[backend]
    monkeypatch.setattr(video_mod, *missing)
    assert backend not in video_mod.installed_backends() and video_mod.installed_backends()[-1] == "pyav"
    assert frame_ids(read_frames(p, [2], backend="auto")) == [2]
    with pytest.raises(ConfigError, match=rf"video backend={backend} but {backend} is not installed"):
        read_frames(p, [2], backend=backend)


def test_torchcodec_without_ffmpeg_is_left_out_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchcodec imports without FFmpeg's libraries (its ffmpeg_major_version is then None): auto
    must not pick it, and the reason says what to install."""
    import sys
    import types

    fake = types.ModuleType("torchcodec")
    fake.ffmpeg_major_version = None
    decoders = types.ModuleType("torchcodec.decoders")
    decoders.VideoDecoder = object
    monkeypatch.setitem(sys.modules, "torchcodec", fake)
    monkeypatch.setitem(sys.modules, "torchcodec.decoders", decoders)
    assert video_mod._torchcodec.__wrapped__() == (None, "torchcodec cannot load FFmpeg's shared libraries "
                                                         "(libavcodec ...): install FFmpeg 4-8, e.g. apt-get install ffmpeg")
    monkeypatch.setitem(sys.modules, "torchcodec", None)  # not installed: the import fails
    assert video_mod._torchcodec.__wrapped__()[1].startswith("torchcodec is not installed")


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_frames_arguments(tmp_path: Path, backend: str) -> None:
    p = write_video(tmp_path / "a.mp4", n=4)
    assert read_frames(p, [], backend=backend).shape[0] == 0
    with pytest.raises(DataError, match="negative"):
        read_frames(p, [-1], backend=backend)
    with pytest.raises(ConfigError, match="backend"):
        read_frames(p, [0], backend="opencv")
    assert frame_ids(read_frames(p, [3, 0], backend=backend)) == [3, 0]
    if backend in video_mod.SEEKING:  # past a seeking backend's frame count: refused
        with pytest.raises(DataError, match=rf"with {backend} \(IndexError: frame index 4 out of range \(4 frames\)"):
            read_frames(p, [4], backend=backend)
    else:  # PyAV (auto's last resort when a seeking backend refuses) gives the last frame
        assert frame_ids(read_frames(p, [4], backend=backend)) == [3]


def test_store_meta_records_the_backend_but_stores_do_not_compare_it(tmp_path: Path) -> None:
    """``video_backend`` in the meta is the decoder auto picks here; a store read by another backend
    stays compatible (it is not one of the compared settings)."""
    from captioning.features.backbones import EncoderConfig, build_backbone
    from captioning.features.extract import store_meta
    from captioning.store.layout import settings_diff

    backbone = build_backbone(EncoderConfig(weights="none", frames=4, frame_size=32))
    meta = store_meta(backbone, "video", "float16")
    assert meta["video_backend"] == video_mod.installed_backends()[0]
    assert settings_diff(meta, {**meta, "video_backend": "pyav", "encoder": {**meta["encoder"],
                                                                               "video_backend": "pyav"}}) == {}
    assert "video_backend" not in store_meta(build_backbone(EncoderConfig(weights="none", image_size=32)), "image",
                                             "float16")
