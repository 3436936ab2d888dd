"""The media side of feature extraction: which files, how video frames are sampled, and the
DataLoader dataset that decodes them in worker processes (``captioning.features.extract``).

Images: ``load_image`` + resize/crop (uint8); videos: ``video_info`` + ``sample_frame_indices`` +
``read_frames`` + the same per-frame resize/crop; 3-D (clip) encoders: the union of the frames of the
K clips centred on the sampled frames, decoded and resized once (``captioning.features.clips``).  A
bad file never raises in a worker: it comes back as a failure value.  With ``encoded_jpegs`` the
JPEGs a GPU decoder can decode travel as their bytes, decoded on the device
(``captioning.features.device_decode``).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from captioning.data.jpeg import decodable_jpeg, device_refusal, jpeg_info
from captioning.data.media import check_media_file, load_image
from captioning.data.video import read_frames, sample_frame_indices, video_info
from captioning.errors import ConfigError, DataError
from captioning.features.backbones import EncoderConfig, Preprocessing
from captioning.features.clips import clip_frame_indices, clip_union
from captioning.features.encoders import is_clip_encoder

__all__ = ["MediaDataset", "MediaItem", "VideoSampling", "collate_media", "error_text"]

log = logging.getLogger("captioning.extract")


@dataclass(frozen=True)
class MediaItem:
    """One file to extract: ``path`` is absolute (or relative to the working directory)."""

    item_id: str
    path: str


@dataclass(frozen=True)
class VideoSampling:
    """How frames are picked from a video (picklable; used in workers).

    ``clip_length``: None for 2-D encoders (one frame per position); for 3-D encoders the clip
    of ``clip_length`` frames every ``clip_stride`` frames centred on each sampled frame.
    """

    frames: int = 28
    strategy: str = "uniform"
    target_fps: float | None = None
    short: str = "repeat"
    backend: str = "auto"
    clip_length: int | None = None
    clip_stride: int = 1

    @classmethod
    def from_encoder(cls, cfg: EncoderConfig) -> VideoSampling:
        clip = (cfg.clip_length, cfg.clip_stride) if is_clip_encoder(cfg.name) else (None, 1)
        return cls(cfg.frames, cfg.frame_strategy, cfg.target_fps, cfg.short_video, cfg.video_backend, *clip)


def error_text(e: BaseException) -> str:
    """``Type: first line of the message`` (at most 500 characters): a failure's one line."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:500]


# ------------------------------------------------------------------------------------ dataset


