"""The extraction job's LightningModule: the frozen backbone on a decoded batch -> features [B, N, C].

``FeatureExtractor.predict_step`` normalises on the device, runs the backbone (precision from the
Trainer) and starts the copy of the batch's features to the host without waiting for it: on a
GPU the copy goes to page-locked memory behind the forward on the same stream, and the prediction
carries ``ready``, the event after which the host may read them (``StoreWriter``'s thread waits for
it, the job never does).  Host data the device needs (a clip's frame positions, which frames are
padding) goes the other way by page-locked memory too (``to_device``): no host wait in the step.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch

from captioning.errors import ConfigError
from captioning.features.backbones import Backbone, Preprocessing

__all__ = ["STORE_DTYPES", "FeatureExtractor", "to_device", "to_host"]

STORE_DTYPES = ("float16", "float32")


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``, from page-locked memory without a host wait on a GPU."""
    if device.type != "cuda" or t.device.type == "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def to_host(t: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """``t`` on the host and, on a GPU, the event after which its copy there is complete."""
    if t.device.type != "cuda":
        return t, None
    host = t.to("cpu", non_blocking=True)  # page-locked, as a non-blocking copy to the host is
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


class FeatureExtractor(pl.LightningModule):
    """Runs the frozen backbone on a decoded batch; ``predict_step`` -> features [B, N, C] on the host.

    Images: N = h*w (row-major grid).  Videos (K frames each): ``pooled`` N = K (per-frame spatial
    mean) or ``grid`` N = K*h*w (frame-major); the features of padded frames (``short_video=pad``)
    are zeros.  Frames are run through the backbone in chunks of at most ``max_frames`` to bound
    memory.  A clip backbone (``backbone.is_clip_encoder``) runs the clip of each real sampled frame
    instead (``max_frames // clip_length`` clips per chunk): ``pooled`` is its space-time mean,
    ``grid`` its time mean.
    """

    def __init__(self, backbone: Backbone, preprocessing: Preprocessing, kind: str = "image",
                 video_features: str = "pooled", dtype: str = "float16", max_frames: int = 256) -> None:
        super().__init__()
        if dtype not in STORE_DTYPES:
            raise ConfigError(f"dtype={dtype!r} is not valid: use float16 | float32")
        self.backbone = backbone
        self.pre = preprocessing
        self.kind = kind
        self.video_features = video_features
        self.out_dtype = torch.float16 if dtype == "float16" else torch.float32
        self.max_frames = max_frames

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 3, S, S] -> grid [B, C, h, w] (float)."""
        return self.backbone(self.pre.normalize(pixels))

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        """-> the batch's ids, valid counts, frame indices and failures, ``features`` [B, N, C] of the
        store's dtype on the host (None for a batch without items) and ``ready`` (see the module)."""
        out = {k: batch[k] for k in ("ids", "valid", "frame_indices", "failures", "num_items")}
        out["features"], out["ready"] = None, None
        if not batch["ids"]:
            return out
        feats = self.features(batch)
        if self.kind == "video" and self.video_features == "grid":  # the store counts positions, not frames
            cells = feats.shape[1] // batch["counts"][0]
            out["valid"] = [None if v is None else v * cells for v in batch["valid"]]
        out["features"], out["ready"] = to_host(feats.to(self.out_dtype).contiguous())
        return out

    def features(self, batch: dict[str, Any]) -> torch.Tensor:
        """[B, N, C] on the device: each image's grid, or each video's frames (or clips) in order."""
        if getattr(self.backbone, "is_clip_encoder", False):
            per_frame = self._clip_features(batch)  # [sum K, C] or [sum K, h*w, C], padding zero
        else:
            pixels = batch["pixels"]
            grids = [self(chunk) for chunk in torch.split(pixels, self.max_frames)]
            grid = torch.cat(grids) if len(grids) > 1 else grids[0]  # [sum K, C, h, w]
            if self.kind == "image":
                return grid.flatten(2).transpose(1, 2)  # [B, h*w, C]
            per_frame = grid.float().mean(dim=(2, 3)) if self.video_features == "pooled" \
                else grid.flatten(2).transpose(1, 2)  # [sum K, C] or [sum K, h*w, C]
            per_frame = self._zero_padding(per_frame, batch)
        k = batch["counts"][0]
        if any(c != k for c in batch["counts"]):
            raise ValueError(f"videos of one batch have {sorted(set(batch['counts']))} frames: every video has K")
        return per_frame.reshape(len(batch["counts"]), -1, per_frame.shape[-1])  # [B, K or K*h*w, C]

    def _zero_padding(self, per_frame: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        """Zeros for the frames past each video's real ones (``short_video=pad``)."""
        k = batch["counts"][0]
        if all(r is None or r >= k for r in batch["real"]):
            return per_frame
        real = torch.tensor([k if r is None else r for r in batch["real"]])
        keep = to_device(torch.arange(k)[None, :] < real[:, None], per_frame.device)  # [B, K]
        shape = (len(batch["real"]), k) + (1,) * (per_frame.dim() - 1)
        return (per_frame.reshape(len(batch["real"]), k, *per_frame.shape[1:]) * keep.reshape(shape)).flatten(0, 1)

    def _clip_features(self, batch: dict[str, Any]) -> torch.Tensor:
        """The clip of every real sampled frame -> [sum K, C] or [sum K, h*w, C]; padding rows zero."""
        frames = batch["clip_frames"].to(self.device, non_blocking=True)  # uint8 [sum U, 3, S, S]
        rows, offset = [], 0
        for index, n in zip(batch["clip_index"], batch["clip_counts"], strict=True):
            rows.append(index + offset)  # [K', L] into this batch's frames
            offset += n
        index = to_device(torch.cat(rows), self.device)  # [M, L], M = real clips in the batch
        per_chunk = max(1, self.max_frames // index.shape[1])
        parts = []
        for part in torch.split(index, per_chunk):
            clips = self.pre.normalize(frames[part]).permute(0, 2, 1, 3, 4).contiguous()  # [m, 3, L, S, S]
            parts.append(self.backbone.clip_features(clips, self.video_features))
        feats = torch.cat(parts) if len(parts) > 1 else parts[0]  # [M, C] or [M, h*w, C]
        out = feats.new_zeros((sum(batch["counts"]), *feats.shape[1:]))
        start, src = 0, 0
        for k, index in zip(batch["counts"], batch["clip_index"], strict=True):
            m = index.shape[0]
            out[start:start + m] = feats[src:src + m]
            start, src = start + k, src + m
        return out
