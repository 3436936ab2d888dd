"""JPEGs decoded on the device (captioning.data.jpeg, captioning.features.device_decode, decode_ahead):
one rule for what a JPEG is, which files go to the GPU decoder, the fallback to PIL with today's
one-line errors, the batch put back in item order, decoding ahead on a thread, and the extraction
job through it.  On a CPU the device decoder is the libraries' libjpeg-turbo decode (the same
dispatch, merge, fallback and thread code); the tests marked ``gpu`` run nvJPEG.

The bounds (mean absolute difference from PIL's pixels, levels of 255):

- 4:4:4 and grayscale: ``TOLERANCE`` = 2, torchvision's criterion for its GPU decoder: the two
  inverse DCTs and colour conversions round differently.  4:2:2 (measured under it on an H200).
- 4:2:0: ``TOLERANCE + upsampling_gap(file)``.  nvJPEG (``NVJPEG_FLAGS_DEFAULT``, as torchvision and
  torchcodec create it) replicates each chroma sample over its 2x2 pixels (a box filter);
  libjpeg-turbo interpolates ("fancy upsampling", a triangle filter): an output chroma sample is
  (9 c + 3 c_h + 3 c_v + c_d) / 16 of the nearest stored sample c and its neighbours across, along
  and diagonally, so the two differ there by (3 (c_h - c) + 3 (c_v - c) + (c_d - c)) / 16 and the
  RGB pixels by that times the JFIF conversion's factors (R: 1.402 Cr, G: 0.344 Cb + 0.714 Cr, B:
  1.772 Cb).  ``upsampling_gap`` computes the mean of that over the file's own stored chroma (read
  with libjpeg's 1/2-scale decode, which yields the 4:2:0 chroma planes unscaled); the triangle
  arithmetic is checked on the CPU to reproduce libjpeg-turbo's chroma exactly.  For the 4:2:0 test
  image it is 2.99, the H200's measured nvJPEG-vs-PIL difference (2.99 against the old bound of 2).
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.data.jpeg import device_refusal, jpeg_info, jpeg_refusal, missing_huffman_tables
from captioning.features import device_decode
from captioning.features import extract as extract_module
from captioning.features.backbones import EncoderConfig, Preprocessing, build_backbone
from captioning.features.decode_ahead import DecodeAhead, wait_for
from captioning.features.device_decode import (
    JPEG_LIBRARIES,
    decode_jpegs,
    decode_on_device,
    resize_all,
    resolve_jpeg_decoder,
)
from captioning.features.media_dataset import MediaDataset, MediaItem, collate_media
from captioning.store.feature_store import FeatureStore

TOLERANCE = 2.0  # mean absolute difference, levels of 255 (see the module docstring)
PRE = Preprocessing(size=32, resize=36, crop="center", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)")


def gpu_library() -> str:
    """The library the job decodes with on this GPU (torchcodec where it works there, else torchvision)."""
    return resolve_jpeg_decoder("nvjpeg", "image", "gpu")


def _photo(seed: int, h: int = 60, w: int = 80) -> Image.Image:
    """A photo-like RGB image: smooth colour fields and noise (compresses like a photograph)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([np.sin(xx * rng.uniform(0.05, 0.2) + c) * np.cos(yy * rng.uniform(0.05, 0.2)) for c in range(3)], -1)
    return Image.fromarray((base * 90 + 128 + rng.normal(0, 8, (h, w, 3))).clip(0, 255).astype(np.uint8))


