"""``captioning-caption``: caption raw images or videos with a checkpoint; attention figures + gallery.

    captioning-caption ckpt_path=<run>/checkpoints/best.ckpt inputs=[photo.jpg,photos/] output_dir=results/cap
    captioning-caption ckpt_path=<ckpt> inputs=[clips/] decode.beam_size=5 device=cuda
    captioning-caption ckpt_path=<ckpt> store_split=test max_items=20   # features from the training store

Raw inputs (image files, video files or folders of them) go through the checkpoint's own
backbone, rebuilt from the ``encoder`` section of the checkpoint's feature meta, with the
extraction job's own code (``MediaDataset`` + ``FeatureExtractor``): same decoding, resize/crop,
normalisation, row-major ``h*w`` flattening, per-frame pooling and store dtype, so the decoder
sees exactly what it was trained on.  ``store_split=<split>`` instead reads the features the
model was trained/evaluated on from its FeatureStore (no backbone needed) and the media files
(for the figures) from its data config.

Writes into ``output_dir``: ``captions.json`` (see ``captioning.viz.gallery``; one entry per
input, ``"error"`` for the inputs that failed), ``figures/<NNNN>_<name>.png`` (images: the crop
the model saw, then one heatmap panel per word; videos: a frame strip above the words x frames
alignment; hard-attention models mark the argmax location) and ``index.html``.

Files in folders that are neither images nor videos (or of the kind the checkpoint does not
caption) are skipped with a note; such files named explicitly, missing paths and unreadable
files become error entries.  Exit status: 0 when every input was captioned, 1 when some failed,
2 for a configuration or checkpoint error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from omegaconf import MISSING, DictConfig

from captioning.config import CONF_DIR, cli_errors, to_config
from captioning.errors import CheckpointError, ConfigError, DataError
from captioning.models.search import BeamConfig

log = logging.getLogger("captioning.caption")

FIGURES_DIR = "figures"


@dataclass
class CaptionConfig:
    ckpt_path: str = MISSING
    inputs: list[str] = field(default_factory=list)  # image/video files and folders of them
    output_dir: str = "outputs/captions"
    decode: BeamConfig = field(default_factory=BeamConfig)
    device: str = "auto"  # auto (cuda if available) | cpu | cuda | cuda:<i>
    batch_size: int = 16
    num_workers: int = 2  # DataLoader processes decoding the media files
    store_split: str | None = None  # caption a split from the checkpoint's FeatureStore instead of inputs
    max_items: int | None = None  # caption at most this many media items
    recursive: bool = True  # look into sub-folders of folder inputs
    progress: bool = True


# ------------------------------------------------------------------------------------ inputs


@dataclass
class Slot:
    """One line of ``captions.json``: a media file to caption, or an input that already failed."""

    input: str  # as the user named it (or folder/relative path for files found in a folder)
    kind: str
    path: str | None = None
    error: str | None = None


def _extensions(kind: str) -> str:
    from captioning.data.media import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS

    exts = IMAGE_EXTENSIONS if kind == "image" else VIDEO_EXTENSIONS
    return " ".join(sorted(exts))


def collect_inputs(inputs: Sequence[str], kind: str, *, recursive: bool = True,
                   exclude: str | Path | None = None) -> tuple[list[Slot], list[str]]:
    """Expand files and folders into slots (in the order given; folders sorted by path).

    ``kind``: what the checkpoint captions (image | video).  A missing path, or a file named
    explicitly that is not a ``kind`` file, becomes an error slot; files in folders that are not
    ``kind`` files are skipped and described in the returned notes.  Hidden files and anything
    under ``exclude`` (the output folder) are ignored; a file found twice is captioned once.
    """
    from captioning.data.media import media_kind

    slots: list[Slot] = []
    notes: list[str] = []
    seen: set[str] = set()
    excl = Path(exclude).resolve() if exclude is not None else None

    def add(display: str, p: Path) -> None:
        key = str(p.resolve())
        if key not in seen:
            seen.add(key)
            slots.append(Slot(display, kind, path=str(p)))

    for raw in inputs:
        p = Path(os.path.expanduser(str(raw)))
        if not p.exists():
            slots.append(Slot(str(raw), media_kind(p) or kind,
                              error=f"input not found: {raw} (check the path; inputs=[file_or_folder,...])"))
            continue
        if p.is_dir():
            walk = p.rglob("*") if recursive else p.iterdir()
            files = sorted(f for f in walk if f.is_file())
            skipped: dict[str, list[str]] = {}
            found = 0
            for f in files:
                rel = f.relative_to(p)
                if any(part.startswith(".") for part in rel.parts):
                    continue
                if excl is not None and (excl == f.resolve() or excl in f.resolve().parents):
                    continue
                fk = media_kind(f)
                if fk == kind:
                    found += 1
                    add(str(f), f)
                else:
                    why = "unsupported type" if fk is None else f"{fk} (this checkpoint captions {kind}s)"
                    skipped.setdefault(why, []).append(str(rel))
            for why, names in skipped.items():
                shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                notes.append(f"{raw}: skipped {len(names)} file(s), {why}: {shown}")
            if not found:
                where = "or its sub-folders " if recursive else ""
                slots.append(Slot(str(raw), kind, error=f"folder {raw} {where}holds no {kind} files "
                                                        f"({_extensions(kind)})"))
            continue
        fk = media_kind(p)
        if fk is None:
            slots.append(Slot(str(raw), kind, error=f"unsupported file type '{p.suffix or '(none)'}': {raw}; "
                                                    f"this checkpoint captions {kind}s ({_extensions(kind)})"))
        elif fk != kind:
            slots.append(Slot(str(raw), fk, error=f"{raw} is a {fk} but this checkpoint captions {kind}s; "
                                                  f"use a checkpoint trained on {fk}s"))
        else:
            add(str(raw), p)
    return slots, notes


# ----------------------------------------------------------------------------------- backbone


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without a GPU is a ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device={name!r} is not a torch device: use auto | cpu | cuda | cuda:<i>") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but no CUDA GPU is available: use device=cpu (or auto)")
    return device


def encoder_config(meta: dict[str, Any], ckpt_path: str | Path) -> Any:
    """The ``EncoderConfig`` the checkpoint's features were extracted with (``meta["encoder"]``)."""
    from captioning.features.backbones import EncoderConfig

    enc = meta.get("encoder")
    if not isinstance(enc, dict):
        raise CheckpointError(
            f"{ckpt_path}: its features were extracted by an older version that did not record the encoder "
            f"(feature_meta has no 'encoder'); re-extract the features and re-train, or caption the stored "
            f"features with store_split=<split>"
        )
    known = {f.name for f in dataclasses.fields(EncoderConfig)}
    unknown = sorted(set(enc) - known)
    if unknown:
        raise CheckpointError(f"{ckpt_path}: feature_meta.encoder has keys {unknown} this code does not know; "
                              f"use the code version that extracted the features")
    return EncoderConfig(**enc)


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x))


