"""Where a grounded object lies among the attention positions: a ``Region`` per object or event.

Images: attention cells tile the network input (``size x size`` after "resize shorter side to
``resize`` then centre crop ``size``", or a plain squash); :class:`Geometry` maps a box from the
original image into that frame.  ``Geometry()`` (or ``None``) means the grid covers the whole
original image (identity when the image already is the network input).
Videos: positions are frames (``pooled`` features, N = K) or frame-major cells (``grid``
features, N = K*h*w; the cells of a frame are summed).
Image regions (detector boxes, ``captioning-import``): the positions are boxes in the original
image's pixels instead of cells.

A ``Region`` holds the fraction of each position inside the object (``weight``) and whether
pointing at it hits the object (``inside``); ``Region.score(alpha)`` is what
``captioning.evaluation.grounding`` measures per word.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from captioning.errors import ConfigError, DataError

# ------------------------------------------------------------------------------------ geometry


@dataclass(frozen=True)
class Geometry:
    """How an original image becomes the network input that the attention grid tiles.

    ``size``: side of the square network input (None: the grid covers the whole original image,
    whatever its size); ``resize``: shorter side before the centre crop (None: ``size``);
    ``crop``: "center" (resize shorter side then centre crop ``size x size``, like torchvision) or
    "none" (squash the whole image to ``size x size``).
    """

    size: int | None = None
    resize: int | None = None
    crop: str = "center"

    def __post_init__(self) -> None:
        if self.crop not in ("center", "none"):
            raise ConfigError(f"grounding geometry crop={self.crop!r} is not valid: use center | none")
        if self.size is not None and self.size < 1:
            raise ConfigError(f"grounding geometry size={self.size!r} must be >= 1 or None")

    @classmethod
    def from_preprocessing(cls, pre: Mapping[str, Any] | None) -> Geometry:
        """From a FeatureStore meta's ``settings["preprocessing"]`` dict ({size, resize, crop, ...})."""
        if not pre:
            return cls()
        return cls(size=int(pre["size"]), resize=None if pre.get("resize") is None else int(pre["resize"]),
                   crop=str(pre.get("crop", "center")))

    @classmethod
    def from_store_meta(cls, meta: Mapping[str, Any] | None) -> Geometry:
        """From a FeatureStore meta dict (reads ``settings.preprocessing``; identity when absent)."""
        settings = (meta or {}).get("settings") or {}
        return cls.from_preprocessing(settings.get("preprocessing"))

    def transform(self, image_size: Sequence[int]) -> tuple[float, float, float, float, float, float]:
        """(sx, sy, ox, oy, out_w, out_h): a point x of the original maps to ``x * sx - ox``.

        The network input spans ``[0, out_w) x [0, out_h)``.
        """
        w, h = float(image_size[0]), float(image_size[1])
        if w <= 0 or h <= 0:
            raise DataError(f"grounding: image size {list(image_size)} must be positive")
        if self.size is None:
            return 1.0, 1.0, 0.0, 0.0, w, h
        s = float(self.size)
        if self.crop == "none":
            return s / w, s / h, 0.0, 0.0, s, s
        resize = self.resize or self.size
        iw, ih = int(image_size[0]), int(image_size[1])
        if min(iw, ih) == resize:
            nw, nh = iw, ih
        elif iw <= ih:  # torchvision: the long side is int(resize * long / short)
            nw, nh = resize, int(resize * ih / iw)
        else:
            nw, nh = int(resize * iw / ih), resize
        left = int(round((nw - self.size) / 2.0))
        top = int(round((nh - self.size) / 2.0))
        return nw / w, nh / h, float(left), float(top), s, s


def as_geometry(geometry: Geometry | Mapping[str, Any] | None) -> Geometry:
    """A ``Geometry`` from itself, a store meta, a preprocessing dict or None (identity)."""
    if geometry is None:
        return Geometry()
    if isinstance(geometry, Geometry):
        return geometry
    if isinstance(geometry, Mapping):
        if "settings" in geometry:
            return Geometry.from_store_meta(geometry)
        return Geometry.from_preprocessing(geometry)
    raise ConfigError(f"grounding geometry must be a Geometry, a preprocessing dict or None, got {type(geometry).__name__}")