def _jpeg(image: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def _without(data: bytes, marker: int) -> bytes:
    """``data`` with every segment of ``marker`` before its first scan cut out (0xDB: the quantization
    tables, 0xC4: the Huffman tables): its other markers look fine."""
    out, pos = bytearray(data[:2]), 2
    while data[pos + 1] != 0xDA:  # up to the first scan
        length = int.from_bytes(data[pos + 2: pos + 4], "big")
        if data[pos + 1] != marker:
            out += data[pos: pos + 2 + length]
        pos += 2 + length
    return bytes(out + data[pos:])


def _scan_tables(data: bytes, selector: int) -> bytes:
    """``data`` whose first scan decodes its second component with Huffman tables ``selector`` (DC << 4 | AC)."""
    pos = data.index(b"\xff\xda")
    out = bytearray(data)
    out[pos + 5 + 2 * 1 + 1] = selector  # SOS: length(2), count(1), then (id, tables) per component
    return bytes(out)


def files(folder: Path) -> dict[str, Path]:
    """JPEGs of each kind the rule and the dispatch tell apart, and a PNG."""
    folder.mkdir(parents=True, exist_ok=True)
    photo = _photo(0)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: PIL applies it
    made = {"444.jpg": _jpeg(photo, subsampling=0), "422.jpg": _jpeg(_photo(1), subsampling=1),
            "420.jpg": _jpeg(_photo(2, 48, 64), subsampling=2), "gray.jpg": _jpeg(_photo(3).convert("L")),
            "progressive.jpg": _jpeg(_photo(4), progressive=True), "cmyk.jpg": _jpeg(_photo(5).convert("CMYK")),
            "rotated.jpg": _jpeg(_photo(6), exif=exif.tobytes()), "truncated.jpg": _jpeg(_photo(7))[:-300],
            "no_tables.jpg": _without(_jpeg(_photo(8)), 0xDB),
            "no_huffman.jpg": _without(_jpeg(_photo(10)), 0xC4),
            "odd_huffman.jpg": _scan_tables(_without(_jpeg(_photo(11)), 0xC4), 0x23)}
    paths = {}
    for name, data in made.items():
        paths[name] = folder / name
        paths[name].write_bytes(data)
    paths["plain.png"] = folder / "plain.png"
    _photo(9).save(paths["plain.png"])
    paths["empty.jpg"] = folder / "empty.jpg"
    paths["empty.jpg"].write_bytes(b"")
    return paths


DEVICE_OK = ("444.jpg", "422.jpg", "420.jpg", "gray.jpg", "no_huffman.jpg")
REFUSED = ("no_tables.jpg", "odd_huffman.jpg")  # by the rule, before any decoder
FAILED = {"truncated.jpg", "empty.jpg", *REFUSED}


def test_which_jpegs_the_device_decoder_gets(tmp_path) -> None:
    paths = files(tmp_path)
    infos = {name: jpeg_info(p.read_bytes()) for name, p in paths.items() if name != "empty.jpg"}
    refusals = {name: device_refusal(info) for name, info in infos.items()}
    assert {n for n, r in refusals.items() if r is None} == set(DEVICE_OK) | set(REFUSED)  # markers look fine
    assert refusals["progressive.jpg"] == "progressive JPEG"
    assert refusals["cmyk.jpg"] == "4 components (CMYK/YCCK)"
    assert refusals["rotated.jpg"] == "EXIF orientation 6"
    assert refusals["truncated.jpg"].startswith("no end-of-image marker")
    assert refusals["plain.png"] == "not a JPEG stream"
    assert infos["420.jpg"].sampling == ((2, 2), (1, 1), (1, 1))
    assert infos["422.jpg"].sampling == ((2, 1), (1, 1), (1, 1))
    assert device_refusal(infos["444.jpg"], max_side=64) == "80x60 pixels"


def test_one_rule_for_what_a_jpeg_is(tmp_path) -> None:
    """Read from the markers alone: the tables each file's first scan needs and which are missing."""
    paths = files(tmp_path)
    infos = {name: jpeg_info(paths[name].read_bytes()) for name in (*DEVICE_OK, *REFUSED, "progressive.jpg")}
    assert jpeg_refusal(infos["no_tables.jpg"]) == "no quantization table 0, 1 (no DQT segment defines it)"
    assert jpeg_refusal(infos["odd_huffman.jpg"]) == "no Huffman table DC 2, AC 3 (no DHT segment defines it)"
    assert missing_huffman_tables(infos["no_huffman.jpg"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert jpeg_refusal(infos["no_huffman.jpg"]) is None  # the standard tables are inserted
    for name in ("444.jpg", "420.jpg", "gray.jpg", "progressive.jpg"):
        assert jpeg_refusal(infos[name]) is None and missing_huffman_tables(infos[name]) == [], name
    assert infos["progressive.jpg"].spectral == (0, 0, 0)  # its first scan: DC only, so no AC table needed


def test_the_standard_huffman_tables_are_libjpegs(tmp_path) -> None:
    """The Annex K.3 tables inserted into a table-less JPEG are those libjpeg writes by default: a file
    cut of its own standard tables and given them back decodes to its own pixels."""
    data = _jpeg(_photo(10))
    bare = _without(data, 0xC4)
    from captioning.data.jpeg import decodable_jpeg

    restored = decodable_jpeg(bare, "x.jpg")
    assert len(restored) == len(data) - 3 * 4  # the four tables in one DHT segment: three marker+length fewer
    assert np.array_equal(np.array(Image.open(io.BytesIO(restored))), np.array(Image.open(io.BytesIO(data))))


def test_one_verdict_on_both_paths_decided_before_any_decoder_runs(tmp_path, monkeypatch) -> None:
    """Refused files fail with the rule's one-line error on the PIL path and on the device path, and
    neither PIL nor the device decoder ever sees them; the table-less file decodes to the same
    pixels on both."""
    paths = files(tmp_path)
    from captioning.data import media

    opened: list[bytes] = []
    real_open = media.Image.open
    monkeypatch.setattr(media.Image, "open", lambda fp, *a, **k: (opened.append(fp.getvalue()), real_open(fp, *a, **k))[1])
    decoded: list[bytes] = []
    for name, decode in list(JPEG_LIBRARIES.items()):
        monkeypatch.setitem(JPEG_LIBRARIES, name, lambda data, device, decode=decode: (
            decoded.extend(bytes(d.numpy()) for d in data), decode(data, device))[1])
    plain = collate_media(_samples(paths, False))
    batch = decode_on_device(collate_media(_samples(paths, True)), PRE, torch.device("cpu"))
    refused = {paths[n].read_bytes() for n in REFUSED}
    assert decoded and opened and not refused & set(decoded) and not refused & set(opened)
    for failures in (plain["failures"], batch["failures"]):
        errors = {item: error for item, _, error in failures}
        assert set(errors) == FAILED
        assert "a JPEG with no quantization table 0, 1" in errors["no_tables.jpg"]
        assert "a JPEG with no Huffman table DC 2, AC 3" in errors["odd_huffman.jpg"]
    assert sorted(plain["failures"]) == sorted(batch["failures"])
    i, j = plain["ids"].index("no_huffman.jpg"), batch["ids"].index("no_huffman.jpg")
    assert (plain["pixels"][i].float() - batch["pixels"][j].float()).abs().mean() < TOLERANCE


def _samples(paths: dict[str, Path], encoded: bool) -> list[dict]:
    ds = MediaDataset([MediaItem(n, str(p)) for n, p in paths.items()], "image", PRE, encoded_jpegs=encoded)
    return [ds[i] for i in range(len(ds))]


def test_workers_pass_on_device_jpegs_and_decode_the_rest_as_before(tmp_path) -> None:
    paths = files(tmp_path)
    plain, enc = _samples(paths, False), _samples(paths, True)
    for a, b in zip(plain, enc, strict=True):
        if a["id"] in DEVICE_OK:  # the file's bytes, undecoded (a table-less one with the standard tables)
            assert b["pixels"] is None and b["error"] is None
            data = bytes(b["encoded"].numpy())
            assert data == paths[a["id"]].read_bytes() or (a["id"] == "no_huffman.jpg" and len(data) > 400)
        else:  # progressive, CMYK, rotated, truncated, refused, PNG, empty: PIL or the rule, as before
            assert b["encoded"] is None and b["error"] == a["error"]
            assert (a["pixels"] is None) == (b["pixels"] is None)
            if a["pixels"] is not None:
                assert torch.equal(a["pixels"], b["pixels"])
    errors = {s["id"]: s["error"] for s in plain if s["error"]}
    assert set(errors) == FAILED
    assert "is empty (0 bytes)" in errors["empty.jpg"] and "cannot decode image" in errors["truncated.jpg"]


def test_batch_decoded_on_the_device_is_the_workers_batch(tmp_path) -> None:
    """Device-decoded items take their place among the worker-decoded ones, equal to PIL's pixels
    within the tolerance; a file no decoder can read leaves the batch with load_image's error."""
    paths = files(tmp_path)
    plain = collate_media(_samples(paths, False))
    batch = decode_on_device(collate_media(_samples(paths, True)), PRE, torch.device("cpu"))
    assert batch["ids"] == plain["ids"] and "encoded" not in batch
    assert batch["pixels"].shape == plain["pixels"].shape == (len(plain["ids"]), 3, 32, 32)
    for i, item in enumerate(batch["ids"]):
        diff = (batch["pixels"][i].float() - plain["pixels"][i].float()).abs().mean()
        assert diff < TOLERANCE if item in DEVICE_OK else diff == 0, (item, diff)
    assert sorted(batch["failures"]) == sorted(plain["failures"])  # the same files, the same one-line errors
    assert batch["counts"] == [1] * len(batch["ids"]) and len(batch["valid"]) == len(batch["ids"])


def test_a_file_the_device_decoder_refuses_is_decoded_by_pil(tmp_path, monkeypatch) -> None:
    from captioning.features import device_decode

    paths = files(tmp_path)
    real = device_decode.decode_jpegs

    def refuse_422(data, device, library="torchcodec"):  # nvjpeg failing on one file of the batch
        out = real(data, device, library)
        return ["RuntimeError: nvjpeg refused it" if d.numel() == paths["422.jpg"].stat().st_size else o
                for d, o in zip(data, out, strict=True)]

    monkeypatch.setattr(device_decode, "decode_jpegs", refuse_422)
    plain = collate_media(_samples(paths, False))
    batch = decode_on_device(collate_media(_samples(paths, True)), PRE, torch.device("cpu"))
    assert batch["ids"] == plain["ids"]
    i = batch["ids"].index("422.jpg")
    assert torch.equal(batch["pixels"][i], plain["pixels"][i])  # PIL's decode, the store's resize/crop
    assert sorted(batch["failures"]) == sorted(plain["failures"])


def test_decoder_errors_are_per_file_and_resizing_groups_sizes(tmp_path) -> None:
    paths = files(tmp_path)
    data = [torch.from_numpy(np.fromfile(paths[n], dtype=np.uint8)) for n in ("444.jpg", "no_tables.jpg", "420.jpg")]
    out = decode_jpegs(data, torch.device("cpu"))
    assert out[0].shape == (3, 60, 80) and out[2].shape == (3, 48, 64)
    assert isinstance(out[1], str) and out[1].startswith("RuntimeError")
    resized = resize_all([out[0], out[2], out[0]], PRE)
    assert resized.shape == (3, 3, 32, 32) and torch.equal(resized[0], resized[2])
    assert torch.equal(resized[1], PRE(out[2]))


def _failures(store: FeatureStore) -> list[tuple[str, str, str]]:
    return sorted((f["id"], f["path"], f["error"]) for f in store.failures)


# ------------------------------------------------------------------------------- decoding ahead


def _loader(paths: dict[str, Path], n: int, batch_size: int):
    """A DataLoader of ``n`` items cycling through ``paths`` (device JPEGs as bytes), in batches."""
    from torch.utils.data import DataLoader

    names = sorted(paths)
    items = [MediaItem(f"{k}-{names[k % len(names)]}", str(paths[names[k % len(names)]])) for k in range(n)]
    ds = MediaDataset(items, "image", PRE, encoded_jpegs=True)
    return DataLoader(ds, batch_size=batch_size, collate_fn=collate_media, num_workers=0)


def test_decoding_ahead_hands_on_every_batch_in_order_decoded_as_in_one_thread(tmp_path, monkeypatch) -> None:
    """``DecodeAhead`` decodes on its own thread, at most ``depth`` batches ahead of the consumer, and
    each batch equals the same batch decoded in the consumer's thread."""
    paths = files(tmp_path)
    threads, ahead, consumed = set(), [], [0]
    real = device_decode.decode_on_device

    def spy(batch, pre, device, library="torchcodec"):
        threads.add(threading.get_ident())
        ahead.append(len(ahead) - consumed[0])  # batches decoded before this one that were not consumed
        return real(batch, pre, device, library)

    monkeypatch.setattr("captioning.features.decode_ahead.decode_on_device", spy)
    loader = _loader(paths, 30, 4)
    got = []
    for batch in DecodeAhead(loader, PRE, torch.device("cpu"), depth=2):
        got.append(wait_for(batch, torch.device("cpu")))
        consumed[0] += 1
    want = [real(b, PRE, torch.device("cpu")) for b in loader]
    assert threads and threading.get_ident() not in threads and max(ahead) <= 3
    assert [b["ids"] for b in got] == [b["ids"] for b in want] and len(got) == len(loader) == 8
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a["pixels"], b["pixels"]) and a["failures"] == b["failures"]


def test_extraction_job_through_the_device_path(tmp_path, monkeypatch) -> None:
    """run_extraction with the device path (a CPU decoder standing in for nvjpeg, on the decoding
    thread): the features of the PIL path within float16 and decoder tolerance, the same failures."""
    paths = files(tmp_path / "img")
    items = [MediaItem(n, str(p)) for n, p in paths.items()]
    backbone = build_backbone(EncoderConfig(weights="none", image_size=64))
    cpu = {"accelerator": "cpu", "devices": 1}
    pil = extract_module.run_extraction(items, "image", backbone, tmp_path / "pil", trainer=cpu, batch_size=4,
                                        num_workers=0, progress=False)
    monkeypatch.setattr(extract_module, "resolve_jpeg_decoder", lambda *a: "torchcodec")
    dev = extract_module.run_extraction(items, "image", backbone, tmp_path / "dev", trainer=cpu, batch_size=4,
                                        num_workers=0, progress=False)
    assert (dev.processed, dev.failed) == (pil.processed, pil.failed) == (len(items) - len(FAILED), len(FAILED))
    a, b = FeatureStore.open(tmp_path / "pil"), FeatureStore.open(tmp_path / "dev")
    assert b.meta["image_decoder"].startswith("nvjpeg (torchcodec") and a.meta["image_decoder"] == "PIL"
    assert _failures(a) == _failures(b)
    for item in a.ids:
        fa, fb = np.asarray(a[item].features, np.float32), np.asarray(b[item].features, np.float32)
        scale = np.abs(fa).mean()
        assert np.abs(fa - fb).mean() < (0.1 * scale if item in DEVICE_OK else 1e-6), item
    assert [n for _, n in dev.written] and sum(n for _, n in dev.written) == len(items) - len(FAILED)


def test_resolving_the_decoder() -> None:
    assert resolve_jpeg_decoder("auto", "image", "cpu") is None
    assert resolve_jpeg_decoder("pil", "image", "gpu") is None
    assert resolve_jpeg_decoder("auto", "video", "gpu") is None
    with pytest.raises(Exception, match="jpeg_decoder='turbo'"):
        resolve_jpeg_decoder("turbo", "image", "cpu")
    with pytest.raises(Exception, match="jpeg_library='pillow'"):
        resolve_jpeg_decoder("nvjpeg", "image", "cpu", "pillow")
    if not torch.cuda.is_available():
        with pytest.raises(Exception, match="jpeg_decoder=nvjpeg but no library can decode JPEGs on a CUDA device"):
            resolve_jpeg_decoder("nvjpeg", "image", "cpu")
        with pytest.raises(Exception, match="jpeg_decoder=nvjpeg but torchvision can"):
            resolve_jpeg_decoder("nvjpeg", "image", "gpu", "torchvision")


# ------------------------------------------------------------------------ the 4:2:0 bound


def _ycbcr(data: bytes, scale: int) -> np.ndarray:
    """libjpeg's decode of ``data`` at 1/``scale`` size without colour conversion: int [H, W, 3] YCbCr.
    At 1/2 a 4:2:0 file's chroma comes out as stored (an 8x8 inverse DCT, no upsampling)."""
    im = Image.open(io.BytesIO(data))
    im.draft("YCbCr", (im.size[0] // scale, im.size[1] // scale))
    assert im.mode == "YCbCr"
    return np.asarray(im).astype(np.int64)


def triangle_upsample(c: np.ndarray) -> np.ndarray:
    """libjpeg-turbo's h2v2 fancy upsampling of a chroma plane [h, w] -> [2h, 2w]: each output sample
    (3 (3 c + c_v) + (3 c_h + c_d) + 8 or 7) >> 4, edges replicated (jdsample.c)."""
    up, down = np.vstack([c[:1], c[:-1]]), np.vstack([c[1:], c[-1:]])
    out = np.empty((2 * c.shape[0], 2 * c.shape[1]), dtype=np.int64)
    for rows, vertical in ((slice(0, None, 2), up), (slice(1, None, 2), down)):
        col = 3 * c + vertical  # each column's sum with its vertical neighbour
        left, right = np.hstack([col[:, :1], col[:, :-1]]), np.hstack([col[:, 1:], col[:, -1:]])
        out[rows, 0::2] = (3 * col + left + 8) >> 4
        out[rows, 1::2] = (3 * col + right + 7) >> 4
    return out


def box_upsample(c: np.ndarray) -> np.ndarray:
    """nvJPEG's (``NVJPEG_FLAGS_DEFAULT``) chroma upsampling: each sample replicated over its 2x2 pixels."""
    return c.repeat(2, axis=0).repeat(2, axis=1)


def ycbcr_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """JFIF's conversion, rounded and clipped: [3, H, W] float."""
    cb, cr = cb - 128.0, cr - 128.0
    rgb = np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb])
    return np.clip(np.rint(rgb), 0, 255)


def upsampling_gap(data: bytes) -> float:
    """Mean |RGB with box-upsampled chroma - RGB with triangle-upsampled chroma| of a 4:2:0 JPEG, from its
    own luma and stored chroma: what nvJPEG's and libjpeg-turbo's upsampling alone make them differ by."""
    full, half = _ycbcr(data, 1), _ycbcr(data, 2)
    y = full[..., 0].astype(np.float64)
    box = ycbcr_to_rgb(y, box_upsample(half[..., 1]), box_upsample(half[..., 2]))
    triangle = ycbcr_to_rgb(y, triangle_upsample(half[..., 1]), triangle_upsample(half[..., 2]))
    return float(np.abs(box - triangle).mean())


def bound(data: bytes) -> float:
    """The mean absolute difference allowed between nvJPEG's pixels and PIL's (module docstring)."""
    info = jpeg_info(data)
    return TOLERANCE + (upsampling_gap(data) if info is not None and info.sampling[0] == (2, 2) else 0.0)


def test_the_triangle_filter_is_libjpeg_turbos_420_chroma(tmp_path) -> None:
    """The arithmetic the 4:2:0 bound rests on: the triangle filter of the stored chroma planes is
    PIL's (libjpeg-turbo's) full-size chroma exactly, and with the JFIF conversion its RGB pixels."""
    data = files(tmp_path)["420.jpg"].read_bytes()
    full, half = _ycbcr(data, 1), _ycbcr(data, 2)
    assert half.shape[:2] == (24, 32) and full.shape[:2] == (48, 64)
    for channel in (1, 2):
        assert np.array_equal(triangle_upsample(half[..., channel]), full[..., channel])
    pil = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64).transpose(2, 0, 1)
    model = ycbcr_to_rgb(full[..., 0].astype(np.float64), full[..., 1], full[..., 2])
    assert np.abs(model - pil).mean() < 0.01
    assert 2.9 < upsampling_gap(data) < 3.1  # what the H200 measured between nvJPEG and PIL: 2.99
    assert bound(data) == TOLERANCE + upsampling_gap(data)
    assert bound(files(tmp_path)["444.jpg"].read_bytes()) == TOLERANCE


# ------------------------------------------------------------------------------------ on a GPU


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("library", list(JPEG_LIBRARIES))
@pytest.mark.parametrize("name", DEVICE_OK)
def test_nvjpeg_pixels_equal_pils(tmp_path, name, library) -> None:
    """nvjpeg on 4:4:4, 4:2:2, 4:2:0, grayscale and table-less JPEGs (as every decoder gets them):
    PIL's pixels within the bound of the file's subsampling, decoded and after the store's resize/crop
    on the device."""
    from captioning.data.jpeg import decodable_jpeg

    if not device_decode.nvjpeg_works("cuda", library):
        pytest.skip(f"{library} does not decode JPEGs on this GPU (not installed, or without nvjpeg)")
    path = files(tmp_path)[name]
    data = decodable_jpeg(path.read_bytes(), path)
    (got,) = decode_jpegs([torch.frombuffer(bytearray(data), dtype=torch.uint8)], torch.device("cuda"), library)
    want = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)
    assert not isinstance(got, str), got
    assert got.device.type == "cuda" and got.shape == want.shape
    limit = bound(data)
    assert (got.cpu().float() - want.float()).abs().mean() <= limit, (name, limit)
    assert (resize_all([got], PRE)[0].cpu().float() - PRE(want).float()).abs().mean() <= limit