def checkpoint_backbone(meta: dict[str, Any], ckpt_path: str | Path, device: torch.device) -> Any:
    """Rebuild the exact backbone of the checkpoint's features and check it against the meta."""
    from captioning.features.backbones import build_backbone

    backbone = build_backbone(encoder_config(meta, ckpt_path))
    video = meta.get("kind") == "video"
    mine, theirs = _plain(backbone.settings(video=video)), _plain(meta.get("settings"))
    if mine != theirs:
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise CheckpointError(
            f"{ckpt_path}: the rebuilt backbone differs from the one the features were extracted with "
            f"({', '.join(diff)}: { {k: theirs.get(k) for k in diff} } vs { {k: mine.get(k) for k in diff} }); "
            f"restore the same encoder weights (e.g. the weights file) or re-extract and re-train"
        )
    return backbone.to(device)


# ------------------------------------------------------------------------------------ features


@dataclass
class Featurized:
    """Features of one media file, as the extraction job stores them.

    features: [N, C] in the store dtype (CPU); valid: real positions; frame_indices: K sampled
    frame numbers (videos); pixels: uint8 [3,S,S] (image) or [K,3,S,S] (frames), the crop the
    backbone saw.  ``error`` is set (and the rest empty) when the file could not be used.
    """

    item_id: str
    path: str
    features: torch.Tensor | None = None
    valid: int = 0
    frame_indices: tuple[int, ...] | None = None
    pixels: torch.Tensor | None = None
    error: str | None = None


