"""The Python API: a trained checkpoint that captions images, videos or precomputed features.

    from captioning import Captioner

    captioner = Captioner.from_checkpoint("outputs/train/<run>/checkpoints/best.ckpt", device="cpu")
    results = captioner.caption(["cat.jpg", "clips/"], beam_size=5)   # one CaptionResult per input
    results[0].caption, results[0].attention, results[0].attention_shape  # [T, H*W], [H, W]
    results[0].figure("cat_attention.png")   # the crop the model saw + one heatmap per word

Raw media go through the checkpoint's own backbone, rebuilt from the feature meta it recorded
(``captioning.features.featurize``), so the decoder sees what it was trained on: every stream's
backbone for two-stream features (joined as in training), the checkpoint's own fine-tuned
encoder weights for a model trained end to end (``captioning.train.finetune``).
``caption_split`` decodes the features of a split from the checkpoint's FeatureStore, and
``caption_features`` decodes features computed elsewhere.  Decoding options are the fields of
``captioning.models.search.DecodeConfig`` (``beam_size``, ``max_length``, ``min_length``,
``length_penalty``, ``alpha``, ``block_unk``, ``block_trigrams``, ``n_best``, ``groups``,
``diversity_strength``, ...), given as keyword arguments; ``CaptionResult.nbest`` holds every
hypothesis when several are asked for.  ``Captioner.from_checkpoint([a, b, c])`` decodes with the
test-time ensemble of the three checkpoints.
``captioning-caption`` is this API plus ``captioning.viz.gallery.write_gallery``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioning.caption.inputs import MediaInput, collect_inputs, limit_media
from captioning.caption.result import AttentionLayout, CaptionResult, hwc
from captioning.config import unknown_keys
from captioning.data.annotations import read_dataset
from captioning.errors import ConfigError, DataError
from captioning.features.featurize import (
    Featurized,
    display_crop,
    featurize_streams,
    rebuild_backbones,
)
from captioning.models.decoding import decoding_autocast
from captioning.models.search import DecodeConfig, decode_batch
from captioning.store.streams import stream_metas
from captioning.train.checkpoint import load_captioner, load_ensemble
from captioning.train.finetune import FinetuneModule
from captioning.train.inputs import checkpoint_inputs
from captioning.viz.gallery import error_line

log = logging.getLogger("captioning.caption")


def resolve_device(name: str | torch.device) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without a GPU is a ConfigError."""
    if isinstance(name, torch.device):
        name = str(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device={name!r} is not a torch device: use auto | cpu | cuda | cuda:<i>") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but no CUDA GPU is available: use device=cpu (or auto)")
    return device


def beam_config(decode: DecodeConfig | None = None, **options: Any) -> DecodeConfig:
    """``decode`` (default ``DecodeConfig()``) with ``options`` (its field names) replaced, validated."""

    unknown = unknown_keys(options, DecodeConfig)
    if unknown:
        names = ", ".join(f.name for f in dataclasses.fields(DecodeConfig))
        raise ConfigError(f"unknown decoding option(s) {unknown}: use {names}")
    return dataclasses.replace(decode or DecodeConfig(), **options).validate()


def marks_hard_attention(module: Any) -> bool:
    """Whether the model's context is ONE attended position at test time (argmax hard attention):
    its figures mark that position.  The one place that asks the decoder about its kind."""
    return bool(module.decoder.hard_attention)