@pytest.mark.gpu
@CUDA
def test_nvjpeg_extraction_equals_the_pil_extraction(tmp_path) -> None:
    paths = files(tmp_path / "img")
    items = [MediaItem(n, str(p)) for n, p in paths.items()]
    backbone = build_backbone(EncoderConfig(weights="none", image_size=64))
    gpu = {"accelerator": "gpu", "devices": 1, "precision": "32-true"}
    runs = {d: extract_module.run_extraction(items, "image", backbone, tmp_path / d, trainer=gpu, batch_size=4,
                                             num_workers=2, progress=False, jpeg_decoder=d) for d in ("pil", "nvjpeg")}
    assert runs["nvjpeg"].failed == runs["pil"].failed == len(FAILED)
    a, b = FeatureStore.open(tmp_path / "pil"), FeatureStore.open(tmp_path / "nvjpeg")
    assert _failures(a) == _failures(b) and b.meta["image_decoder"].startswith("nvjpeg")
    for item in a.ids:
        fa, fb = np.asarray(a[item].features, np.float32), np.asarray(b[item].features, np.float32)
        assert np.abs(fa - fb).mean() < 0.1 * np.abs(fa).mean(), item


@pytest.mark.gpu
@CUDA
def test_decoding_ahead_on_the_gpu_equals_a_synchronous_decode_over_many_batches(tmp_path) -> None:
    """Batches decoded on the decoding thread's stream while the job's stream runs other work that
    allocates and frees memory (the hazard of pytorch/vision#9606: a decoder writing into memory still
    in use): every batch's pixels equal the same batch decoded synchronously, over 60 batches."""
    paths = {n: p for n, p in files(tmp_path).items() if n in DEVICE_OK}
    device, library = torch.device("cuda"), gpu_library()
    loader = _loader(paths, 60 * 8, 8)
    want = []
    for batch in loader:
        want.append(decode_on_device(batch, PRE, device, library)["pixels"].cpu())
        torch.cuda.synchronize()
    got = []
    for k, batch in enumerate(DecodeAhead(loader, PRE, device, depth=2, library=library)):
        batch = wait_for(batch, device)
        for _ in range(3):  # the job's stream busy with memory that comes and goes
            x = torch.randn(2048, 2048, device=device)
            del x
        got.append(batch["pixels"].sum(dim=(1, 2, 3)))
        want_sum = want[k].to(device).sum(dim=(1, 2, 3))
        got[-1] = got[-1] - want_sum  # compared on the device, read once at the end
    assert all(int(d.abs().max()) == 0 for d in got) and len(got) == 60


