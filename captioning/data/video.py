"""Video decoding and frame sampling: decord first, PyAV as the fallback.

- ``video_info(path)`` -> ``VideoInfo(num_frames, fps, width, height)``; raises DataError for
  missing/empty/unreadable files, files without a video stream and videos without frames.
- ``sample_frame_indices(num_frames, k, ...)`` -> ``(indices, valid)``: which frames to decode.
- ``read_frames(path, indices)`` -> uint8 ``[len(indices), H, W, 3]`` RGB.

Backends: ``"decord"`` (fast random access), ``"pyav"`` (sequential decoding from the start: exact
frame order, also for variable frame rate; slower for far-away frames of long videos) and
``"auto"``: decord when installed and able to read the file, else PyAV.  Frame indices count
decoded frames in presentation order from 0; with ``"auto"`` both functions pick the same backend
for a given file, so indices from ``video_info`` are valid for ``read_frames``.  MPEG program and
transport streams (``.mpg``, ``.mpeg``, ``.vob``, ``.ts``, ``.m2ts``, recognised by their first
bytes whatever the extension) always go to PyAV: decord's seek in a program stream silently
returns the first frame for every index, and it cannot open transport streams
(``backend=decord`` refuses them with a DataError).  When a container's frame count overstates
the frames PyAV can decode, indices past the end are given the last decoded frame.  decord's
array bridge is left at its default (nothing global is changed).  Container rotation metadata is
not applied.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captioning.data.media import check_media_file
from captioning.errors import ConfigError, DataError

log = logging.getLogger(__name__)

BACKENDS = ("auto", "decord", "pyav")
STRATEGIES = ("uniform", "fps", "all")
SHORT_POLICIES = ("repeat", "pad")
DECORD_THREADS = 1  # per reader: extraction runs many DataLoader workers side by side


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
def _decord() -> Any:
    try:
        import decord
    except Exception:  # not installed (e.g. aarch64) or a broken build
        return None
    return decord


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"video backend={backend!r} is not valid: use {' | '.join(BACKENDS)}")
    if backend == "decord" and _decord() is None:
        raise ConfigError("video backend=decord but decord is not installed: pip install decord, or use "
                          "backend=pyav | auto")


def _short(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {line}"[:300] if line else type(e).__name__


def _mpeg_stream(p: Path) -> bool:
    """True for an MPEG program stream (pack header ``00 00 01 BA``) or transport stream (sync byte
    0x47 every 188 bytes, or every 192 for M2TS), whose frames decord cannot seek to."""
    try:
        with open(p, "rb") as f:
            head = f.read(197)
    except OSError:
        return False  # the backend reports the file
    if head[:4] == b"\x00\x00\x01\xba":
        return True
    return any(len(head) > start + size and head[start] == head[start + size] == 0x47
               for start, size in ((0, 188), (4, 192)))


def _use_decord(backend: str, p: Path) -> bool:
    if backend == "pyav" or (backend == "auto" and _decord() is None):
        return False
    if _mpeg_stream(p):
        if backend == "decord":
            raise DataError(f"video {p} is an MPEG program/transport stream, in which decord cannot seek to a "
                            f"frame (it returns wrong frames): use backend=pyav or auto")
        return False
    return True


def video_info(path: str | Path, backend: str = "auto") -> VideoInfo:
    """Frame count, average fps and size of a video; DataError naming the file when unreadable."""
    p = check_media_file(path, "video")
    _check_backend(backend)
    decord_error = None
    if _use_decord(backend, p):
        try:
            return _decord_info(p)
        except Exception as e:
            if backend == "decord":
                raise DataError(f"cannot read video {p} with decord ({_short(e)}); try backend=pyav") from e
            decord_error = e
            log.debug("decord cannot read %s (%s); trying PyAV", p, _short(e))
    try:
        return _pyav_info(p)
    except DataError:
        raise
    except Exception as e:
        also = f"; decord: {_short(decord_error)}" if decord_error is not None else ""
        raise DataError(f"cannot read video {p} ({_short(e)}{also}): not a readable video file") from e


def read_frames(path: str | Path, indices: Sequence[int], backend: str = "auto") -> np.ndarray:
    """Decode the frames ``indices`` (any order, repeats allowed) -> uint8 RGB ``[len(indices), H, W, 3]``."""
    p = check_media_file(path, "video")
    _check_backend(backend)
    idx = [int(i) for i in indices]
    if any(i < 0 for i in idx):
        raise DataError(f"video {p}: negative frame index in {idx[:10]}")
    if not idx:
        return np.zeros((0, 0, 0, 3), dtype=np.uint8)
    decord_error = None
    if _use_decord(backend, p):
        try:
            return _decord_frames(p, idx)
        except DataError:
            raise
        except Exception as e:
            if backend == "decord":
                raise DataError(f"cannot decode video {p} with decord ({_short(e)}); try backend=pyav") from e
            decord_error = e
            log.debug("decord cannot decode %s (%s); trying PyAV", p, _short(e))
    try:
        return _pyav_frames(p, idx)
    except DataError:
        raise
    except Exception as e:
        also = f"; decord: {_short(decord_error)}" if decord_error is not None else ""
        raise DataError(f"cannot decode video {p} ({_short(e)}{also}): not a readable video file") from e


# -- decord


def _decord_reader(p: Path) -> Any:
    decord = _decord()
    return decord.VideoReader(str(p), ctx=decord.cpu(0), num_threads=DECORD_THREADS)


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
    n = len(vr)
    wanted = sorted(set(idx))
    if wanted[-1] >= n:
        raise IndexError(f"frame index {wanted[-1]} out of range ({n} frames)")  # auto: PyAV may count more
    frames = _to_numpy(vr.get_batch(wanted))  # [len(wanted), H, W, 3]
    if frames.ndim != 4 or frames.shape[0] != len(wanted) or frames.shape[-1] != 3:
        raise RuntimeError(f"decord returned an array of shape {frames.shape}")
    pos = {f: j for j, f in enumerate(wanted)}
    out = frames[[pos[i] for i in idx]]
    return np.ascontiguousarray(out, dtype=np.uint8)


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
