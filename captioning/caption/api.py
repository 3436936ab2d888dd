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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioning.caption.inputs import MediaInput, collect_inputs, limit_media
from captioning.config import checkpoint_data_config, unknown_keys
from captioning.data.annotations import read_dataset
from captioning.errors import CheckpointError, ConfigError, DataError
from captioning.features.featurize import (
    Featurized,
    display_crop,
    featurize_streams,
    rebuild_backbones,
)
from captioning.models.decoding import decoding_autocast
from captioning.models.search import DecodeConfig, decode_batch
from captioning.store.streams import open_features, stream_metas
from captioning.train.checkpoint import check_compatible, load_captioner, load_ensemble
from captioning.train.finetune import FinetuneModule
from captioning.viz.gallery import error_line
from captioning.viz.heatmaps import plot_result

log = logging.getLogger("captioning.caption")


@dataclass
class CaptionResult:
    """The caption of one input and the attention that emitted each of its words.

    attention: float64 ``[T, H*W]`` for an image (row-major over the feature grid,
    ``attention_shape = [H, W]``) or ``[T, K]`` for a video (one weight per sampled frame,
    ``attention_shape = [K]``, the frames' numbers in ``frame_indices``); row ``t`` holds the
    weights used to emit ``tokens[t]``.  ``has_attention`` is False for models without
    attention (uniform weights are reported).  ``image``: the crop the model saw, uint8
    ``[S, S, 3]`` or ``[K, S, S, 3]`` (None for features given without pixels).  Image regions
    (features imported from a detector, ``captioning-import``): ``attention`` [T, n] over the n
    real regions, ``attention_shape = [n]``, ``boxes`` [n, 4] their pixel boxes (x1, y1, x2, y2)
    in an image of ``image_size`` (W, H) when the store has them, ``image`` the whole image.  An
    input that failed has ``error`` (one line) and no caption.
    """

    input: str
    kind: str  # image | video
    caption: str = ""
    tokens: list[str] = field(default_factory=list)
    attention: np.ndarray | None = None
    attention_shape: list[int] = field(default_factory=list)
    frame_indices: list[int] | None = None
    score: float | None = None  # the beam's ranking score (summed log-probs, length-normalised if set)
    token_log_probs: list[float] = field(default_factory=list)  # each word's log-prob, then <eos>'s
    nbest: list[tuple[str, float]] = field(default_factory=list)  # (caption, score), best first, when decode
    # asks for several (n_best > 1, diverse groups, num_samples > 1); empty otherwise
    has_attention: bool = True
    hard_attention: bool = False  # the model attends to one location per word (figures mark it)
    image: np.ndarray | None = field(default=None, repr=False)
    path: str | None = None
    error: str | None = None
    boxes: np.ndarray | None = field(default=None, repr=False)
    image_size: list[int] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def figure(self, path: str | Path, **kwargs: Any) -> Path:
        """Save this caption's attention figure (PNG, or JPEG/PDF/SVG by the path's suffix;
        ``captioning.viz.heatmaps.plot_result``)."""
        return plot_result(self, path, **kwargs)


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


def _hwc(pixels: torch.Tensor | None) -> np.ndarray | None:
    """uint8 [3,S,S] -> [S,S,3] or [K,3,S,S] -> [K,S,S,3] numpy."""
    if pixels is None:
        return None
    x = pixels.detach().cpu()
    x = x.permute(1, 2, 0) if x.ndim == 3 else x.permute(0, 2, 3, 1)
    return np.ascontiguousarray(x.numpy().astype(np.uint8))


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
        self.kind: str = self.feature_meta.get("kind", "image")
        grid = self.feature_meta.get("grid")
        self.grid: tuple[int, int] | None = (int(grid[0]), int(grid[1])) if grid else None
        # image regions (imported detector features): no grid, attention is per region
        self.regions = self.kind == "image" and self.grid is None and bool(self.feature_meta.get("regions"))
        if self.kind == "image" and self.grid is None and not self.regions:
            raise CheckpointError("image features without a grid in the checkpoint's feature_meta")

        video = stream_metas(self.feature_meta)[0].get("settings", {}).get("video") or {}
        # video_features=grid: the K*h*w positions are frame-major; attention is summed per frame
        self._cells = self.grid[0] * self.grid[1] if video.get("video_features") == "grid" and self.grid else 1
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
                   progress: bool = False, decode: DecodeConfig | None = None,
                   **options: Any) -> Iterator[CaptionResult]:
        """The stored features the model was trained/evaluated on, in the split's order; the media
        files (from the checkpoint's data config) are read only for the figures."""
        cfg = beam_config(decode, **options)
        hp = self.module.hparams
        data_cfg = checkpoint_data_config(hp["config"])
        store = open_features(hp["config"]["features_dir"])
        check_compatible(hp, hp["vocab"], dict(store.meta), self.source)
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
                self._encoders = [b.to(self.device) for b in rebuild_backbones(self.feature_meta, self.source)]
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
                    r.input, r.path, r.image = found[i].input, found[i].path, _hwc(f.pixels)
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
            h = hyps[0]
            tokens = [itos[t] for t in h.tokens]
            if h.attention is None:  # show_tell / mean_pool: the context is the uniform mean
                att = np.zeros((len(tokens), n), dtype=np.float64)
                att[:, : int(f.valid)] = 1.0 / int(f.valid)
            else:
                att = h.attention[: len(tokens)].float().cpu().numpy().astype(np.float64)
            r = CaptionResult(f.item_id, self.kind, caption=" ".join(tokens), tokens=tokens, score=float(h.score),
                              token_log_probs=list(h.token_log_probs),
                              has_attention=h.attention is not None, hard_attention=self.hard_attention,
                              nbest=[(" ".join(itos[t] for t in x.tokens), float(x.score)) for x in hyps]
                              if len(hyps) > 1 else [])
            if self.regions:  # the real regions only, with their boxes when known
                n_real = int(f.valid)
                r.attention, r.attention_shape = att[:, :n_real], [n_real]
                r.boxes = None if f.boxes is None else np.asarray(f.boxes[:n_real], dtype=np.float64)
                r.image_size = None if f.image_size is None else [int(s) for s in f.image_size]
            elif self.kind == "image":
                assert self.grid is not None
                r.attention, r.attention_shape = att, list(self.grid)
            else:
                if self._cells > 1:  # [T, K*h*w] frame-major -> weight per frame [T, K]
                    att = att.reshape(att.shape[0], -1, self._cells).sum(axis=-1)
                r.attention, r.attention_shape = att, [int(att.shape[1])]
                r.frame_indices = [int(i) for i in (f.frame_indices or range(att.shape[1]))]
            out.append(r)
        return out