def box_in_input(image_size: Sequence[int], box: Sequence[float],
                 geometry: Geometry | None = None) -> tuple[float, float, float, float, float, float]:
    """The box [x0, y0, x1, y1) in network-input coordinates, clipped: (x0, y0, x1, y1, W_in, H_in)."""
    if len(box) != 4:
        raise DataError(f"grounding: box {list(box)} must be [x0, y0, x1, y1]")
    sx, sy, ox, oy, out_w, out_h = as_geometry(geometry).transform(image_size)
    x0, y0, x1, y1 = (float(v) for v in box)
    x0, x1 = np.clip([x0 * sx - ox, x1 * sx - ox], 0.0, out_w)
    y0, y1 = np.clip([y0 * sy - oy, y1 * sy - oy], 0.0, out_h)
    return float(x0), float(y0), float(max(x0, x1)), float(max(y0, y1)), out_w, out_h


def cell_box_overlap(grid: Sequence[int], image_size: Sequence[int], box: Sequence[float],
                     geometry: Geometry | Mapping[str, Any] | None = None) -> np.ndarray:
    """Fraction of each attention cell's area inside ``box``: float64 [h*w], row-major.

    ``grid``: (h, w) cells tiling the network input; ``image_size``: (W, H) of the original image;
    ``box``: [x0, y0, x1, y1] pixels of the original (x1/y1 exclusive); ``geometry``: the
    preprocessing (None: the grid covers the whole original image).
    """
    gh, gw = int(grid[0]), int(grid[1])
    if gh < 1 or gw < 1:
        raise DataError(f"grounding: grid {list(grid)} must be (h, w) with h, w >= 1")
    x0, y0, x1, y1, out_w, out_h = box_in_input(image_size, box, as_geometry(geometry))
    xs = np.linspace(0.0, out_w, gw + 1)
    ys = np.linspace(0.0, out_h, gh + 1)
    fx = np.clip(np.minimum(xs[1:], x1) - np.maximum(xs[:-1], x0), 0.0, None) / np.diff(xs)  # [w]
    fy = np.clip(np.minimum(ys[1:], y1) - np.maximum(ys[:-1], y0), 0.0, None) / np.diff(ys)  # [h]
    return np.outer(fy, fx).reshape(-1)


def cell_centres_in_box(grid: Sequence[int], image_size: Sequence[int], box: Sequence[float],
                        geometry: Geometry | Mapping[str, Any] | None = None) -> np.ndarray:
    """bool [h*w]: whether each cell's centre lies inside the box (half-open, input coordinates)."""
    gh, gw = int(grid[0]), int(grid[1])
    x0, y0, x1, y1, out_w, out_h = box_in_input(image_size, box, as_geometry(geometry))
    cx = (np.arange(gw) + 0.5) * out_w / gw
    cy = (np.arange(gh) + 0.5) * out_h / gh
    inside_x = (cx >= x0) & (cx < x1)
    inside_y = (cy >= y0) & (cy < y1)
    return np.outer(inside_y, inside_x).reshape(-1)


def region_box_overlap(regions: np.ndarray, box: Sequence[float]) -> np.ndarray:
    """Fraction of each region box's area inside ``box``: float64 [n]; regions [n, 4] and box
    [x0, y0, x1, y1] in the same pixels.  A region of no area counts 1 when its point is inside."""
    r = np.asarray(regions, dtype=np.float64).reshape(-1, 4)
    x0, y0, x1, y1 = (float(v) for v in box)
    w = np.clip(np.minimum(r[:, 2], x1) - np.maximum(r[:, 0], x0), 0.0, None)
    h = np.clip(np.minimum(r[:, 3], y1) - np.maximum(r[:, 1], y0), 0.0, None)
    area = (r[:, 2] - r[:, 0]) * (r[:, 3] - r[:, 1])
    point = ((r[:, 0] >= x0) & (r[:, 0] < x1) & (r[:, 1] >= y0) & (r[:, 1] < y1)).astype(np.float64)
    return np.where(area > 0, w * h / np.where(area > 0, area, 1.0), point)


