"""``captioning-caption``: caption raw images or videos with a checkpoint; attention figures + gallery.

    captioning-caption ckpt_path=<run>/checkpoints/best.ckpt inputs=[photo.jpg,photos/] output_dir=results/cap
    captioning-caption ckpt_path=<ckpt> inputs=[clips/] decode.beam_size=5 device=cuda
    captioning-caption ckpt_path=<ckpt> store_split=test max_items=20   # features from the training store

The job is ``captioning.caption.job.caption``.  Exit status: 0 when every input was captioned,
1 when some failed, 2 for a configuration or checkpoint error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from captioning.caption.job import CaptionConfig, caption
from captioning.config import CONF_DIR, register_schema, to_config
from captioning.jobs import cli_errors, composition_errors
from captioning.viz.viewer import viewer_switch

__all__ = ["CaptionConfig", "main"]

register_schema("caption_schema", CaptionConfig)  # typed at composition: a bad key or value is refused there


@viewer_switch  # viewer=true: conf/viewer/true.yaml (Hydra alone would read a boolean)
@composition_errors
@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="caption")
@cli_errors
def main(raw: DictConfig) -> None:
    cfg = to_config(raw, CaptionConfig)
    summary = caption(cfg)
    out = Path(summary.output_dir)
    print(f"captioned {summary.captioned} input(s), {summary.failed} failed; results in {out}/: "
          f"captions.json, figures/, index.html (open {out / 'index.html'})", flush=True)
    if summary.viewer is not None:
        print(f"attention viewer: {summary.viewer} (open it in a browser)", flush=True)
    if summary.failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
