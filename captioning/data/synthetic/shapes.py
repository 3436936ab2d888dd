"""Synthetic image captioning data: 1-4 coloured shapes on a textured background.

Each image gets 5 reference captions from a few phrasings that name colours, shapes, sizes,
counts and spatial relations, e.g. "a red circle to the left of a blue square",
"two green triangles", "there is a large yellow star above a small red circle",
"three shapes: a white cross, a purple star and a blue circle" (listed left to right).
The vocabulary is about 45 words and captions have at most 17 tokens.

Layout written under ``root`` (see docs/CONTRACTS.md):
``images/<id:06d>.jpg`` (JPEG q95), ``annotations/captions_{train,val,test}.json`` (COCO) and
``annotations/grounding.json`` (each object's pixel box and the words that refer to it).
Image ids start at 1.  Everything is a deterministic function of ``seed``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioning.data.synthetic.common import (
    COLOURS,
    NUMBERS,
    PALETTE,
    PLURALS,
    SHAPES,
    add_noise,
    caption_stats,
    caption_tokens,
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
MAX_TOKENS = 17
COUNT_WEIGHTS = {1: 0.2, 2: 0.35, 3: 0.25, 4: 0.2}
DUPLICATE_PROB = 0.25  # multi-object images: object 2 copies colour+shape of object 1 ("two red circles")
SPLIT_NAMES = ("train", "val", "test")

_SINGLE = ("{A}", "there is {A}", "{a}", "{a} on a noisy background", "an image with {A}", "a picture of {a}")
_SAME = ("{g}", "there are {g}", "{g} on a noisy background", "an image with {g}", "a picture of {g}")
_HORIZONTAL = (
    "{a} to the left of {b}",
    "{b} to the right of {a}",
    "there is {A} to the left of {B}",
    "{A} to the left of {B}",
    "{a} on the left and {b} on the right",
)
_VERTICAL = (
    "{a} above {b}",
    "{b} below {a}",
    "there is {A} above {B}",
    "{A} above {B}",
    "{a} at the top and {b} at the bottom",
)
_LIST = (
    "{L}",
    "{N} shapes: {L}",
    "there are {N} shapes: {L}",
    "{L} from left to right",
    "{L} on a noisy background",
    "an image with {L}",
)


@dataclass
class ShapeObject:
    colour: str
    shape: str
    size: str  # small | large
    cx: float
    cy: float
    r: float
    angle: float

    def phrase(self, with_size: bool = False) -> str:
        size = f"{self.size} " if with_size else ""
        return f"a {size}{self.colour} {self.shape}"


def _radius(size: str, rng: np.random.Generator, scale: float) -> float:
    lo, hi = (14.0, 18.0) if size == "small" else (26.0, 32.0)
    return float(rng.uniform(lo, hi)) * scale


def _angle(shape: str, rng: np.random.Generator) -> float:
    if shape in ("square", "cross"):
        return float(rng.uniform(-0.35, 0.35))
    if shape == "circle":
        return 0.0
    return float(rng.uniform(-math.pi, math.pi))


def _placement_ok(objs: list[ShapeObject], new: ShapeObject, image_size: int, distinct_pair: bool) -> bool:
    margin = 4.0 * image_size / 224.0
    for o in objs:
        # bounding squares (radius + margin) must not overlap
        if abs(o.cx - new.cx) < o.r + new.r + margin and abs(o.cy - new.cy) < o.r + new.r + margin:
            return False
    if distinct_pair and objs:
        # two different objects: one axis must clearly dominate so "left of" / "above" is unambiguous
        dx, dy = abs(new.cx - objs[0].cx), abs(new.cy - objs[0].cy)
        if max(dx, dy) < 1.6 * min(dx, dy) or max(dx, dy) < 0.2 * image_size:
            return False
    return True


def _sample_objects(rng: np.random.Generator, image_size: int) -> list[ShapeObject]:
    """1-4 non-overlapping shapes; for >= 3 objects the x centres are well separated."""
    scale = image_size / 224.0
    counts = list(COUNT_WEIGHTS)
    n = int(rng.choice(counts, p=list(COUNT_WEIGHTS.values())))
    kinds = [(str(rng.choice(COLOURS)), str(rng.choice(SHAPES))) for _ in range(n)]
    if n >= 2 and rng.random() < DUPLICATE_PROB:
        kinds[1] = kinds[0]
    distinct_pair = n == 2 and kinds[0] != kinds[1]
    sizes = [str(rng.choice(("small", "large"))) for _ in range(n)]
    for restart in range(200):
        if restart >= 100:  # crowded: fall back to small shapes
            sizes = ["small"] * n
        objs: list[ShapeObject] = []
        for (colour, shape), size in zip(kinds, sizes, strict=True):
            r = _radius(size, rng, scale)
            lo = r + 3.0 * scale
            for _ in range(60):
                cand = ShapeObject(colour, shape, size, float(rng.uniform(lo, image_size - lo)),
                                   float(rng.uniform(lo, image_size - lo)), r, _angle(shape, rng))
                if _placement_ok(objs, cand, image_size, distinct_pair) and (
                    n < 3 or all(abs(cand.cx - o.cx) >= 0.09 * image_size for o in objs)
                ):
                    objs.append(cand)
                    break
            else:
                break
        if len(objs) == n:
            return objs
    raise RuntimeError("could not place shapes; image_size too small?")  # pragma: no cover


def _groups(objs: Sequence[ShapeObject]) -> list[list[ShapeObject]]:
    """Objects grouped by (colour, shape), groups ordered by their leftmost member."""
    groups: dict[tuple[str, str], list[ShapeObject]] = {}
    for o in objs:
        groups.setdefault((o.colour, o.shape), []).append(o)
    return sorted(groups.values(), key=lambda g: min(o.cx for o in g))


def _group_phrase(g: Sequence[ShapeObject]) -> str:
    if len(g) == 1:
        return g[0].phrase()
    return f"{NUMBERS[len(g)]} {g[0].colour} {PLURALS[g[0].shape]}"


def _join(phrases: Sequence[str]) -> str:
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def caption_templates(objs: Sequence[ShapeObject]) -> list[str]:
    """All the reference phrasings that are true of this image (at most MAX_TOKENS tokens)."""
    groups = _groups(objs)
    if len(groups) == 1 and len(objs) == 1:
        o = objs[0]
        out = [t.format(A=o.phrase(True), a=o.phrase()) for t in _SINGLE]
    elif len(groups) == 1:
        out = [t.format(g=_group_phrase(objs)) for t in _SAME]
    elif len(objs) == 2:
        p, q = objs
        if abs(p.cx - q.cx) >= abs(p.cy - q.cy):
            first, second = (p, q) if p.cx < q.cx else (q, p)
            templates = _HORIZONTAL
        else:
            first, second = (p, q) if p.cy < q.cy else (q, p)
            templates = _VERTICAL
        out = [
            t.format(a=first.phrase(), b=second.phrase(), A=first.phrase(True), B=second.phrase(True))
            for t in templates
        ]
    else:
        listing = _join([_group_phrase(g) for g in groups])
        out = [t.format(L=listing, N=NUMBERS[len(objs)]) for t in _LIST]
    fitting = [c for c in out if len(caption_tokens(c)) <= MAX_TOKENS]
    return fitting or out[:1]


def _choose_captions(rng: np.random.Generator, templates: list[str], k: int) -> list[str]:
    if len(templates) >= k:
        return [templates[i] for i in rng.choice(len(templates), size=k, replace=False)]
    extra = [templates[i] for i in rng.choice(len(templates), size=k - len(templates))]
    return list(templates) + extra


def render_image(index: int, seed: int = 0, image_size: int = 224) -> tuple[np.ndarray, list[dict[str, Any]], list[str]]:
    """Render one item: (pixels uint8 [H, W, 3], objects with boxes and words, 5 captions).

    Pixels are before JPEG compression.
    """
    rng = item_rng(seed, index)
    objs = _sample_objects(rng, image_size)
    canvas = textured_background(rng, image_size, image_size)
    records = []
    for o in objs:
        mask = shape_mask(o.shape, o.cx, o.cy, o.r, o.angle, image_size, image_size)
        jitter = rng.uniform(-10.0, 10.0, size=3)
        canvas[mask] = np.asarray(PALETTE[o.colour], np.float32) + jitter
        records.append({
            "box": mask_box(mask),
            "words": [o.size, o.colour, o.shape, PLURALS[o.shape]],
            "colour": o.colour,
            "shape": o.shape,
            "size": o.size,
            "center": [round(o.cx, 2), round(o.cy, 2)],
        })
    pixels = add_noise(rng, canvas, sigma=5.0)
    captions = _choose_captions(rng, caption_templates(objs), CAPTIONS_PER_IMAGE)
    return pixels, records, captions


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
            "info": {"description": f"synthetic shapes ({name} split)", "version": "1.0", "year": 2024,
                     "contributor": "captioning.data.synthetic", "seed": seed},
            "licenses": [{"id": 1, "name": "CC0 1.0 (synthetic data)", "url": ""}],
            "images": [],
            "annotations": [],
        }
        for name in SPLIT_NAMES
    }
    grounding: dict[str, Any] = {"kind": "image", "dataset": "shapes", "items": {}}
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