class MediaDataset(Dataset):
    """Decodes one image or video per index into uint8 pixels; failures are returned, never raised.

    ``__getitem__`` -> dict ``id``, ``path``, ``pixels`` (uint8 [3,S,S] image or [K,3,S,S] frames,
    None on failure), ``valid`` (videos: real frames), ``frame_indices`` (videos), ``error`` (str|None);
    clip encoders also ``clip_frames`` (uint8 [U,3,S,S], the union of the clips' frames) and
    ``clip_index`` (long [K',L] positions in it, one row per real sampled frame); ``pixels`` are then
    the sampled (centre) frames.  ``encoded_jpegs``: a JPEG that a GPU decoder may decode
    (``captioning.data.jpeg.device_refusal``) comes back undecoded, as ``encoded`` (uint8 [bytes],
    the file), for ``captioning.features.device_decode`` to decode on the device; other files are
    decoded here as before.
    """

    def __init__(self, items: Sequence[MediaItem], kind: str, preprocessing: Preprocessing,
                 video: VideoSampling | None = None, encoded_jpegs: bool = False) -> None:
        if kind not in ("image", "video"):
            raise ConfigError(f"data.kind={kind!r} is not valid: use image | video")
        self.items = list(items)
        self.kind = kind
        self.pre = preprocessing
        self.video = video or VideoSampling()
        self.encoded_jpegs = encoded_jpegs and kind == "image"

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.items[index]
        out: dict[str, Any] = {"id": item.item_id, "path": item.path, "pixels": None, "valid": None,
                               "real": None, "frame_indices": None, "clip_frames": None, "clip_index": None,
                               "encoded": None, "error": None}
        try:
            if self.kind == "image":
                encoded = self._device_jpeg(item.path) if self.encoded_jpegs else None
                out["encoded" if encoded is not None else "pixels"] = (
                    encoded if encoded is not None else self._image(item.path))
            else:
                out.update(self._video(item.path))
        except Exception as e:  # a bad file becomes a failure record, whatever went wrong
            out["error"] = error_text(e)
            log.debug("failed %s: %s", item.path, traceback.format_exc())
        return out

    @staticmethod
    def _device_jpeg(path: str) -> torch.Tensor | None:
        """The file's bytes (uint8 [n]) as every decoder gets them (``decodable_jpeg``: its DataError
        for a JPEG no decoder may decode) when a GPU decoder may decode them, else None (PIL decodes it)."""
        p = check_media_file(path, "image")
        data = decodable_jpeg(p.read_bytes(), p)
        if device_refusal(jpeg_info(data)) is not None:
            return None
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def _image(self, path: str) -> torch.Tensor:

        img = load_image(path)
        arr = np.array(img.convert("RGB") if img.mode != "RGB" else img)  # writable [H, W, 3] uint8
        x = torch.from_numpy(arr).permute(2, 0, 1)  # [3, H, W] uint8
        return self.pre(x).contiguous()

    def _video(self, path: str) -> dict[str, Any]:
        """-> pixels (frames uint8 [K,3,S,S]), valid, real (frames that are not padding), frame_indices;
        clip encoders also clip_frames and clip_index."""

        v = self.video
        info = video_info(path, backend=v.backend)
        if not info.num_frames or info.num_frames < 1:
            raise DataError(f"video {path} has no frames")
        indices, valid = sample_frame_indices(
            info.num_frames, v.frames, strategy=v.strategy, fps=info.fps, target_fps=v.target_fps, short=v.short
        )
        indices = [int(i) for i in indices]
        valid = int(valid)
        if v.strategy == "all":  # every frame, zero-padded to the store's K positions
            if len(indices) > v.frames:
                raise DataError(f"video {path} has {len(indices)} frames, more than encoder.frames={v.frames} "
                                f"positions (frame_strategy=all): raise encoder.frames or use uniform")
            real = indices
            indices = indices + [indices[-1]] * (v.frames - len(indices))
        else:
            real = indices[:valid] if v.short == "pad" else indices
        out: dict[str, Any] = {"valid": valid, "real": len(real), "frame_indices": tuple(indices)}
        if v.clip_length is None:
            x = self._frames(path, real)  # [K', 3, S, S]
        else:  # the frames of all K' clips, each decoded and resized once

            union, index = clip_union(clip_frame_indices(real, info.num_frames, v.clip_length, v.clip_stride))
            out["clip_frames"] = self._frames(path, union)  # [U, 3, S, S]
            out["clip_index"] = torch.from_numpy(index)  # [K', L]
            position = {f: u for u, f in enumerate(union)}
            x = out["clip_frames"][[position[c] for c in real]]  # the centre frames [K', 3, S, S]
        if len(real) < len(indices):  # pad: zero pixels past `valid` (their features are zeroed too)
            pad = torch.zeros((len(indices) - len(real), *x.shape[1:]), dtype=x.dtype)
            x = torch.cat([x, pad])
        out["pixels"] = x
        return out

    def _frames(self, path: str, indices: Sequence[int]) -> torch.Tensor:
        """Decode ``indices`` and resize/crop them: uint8 [len(indices), 3, S, S]."""

        frames = read_frames(path, indices, backend=self.video.backend)  # [n, H, W, 3] uint8
        if len(frames) != len(indices):
            raise DataError(f"video {path}: read {len(frames)} frames, expected {len(indices)}")
        x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)  # [n, 3, H, W]
        return self.pre(x).contiguous()


def collate_media(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Batch the decoded items; frames of all videos are flattened to one [sum K, 3, S, S] tensor.
    Encoded JPEGs (``MediaDataset(encoded_jpegs=True)``) are listed in ``encoded`` as (position in
    ``ids``, file bytes, path), their pixels left to ``captioning.features.device_decode``.

    Clip encoders: ``clip_frames`` [sum U, 3, S, S] (every video's frame union), ``clip_counts``
    (U per video) and ``clip_index`` (per video [K', L] positions into its own union).
    """
    ok = [s for s in samples if s["error"] is None]
    failures = [(s["id"], s["path"], s["error"]) for s in samples if s["error"] is not None]
    decoded = [s["pixels"] if s["pixels"].ndim == 4 else s["pixels"][None] for s in ok if s.get("encoded") is None]
    pixels = torch.cat(decoded) if decoded else torch.zeros((0, 3, 1, 1), dtype=torch.uint8)
    encoded = [(i, s["encoded"], s["path"]) for i, s in enumerate(ok) if s.get("encoded") is not None]
    clips = bool(ok) and ok[0].get("clip_frames") is not None
    return {
        "ids": [s["id"] for s in ok],
        "pixels": pixels,  # the items decoded here; encoded JPEGs (position in ids, bytes, path) apart
        "encoded": encoded or None,
        "counts": [1 if s.get("encoded") is not None or s["pixels"].ndim == 3 else int(s["pixels"].shape[0])
                   for s in ok],
        "valid": [s["valid"] for s in ok],
        "real": [s["real"] for s in ok],
        "frame_indices": [s["frame_indices"] for s in ok],
        "clip_frames": torch.cat([s["clip_frames"] for s in ok]) if clips else None,
        "clip_counts": [int(s["clip_frames"].shape[0]) for s in ok] if clips else None,
        "clip_index": [s["clip_index"] for s in ok] if clips else None,
        "failures": failures,
        "num_items": len(samples),
    }
