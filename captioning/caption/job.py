"""The caption job (``captioning-caption``): raw images or videos -> captions, attention figures, gallery.

    captioning-caption ckpt_path=<run>/checkpoints/best.ckpt inputs=[photo.jpg,photos/] output_dir=results/cap
    captioning-caption ckpt_path=<ckpt> inputs=[clips/] decode.beam_size=5 device=cuda
    captioning-caption ckpt_path=<ckpt> store_split=test max_items=20   # features from the training store

Raw inputs (image files, video files or folders of them) go through the checkpoint's own
backbone, rebuilt from the ``encoder`` section of the checkpoint's feature meta, with the
extraction job's own code, so the decoder sees exactly what it was trained on
(``captioning.caption.api.Captioner``).  ``store_split=<split>`` instead reads the features the model
was trained/evaluated on from its FeatureStore and the media files (for the figures) from its
data config (moved since: ``data_root=<its new folder>`` or ``features_dir=``, as for
``captioning-evaluate``).

Writes into ``output_dir`` (``captioning.viz.gallery.write_gallery``): ``captions.json`` (one
entry per input, ``"error"`` for the inputs that failed; each word's log-prob, and the rows of
``attention.npy`` that hold its attention: ``captioning.viz.captions_file``), ``figures/<NNNN>_<name>.png`` (images:
the crop the model saw, then one heatmap panel per word; videos: a frame strip above the words x
frames alignment; hard-attention models mark the argmax location) and ``index.html``; with
``viewer=true`` also ``viewer/index.html``, the interactive attention viewer (``captioning.viz.viewer``).

Files in folders that are neither images nor videos (or of the kind the checkpoint does not
caption) are skipped with a note; such files named explicitly, missing paths and unreadable
files become error entries.  Exit status: 0 when every input was captioned, 1 when some failed,
2 for a configuration or checkpoint error.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from captioning.caption.api import Captioner
from captioning.errors import ConfigError
from captioning.models.search import DecodeConfig
from captioning.predictions import ATTENTION_FILE
from captioning.provenance import provenance, write_provenance
from captioning.store.layout import store_id
from captioning.viz.gallery import write_gallery
from captioning.viz.viewer import ViewerConfig
from captioning.viz.viewer.results import ResultsViewer


@dataclass
class CaptionConfig:
    ckpt_path: str = MISSING
    inputs: list[str] = field(default_factory=list)  # image/video files and folders of them
    output_dir: str = "outputs/captions"
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    device: str = "auto"  # auto (cuda if available) | cpu | cuda | cuda:<i>
    precision: str = "fp32"  # fp32 | bf16 | fp16: the decoding's arithmetic (autocast; captions can differ)
    batch_size: int = 16
    num_workers: int = 2  # DataLoader processes decoding the media files
    store_split: str | None = None  # caption a split from the checkpoint's FeatureStore instead of inputs
    data_root: str | None = None  # store_split: the checkpoint's dataset moved here (captioning.train.inputs)
    features_dir: Any = None  # store_split: its store(s) now, a folder or one per stream (default: the checkpoint's)
    max_items: int | None = None  # caption at most this many media items
    recursive: bool = True  # look into sub-folders of folder inputs
    progress: bool = True
    viewer: ViewerConfig = field(default_factory=ViewerConfig)  # viewer=true: <output_dir>/viewer/ (docs/viewer.md)


@dataclass
class CaptionSummary:
    output_dir: str
    captioned: int
    failed: int
    entries: list[dict[str, Any]]
    viewer: Path | None = None  # viewer/index.html when viewer=true


def caption(cfg: CaptionConfig) -> CaptionSummary:
    """Caption ``cfg.inputs`` (or a stored split) and write captions.json, figures and index.html."""

    cfg.decode.validate()
    if cfg.batch_size < 1 or cfg.num_workers < 0:
        raise ConfigError("batch_size must be >= 1 and num_workers >= 0")
    if cfg.store_split is None and not cfg.inputs:
        raise ConfigError("nothing to caption: pass inputs=[<image/video files or folders>] "
                          "(or store_split=<split> to caption stored features)")
    if cfg.store_split is not None and cfg.inputs:
        raise ConfigError("pass either inputs=[...] (raw media) or store_split=<split> (stored features), not both")
    if cfg.store_split is None and (cfg.data_root is not None or cfg.features_dir is not None):
        raise ConfigError("data_root= and features_dir= say where a stored split is: pass store_split=<split> "
                          "(raw inputs need neither)")
    captioner = Captioner.from_checkpoint(cfg.ckpt_path, device=cfg.device, precision=cfg.precision)
    out = Path(cfg.output_dir)
    options = {"max_items": cfg.max_items, "batch_size": cfg.batch_size, "progress": cfg.progress,
               "decode": cfg.decode}
    results = (captioner.iter_split(cfg.store_split, data_root=cfg.data_root, features_dir=cfg.features_dir,
                                    **options) if cfg.store_split is not None else
               captioner.iter_caption(cfg.inputs, recursive=cfg.recursive, exclude=out,
                                      num_workers=cfg.num_workers, **options))
    title = f"Captions by {Path(cfg.ckpt_path).name}"
    viewer = ResultsViewer(out, cfg.viewer, captioner, title) if cfg.viewer.wanted else None
    entries = write_gallery(results if viewer is None else viewer.tap(results), out, title=title)
    viewer_path = None if viewer is None else viewer.close()
    write_provenance(out, provenance(store=store_id(captioner.feature_meta), checkpoints=captioner.module.checkpoint_runs,
                                     precision=cfg.precision),
                     ("captions.json",) + ((ATTENTION_FILE,) if (out / ATTENTION_FILE).is_file() else ()))
    failed = [e for e in entries if "error" in e]
    for e in failed:
        print(f"failed: {e['input']}: {e['error']}", file=sys.stderr, flush=True)
    return CaptionSummary(str(out), len(entries) - len(failed), len(failed), entries, viewer_path)
