"""Embedded synthetic datasets, generated deterministically from a seed (see docs/CONTRACTS.md).

``generate_shapes``: images of 1-4 coloured shapes with COCO captions and object boxes.
``generate_moving_shapes``: short H.264 videos of ordered events with MSR-VTT captions and
event frame spans.  ``ensure_generated``: generate once into a data root (stamp + temp folder).
"""

from __future__ import annotations

from captioning.data.synthetic.common import ensure_generated, generation_params, read_stamp
from captioning.data.synthetic.moving_shapes import generate_moving_shapes
from captioning.data.synthetic.shapes import generate_shapes

__all__ = ["ensure_generated", "generate_moving_shapes", "generate_shapes", "generation_params", "read_stamp"]