def _autocast(device: torch.device, precision: Any) -> contextlib.AbstractContextManager:
    """The extraction job's mixed precision when the meta records one and a GPU is used."""
    dtypes = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
    if device.type == "cuda" and precision in dtypes:
        return torch.autocast("cuda", dtype=dtypes[precision])
    return contextlib.nullcontext()


def featurize(backbone: Any, items: Sequence[tuple[str, str]], kind: str, *, dtype: str = "float16",
              batch_size: int = 16, num_workers: int = 0, device: torch.device | str = "cpu",
              precision: Any = None) -> Iterator[list[Featurized]]:
    """Yield, per batch, the features of ``items`` ((item_id, path) pairs) computed exactly as
    ``captioning-extract`` computes them: the extraction module's ``MediaDataset`` (decode,
    frame sampling, resize/crop), ``collate_media`` and ``FeatureExtractor.predict_step``
    (normalise, backbone, ``h*w`` row-major flattening or per-frame pooling, store dtype).
    """
    from torch.utils.data import DataLoader

    from captioning.features.extract import (
        FeatureExtractor,
        MediaDataset,
        MediaItem,
        VideoSampling,
        collate_media,
    )

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
            pixels = torch.split(batch["pixels"], batch["counts"])
            for k, item_id in enumerate(out["ids"]):
                feats = out["features"][k]
                valid = out["valid"][k]
                px = pixels[k] if video else pixels[k][0]
                out_items.append(Featurized(
                    item_id, paths[item_id], features=feats.cpu(),
                    valid=int(feats.shape[0] if valid is None else valid),
                    frame_indices=None if out["frame_indices"][k] is None else tuple(out["frame_indices"][k]),
                    pixels=px,
                ))
        yield out_items


def featurize_files(backbone: Any, paths: Sequence[str | Path], kind: str, **kwargs: Any) -> list[Featurized]:
    """``featurize`` for a list of files, in their order (item ids are the positions)."""
    got: dict[str, Featurized] = {}
    for batch in featurize(backbone, [(str(i), str(p)) for i, p in enumerate(paths)], kind, **kwargs):
        got.update({f.item_id: f for f in batch})
    return [got[str(i)] for i in range(len(paths))]


# ------------------------------------------------------------------------------------ captions


def _hwc(pixels: torch.Tensor) -> np.ndarray:
    """uint8 [3,S,S] -> [S,S,3] or [K,3,S,S] -> [K,S,S,3] numpy."""
    x = pixels.detach().cpu()
    x = x.permute(1, 2, 0) if x.ndim == 3 else x.permute(0, 2, 3, 1)
    return np.ascontiguousarray(x.numpy().astype(np.uint8))


@dataclass
class Captioned:
    tokens: list[str]
    attention: np.ndarray  # [T, N] over the feature positions
    score: float
    attention_model: bool  # False: the model has no attention (uniform weights are reported)


