"""The generate job (``captioning-generate``): write an embedded synthetic dataset (deterministic from ``seed``).

    captioning-generate dataset=shapes                      # -> data/shapes
    captioning-generate dataset=moving_shapes num_items=200 root=/tmp/ms
    captioning-generate dataset=shapes force=true           # regenerate even if up to date

Generation is skipped when ``<root>/generated.json`` records the same parameters.  Data are
written into a temp folder and moved into ``root`` when complete; the stamp is written last.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from captioning.data.synthetic import ensure_generated

log = logging.getLogger("captioning.generate")


@dataclass
class GenerateConfig:
    dataset: str = "shapes"  # shapes | moving_shapes
    root: str | None = None  # default: data/<dataset>
    num_items: int | None = None  # images or videos (None: the generator's default)
    seed: int = 0
    image_size: int = 224  # shapes: square image side
    frames: int = 32  # moving_shapes: frames per video (a multiple of 16)
    video_size: int = 96  # moving_shapes: square frame side (even)
    events: list[str] | None = None  # moving_shapes: event kinds (None: [appear]; see the generator)
    force: bool = False  # regenerate even when the stamp matches


def generate(cfg: GenerateConfig) -> dict[str, Any]:
    """Generate (or skip) as configured; returns ``ensure_generated``'s result."""

    result = ensure_generated(
        cfg.dataset, cfg.root, num_items=cfg.num_items, seed=cfg.seed, image_size=cfg.image_size,
        frames=cfg.frames, video_size=cfg.video_size, events=cfg.events, force=cfg.force,
    )
    summary = result.get("summary") or {}
    if result["generated"]:
        log.info("generated %s in %s (%.1f s): splits %s, vocabulary %s words, captions <= %s tokens",
                 cfg.dataset, result["root"], result["seconds"], summary.get("splits"),
                 summary.get("vocab_size"), summary.get("max_tokens"))
    return result
