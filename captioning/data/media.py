"""Robust image loading: any readable image file -> an RGB ``PIL.Image``, or a DataError naming it.

Conversions done by ``load_image``:

- EXIF orientation is applied (``ImageOps.exif_transpose``): a photo taken in portrait comes
  back in portrait.  A broken EXIF block is ignored (the pixels are still used).
- Transparency (RGBA, LA, PA, palette or L with a transparent colour) is **composited on a white
  background** (``background=``), so transparent regions do not turn black.  (An RGB image's
  transparent colour key, a rare PNG feature, is ignored.)
- 16-bit images (PNG ``I;16`` / ``I``) are scaled to 8 bit (``v * 255 / 65535``); ``I`` images whose
  values all fit in 0..255 are taken as 8-bit.  Float images (``F``) in [0, 1] are scaled by 255,
  otherwise clipped to 0..255.
- CMYK is converted with Pillow's conversion (no ICC colour management); grayscale, bilevel and
  palette images are expanded to RGB.
- Images larger than ``max_side`` on their longest side are downscaled (aspect kept).  JPEGs are
  decoded at a reduced scale (``Image.draft``: 1/2, 1/4 or 1/8), so huge photos never get decoded
  at full size; this also lets a JPEG above Pillow's decompression-bomb limit
  (``Image.MAX_IMAGE_PIXELS``) through when its reduced size is within the limit.  Other formats
  beyond the limit are refused.
- Multi-frame files (GIF, TIFF, MPO) give their first frame.

A JPEG is decoded as ``captioning.data.jpeg.decodable_jpeg`` says every decoder decodes it (the
standard Huffman tables inserted where its stream leaves them out; refused when a quantization
table is missing), so that the GPU decoder and this one agree on what a JPEG is.

Truncated, corrupt, zero-byte and non-image files raise ``DataError`` naming the file.
Pillow's global ``ImageFile.LOAD_TRUNCATED_IMAGES`` is not changed (keep it False).

Videos: ``video_files_by_id(media_dir)`` finds a dataset's video files by id in any container
the video backends read (``VIDEO_EXTENSIONS``, matched case-insensitively); every video annotation
reader resolves its ids through it.
"""

from __future__ import annotations

import io
import logging
import math
import os
import struct
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, JpegImagePlugin

from captioning.data.jpeg import decodable_jpeg
from captioning.errors import DataError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS: frozenset[str] = frozenset({
    ".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm",
    ".pbm", ".pnm",
})
VIDEO_EXTENSIONS: frozenset[str] = frozenset({
    ".mp4", ".m4v", ".mov", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".wmv", ".flv", ".3gp", ".ts",
    ".ogv",
})

_ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, TypeError, KeyError, struct.error,
                  Image.DecompressionBombError, MemoryError)


def video_files_by_id(media_dir: str | Path) -> dict[str, list[str]]:
    """Video files directly in ``media_dir`` grouped by id: ``{"video7": ["video7.webm"], ...}``.

    A file's id is its name without the extension; any extension of ``VIDEO_EXTENSIONS`` counts, in
    any case (``clip.MP4``, ``clip.mov``).  Names are returned as they are on disk, sorted; an id
    with several files (``clip.mp4`` and ``clip.webm``) lists them all, for the caller to refuse.
    A missing or unreadable folder gives ``{}``.
    """
    found: dict[str, list[str]] = {}
    try:
        with os.scandir(media_dir) as entries:
            for entry in entries:
                stem, ext = os.path.splitext(entry.name)
                if stem and ext.lower() in VIDEO_EXTENSIONS and entry.is_file():
                    found.setdefault(stem, []).append(entry.name)
    except OSError:
        return {}
    return {stem: sorted(names) for stem, names in found.items()}


def media_kind(path: str | Path) -> str | None:
    """``"image"`` / ``"video"`` from the file extension (case-insensitive), else None."""
    ext = Path(path).suffix.lower()
    if ext in IMAGE_EXTENSIONS:
        return "image"
    if ext in VIDEO_EXTENSIONS:
        return "video"
    return None