def caption_features(model: Any, features: Sequence[torch.Tensor], valid: Sequence[int],
                     cfg: BeamConfig, device: torch.device) -> list[Captioned]:
    """Decode a batch of [N, C] feature sets (real positions first) -> tokens + attention [T, N]."""
    x = torch.stack([f.float() for f in features]).to(device)
    n = x.shape[1]
    mask = torch.arange(n)[None, :] < torch.tensor([int(v) for v in valid])[:, None]
    hyps = model.generate(x, mask.to(device), cfg)
    itos = model.vocab.itos
    out = []
    for h, v in zip(hyps, valid, strict=True):
        tokens = [itos[t] for t in h.tokens]
        if h.attention is None:  # show_tell / mean_pool: the context is the uniform mean
            att = np.zeros((len(tokens), n), dtype=np.float64)
            att[:, : int(v)] = 1.0 / int(v)
            has = False
        else:
            att = h.attention[: len(tokens)].float().cpu().numpy().astype(np.float64)
            has = True
        out.append(Captioned(tokens, att, float(h.score), has))
    return out


@dataclass
class Rendering:
    """How to draw a model's figures: kind, grid, hard-attention markers, video feature layout."""

    kind: str
    grid: tuple[int, int] | None
    hard: bool
    video_grid_cells: int = 1  # video_features=grid: cells per frame (attention summed per frame)


def build_entry(slot_index: int, slot: Slot, cap: Captioned, display: np.ndarray,
                frame_indices: Sequence[int] | None, how: Rendering, out_dir: Path) -> dict[str, Any]:
    """Draw the figure of one captioned input and return its ``captions.json`` entry.

    display: the crop the model saw, [S,S,3] (image) or [K,S,S,3] (video frames).
    """
    from captioning.viz.gallery import figure_name, make_entry
    from captioning.viz.heatmaps import (
        brightest_cell,
        image_attention_figure,
        video_attention_figure,
    )

    rel = f"{FIGURES_DIR}/{figure_name(slot.input, slot_index)}"
    extra: dict[str, Any] = {"score": round(cap.score, 4)}
    if not cap.attention_model:
        extra["attention_note"] = "the model has no attention: uniform weights over the features"
    title = " ".join(cap.tokens)
    if how.kind == "image":
        assert how.grid is not None
        hard_points = [brightest_cell(row, how.grid) for row in cap.attention] if how.hard else None
        image_attention_figure(display, cap.tokens, cap.attention, how.grid, out_dir / rel,
                               hard_points=hard_points, title=title)
        return make_entry(slot.input, cap.tokens, cap.attention, kind="image", figure=rel,
                          attention_shape=list(how.grid), **extra)
    att = cap.attention
    if how.video_grid_cells > 1:  # [T, K*h*w] frame-major -> weight per frame [T, K]
        att = att.reshape(att.shape[0], -1, how.video_grid_cells).sum(axis=-1)
    frames = list(frame_indices or range(att.shape[1]))
    video_attention_figure(display, cap.tokens, att, frames, out_dir / rel, hard=how.hard, title=title)
    return make_entry(slot.input, cap.tokens, att, kind="video", figure=rel,
                      frame_indices=frames, **extra)


# ------------------------------------------------------------------------------------ the job


@dataclass
class CaptionSummary:
    output_dir: str
    captioned: int
    failed: int
    entries: list[dict[str, Any]]

    @property
    def index_html(self) -> str:
        return str(Path(self.output_dir) / "index.html")


def _rendering(model: Any, meta: dict[str, Any]) -> Rendering:
    kind = meta.get("kind", "image")
    grid = tuple(int(g) for g in meta["grid"]) if meta.get("grid") else None
    mcfg = model.model_cfg
    hard = mcfg.variant == "hard_attention" and mcfg.test_mode == "argmax"
    if kind == "image":
        if grid is None:
            raise CheckpointError("image features without a grid in the checkpoint's feature_meta")
        return Rendering("image", grid, hard)
    cells = 1
    if (meta.get("settings", {}).get("video") or {}).get("video_features") == "grid" and grid:
        cells = grid[0] * grid[1]
    return Rendering("video", grid, hard, video_grid_cells=cells)


