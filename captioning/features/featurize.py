"""Features of raw media for a trained model, computed exactly as its FeatureStore holds them.

A checkpoint records the meta of the features it was trained on, including the full
``EncoderConfig`` (``meta["encoder"]``).  ``rebuild_backbone`` builds that backbone again and
checks that it gives the recorded settings; ``featurize`` runs it with the extraction job's own
pieces (``MediaDataset`` + ``collate_media`` + ``FeatureExtractor.predict_step``): same decoding,
frame sampling, resize/crop, normalisation, row-major ``h*w`` flattening or per-frame pooling,
and store dtype, so a decoder sees what it was trained on.  ``display_crop`` recomputes the
pixels behind stored features (for figures).

Two-stream features (``captioning.store.streams``: e.g. a 2-D appearance and a 3-D motion store
read as one) record every stream's meta: ``rebuild_backbones`` rebuilds each stream's backbone
and ``featurize_streams`` runs them all and joins their features per item as the stores are
joined (concatenated in stream order, frame indices checked equal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioning.config import unknown_keys
from captioning.data.media import load_image
from captioning.data.video import read_frames
from captioning.errors import CheckpointError, DataError
from captioning.features.backbones import Backbone, EncoderConfig, Preprocessing
from captioning.features.encoders import build_encoder
from captioning.features.extract import (
    FeatureExtractor,
    MediaDataset,
    MediaItem,
    VideoSampling,
    collate_media,
)
from captioning.store.layout import settings_diff
from captioning.store.streams import stream_metas


@dataclass
class Featurized:
    """Features of one media file, as the extraction job stores them.

    features: [N, C] in the store dtype (CPU); valid: real positions; frame_indices: K sampled
    frame numbers (videos); pixels: uint8 [3,S,S] (image) or [K,3,S,S] (frames), the crop the
    backbone saw (imported region features: the whole image); boxes: [N, 4] pixel boxes of image
    regions and image_size (W, H) of their image, when the store has them.  ``error`` is set (and
    the rest empty) when the file could not be used.
    """

    item_id: str
    path: str
    features: torch.Tensor | None = None
    valid: int = 0
    frame_indices: tuple[int, ...] | None = None
    pixels: torch.Tensor | None = None
    error: str | None = None
    boxes: np.ndarray | None = None
    image_size: tuple[int, int] | None = None


def encoder_config(meta: Mapping[str, Any], source: str | Path) -> EncoderConfig:
    """The ``EncoderConfig`` the features of ``meta`` were extracted with (``meta["encoder"]``)."""

    enc = meta.get("encoder")
    if meta.get("imported"):
        raise CheckpointError(
            f"{source}: its features were imported (captioning-import, format={meta['imported'].get('format')}), "
            f"made by a network this code does not have: it cannot compute them for new media; caption the "
            f"stored features (store_split=<split>) or your own features (Captioner.caption_features)"
        )
    if meta.get("streams"):
        raise CheckpointError(f"{source}: its features join {len(meta['streams'])} feature streams; rebuild "
                              f"every stream's encoder (rebuild_backbones), not one")
    if not isinstance(enc, dict):
        raise CheckpointError(
            f"{source}: its features were extracted by an older version that did not record the encoder "
            f"(feature_meta has no 'encoder'); re-extract the features and re-train, or caption the stored "
            f"features with store_split=<split>"
        )
    unknown = sorted(unknown_keys(enc, EncoderConfig))
    if unknown:
        raise CheckpointError(f"{source}: feature_meta.encoder has keys {unknown} this code does not know; "
                              f"use the code version that extracted the features")
    return EncoderConfig(**enc)


def rebuild_backbone(meta: Mapping[str, Any], source: str | Path) -> Backbone:
    """The exact backbone of the features of ``meta``, checked against the settings they record."""

    backbone = build_encoder(encoder_config(meta, source))
    rebuilt = {"settings": backbone.settings(video=meta.get("kind") == "video")}
    diff = settings_diff(meta, rebuilt, keys=("settings",))
    if diff:
        raise CheckpointError(
            f"{source}: the rebuilt backbone differs from the one the features were extracted with "
            f"({', '.join(diff)}: { {k: t for k, (t, _) in diff.items()} } vs "
            f"{ {k: m for k, (_, m) in diff.items()} }); restore the same encoder weights (e.g. the weights "
            f"file) or re-extract and re-train"
        )
    return backbone


def rebuild_backbones(meta: Mapping[str, Any], source: str | Path) -> list[Backbone]:
    """The backbone of every feature stream of ``meta`` (one for a plain store), in stream order."""

    metas = stream_metas(meta)
    if len(metas) == 1:
        return [rebuild_backbone(metas[0], source)]
    return [rebuild_backbone(m, f"{source} (feature stream {i}: {m.get('root', '?')})") for i, m in enumerate(metas)]


def _autocast(device: torch.device, precision: Any) -> contextlib.AbstractContextManager:
    """The extraction job's mixed precision when the meta records one and a GPU is used."""
    dtypes = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
    if device.type == "cuda" and precision in dtypes:
        return torch.autocast("cuda", dtype=dtypes[precision])
    return contextlib.nullcontext()