def region_centres_in_box(regions: np.ndarray, box: Sequence[float]) -> np.ndarray:
    """bool [n]: whether each region box's centre lies inside ``box`` (half-open)."""
    r = np.asarray(regions, dtype=np.float64).reshape(-1, 4)
    cx, cy = (r[:, 0] + r[:, 2]) / 2, (r[:, 1] + r[:, 3]) / 2
    return (cx >= box[0]) & (cx < box[2]) & (cy >= box[1]) & (cy < box[3])


def normalised_attention(alpha: np.ndarray, valid: int | None = None) -> np.ndarray:
    """alpha over the valid positions, renormalised to sum 1 (zeros stay zeros)."""
    a = np.asarray(alpha, dtype=np.float64).reshape(-1)
    if valid is not None:
        a = a[:valid]
    a = np.where(np.isfinite(a), np.clip(a, 0.0, None), 0.0)
    total = a.sum()
    return a / total if total > 0 else a


# -------------------------------------------------------------------------------------- video


def frames_in_span(frame_indices: Sequence[int], span: Sequence[int]) -> np.ndarray:
    """bool [K]: whether each sampled frame's source index lies in ``[f0, f1)``."""
    f0, f1 = int(span[0]), int(span[1])
    idx = np.asarray(list(frame_indices), dtype=np.int64)
    return (idx >= f0) & (idx < f1)


def frame_attention(alpha: np.ndarray, num_frames: int, valid_frames: int | None = None) -> np.ndarray:
    """Per-frame attention [K_valid] from alpha [K] (pooled) or [K*h*w] (frame-major grid), renormalised."""
    a = np.asarray(alpha, dtype=np.float64).reshape(-1)
    k = int(num_frames)
    if k < 1 or a.size % k:
        raise DataError(f"grounding: attention has {a.size} positions, not a multiple of the {k} sampled frames")
    per_frame = a.reshape(k, -1).sum(axis=1) if a.size != k else a
    return normalised_attention(per_frame, valid_frames)


@dataclass
class Region:
    """Where one object lies among the valid positions: ``weight`` [N_valid], the fraction of each
    position inside it, and ``inside`` [N_valid], whether pointing at that position hits it.
    ``frames``: for videos, the K sampled frames (attention over K*h*w grid positions is summed
    per frame).  ``score(alpha)``: the attention mass inside and whether the argmax hits."""

    weight: np.ndarray
    inside: np.ndarray
    frames: int | None = None

    @classmethod
    def of_box(cls, grid: Sequence[int], image_size: Sequence[int], box: Sequence[float],
               geometry: Geometry | Mapping[str, Any] | None = None) -> Region:
        """An image object's box on the feature grid (after the extractor's resize and crop)."""
        return cls(cell_box_overlap(grid, image_size, box, geometry), cell_centres_in_box(grid, image_size, box, geometry))

    @classmethod
    def of_span(cls, frame_indices: Sequence[int], span: Sequence[int], valid_frames: int | None = None) -> Region:
        """A video event's frame span ``[f0, f1)`` among the valid sampled frames."""
        k_valid = len(frame_indices) if valid_frames is None else int(valid_frames)
        inside = frames_in_span(frame_indices, span)[:k_valid]
        return cls(inside.astype(np.float64), inside, frames=len(frame_indices))

    @property
    def chance_mass(self) -> float:
        return float(self.weight.mean())

    @property
    def chance_hit(self) -> float:
        return float(self.inside.mean())

    def score(self, alpha: np.ndarray) -> tuple[float, bool]:
        """(attention mass in the object, argmax hit) of alpha [N] (renormalised over the valid positions)."""
        n = self.weight.size
        a = frame_attention(alpha, self.frames, n) if self.frames is not None else normalised_attention(alpha, n)
        if a.size != n:
            raise DataError(f"grounding: attention has {a.size} valid positions but the object's region has {n}")
        return float((a * self.weight).sum()), bool(self.inside[int(np.argmax(a))]) if n else False