def _error_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if isinstance(e, (DataError, ConfigError, CheckpointError)) and text else (
        f"{type(e).__name__}: {text}" if text else type(e).__name__)


def _raw_batches(cfg: CaptionConfig, model: Any, slots: list[Slot], device: torch.device
                 ) -> Iterator[list[tuple[int, Featurized]]]:
    meta = dict(model.hparams["feature_meta"])
    backbone = checkpoint_backbone(meta, cfg.ckpt_path, device)
    todo = [(str(i), s.path) for i, s in enumerate(slots) if s.error is None]
    for batch in featurize(backbone, todo, meta["kind"], dtype=meta.get("dtype", "float16"),
                           batch_size=cfg.batch_size, num_workers=cfg.num_workers, device=device,
                           precision=meta.get("precision")):
        yield [(int(f.item_id), f) for f in batch]


def _store_slots(cfg: CaptionConfig, model: Any) -> tuple[list[Slot], Any, dict[str, str]]:
    """Slots of the split's items that have features in the checkpoint's store."""
    from captioning.checkpoint import check_compatible
    from captioning.cli.evaluate import _data_config
    from captioning.data.annotations import read_dataset
    from captioning.data.store import FeatureStore

    train_cfg = model.hparams["config"]
    data_cfg = _data_config(train_cfg, None)
    store = FeatureStore.open(train_cfg["features_dir"])
    check_compatible({"hyper_parameters": dict(model.hparams)}, model.hparams["vocab"], dict(store.meta),
                     cfg.ckpt_path)
    records = read_dataset(data_cfg).split(cfg.store_split)
    if not records:
        raise ConfigError(f"store_split={cfg.store_split!r} has no items in data '{data_cfg.name}': "
                          f"use train, val or test")
    slots, ids, seen = [], {}, set()
    for r in records:
        if r.item_id in seen or r.item_id not in store:
            continue
        seen.add(r.item_id)
        slot = Slot(r.path, data_cfg.kind, path=os.path.join(data_cfg.media_dir, r.path))
        ids[str(len(slots))] = r.item_id
        slots.append(slot)
    return slots, store, ids


def _store_batches(cfg: CaptionConfig, model: Any, slots: list[Slot], store: Any, ids: dict[str, str]
                   ) -> Iterator[list[tuple[int, Featurized]]]:
    """Stored features + the display crop recomputed from the media file with the stored settings."""
    from captioning.data.media import load_image
    from captioning.data.video import read_frames
    from captioning.features.backbones import Preprocessing

    meta = dict(model.hparams["feature_meta"])
    p = dict(meta["settings"]["preprocessing"])
    pre = Preprocessing(int(p["size"]), int(p["resize"]), str(p["crop"]), tuple(p["mean"]), tuple(p["std"]),
                        str(p.get("interpolation", "bilinear")))
    todo = [i for i, s in enumerate(slots) if s.error is None]
    for start in range(0, len(todo), cfg.batch_size):
        out = []
        for i in todo[start: start + cfg.batch_size]:
            item = store[ids[str(i)]]
            f = Featurized(str(i), slots[i].path or "", features=torch.from_numpy(np.array(item.features)),
                           valid=int(item.valid), frame_indices=item.frame_indices)
            try:
                if meta["kind"] == "image":
                    arr = np.array(load_image(f.path))
                    f.pixels = pre(torch.from_numpy(arr).permute(2, 0, 1))
                else:
                    frames = read_frames(f.path, list(item.frame_indices or ()))
                    f.pixels = pre(torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2))
            except Exception as e:  # the caption needs no media, but the figure does
                f = Featurized(f.item_id, f.path, error=f"cannot draw the figure: {_error_line(e)}")
            out.append((i, f))
        yield out


