"""Synthetic image captioning data where attention matters: 2-6 coloured shapes, listed left to right.

    "a red circle, a blue square and a red square"
    "from left to right: a white star, a red star, a white cross and a red circle"
    "a green triangle to the left of a green circle"

Design choices (documented for the experiments that use this data):

* Binding matters.  Within an image every object has a distinct (colour, shape) pair, but
  colours and shapes are SHARED across objects in other pairings: an image with n >= 3
  objects draws its pairs from k_c x k_s colours x shapes with 2 <= k_c, k_s <= n - 1 (and
  every chosen colour and shape used), so some colour and some shape occur more than once
  (a red circle, a blue square, a red square).  Two-object images draw 2 of the 4 pairs of
  2 colours x 2 shapes (2 of the 6 choices share neither word, so the bag of words leaves
  the binding open).  The bag of colours and the bag of shapes therefore do not fix the
  caption: which colour goes with which shape, and in which order, has to be read off the
  image where the objects are.
* Order matters.  Captions list the objects left to right; object centres lie at least one
  layout cell apart in x, so the order is unambiguous.
* Length varies: 2-6 objects (uniform), captions of 7-23 tokens (3 tokens per object).
* Layout grid.  Centres lie on the half-cell lattice of a 7 x 7 grid over the image, which at
  224 px is the 7 x 7 feature grid of EfficientNet-Lite0 (32-px cells): on cell centres, cell
  edges or cell corners, within [1, 6] cells of the top-left corner.  Objects are 1.5-1.8
  cells wide (radius 0.75-0.9 cell), so an object's box contains the 1, 2 or 4 cell centres
  within half a cell of its own centre: the pointing chance (share of cells whose centre is in
  the box) is about 2.25 / 49 = 0.046.  Boxes are separated by >= 1/4 cell.
* Vocabulary: 6 colours, 5 shapes, number words two-six and 14 function words (30 words).

Layout written under ``root`` (see docs/CONTRACTS.md):
``images/<id:06d>.jpg`` (JPEG q95), ``annotations/captions_{train,val,test}.json`` (COCO) and
``annotations/grounding.json``: per image each object's pixel box, colour, shape, centre and
left-to-right rank (0 = leftmost) and the words that refer to it; top-level ``word_classes``
(the words the grounding and structure metrics score).  Image ids start at 1.  Everything is a
deterministic function of ``seed``; an image's layout (:func:`image_layout`) can be drawn
without rendering it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.data.synthetic.common import (
    COLOURS,
    PALETTE,
    SHAPES,
    add_noise,
    caption_stats,
    item_rng,
    mask_box,
    parallel_map,
    shape_mask,
    split_sizes,
    textured_background,
)
from captioning.utils.io import atomic_write_json

DEFAULT_NUM_IMAGES = 3000
CAPTIONS_PER_IMAGE = 5
GRID = 7  # layout grid: the 7x7 feature grid of a 224-px input at stride 32
MIN_OBJECTS, MAX_OBJECTS = 2, 6
RADIUS_CELLS = (0.75, 0.9)  # object radius, in layout cells
GAP_CELLS = 0.25  # minimum gap between the bounding squares of two objects
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
SPLIT_NAMES = ("train", "val", "test")
WORD_CLASSES = {"colour": list(COLOURS), "shape": list(SHAPES)}

# {L}: the objects left to right, "a red circle, a blue square and a red square"
_LIST = (
    "{L}",
    "from left to right: {L}",
    "{L}, from left to right",
    "there is {L}",
    "{N} shapes: {L}",
    "an image of {L}",
)
_PAIR = (  # two objects, {a} left of {b}
    "{a} to the left of {b}",
    "{a} on the left and {b} on the right",
)


@dataclass(frozen=True)
class ShapeObject:
    """One object of an image: its words and its geometry in pixels."""

    colour: str
    shape: str
    cx: float
    cy: float
    r: float
    angle: float

    def phrase(self) -> str:
        return f"a {self.colour} {self.shape}"


def sample_pairs(rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
    """n distinct (colour, shape) pairs whose colours and shapes are shared across objects.

    n >= 3: k_c colours x k_s shapes with 2 <= k_c, k_s <= n - 1 and k_c * k_s >= n, every
    chosen colour and shape used at least once.  n == 2: 2 of the 4 pairs of 2 x 2.  n == 1: any.
    """
    if n == 1:
        return [(str(rng.choice(COLOURS)), str(rng.choice(SHAPES)))]
    hi = max(2, n - 1)
    while True:
        k_c, k_s = int(rng.integers(2, min(hi, len(COLOURS)) + 1)), int(rng.integers(2, min(hi, len(SHAPES)) + 1))
        if k_c * k_s >= n:
            break
    colours = [str(c) for c in rng.choice(COLOURS, size=k_c, replace=False)]
    shapes = [str(s) for s in rng.choice(SHAPES, size=k_s, replace=False)]
    grid = list(itertools.product(colours, shapes))
    while True:
        pairs = [grid[i] for i in rng.choice(len(grid), size=n, replace=False)]
        if n == 2 or ({c for c, _ in pairs} == set(colours) and {s for _, s in pairs} == set(shapes)):
            return pairs


def _angle(shape: str, rng: np.random.Generator) -> float:
    """Small rotations only, so that every shape stays inside its bounding square (half-side ~r)."""
    limit = {"circle": 0.0, "square": 0.2, "cross": 0.1, "triangle": 0.15, "star": math.pi / 5}[shape]
    return float(rng.uniform(-limit, limit)) if limit else 0.0


def sample_layout(rng: np.random.Generator, image_size: int = 224) -> list[ShapeObject]:
    """2-6 non-overlapping objects on the half-cell lattice, sorted left to right.

    x centres are distinct lattice points at least one cell apart (drawn uniformly among all
    such sets); y centres are drawn per object, left to right, among the lattice points where
    its bounding square keeps a gap of ``GAP_CELLS`` to every earlier object.
    """
    cell = image_size / GRID
    n = int(rng.integers(MIN_OBJECTS, MAX_OBJECTS + 1))
    pairs = sample_pairs(rng, n)
    lattice = np.arange(2, 2 * GRID - 1)  # half-cell units: 1 to 6 cells
    for _ in range(1000):
        # n points of `lattice` at least 2 apart: choose n of len - (n - 1) slots, spread by i
        slots = np.sort(rng.choice(len(lattice) - (n - 1), size=n, replace=False))
        xs = lattice[slots + np.arange(n)]
        radii = rng.uniform(*RADIUS_CELLS, size=n) * cell
        objs: list[ShapeObject] = []
        for (colour, shape), hx, r in zip(pairs, xs, radii, strict=True):
            cx = float(hx) * cell / 2
            free = [
                hy for hy in lattice
                if all(abs(cx - o.cx) >= r + o.r + GAP_CELLS * cell or
                       abs(hy * cell / 2 - o.cy) >= r + o.r + GAP_CELLS * cell for o in objs)
            ]
            if not free:
                break
            cy = float(rng.choice(free)) * cell / 2
            objs.append(ShapeObject(colour, shape, cx, cy, float(r), _angle(shape, rng)))
        if len(objs) == n:
            # the pairs were drawn in random order, so their left-to-right order is random too
            return objs
    raise RuntimeError("could not place the shapes")  # pragma: no cover


def image_layout(index: int, seed: int = 0, image_size: int = 224) -> list[ShapeObject]:
    """The objects of image ``index`` (left to right), without rendering it."""
    return sample_layout(item_rng(seed, index, stream=1), image_size)


def _join(phrases: Sequence[str]) -> str:
    return ", ".join(phrases[:-1]) + " and " + phrases[-1] if len(phrases) > 1 else phrases[0]


def caption_templates(objs: Sequence[ShapeObject]) -> list[str]:
    """All reference phrasings of a left-to-right list of objects (each names every object, in order)."""
    listing = _join([o.phrase() for o in objs])
    out = [t.format(L=listing, N=NUMBER_WORDS.get(len(objs), str(len(objs)))) for t in _LIST]
    if len(objs) == 2:
        out += [t.format(a=objs[0].phrase(), b=objs[1].phrase()) for t in _PAIR]
    return out


def render_image(index: int, seed: int = 0, image_size: int = 224) -> tuple[np.ndarray, list[dict[str, Any]], list[str]]:
    """Render one item: (pixels uint8 [H, W, 3], objects left to right, 5 captions).

    Objects: ``box`` [x0, y0, x1, y1] (tight, x1/y1 exclusive), ``words``, ``colour``,
    ``shape``, ``center`` [cx, cy] and ``rank`` (0 = leftmost).  Pixels are before JPEG
    compression.
    """
    objs = image_layout(index, seed, image_size)
    rng = item_rng(seed, index, stream=2)
    canvas = textured_background(rng, image_size, image_size)
    records = []
    for rank, o in enumerate(objs):
        mask = shape_mask(o.shape, o.cx, o.cy, o.r, o.angle, image_size, image_size)
        canvas[mask] = np.asarray(PALETTE[o.colour], np.float32) + rng.uniform(-10.0, 10.0, size=3)
        records.append({
            "box": mask_box(mask),
            "words": [o.colour, o.shape],
            "colour": o.colour,
            "shape": o.shape,
            "center": [round(o.cx, 2), round(o.cy, 2)],
            "rank": rank,
        })
    pixels = add_noise(rng, canvas, sigma=5.0)
    templates = caption_templates(objs)
    pick = item_rng(seed, index, stream=3).choice(len(templates), size=CAPTIONS_PER_IMAGE, replace=False)
    return pixels, records, [templates[i] for i in pick]


def _write_image(task: tuple) -> tuple[list[dict[str, Any]], list[str]]:
    folder, index, seed, image_size = task
    pixels, objects, captions = render_image(index, seed, image_size)
    Image.fromarray(pixels).save(Path(folder) / f"{index + 1:06d}.jpg", format="JPEG", quality=95)
    return objects, captions


def generate_shapes(
    root: str | Path,
    num_images: int = DEFAULT_NUM_IMAGES,
    seed: int = 0,
    image_size: int = 224,
    splits: Sequence[float] = (0.8, 0.1, 0.1),
    workers: int | None = None,
) -> dict[str, Any]:
    """Write the shapes dataset under ``root``; returns a summary (counts, vocabulary, lengths).

    Image ``i`` (id ``i + 1``) depends only on (seed, i); ids are assigned to train/val/test
    in order of the split fractions; ``workers`` (processes; None: up to 4 CPUs) does not
    change the output.
    """
    root = Path(root)
    n_train, n_val, n_test = split_sizes(num_images, splits)
    (root / "images").mkdir(parents=True, exist_ok=True)
    coco: dict[str, dict[str, Any]] = {
        name: {
            "info": {"description": f"synthetic shapes ({name} split)", "version": "2.0", "year": 2024,
                     "contributor": "captioning.data.synthetic", "seed": seed},
            "licenses": [{"id": 1, "name": "CC0 1.0 (synthetic data)", "url": ""}],
            "images": [],
            "annotations": [],
        }
        for name in SPLIT_NAMES
    }
    grounding: dict[str, Any] = {"kind": "image", "dataset": "shapes", "word_classes": WORD_CLASSES,
                                 "items": {}}
    all_captions: list[str] = []
    objects_per_image: dict[str, int] = {}
    ann_id = 1
    tasks = [(str(root / "images"), i, seed, image_size) for i in range(num_images)]
    for i, (objects, captions) in enumerate(parallel_map(_write_image, tasks, workers)):
        image_id = i + 1
        file_name = f"{image_id:06d}.jpg"
        split = SPLIT_NAMES[0] if i < n_train else SPLIT_NAMES[1] if i < n_train + n_val else SPLIT_NAMES[2]
        coco[split]["images"].append({"id": image_id, "file_name": file_name, "width": image_size,
                                      "height": image_size, "license": 1})
        for c in captions:
            coco[split]["annotations"].append({"id": ann_id, "image_id": image_id, "caption": c})
            ann_id += 1
        grounding["items"][str(image_id)] = {"size": [image_size, image_size], "file_name": file_name,
                                             "objects": objects}
        all_captions.extend(captions)
        key = str(len(objects))
        objects_per_image[key] = objects_per_image.get(key, 0) + 1
    for name in SPLIT_NAMES:
        atomic_write_json(root / "annotations" / f"captions_{name}.json", coco[name])
    atomic_write_json(root / "annotations" / "grounding.json", grounding)
    return {
        "dataset": "shapes",
        "root": str(root),
        "num_images": num_images,
        "seed": seed,
        "image_size": image_size,
        "splits": {"train": n_train, "val": n_val, "test": n_test},
        "objects_per_image": dict(sorted(objects_per_image.items())),
        **caption_stats(all_captions),
    }
