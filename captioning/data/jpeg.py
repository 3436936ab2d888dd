"""What a JPEG file is, read from its markers: whether any decoder may decode it, with which tables,
and whether a GPU decoder (nvjpeg) may.

``jpeg_info(data)`` walks the markers of a JPEG stream up to its first scan (SOS) and reports the
frame (SOF) type, sample precision, size, components and their sampling factors and quantization
tables, the tables defined before the scan, the first scan's components and spectral selection,
the Adobe APP14 colour transform and the EXIF orientation; it never decodes pixels.

**One rule for every decoder** (``jpeg_refusal``, ``decodable_jpeg``), decided before any decoder
runs, so that a file is a feature on every machine or a failure on every machine: the first scan's
quantization tables must be defined (no decoder can make pixels without them: libjpeg refuses such a
file, nvjpeg decodes it into garbage); a Huffman table the scan needs and no DHT segment defines is
the standard table of ITU T.81 Annex K.3 when it is one of the four (DC/AC, tables 0 and 1): motion-
JPEG frames leave them out, libjpeg-turbo >= 1.4 inserts them and older libjpeg refuses such a file,
so ``decodable_jpeg`` inserts them into the stream every decoder then gets.

``device_refusal`` says why a file must go to PIL instead of the GPU (None: the GPU may decode it):
only baseline or extended-sequential Huffman JPEGs of 8-bit YCbCr (3 components) or grayscale with
the usual sampling factors go to the GPU; progressive, lossless, arithmetic-coded, 12-bit, CMYK/YCCK
(4 components), RGB-coded (Adobe transform 0), EXIF-rotated, truncated (no end-of-image marker)
and oversized files are decoded by ``captioning.data.media.load_image``, which applies the
conversions and raises the one-line errors this project documents for them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from captioning.errors import DataError

__all__ = ["STANDARD_HUFFMAN_TABLES", "JpegInfo", "decodable_jpeg", "device_refusal", "jpeg_info", "jpeg_refusal",
           "missing_huffman_tables"]

SOI, EOI, SOS, DQT, DHT = 0xD8, 0xD9, 0xDA, 0xDB, 0xC4
# Start-of-frame markers (ITU T.81 Table B.1); DHT (C4), JPG (C8) and DAC (CC) are not frames
SOF_NAMES = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive", 0xC3: "lossless",
             0xC5: "differential", 0xC6: "differential-progressive", 0xC7: "differential-lossless",
             0xC9: "arithmetic", 0xCA: "arithmetic-progressive", 0xCB: "arithmetic-lossless",
             0xCD: "differential-arithmetic", 0xCE: "differential-arithmetic-progressive",
             0xCF: "differential-arithmetic-lossless"}
_STANDALONE = {0x01, *range(0xD0, 0xD8), SOI, EOI}  # markers without a length field
_DEVICE_FRAMES = ("baseline", "extended")
_HUFFMAN_FRAMES = ("baseline", "extended", "progressive", "lossless", "differential",
                   "differential-progressive", "differential-lossless")

#: ITU T.81 Annex K.3 (tables K.3-K.6): (class 0 DC | 1 AC, table id) -> (the 16 code-length counts,
#: the symbols), the tables libjpeg writes by default and libjpeg-turbo decodes a scan with when its
#: stream defines none (jstdhuff.c)
STANDARD_HUFFMAN_TABLES: dict[tuple[int, int], tuple[bytes, bytes]] = {
    (0, 0): (bytes([0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]), bytes(range(12))),
    (0, 1): (bytes([0, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]), bytes(range(12))),
    (1, 0): (bytes([0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 125]), bytes.fromhex(
        "01020300041105122131410613516107227114328191a1082342b1c11552d1f02433627282090a161718191a25262728292a34"
        "35363738393a434445464748494a535455565758595a636465666768696a737475767778797a838485868788898a9293949596"
        "9798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae1e2e3e4e5e6e7e8e9eaf1"
        "f2f3f4f5f6f7f8f9fa")),
    (1, 1): (bytes([0, 2, 1, 2, 4, 4, 3, 4, 7, 5, 4, 4, 0, 1, 2, 119]), bytes.fromhex(
        "000102031104052131061241510761711322328108144291a1b1c109233352f0156272d10a162434e125f11718191a26272829"
        "2a35363738393a434445464748494a535455565758595a636465666768696a737475767778797a82838485868788898a929394"
        "95969798999aa2a3a4a5a6a7a8a9aab2b3b4b5b6b7b8b9bac2c3c4c5c6c7c8c9cad2d3d4d5d6d7d8d9dae2e3e4e5e6e7e8e9ea"
        "f2f3f4f5f6f7f8f9fa")),
}
_LUMA_SAMPLING = {(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)}  # 4:4:4, 4:2:2, 4:4:0, 4:2:0, 4:1:1


@dataclass(frozen=True)
class JpegInfo:
    """A JPEG's frame: ``frame`` (``SOF_NAMES``), ``precision`` (bits), ``width`` x ``height``,
    per-component ``sampling`` (h, v) factors, the Adobe ``transform`` (None: no APP14 marker),
    the EXIF ``orientation`` (None: none recorded) and whether the stream ends with EOI.  Its
    tables: per frame component the quantization table it uses (``quant_ids``), the quantization
    tables (``quant_tables``) and Huffman tables ((class 0 DC | 1 AC, id): ``huffman_tables``)
    defined before the first scan; the first scan (at byte ``scan_offset``): per component its
    position in the frame and its DC and AC tables (``scan``), and its ``spectral`` (Ss, Se, Ah)."""

    frame: str
    precision: int
    width: int
    height: int
    sampling: tuple[tuple[int, int], ...]
    transform: int | None
    orientation: int | None
    complete: bool
    quant_ids: tuple[int, ...] = ()
    quant_tables: frozenset[int] = frozenset()
    huffman_tables: frozenset[tuple[int, int]] = frozenset()
    scan: tuple[tuple[int, int, int], ...] = ()
    spectral: tuple[int, int, int] = (0, 63, 0)
    scan_offset: int = 0


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


def _table_ids(payload: bytes, marker: int) -> list[tuple[int, int]] | None:
    """The tables a DQT (ids as (0, id)) or DHT ((class, id)) segment defines; None when malformed."""
    out, pos = [], 0
    while pos < len(payload):
        kind, ident = payload[pos] >> 4, payload[pos] & 15
        if marker == DQT:
            size = 1 + 64 * (2 if kind else 1)  # 8- or 16-bit entries
            out.append((0, ident))
        else:
            size = 17 + sum(payload[pos + 1: pos + 17])
            out.append((kind, ident))
        if pos + size > len(payload):
            return None
        pos += size
    return out


def _scan(payload: bytes, ids: tuple[int, ...]) -> tuple[tuple[tuple[int, int, int], ...], tuple[int, int, int]] | None:
    """An SOS segment: per component (position in the frame's ``ids``, DC id, AC id), and (Ss, Se, Ah)."""
    count = payload[0] if payload else 0
    if len(payload) < 1 + 2 * count + 3:
        return None
    comps = []
    for k in range(count):
        cid, tables = payload[1 + 2 * k], payload[2 + 2 * k]
        comps.append((ids.index(cid) if cid in ids else -1, tables >> 4, tables & 15))
    ss, se, a = payload[1 + 2 * count: 4 + 2 * count]
    return tuple(comps), (ss, se, a >> 4)


def jpeg_info(data: bytes | memoryview) -> JpegInfo | None:
    """The frame of the JPEG stream ``data`` (its markers up to the first scan); None when ``data``
    is not a JPEG stream or its markers are malformed before the frame and first scan are found."""
    data = memoryview(data)
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != SOI:
        return None
    pos, frame, transform, orientation, ids = 2, None, None, None, ()
    tables: dict[int, set] = {DQT: set(), DHT: set()}
    scan = None
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
            ids = tuple(comps[3 * c] for c in range(count))
            frame = (SOF_NAMES[marker], precision, width, height,
                     tuple((comps[3 * c + 1] >> 4, comps[3 * c + 1] & 15) for c in range(count)),
                     tuple(comps[3 * c + 2] for c in range(count)))
        elif marker in tables:
            defined = _table_ids(payload, marker)
            if defined is None:
                return None
            tables[marker].update(t if marker == DHT else t[1] for t in defined)
        elif marker == 0xEE and payload[:5] == b"Adobe" and len(payload) >= 12:
            transform = payload[11]
        elif marker == 0xE1 and payload[:6] == b"Exif\0\0" and orientation is None:
            orientation = _exif_orientation(payload)
        elif marker == SOS:
            scan = _scan(payload, ids)
            break
        pos += 2 + length
    if frame is None or scan is None:
        return None
    complete = bytes(data[-2:]) == b"\xff\xd9" or bytes(data).rstrip(b"\0").endswith(b"\xff\xd9")
    return JpegInfo(*frame[:5], transform, orientation, complete, quant_ids=frame[5],
                    quant_tables=frozenset(tables[DQT]), huffman_tables=frozenset(tables[DHT]), scan=scan[0],
                    spectral=scan[1], scan_offset=pos)


def missing_huffman_tables(info: JpegInfo) -> list[tuple[int, int]]:
    """The Huffman tables ((class 0 DC | 1 AC, id)) the first scan decodes with and no DHT segment
    before it defines (none for arithmetic-coded frames)."""
    if info.frame not in _HUFFMAN_FRAMES:
        return []
    ss, _, ah = info.spectral
    sequential = "progressive" not in info.frame
    lossless = "lossless" in info.frame
    need = set()
    for _, dc, ac in info.scan:
        if lossless or (sequential or (ss == 0 and ah == 0)):
            need.add((0, dc))
        if not lossless and (sequential or ss > 0):
            need.add((1, ac))
    return sorted(need - info.huffman_tables)


def jpeg_refusal(info: JpegInfo) -> str | None:
    """Why no decoder may decode the JPEG stream of ``info`` (None: every decoder may, with the tables
    ``decodable_jpeg`` gives it): a quantization table or a non-standard Huffman table its first scan
    needs is defined nowhere."""
    scanned = [info.quant_ids[k] for k, _, _ in info.scan if 0 <= k < len(info.quant_ids)]
    if len(scanned) != len(info.scan):
        return "its scan names a component its frame does not have"
    undefined = sorted(set(scanned) - info.quant_tables)
    if undefined:
        return f"no quantization table {', '.join(map(str, undefined))} (no DQT segment defines it)"
    odd = [t for t in missing_huffman_tables(info) if t not in STANDARD_HUFFMAN_TABLES]
    if odd:
        names = ", ".join(f"{('DC', 'AC')[c]} {i}" for c, i in odd)
        return f"no Huffman table {names} (no DHT segment defines it)"
    return None


def decodable_jpeg(data: bytes, path: object) -> bytes:
    """The bytes every decoder gets for the file ``path`` holding ``data``: unchanged, or with the
    standard Huffman tables its first scan needs (Annex K.3) inserted before the scan; a DataError
    naming the file when no decoder may decode it (``jpeg_refusal``).  Not a JPEG stream: unchanged."""
    info = jpeg_info(data)
    if info is None:
        return data
    why = jpeg_refusal(info)
    if why is not None:
        raise DataError(f"cannot decode image {path}: a JPEG with {why}: re-encode it or remove it")
    missing = missing_huffman_tables(info)
    if not missing:
        return data
    body = b"".join(bytes([c << 4 | i]) + STANDARD_HUFFMAN_TABLES[c, i][0] + STANDARD_HUFFMAN_TABLES[c, i][1]
                    for c, i in missing)
    segment = bytes([0xFF, DHT]) + (len(body) + 2).to_bytes(2, "big") + body
    return bytes(data[: info.scan_offset]) + segment + bytes(data[info.scan_offset:])


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