def grid_regions(entry: Mapping[str, Any], objects: Sequence[Mapping[str, Any]], grid: Sequence[int],
                   geom: Geometry, positions: int, valid: int | None, key: str) -> list[Region | None]:
    """Each object of one image item on the ``grid`` cells (None where it was cropped away)."""
    size = entry.get("size")
    if not size or len(size) != 2:
        raise DataError(f"grounding file: item {key} has no 'size': [W, H]; regenerate the dataset")
    cells = int(grid[0]) * int(grid[1])
    if positions != cells:
        raise DataError(f"grounding: item {key}: attention has {positions} positions but the grid "
                        f"{list(grid)} has {cells} cells")
    if valid is not None and valid != cells:
        raise DataError(f"grounding: item {key}: valid={valid} but an image has {cells} cells")
    regions = [Region.of_box(grid, size, o["box"], geom) for o in objects]
    return [r if r.weight.sum() > 0 else None for r in regions]


def box_regions(entry: Mapping[str, Any], objects: Sequence[Mapping[str, Any]], boxes: Any,
                 boxes_size: Sequence[int] | None, key: str) -> list[Region | None]:
    """Each object among the valid region boxes (moved from ``boxes_size`` to the file's image size)."""
    size = entry.get("size")
    if not size or len(size) != 2:
        raise DataError(f"grounding file: item {key} has no 'size': [W, H]; regenerate the dataset")
    if boxes is None:
        raise DataError(f"grounding: item {key} has no region boxes")
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if boxes_size is not None:
        sx, sy = float(size[0]) / float(boxes_size[0]), float(size[1]) / float(boxes_size[1])
        b = b * np.array([sx, sy, sx, sy])
    out: list[Region | None] = []
    for o in objects:
        weight = region_box_overlap(b, o["box"])
        out.append(Region(weight, region_centres_in_box(b, o["box"])) if weight.sum() > 0 else None)
    return out


def video_regions(events: Sequence[Mapping[str, Any]], frames: Sequence[int] | None, positions: int,
                   valid: int | None, grid: Sequence[int] | None, key: str) -> list[Region | None]:
    """Each event of one video among its valid sampled frames (None where no sampled frame shows it)."""
    if not frames:
        raise DataError(f"grounding: video {key} has no frame_indices; pass the sampled frames of every video")
    k = len(frames)
    cells = positions // k if positions % k == 0 else 0
    if cells < 1 or (cells > 1 and grid is not None and cells != int(grid[0]) * int(grid[1])):
        raise DataError(f"grounding: video {key}: attention has {positions} positions, which is neither "
                        f"the {k} sampled frames nor {k} frames x grid cells")
    k_valid = k if valid is None else max(0, min(k, int(valid) // cells))
    if k_valid < 1:
        return [None] * len(events)
    regions = [Region.of_span(frames, e["span"], k_valid) for e in events]
    return [r if r.inside.any() else None for r in regions]


@dataclass(frozen=True)
class AttentionPositions:
    """What the N attention positions of every item are: cells of ``grid`` (images, after
    ``geometry``), region ``boxes`` (image regions, in ``image_sizes``), or the sampled
    ``frame_indices`` (videos, frames or frame-major cells); ``valid``: key -> N_valid."""

    kind: str
    grid: Sequence[int] | None
    geometry: Geometry
    boxes: Mapping[Any, Any] | None
    image_sizes: Mapping[Any, Sequence[int]]
    frame_indices: Mapping[str, list[int]]
    valid: Mapping[str, int]

    def regions(self, raw_key: Any, entry: Mapping[str, Any], objects: Sequence[Mapping[str, Any]],
                positions: int) -> list[Region | None]:
        """Each object/event of one item among its ``positions`` attention positions (None where
        it is unobservable)."""
        key = str(raw_key)
        if self.kind == "image" and self.boxes is not None:
            return box_regions(entry, objects, self.boxes.get(raw_key, self.boxes.get(key)),
                                self.image_sizes.get(raw_key, self.image_sizes.get(key)), key)
        if self.kind == "image":
            return grid_regions(entry, objects, self.grid, self.geometry, positions, self.valid.get(key), key)
        return video_regions(objects, self.frame_indices.get(key), positions, self.valid.get(key), self.grid, key)