def featurize(backbone: Backbone, items: Sequence[tuple[str, str]], kind: str, *, dtype: str = "float16",
              batch_size: int = 16, num_workers: int = 0, device: torch.device | str = "cpu",
              precision: Any = None) -> Iterator[list[Featurized]]:
    """Yield, per batch of ``items`` ((item_id, path) pairs, in order), their ``Featurized``.

    A file that cannot be decoded comes back with its ``error``; nothing raises per file.
    """
    from torch.utils.data import DataLoader


    device = torch.device(device)
    cfg = backbone.cfg
    video = kind == "video"
    pre = backbone.preprocessing(video=video)
    dataset = MediaDataset([MediaItem(i, p) for i, p in items], kind, pre,
                           VideoSampling.from_encoder(cfg) if video else None)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                        collate_fn=collate_media, pin_memory=device.type == "cuda")
    extractor = FeatureExtractor(backbone, pre, kind=kind, video_features=cfg.video_features, dtype=dtype).to(device)
    paths = dict(items)
    for b, batch in enumerate(loader):
        out_items = [Featurized(i, p, error=e) for i, p, e in batch["failures"]]
        if batch["ids"]:
            on_device = {**batch, "pixels": batch["pixels"].to(device, non_blocking=True)}
            with torch.inference_mode(), _autocast(device, precision):
                out = extractor.predict_step(on_device, b)
            if out["ready"] is not None:  # the features' copy to the host ([B, N, C])
                out["ready"].synchronize()
            pixels = torch.split(batch["pixels"], batch["counts"])
            for k, item_id in enumerate(out["ids"]):
                feats = out["features"][k]
                valid = out["valid"][k]
                frames = out["frame_indices"][k]
                out_items.append(Featurized(
                    item_id, paths[item_id], features=feats.cpu(),
                    valid=int(feats.shape[0] if valid is None else valid),
                    frame_indices=None if frames is None else tuple(frames),
                    pixels=pixels[k] if video else pixels[k][0],
                ))
        yield out_items


def featurize_streams(backbones: Sequence[Backbone], meta: Mapping[str, Any], items: Sequence[tuple[str, str]],
                      **kwargs: Any) -> Iterator[list[Featurized]]:
    """``featurize`` with the backbone of every stream of ``meta`` (``rebuild_backbones``), joined per
    item as ``FeatureStreams`` joins the stores: features [N, C_1 + C_2 + ...] in stream order (in
    ``meta["dtype"]``), each stream's in its own store dtype and precision first; an item whose
    streams sampled other frames (or failed in any stream) comes back with its ``error``.
    kwargs: ``featurize``'s batch_size / num_workers / device; pixels are the first stream's."""

    metas = stream_metas(meta)
    kind = str(meta.get("kind", "image"))
    if len(metas) != len(backbones):
        raise CheckpointError(f"{len(backbones)} backbones for features of {len(metas)} streams")
    runs = [featurize(b, items, kind, dtype=m.get("dtype", "float16"), precision=m.get("precision"), **kwargs)
            for b, m in zip(backbones, metas, strict=True)]
    if len(runs) == 1:
        yield from runs[0]
        return
    dtype = torch.float32 if str(meta.get("dtype")) == "float32" else torch.float16
    for batches in zip(*runs, strict=True):  # the same items per batch in every stream
        streams = [{f.item_id: f for f in batch} for batch in batches]
        out = []
        for item_id, first in streams[0].items():
            parts = [s[item_id] for s in streams]
            failed = next((p for p in parts if p.error is not None), None)
            other = next((p for p in parts if (p.frame_indices, p.valid) != (first.frame_indices, first.valid)), None)
            if failed is not None:
                out.append(Featurized(item_id, first.path, error=failed.error))
            elif other is not None:
                out.append(Featurized(item_id, first.path, error=(
                    f"the feature streams sampled other frames ({first.frame_indices}, {first.valid} valid vs "
                    f"{other.frame_indices}, {other.valid} valid): their encoders need the same encoder.frames / "
                    f"frame_strategy / target_fps / short_video")))
            else:
                features = torch.cat([p.features.to(dtype) for p in parts], dim=1)  # type: ignore[union-attr]
                out.append(Featurized(item_id, first.path, features=features, valid=first.valid,
                                      frame_indices=first.frame_indices, pixels=first.pixels))
        yield out


def stored_preprocessing(meta: Mapping[str, Any]) -> Preprocessing:
    """The resize/crop/normalisation recorded in a store's meta (two streams: the first stream's)."""

    p = dict(stream_metas(meta)[0]["settings"]["preprocessing"])
    return Preprocessing(int(p["size"]), int(p["resize"]), str(p["crop"]), tuple(p["mean"]), tuple(p["std"]),
                         str(p.get("interpolation", "bilinear")))


def display_crop(meta: Mapping[str, Any], path: str | Path,
                 frame_indices: Sequence[int] | None = None) -> torch.Tensor:
    """The pixels behind stored features: the recorded resize/crop applied to the media file again.

    -> uint8 [3,S,S] (image) or [K,3,S,S] (the ``frame_indices`` frames of a video); two-stream
    features: the first stream's crop.  Imported image features (``captioning-import``): the whole
    image, which their boxes (or grid) lie in; imported video features record no frame sampling
    (a DataError).
    """

    imported = stream_metas(meta)[0].get("imported")
    if imported and meta["kind"] == "image":
        return torch.from_numpy(np.array(load_image(path, max_side=None))).permute(2, 0, 1)
    if imported:
        raise DataError(f"imported video features ({imported.get('format')}) record no frame numbers to read "
                        f"from {path}")
    pre = stored_preprocessing(meta)
    if meta["kind"] == "image":
        return pre(torch.from_numpy(np.array(load_image(path))).permute(2, 0, 1))
    frames = read_frames(path, list(frame_indices or ()))
    return pre(torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2))