def caption(cfg: CaptionConfig) -> CaptionSummary:
    """Caption ``cfg.inputs`` (or a stored split) and write captions.json, figures and index.html."""
    from tqdm import tqdm

    from captioning.checkpoint import load_captioner
    from captioning.viz.gallery import error_entry, write_captions_json, write_index_html

    cfg.decode.validate()
    if cfg.batch_size < 1 or cfg.num_workers < 0:
        raise ConfigError("batch_size must be >= 1 and num_workers >= 0")
    if cfg.store_split is None and not cfg.inputs:
        raise ConfigError("nothing to caption: pass inputs=[<image/video files or folders>] "
                          "(or store_split=<split> to caption stored features)")
    if cfg.store_split is not None and cfg.inputs:
        raise ConfigError("pass either inputs=[...] (raw media) or store_split=<split> (stored features), not both")
    device = resolve_device(cfg.device)
    model = load_captioner(cfg.ckpt_path).to(device)
    meta = dict(model.hparams["feature_meta"])
    kind = meta.get("kind", "image")
    how = _rendering(model, meta)
    out_dir = Path(cfg.output_dir)
    (out_dir / FIGURES_DIR).mkdir(parents=True, exist_ok=True)

    store = ids = None
    if cfg.store_split is None:
        slots, notes = collect_inputs(cfg.inputs, kind, recursive=cfg.recursive, exclude=out_dir)
    else:
        slots, store, ids = _store_slots(cfg, model)
        notes = []
    for note in notes:
        log.info("note: %s", note)
    if cfg.max_items is not None:
        keep, n = [], 0
        for s in slots:
            if s.error is None:
                n += 1
                if n > cfg.max_items:
                    continue
            keep.append(s)
        slots = keep
    media = sum(s.error is None for s in slots)
    log.info("captioning %d %s(s) with %s on %s -> %s", media, kind, cfg.ckpt_path, device, out_dir)

    entries: list[dict[str, Any] | None] = [None] * len(slots)
    for i, s in enumerate(slots):
        if s.error is not None:
            entries[i] = error_entry(s.input, s.kind, s.error)
    batches = (_raw_batches(cfg, model, slots, device) if store is None
               else _store_batches(cfg, model, slots, store, ids or {}))
    bar = tqdm(total=media, desc="caption", unit=kind, disable=not cfg.progress or media == 0,
               dynamic_ncols=True, file=sys.stderr)
    try:
        for batch in batches:
            ok = [(i, f) for i, f in batch if f.error is None]
            for i, f in batch:
                if f.error is not None:
                    entries[i] = error_entry(slots[i].input, slots[i].kind, f.error)
            if ok:
                caps = caption_features(model, [f.features for _, f in ok], [f.valid for _, f in ok],
                                        cfg.decode, device)
                for (i, f), cap in zip(ok, caps, strict=True):
                    try:
                        entries[i] = build_entry(i, slots[i], cap, _hwc(f.pixels), f.frame_indices, how, out_dir)
                    except Exception as e:  # one bad figure must not lose the other captions
                        log.exception("figure of %s failed", slots[i].input)
                        entries[i] = error_entry(slots[i].input, slots[i].kind, _error_line(e))
            bar.update(len(batch))
    finally:
        bar.close()

    final = [e for e in entries if e is not None]
    write_captions_json(final, out_dir / "captions.json")
    write_index_html(final, out_dir, title=f"Captions by {Path(cfg.ckpt_path).name}")
    failed = [e for e in final if "error" in e]
    for e in failed:
        print(f"failed: {e['input']}: {e['error']}", file=sys.stderr, flush=True)
    return CaptionSummary(str(out_dir), len(final) - len(failed), len(failed), final)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="caption")
@cli_errors
def main(raw: DictConfig) -> None:
    cfg = to_config(raw, CaptionConfig)
    summary = caption(cfg)
    out = Path(summary.output_dir)
    print(f"captioned {summary.captioned} input(s), {summary.failed} failed; results in {out}/: "
          f"captions.json, {FIGURES_DIR}/, index.html (open {out / 'index.html'})", flush=True)
    if summary.failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
