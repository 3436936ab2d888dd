"""Video decoding and frame sampling: torchcodec first, then decord, then PyAV.

- ``video_info(path)`` -> ``VideoInfo(num_frames, fps, width, height)``; raises DataError for
  missing/empty/unreadable files, files without a video stream and videos without frames.
- ``sample_frame_indices(num_frames, k, ...)`` -> ``(indices, valid)``: which frames to decode.
- ``read_frames(path, indices)`` -> uint8 ``[len(indices), H, W, 3]`` RGB.

Backends (``encoder.video_backend``): ``"torchcodec"`` (PyTorch's maintained FFmpeg decoder, exact
seek mode: frames indexed by a scan of the file; needs FFmpeg 4-8's shared libraries on the
system), ``"decord"`` (fast random access; unmaintained since 2022), ``"pyav"`` (sequential
decoding from the start: exact frame order, also for variable frame rate; slower for far-away
frames of long videos) and ``"auto"``: the first installed of torchcodec, decord, PyAV (probed once
per process, ``installed_backends()``; ``resolve_backend()`` names it and the extraction job
records it in the store meta as ``video_backend``), each file going to the next backend when one
cannot read it.  On the same file all three return the same frames (max abs pixel difference 0
on the test videos: mp4/webm/mkv/avi/mov/m4v, H.264, VP8/9, MPEG-4, MJPEG, 4:2:0 and 4:4:4, odd
sizes, variable frame rate), so the backend is not a feature setting.  Frame indices count
decoded frames in presentation order from 0; with ``"auto"`` both functions pick the same backend
for a given file, so indices from ``video_info`` are valid for ``read_frames``.  MPEG program and
transport streams (``.mpg``, ``.mpeg``, ``.vob``, ``.ts``, ``.m2ts``, recognised by their first
bytes whatever the extension) always go to PyAV: seeking in a program stream silently returns
the wrong frames (decord: the first frame for every index; torchcodec 0.17: the frame before),
and transport streams fail in both (``backend=decord|torchcodec`` refuses them with a DataError).
When a container's frame count overstates the frames PyAV can decode, indices past the end are
given the last decoded frame.  decord's array bridge is left at its default (nothing global is
changed).  Container rotation metadata is not applied by decord or PyAV (what torchcodec does
with it is not tested here).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captioning.data.media import check_media_file
from captioning.errors import ConfigError, DataError

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torchcodec", "decord", "pyav")
PREFERENCE = ("torchcodec", "decord", "pyav")  # what auto tries, among the installed ones
SEEKING = ("torchcodec", "decord")  # random access by frame index (not in MPEG program/transport streams)
STRATEGIES = ("uniform", "fps", "all")
SHORT_POLICIES = ("repeat", "pad")
THREADS = 1  # decoding threads per reader: extraction runs many DataLoader workers side by side


@dataclass(frozen=True)
class VideoInfo:
    """num_frames: decodable frames (>= 1); fps: average frame rate (0.0 if unknown); width/height: pixels."""

    num_frames: int
    fps: float
    width: int
    height: int

    @property
    def duration(self) -> float:
        """Seconds (0.0 when the frame rate is unknown)."""
        return self.num_frames / self.fps if self.fps > 0 else 0.0


# ------------------------------------------------------------------------------------ sampling


def sample_frame_indices(num_frames: int, k: int | None, strategy: str = "uniform", fps: float | None = None,
                         target_fps: float | None = None, short: str = "repeat") -> tuple[list[int], int]:
    """Frame indices to decode and how many of them are real: ``(indices, valid)``.

    - ``uniform``: the centre frame of each of ``k`` equal segments, ``floor((i + 0.5) * F / k)``
      (Yao et al. 2015 sample 28 frames this way).
    - ``fps``: every ``round(fps / target_fps)``-th frame from frame 0; when that gives more than
      ``k`` frames, ``k`` of them spread uniformly (centres of ``k`` segments), so the whole video
      stays covered.
    - ``all``: every frame, ``k`` ignored (``valid = F``; no repeat/pad).

    Fewer than ``k`` frames available (``uniform`` with ``F < k``, or ``fps``): ``short="repeat"``
    repeats frames uniformly (non-decreasing) up to ``k`` with ``valid = k``; ``short="pad"``
    returns the available frames first and ``valid`` < ``k``; the list still has length ``k``,
    the padding positions repeat the last real index and must be masked by the caller.
    Indices are always in ``[0, F - 1]``.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"frame sampling strategy={strategy!r} is not valid: use {' | '.join(STRATEGIES)}")
    if short not in SHORT_POLICIES:
        raise ConfigError(f"short video policy short={short!r} is not valid: use repeat | pad")
    n = int(num_frames)
    if n < 1:
        raise DataError(f"cannot sample frames from a video with {num_frames} frames")
    if strategy == "all":
        return list(range(n)), n
    if k is None or int(k) < 1:
        raise ConfigError(f"frames per video k={k!r} must be an int >= 1")
    k = int(k)
    if strategy == "uniform":
        candidates = list(range(n))
    else:
        if fps is None or not fps > 0:
            raise DataError(f"frame sampling strategy=fps needs the video's frame rate, got fps={fps!r}; "
                            f"use strategy=uniform for this data")
        if target_fps is None or not target_fps > 0:
            raise ConfigError(f"frame sampling strategy=fps needs target_fps > 0, got {target_fps!r}")
        step = max(1, round(float(fps) / float(target_fps)))
        candidates = list(range(0, n, step))
    m = len(candidates)
    if m >= k or short == "repeat":
        return [candidates[((2 * i + 1) * m) // (2 * k)] for i in range(k)], k
    return candidates + [candidates[-1]] * (k - m), m


# ------------------------------------------------------------------------------------ backends


@functools.lru_cache(maxsize=1)
def _torchcodec() -> tuple[Any, str]:
    """(torchcodec's ``VideoDecoder`` or None, why not): probed once per process."""
    try:
        import torchcodec
        from torchcodec.decoders import VideoDecoder
    except ImportError:
        return None, "torchcodec is not installed: pip install torchcodec (with FFmpeg 4-8 on the system)"
    except Exception as e:  # a build for another torch, or (older releases) FFmpeg missing
        return None, f"torchcodec cannot load ({_short(e)})"
    if getattr(torchcodec, "ffmpeg_major_version", 0) is None:  # installed, FFmpeg's libraries not found
        return None, ("torchcodec cannot load FFmpeg's shared libraries (libavcodec ...): install FFmpeg 4-8, "
                      "e.g. apt-get install ffmpeg")
    return VideoDecoder, ""


@functools.lru_cache(maxsize=1)
def _decord() -> Any:
    try:
        import decord
    except Exception:  # not installed (e.g. aarch64) or a broken build
        return None
    return decord


def unavailable(backend: str) -> str | None:
    """Why ``backend`` cannot decode in this process (None: it can)."""
    if backend == "torchcodec":
        return _torchcodec()[1] or None
    if backend == "decord" and _decord() is None:
        return "decord is not installed: pip install decord (x86_64 wheels only)"
    return None


def installed_backends() -> tuple[str, ...]:
    """The backends this process can decode with, in ``auto``'s order: torchcodec, decord, PyAV."""
    return tuple(b for b in PREFERENCE if unavailable(b) is None)


def resolve_backend(backend: str = "auto") -> str:
    """The backend that decodes for ``backend``: itself, or for ``auto`` the first installed one
    (single files it cannot read, and MPEG streams for the seeking backends, go to the next)."""
    _check_backend(backend)
    return installed_backends()[0] if backend == "auto" else backend


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"video backend={backend!r} is not valid: use {' | '.join(BACKENDS)}")
    why = unavailable(backend) if backend != "auto" else None
    if why:
        raise ConfigError(f"video backend={backend} but {why}; or use backend=auto")


def _short(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {line}"[:300] if line else type(e).__name__


def _mpeg_stream(p: Path) -> bool:
    """True for an MPEG program stream (pack header ``00 00 01 BA``) or transport stream (sync byte
    0x47 every 188 bytes, or every 192 for M2TS), whose frames decord and torchcodec cannot seek to."""
    try:
        with open(p, "rb") as f:
            head = f.read(197)
    except OSError:
        return False  # the backend reports the file
    if head[:4] == b"\x00\x00\x01\xba":
        return True
    return any(len(head) > start + size and head[start] == head[start + size] == 0x47
               for start, size in ((0, 188), (4, 192)))


def _order(backend: str, p: Path) -> list[str]:
    """The backends to try on ``p``, in order: ``backend``, or for ``auto`` every installed one."""
    order = list(installed_backends()) if backend == "auto" else [backend]
    if _mpeg_stream(p):
        if backend in SEEKING:
            raise DataError(f"video {p} is an MPEG program/transport stream, in which {backend} cannot seek to a "
                            f"frame (it returns wrong frames or fails): use backend=pyav or auto")
        order = [b for b in order if b not in SEEKING]
    return order


def _first(p: Path, backend: str, verb: str, call: Callable[[str], Any]) -> Any:
    """``call(b)`` for the first backend ``b`` of ``_order`` that succeeds; DataError naming ``p`` when none does."""
    order = _order(backend, p)
    failed: list[str] = []
    for b in order:
        try:
            return call(b)
        except Exception as e:
            last = b == order[-1]
            if isinstance(e, DataError) and (last or backend != "auto"):
                raise  # names the file already
            if backend != "auto" and b != "pyav":
                raise DataError(f"cannot {verb} video {p} with {b} ({_short(e)}); try backend=pyav") from e
            if last:
                also = "".join(f"; {f}" for f in failed)
                # the verdict first: a backend's message (torchcodec's names C++ sources) can be long
                raise DataError(f"not a readable video file: cannot {verb} video {p} ({_short(e)}{also})") from e
            failed.append(f"{b}: {_short(e)}")
            log.debug("%s cannot %s %s (%s); trying the next backend", b, verb, p, _short(e))
    raise AssertionError("unreachable: PyAV is always the last backend")  # pragma: no cover


def video_info(path: str | Path, backend: str = "auto") -> VideoInfo:
    """Frame count, average fps and size of a video; DataError naming the file when unreadable."""
    p = check_media_file(path, "video")
    _check_backend(backend)
    return _first(p, backend, "read", lambda b: _READERS[b][0](p))


def read_frames(path: str | Path, indices: Sequence[int], backend: str = "auto") -> np.ndarray:
    """Decode the frames ``indices`` (any order, repeats allowed) -> uint8 RGB ``[len(indices), H, W, 3]``."""
    p = check_media_file(path, "video")
    _check_backend(backend)
    idx = [int(i) for i in indices]
    if any(i < 0 for i in idx):
        raise DataError(f"video {p}: negative frame index in {idx[:10]}")
    if not idx:
        return np.zeros((0, 0, 0, 3), dtype=np.uint8)
    return _first(p, backend, "decode", lambda b: _READERS[b][1](p, idx))


def _gather(frames: np.ndarray, wanted: list[int], idx: list[int], backend: str) -> np.ndarray:
    """Frames decoded once each for the sorted unique ``wanted`` [U, H, W, 3] -> in ``idx``'s order."""
    if frames.ndim != 4 or frames.shape[0] != len(wanted) or frames.shape[-1] != 3:
        raise RuntimeError(f"{backend} returned an array of shape {frames.shape}")
    pos = {f: j for j, f in enumerate(wanted)}
    return np.ascontiguousarray(frames[[pos[i] for i in idx]], dtype=np.uint8)


def _in_range(wanted: list[int], n: int) -> None:
    if wanted[-1] >= n:  # auto: PyAV may decode more frames than the container index lists
        raise IndexError(f"frame index {wanted[-1]} out of range ({n} frames)")


# -- torchcodec


def _torchcodec_decoder(p: Path) -> Any:
    decoder = _torchcodec()[0]
    return decoder(str(p), seek_mode="exact", dimension_order="NHWC", num_ffmpeg_threads=THREADS)


def _torchcodec_info(p: Path) -> VideoInfo:
    m = _torchcodec_decoder(p).metadata  # exact mode: frames counted by a scan of the file
    n = int(m.num_frames or 0)
    if n < 1:
        raise DataError(f"video {p} has no frames")
    return VideoInfo(num_frames=n, fps=float(m.average_fps or 0.0), width=int(m.width), height=int(m.height))


def _torchcodec_frames(p: Path, idx: list[int]) -> np.ndarray:
    decoder = _torchcodec_decoder(p)
    wanted = sorted(set(idx))
    _in_range(wanted, len(decoder))
    return _gather(decoder.get_frames_at(wanted).data.numpy(), wanted, idx, "torchcodec")  # [U, H, W, 3]


# -- decord


def _decord_reader(p: Path) -> Any:
    decord = _decord()
    return decord.VideoReader(str(p), ctx=decord.cpu(0), num_threads=THREADS)


def _to_numpy(x: Any) -> np.ndarray:
    """A decord batch under any bridge (native NDArray, torch, numpy) -> numpy."""
    if hasattr(x, "asnumpy"):
        return x.asnumpy()
    if hasattr(x, "numpy"):
        return x.numpy()
    return np.asarray(x)


def _decord_info(p: Path) -> VideoInfo:
    vr = _decord_reader(p)
    n = len(vr)
    if n < 1:
        raise DataError(f"video {p} has no frames")
    h, w = _to_numpy(vr[0]).shape[:2]
    return VideoInfo(num_frames=n, fps=float(vr.get_avg_fps() or 0.0), width=int(w), height=int(h))


def _decord_frames(p: Path, idx: list[int]) -> np.ndarray:
    vr = _decord_reader(p)
    wanted = sorted(set(idx))
    _in_range(wanted, len(vr))
    return _gather(_to_numpy(vr.get_batch(wanted)), wanted, idx, "decord")  # [U, H, W, 3]


# -- PyAV


def _pyav_open(p: Path) -> Any:
    import av

    return av.open(str(p))


def _video_stream(container: Any, p: Path) -> Any:
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["none"]
        raise DataError(f"{p} has no video stream (streams: {', '.join(kinds)}): not a video")
    return container.streams.video[0]


def _pyav_info(p: Path) -> VideoInfo:
    with _pyav_open(p) as container:
        stream = _video_stream(container, p)
        n = int(stream.frames or 0)
        if n <= 0:  # the container does not say (mkv, webm): count the video packets
            n = sum(1 for pkt in container.demux(stream) if pkt.size)
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        width, height = int(stream.codec_context.width or 0), int(stream.codec_context.height or 0)
    if n < 1:
        raise DataError(f"video {p} has no frames")
    return VideoInfo(num_frames=n, fps=float(rate) if rate else 0.0, width=width, height=height)


def _pyav_frames(p: Path, idx: list[int]) -> np.ndarray:
    wanted = set(idx)
    last_wanted = max(idx)
    got: dict[int, np.ndarray] = {}
    size: tuple[int, int] | None = None
    last_frame, count = None, 0
    with _pyav_open(p) as container:
        stream = _video_stream(container, p)
        stream.thread_type = "AUTO"
        for i, frame in enumerate(container.decode(stream)):
            count = i + 1
            last_frame = frame
            if size is None:
                size = (frame.width, frame.height)
            if i in wanted:
                got[i] = _rgb(frame, size)
            if i >= last_wanted:
                break
        if count == 0:
            raise DataError(f"video {p} has no decodable frames")
        missing = sorted(wanted - set(got))
        if missing:  # the container promised more frames than it holds
            log.debug("video %s: %d frames decoded; indices %s use the last frame", p, count, missing[:5])
            tail = _rgb(last_frame, size)
            for i in missing:
                got[i] = tail
    return np.stack([got[i] for i in idx])


def _rgb(frame: Any, size: tuple[int, int] | None) -> np.ndarray:
    """A PyAV frame -> [H, W, 3] uint8 RGB, resized to ``size`` (W, H) if the stream changes size."""
    if size is not None and (frame.width, frame.height) != size:
        frame = frame.reformat(width=size[0], height=size[1])
    return frame.to_ndarray(format="rgb24")


# name -> (info, frames) readers
_READERS: dict[str, tuple[Callable[[Path], VideoInfo], Callable[[Path, list[int]], np.ndarray]]] = {
    "torchcodec": (_torchcodec_info, _torchcodec_frames),
    "decord": (_decord_info, _decord_frames),
    "pyav": (_pyav_info, _pyav_frames),
}