@pytest.mark.gpu
@CUDA
def test_the_extraction_job_on_the_gpu_writes_what_a_synchronous_run_computes(tmp_path) -> None:
    """Nothing written while a decode was in flight differs from a synchronous run: the job (decoding
    ahead, the writer's thread) against each batch decoded, run through the backbone and copied in turn."""
    paths = {n: p for n, p in files(tmp_path / "img").items() if n in DEVICE_OK}
    names = sorted(paths)
    items = [MediaItem(f"{k}", str(paths[names[k % len(names)]])) for k in range(40 * 8)]
    backbone = build_backbone(EncoderConfig(weights="none", image_size=64))
    gpu = {"accelerator": "gpu", "devices": 1, "precision": "32-true"}
    extract_module.run_extraction(items, "image", backbone, tmp_path / "job", trainer=gpu, batch_size=8,
                                  num_workers=2, progress=False, jpeg_decoder="nvjpeg")
    store = FeatureStore.open(tmp_path / "job")
    module = extract_module.FeatureExtractor(backbone, backbone.preprocessing(), "image").cuda().eval()
    ds = MediaDataset(items, "image", backbone.preprocessing(), encoded_jpegs=True)
    for start in range(0, len(items), 8):
        batch = decode_on_device(collate_media([ds[i] for i in range(start, start + 8)]), backbone.preprocessing(),
                                 torch.device("cuda"), gpu_library())
        with torch.inference_mode():
            feats = module.features(batch).to(torch.float16).cpu()
        for i, item in enumerate(batch["ids"]):
            np.testing.assert_allclose(np.asarray(store[item].features, np.float32), feats[i].float().numpy(),
                                       rtol=1e-3, atol=1e-3)