class Captioner:
    """A trained caption model (decoder, vocabulary, feature meta) on a device, ready to caption.

    ``kind``: what it captions (image | video); ``grid``: (H, W) of its feature grid (None for
    pooled video features); ``feature_meta``: what its FeatureStore recorded.
    """

    def __init__(self, module: Any, *, device: str | torch.device = "auto", source: str | Path = "<model>",
                 precision: str = "fp32") -> None:
        self.device = resolve_device(device)
        decoding_autocast(self.device, precision)  # a bad name fails here
        self.precision = precision  # the decoding's arithmetic (models.decoding.PRECISIONS)
        self.module = module.to(self.device).eval()
        self.source = str(source)
        self.feature_meta: dict[str, Any] = dict(module.hparams["feature_meta"])
        self.layout = AttentionLayout.of(self.feature_meta)
        self.kind, self.grid, self.regions = self.layout.kind, self.layout.grid, self.layout.regions
        self.hard_attention = marks_hard_attention(module)
        self._encoders: list[Any] | None = None

    @classmethod
    def from_checkpoint(cls, path: str | Path | Sequence[str | Path], device: str | torch.device = "auto",
                        precision: str = "fp32") -> Captioner:
        """Load a ``captioning-train`` checkpoint (safe loading) onto ``device`` (auto | cpu | cuda[:i]); decode
        in ``precision`` (fp32, or bf16 / fp16 autocast: faster on a GPU, captions can differ).

        A list of checkpoints: their test-time ensemble (``captioning.models.ensemble``: the mean of
        their word distributions; the attention of results and figures is the mean of theirs)."""
        one = isinstance(path, (str, Path))
        paths = [str(path)] if one else [str(p) for p in path]  # type: ignore[union-attr]
        model = load_captioner(paths[0]) if one else load_ensemble(paths)
        return cls(model, device=resolve_device(device), source=" + ".join(paths), precision=precision)

    @property
    def vocab(self) -> Any:
        return self.module.vocab

    # ------------------------------------------------------------------------ public API
    def caption(self, inputs: str | Path | Sequence[str | Path], **kwargs: Any) -> list[CaptionResult]:
        """Caption image/video files and folders of them: one result per media file or failed input.

        See ``iter_caption`` for the options; decoding options (``beam_size=5``, ...) as keywords.
        """
        return list(self.iter_caption(inputs, **kwargs))

    def iter_caption(self, inputs: str | Path | Sequence[str | Path], *, recursive: bool = True,
                     exclude: str | Path | None = None, max_items: int | None = None, batch_size: int = 16,
                     num_workers: int = 0, progress: bool = False, decode: DecodeConfig | None = None,
                     **options: Any) -> Iterator[CaptionResult]:
        """``caption`` as a stream, in input order (figures can be drawn while later batches decode).

        recursive: look into sub-folders; exclude: a folder whose files are never inputs;
        max_items: caption at most this many media files; num_workers: DataLoader processes
        decoding the media; decode / options: ``DecodeConfig`` and field overrides.
        """
        cfg = beam_config(decode, **options)
        if isinstance(inputs, (str, Path)):
            inputs = [inputs]
        found, notes = collect_inputs(inputs, self.kind, recursive=recursive, exclude=exclude)
        for note in notes:
            log.info("note: %s", note)
        found = limit_media(found, max_items)
        todo = [(str(i), s.path) for i, s in enumerate(found) if s.error is None and s.path is not None]
        log.info("captioning %d %s(s) with %s on %s", len(todo), self.kind, self.source, self.device)
        self.encoders()  # a checkpoint that cannot rebuild its backbones fails here, before any output
        yield from self._in_order(found, self._raw_batches(todo, batch_size, num_workers), cfg, progress)

    def caption_split(self, split: str, **kwargs: Any) -> list[CaptionResult]:
        """Caption a split of the checkpoint's dataset from its FeatureStore (see ``iter_split``)."""
        return list(self.iter_split(split, **kwargs))

    def iter_split(self, split: str, *, max_items: int | None = None, batch_size: int = 16,
                   progress: bool = False, data_root: str | None = None, features_dir: Any = None,
                   decode: DecodeConfig | None = None, **options: Any) -> Iterator[CaptionResult]:
        """The stored features the model was trained/evaluated on, in the split's order; the media
        files (from the checkpoint's data config) are read only for the figures.  data_root /
        features_dir: where the dataset / the store(s) are now, if moved
        (``captioning.train.inputs.checkpoint_inputs``)."""
        cfg = beam_config(decode, **options)
        inputs = checkpoint_inputs(self.module.hparams, self.source, data_root=data_root,
                                   features_dir=features_dir)
        data_cfg, store = inputs.data, inputs.store
        records = read_dataset(data_cfg).split(split)
        if not records:
            raise ConfigError(f"store_split={split!r} has no items in data '{data_cfg.name}': use train, val or test")
        found: list[MediaInput] = []
        found_ids: set[str] = set()
        ids: list[str] = []  # the store id of each found item (records list an item once per caption)
        for r in records:
            if r.item_id in store and r.item_id not in found_ids:
                found_ids.add(r.item_id)
                ids.append(r.item_id)
                found.append(MediaInput(r.path, data_cfg.kind, path=os.path.join(data_cfg.media_dir, r.path)))
        if max_items is not None:
            found, ids = found[:max_items], ids[:max_items]
        log.info("captioning %d %s(s) with %s on %s", len(found), self.kind, self.source, self.device)
        yield from self._in_order(found, self._store_batches(found, ids, store, batch_size), cfg, progress)

    def caption_features(self, features: Any, valid: Sequence[int] | None = None, *,
                         frame_indices: Sequence[Sequence[int] | None] | None = None,
                         images: Sequence[np.ndarray | None] | None = None, names: Sequence[str] | None = None,
                         boxes: Sequence[np.ndarray | None] | None = None,
                         image_sizes: Sequence[Sequence[int] | None] | None = None,
                         batch_size: int = 64, decode: DecodeConfig | None = None,
                         **options: Any) -> list[CaptionResult]:
        """Caption precomputed features: ``[B, N, C]`` (tensor or array, or B arrays ``[N, C]``).

        valid: real positions per item (the first ``valid[b]``; default all N); frame_indices:
        per video, its K frame numbers; images: per item the pixels for figures ([S,S,3] or
        [K,S,S,3] uint8; image regions: the whole image); names: the results' ``input`` (default
        ``features[b]``); boxes / image_sizes: per item of a region model, the [>= valid, 4] pixel
        boxes of its regions and (W, H) of its image, for the figures.
        """
        cfg = beam_config(decode, **options)
        x = [torch.as_tensor(np.asarray(f)) for f in features]
        dim = int(self.feature_meta["dim"])
        for b, f in enumerate(x):
            if f.ndim != 2 or f.shape[1] != dim or (x and f.shape != x[0].shape):
                raise DataError(f"features[{b}] has shape {list(f.shape)}; this model takes [N, {dim}] per item "
                                f"(the same N for all items)")
        n = len(x)
        valid = [int(f.shape[0]) for f in x] if valid is None else [int(v) for v in valid]
        names = [f"features[{b}]" for b in range(n)] if names is None else [str(s) for s in names]
        frames = list(frame_indices) if frame_indices is not None else [None] * n
        pics = list(images) if images is not None else [None] * n
        boxes = list(boxes) if boxes is not None else [None] * n
        sizes = list(image_sizes) if image_sizes is not None else [None] * n
        if not len(valid) == len(names) == len(frames) == len(pics) == len(boxes) == len(sizes) == n:
            raise ConfigError(f"caption_features: {n} feature sets but valid/names/frame_indices/images/boxes/"
                              f"image_sizes of other lengths")
        if any(not 1 <= v <= (x[0].shape[0] if x else 0) for v in valid):
            raise DataError(f"valid={valid} must be between 1 and N for every item")
        out: list[CaptionResult] = []
        for start in range(0, n, batch_size):
            part = range(start, min(n, start + batch_size))
            feats = [Featurized(names[b], "", features=x[b], valid=valid[b],
                                frame_indices=None if frames[b] is None else tuple(frames[b]),
                                boxes=None if boxes[b] is None else np.asarray(boxes[b], dtype=np.float32),
                                image_size=None if sizes[b] is None else (int(sizes[b][0]), int(sizes[b][1])))
                     for b in part]
            for b, r in zip(part, self._decode(feats, cfg), strict=True):
                r.input = names[b]
                r.image = None if pics[b] is None else np.asarray(pics[b], dtype=np.uint8)
                out.append(r)
        return out

    def backbone(self) -> Any:
        """The checkpoint's feature extractor (raw media only; see ``encoders``)."""
        encoders = self.encoders()
        if len(encoders) != 1:
            raise ConfigError(f"{self.source} reads {len(encoders)} feature streams: use encoders(), one per stream")
        return encoders[0]

    def encoders(self) -> list[Any]:
        """The backbone of each feature stream, built on first use (raw media only): rebuilt from the
        feature meta and checked against it, or the checkpoint's own fine-tuned encoder."""
        if self._encoders is None:

            if isinstance(self.module, FinetuneModule):  # its weights are in the checkpoint, not in a file
                self._encoders = [self.module.encoder]
            else:
                self._encoders = [b.for_inference().to(self.device)
                                  for b in rebuild_backbones(self.feature_meta, self.source)]
        return self._encoders

    # ------------------------------------------------------------------------ internals
    def _raw_batches(self, todo: list[tuple[str, str]], batch_size: int, num_workers: int
                     ) -> Iterator[list[tuple[int, Any]]]:
        """(index, Featurized) of the media files ``todo`` ((index, path) pairs), per batch."""
        for batch in featurize_streams(self.encoders(), self.feature_meta, todo, batch_size=batch_size,
                                       num_workers=num_workers, device=self.device):
            yield [(int(f.item_id), f) for f in batch]

    def _store_batches(self, found: list[Any], ids: list[str], store: Any, batch_size: int
                       ) -> Iterator[list[tuple[int, Any]]]:
        """Stored features + the display crop recomputed from the media file with the stored settings."""

        for start in range(0, len(found), batch_size):
            out = []
            for i in range(start, min(len(found), start + batch_size)):
                item = store[ids[i]]
                f = Featurized(str(i), found[i].path or "", features=torch.from_numpy(np.array(item.features)),
                               valid=int(item.valid), frame_indices=item.frame_indices,
                               boxes=None if item.boxes is None else np.array(item.boxes), image_size=item.image_size)
                try:
                    f.pixels = display_crop(self.feature_meta, f.path, item.frame_indices)
                except Exception as e:  # the caption needs no media, but the figure does
                    if not stream_metas(self.feature_meta)[0].get("imported"):
                        f = Featurized(f.item_id, f.path, error=f"cannot draw the figure: {error_line(e)}")
                    else:  # features made elsewhere often come without their media: drawn on gray
                        log.info("%s: no image for the figure (%s); drawn on gray", f.path, error_line(e))
                out.append((i, f))
            yield out

    def _in_order(self, found: list[Any], batches: Iterable[list[tuple[int, Any]]], cfg: DecodeConfig,
                  progress: bool) -> Iterator[CaptionResult]:
        """Decode each batch and yield the results in ``found``'s order as soon as they are complete."""
        from tqdm import tqdm

        ready: dict[int, CaptionResult] = {
            i: CaptionResult(s.input, s.kind, path=s.path, error=s.error) for i, s in enumerate(found) if s.error
        }
        media = sum(s.error is None for s in found)
        bar = tqdm(total=media, desc="caption", unit=self.kind, disable=not progress or media == 0,
                   dynamic_ncols=True, file=sys.stderr)
        nxt = 0
        try:
            for batch in batches:
                ok = [(i, f) for i, f in batch if f.error is None]
                for i, f in batch:
                    if f.error is not None:
                        ready[i] = CaptionResult(found[i].input, found[i].kind, path=found[i].path, error=f.error)
                for (i, f), r in zip(ok, self._decode([f for _, f in ok], cfg), strict=True):
                    r.input, r.path, r.image = found[i].input, found[i].path, hwc(f.pixels)
                    ready[i] = r
                bar.update(len(batch))
                while nxt in ready:
                    yield ready.pop(nxt)
                    nxt += 1
        finally:
            bar.close()
        for i in sorted(ready):
            yield ready.pop(i)

    def _decode(self, feats: Sequence[Any], cfg: DecodeConfig) -> list[CaptionResult]:
        """Decode a batch of ``Featurized`` ([N, C] each, real positions first) -> results."""
        if not feats:
            return []
        x = torch.stack([f.features.float() for f in feats]).to(self.device)
        n = x.shape[1]
        mask = torch.arange(n)[None, :] < torch.tensor([int(f.valid) for f in feats])[:, None]
        v = self.module.vocab
        with torch.no_grad(), decoding_autocast(self.device, self.precision):
            nbest = decode_batch(self.module.decoder, x, mask.to(self.device), cfg, v.bos, v.eos, v.unk)
        itos, out = v.itos, []
        for hyps, f in zip(nbest, feats, strict=True):
            out.append(self.layout.result(hyps, f, itos, n, hard_attention=self.hard_attention))
        return out
