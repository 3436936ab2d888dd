"""Embedded synthetic datasets, generated deterministically from a seed (see docs/CONTRACTS.md).

``generate_shapes``: images of 2-6 coloured shapes (colours and shapes shared across objects)
with COCO captions listing them left to right, and object boxes.
``generate_moving_shapes``: short H.264 videos of two brief events whose captions differ only in
the events' order, with MSR-VTT captions and event frame spans.
``ensure_generated``: generate once into a data root (stamp + temp folder).
"""

from __future__ import annotations

from captioning.data.synthetic.datasets import ensure_generated, generation_params, read_stamp
from captioning.data.synthetic.moving_shapes import generate_moving_shapes
from captioning.data.synthetic.shapes import generate_shapes

__all__ = ["ensure_generated", "generate_moving_shapes", "generate_shapes", "generation_params", "read_stamp"]