def check_media_file(path: str | Path, what: str) -> Path:
    """Raise DataError unless ``path`` is an existing, non-empty regular file."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{what} file not found: {p} (check the dataset's media_dir and annotation paths)")
    if not p.is_file():
        raise DataError(f"{what} path {p} is not a regular file")
    if p.stat().st_size == 0:
        raise DataError(f"{what} file {p} is empty (0 bytes): re-download or remove it")
    return p


def load_image(path: str | Path, max_side: int | None = 4096,
               background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Decode ``path`` into an RGB image, EXIF-oriented, longest side <= ``max_side`` (None: no limit).

    Raises DataError naming the file for missing, empty, truncated, corrupt or non-image files
    and for non-JPEG images beyond Pillow's decompression-bomb limit.
    """
    p = check_media_file(path, "image")
    if max_side is not None and max_side < 1:
        raise ValueError(f"max_side must be >= 1 or None, got {max_side}")
    im: Image.Image | None = None
    out: Image.Image | None = None
    try:
        im = _open(p, decodable_jpeg(p.read_bytes(), p), max_side)
        im.load()
        _exif_transpose(im, p)
        out = im
        if max_side is not None and max(out.size) > max_side and out.mode not in ("1", "P", "PA"):
            try:  # shrink before the mode conversion: less memory for huge images
                out.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
            except (ValueError, OSError):  # a mode Pillow cannot resample: shrink after converting
                pass
        out = _to_rgb(out, background, p)
        if max_side is not None and max(out.size) > max_side:
            out.thumbnail((max_side, max_side), Image.Resampling.BICUBIC)
        if out is im and getattr(im, "fp", None) is not None:
            out = im.copy()  # multi-frame files keep their file open: detach before closing it
        return out
    except DataError:
        raise
    except _DECODE_ERRORS as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot decode image {p}: {msg} (truncated, corrupt or not an image file)") from e
    finally:
        if im is not None and im is not out:
            im.close()


def _open(path: Path, data: bytes, max_side: int | None) -> Image.Image:
    """Open the file ``path`` holding ``data`` lazily (header only); request a reduced JPEG decode when
    the image is larger than needed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as e:
            if max_side is None or data[:3] != b"\xff\xd8\xff":
                raise DataError(f"image {path} is too large to decode safely ({e}); downscale it, or raise "
                                f"PIL.Image.MAX_IMAGE_PIXELS if you trust the file") from e
            # The plugin class skips Image.open's size check; the reduced size is checked below.
            im = JpegImagePlugin.JpegImageFile(io.BytesIO(data))
    if max_side is not None and im.format in ("JPEG", "MPO") and max(im.size) > max_side:
        w, h = im.size
        m = max(w, h)
        im.draft(None, (max(1, math.ceil(w * max_side / m)), max(1, math.ceil(h * max_side / m))))
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and im.size[0] * im.size[1] > 2 * limit:
        size = im.size
        im.close()
        raise DataError(f"image {path} is too large to decode safely ({size[0]}x{size[1]} pixels even after "
                        f"reduction); downscale it, or raise PIL.Image.MAX_IMAGE_PIXELS if you trust the file")
    return im


def _exif_transpose(im: Image.Image, path: Path) -> None:
    """Apply the EXIF orientation in place (a malformed EXIF block is ignored)."""
    try:
        ImageOps.exif_transpose(im, in_place=True)
    except Exception as e:
        log.debug("ignoring unreadable EXIF orientation of %s: %s", path, e)


def _to_rgb(im: Image.Image, background: tuple[int, int, int], path: Path) -> Image.Image:
    """Any Pillow mode -> RGB (see the module docstring for the conventions)."""
    mode = im.mode
    if mode == "RGB":
        return im
    if mode in _SIXTEEN_BIT_MODES:
        arr = np.asarray(im).astype(np.int64)
        if mode == "I" and arr.size and arr.min() >= 0 and arr.max() <= 255:
            arr8 = arr.astype(np.uint8)
        else:
            arr8 = ((np.clip(arr, 0, 65535) * 255 + 32767) // 65535).astype(np.uint8)
        return Image.fromarray(arr8).convert("RGB")  # [H, W] uint8 -> "L"
    if mode == "F":
        arr = np.nan_to_num(np.asarray(im, dtype=np.float64))
        if arr.size and arr.min() >= 0.0 and arr.max() <= 1.0:
            arr = arr * 255.0
        return Image.fromarray(np.clip(np.rint(arr), 0, 255).astype(np.uint8)).convert("RGB")
    transparent = mode in _ALPHA_MODES or (mode in ("P", "L", "1") and "transparency" in im.info)
    if transparent:
        rgba = im.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        canvas.alpha_composite(rgba)
        return canvas.convert("RGB")
    try:
        return im.convert("RGB")
    except ValueError as e:
        raise DataError(f"image {path} has mode {mode}, which cannot be "
                        f"converted to RGB; convert it (e.g. to PNG/JPEG RGB) first") from e
