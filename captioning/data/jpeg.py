"""What a JPEG file is, read from its markers: whether a GPU decoder (nvjpeg) may decode it.

``jpeg_info(data)`` walks the markers of a JPEG stream up to its first scan (SOS) and reports the
frame (SOF) type, sample precision, size, components and their sampling factors, the Adobe
APP14 colour transform and the EXIF orientation; it never decodes pixels.  ``device_refusal``
says why a file must go to PIL instead of the GPU (None: the GPU may decode it): only baseline or
extended-sequential Huffman JPEGs of 8-bit YCbCr (3 components) or grayscale with the usual
sampling factors go to the GPU; progressive, lossless, arithmetic-coded, 12-bit, CMYK/YCCK
(4 components), RGB-coded (Adobe transform 0), EXIF-rotated, truncated (no end-of-image marker)
and oversized files are decoded by ``captioning.data.media.load_image``, which applies the
conversions and raises the one-line errors this project documents for them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["JpegInfo", "device_refusal", "jpeg_info"]

SOI, EOI, SOS = 0xD8, 0xD9, 0xDA
# Start-of-frame markers (ITU T.81 Table B.1); DHT (C4), JPG (C8) and DAC (CC) are not frames
SOF_NAMES = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive", 0xC3: "lossless",
             0xC5: "differential", 0xC6: "differential-progressive", 0xC7: "differential-lossless",
             0xC9: "arithmetic", 0xCA: "arithmetic-progressive", 0xCB: "arithmetic-lossless",
             0xCD: "differential-arithmetic", 0xCE: "differential-arithmetic-progressive",
             0xCF: "differential-arithmetic-lossless"}
_STANDALONE = {0x01, *range(0xD0, 0xD8), SOI, EOI}  # markers without a length field
_DEVICE_FRAMES = ("baseline", "extended")
_LUMA_SAMPLING = {(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)}  # 4:4:4, 4:2:2, 4:4:0, 4:2:0, 4:1:1


@dataclass(frozen=True)
class JpegInfo:
    """A JPEG's frame: ``frame`` (``SOF_NAMES``), ``precision`` (bits), ``width`` x ``height``,
    per-component ``sampling`` (h, v) factors, the Adobe ``transform`` (None: no APP14 marker),
    the EXIF ``orientation`` (None: none recorded) and whether the stream ends with EOI."""

    frame: str
    precision: int
    width: int
    height: int
    sampling: tuple[tuple[int, int], ...]
    transform: int | None
    orientation: int | None
    complete: bool


def _exif_orientation(payload: bytes) -> int | None:
    """The Orientation tag (0x0112) of IFD0 of an APP1 ``Exif\\0\\0`` payload; None when absent or unreadable."""
    tiff = payload[6:]
    if len(tiff) < 8 or tiff[:2] not in (b"II", b"MM"):
        return None
    order = "<" if tiff[:2] == b"II" else ">"
    try:
        (ifd,) = struct.unpack_from(order + "I", tiff, 4)
        (count,) = struct.unpack_from(order + "H", tiff, ifd)
        for k in range(count):
            tag, kind, _, value = struct.unpack_from(order + "HHI4s", tiff, ifd + 2 + 12 * k)
            if tag == 0x0112 and kind == 3:  # SHORT, left-justified in the value field
                return struct.unpack_from(order + "H", value)[0]
    except struct.error:
        return None
    return None


def jpeg_info(data: bytes | memoryview) -> JpegInfo | None:
    """The frame of the JPEG stream ``data`` (its markers up to the first scan); None when ``data``
    is not a JPEG stream or its markers are malformed before the frame and first scan are found."""
    data = memoryview(data)
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != SOI:
        return None
    pos, frame, transform, orientation = 2, None, None, None
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", data, pos + 2)
        payload = bytes(data[pos + 4: pos + 2 + length])
        if length < 2 or len(payload) != length - 2:
            return None
        if marker in SOF_NAMES and frame is None and len(payload) >= 6:
            precision, height, width, count = struct.unpack_from(">BHHB", payload)
            comps = payload[6: 6 + 3 * count]
            if len(comps) != 3 * count:
                return None
            frame = (SOF_NAMES[marker], precision, width, height,
                     tuple((comps[3 * c + 1] >> 4, comps[3 * c + 1] & 15) for c in range(count)))
        elif marker == 0xEE and payload[:5] == b"Adobe" and len(payload) >= 12:
            transform = payload[11]
        elif marker == 0xE1 and payload[:6] == b"Exif\0\0" and orientation is None:
            orientation = _exif_orientation(payload)
        elif marker == SOS:
            break
        pos += 2 + length
    if frame is None:
        return None
    complete = bytes(data[-2:]) == b"\xff\xd9" or bytes(data).rstrip(b"\0").endswith(b"\xff\xd9")
    return JpegInfo(*frame, transform, orientation, complete)


def device_refusal(info: JpegInfo | None, max_side: int | None = 4096) -> str | None:
    """Why a JPEG of ``info`` goes to PIL rather than the GPU decoder; None when the GPU may decode
    it (see the module docstring).  ``max_side``: ``load_image``'s limit (larger files are reduced
    while decoding, which the GPU decoder does not do)."""
    if info is None:
        return "not a JPEG stream"
    if info.frame not in _DEVICE_FRAMES:
        return f"{info.frame} JPEG"
    if info.precision != 8:
        return f"{info.precision}-bit JPEG"
    if len(info.sampling) not in (1, 3):
        return f"{len(info.sampling)} components (CMYK/YCCK)"
    if len(info.sampling) == 3 and (info.transform == 0 or info.sampling[0] not in _LUMA_SAMPLING
                                    or info.sampling[1:] != ((1, 1), (1, 1))):
        return "RGB-coded or unusually subsampled JPEG"
    if info.orientation not in (None, 1):
        return f"EXIF orientation {info.orientation}"
    if not info.complete:
        return "no end-of-image marker (truncated?)"
    if not (0 < info.width and 0 < info.height) or (max_side is not None and max(info.width, info.height) > max_side):
        return f"{info.width}x{info.height} pixels"
    return None
