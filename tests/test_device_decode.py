"""JPEGs decoded on the device (captioning.data.jpeg, captioning.features.device_decode): which files go
to the GPU decoder, the fallback to PIL with today's one-line errors, the batch put back in item order,
and the extraction job through it.  On a CPU the device decoder is torchvision's libjpeg-turbo
decode_jpeg (the same dispatch, merge and fallback code); the tests marked ``gpu`` run nvjpeg.

Tolerance: decoded pixels agree with PIL's to a mean absolute difference below 2 levels, the
criterion torchvision's own tests use for its GPU decoder (nvjpeg's inverse DCT and chroma
upsampling are not libjpeg-turbo's)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioning.data.jpeg import device_refusal, jpeg_info
from captioning.features import extract as extract_module
from captioning.features.backbones import EncoderConfig, Preprocessing, build_backbone
from captioning.features.device_decode import (
    decode_jpegs,
    decode_on_device,
    resize_all,
    resolve_jpeg_decoder,
)
from captioning.features.media_dataset import MediaDataset, MediaItem, collate_media
from captioning.store.feature_store import FeatureStore

TOLERANCE = 2.0  # mean absolute difference, levels of 255
PRE = Preprocessing(size=32, resize=36, crop="center", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)")


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


def _without_quantization_tables(data: bytes) -> bytes:
    """A JPEG whose DQT segments are cut out: its markers look fine, no decoder can decode it."""
    out, pos = bytearray(data[:2]), 2
    while data[pos + 1] != 0xDA:  # up to the first scan
        length = int.from_bytes(data[pos + 2: pos + 4], "big")
        if data[pos + 1] != 0xDB:
            out += data[pos: pos + 2 + length]
        pos += 2 + length
    return bytes(out + data[pos:])


def files(folder: Path) -> dict[str, Path]:
    """JPEGs of each kind the dispatch tells apart, and a PNG."""
    folder.mkdir(parents=True, exist_ok=True)
    photo = _photo(0)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: PIL applies it
    made = {"444.jpg": _jpeg(photo, subsampling=0), "422.jpg": _jpeg(_photo(1), subsampling=1),
            "420.jpg": _jpeg(_photo(2, 48, 64), subsampling=2), "gray.jpg": _jpeg(_photo(3).convert("L")),
            "progressive.jpg": _jpeg(_photo(4), progressive=True), "cmyk.jpg": _jpeg(_photo(5).convert("CMYK")),
            "rotated.jpg": _jpeg(_photo(6), exif=exif.tobytes()), "truncated.jpg": _jpeg(_photo(7))[:-300],
            "no_tables.jpg": _without_quantization_tables(_jpeg(_photo(8)))}
    paths = {}
    for name, data in made.items():
        paths[name] = folder / name
        paths[name].write_bytes(data)
    paths["plain.png"] = folder / "plain.png"
    _photo(9).save(paths["plain.png"])
    paths["empty.jpg"] = folder / "empty.jpg"
    paths["empty.jpg"].write_bytes(b"")
    return paths


DEVICE_OK = ("444.jpg", "422.jpg", "420.jpg", "gray.jpg")


def test_which_jpegs_the_device_decoder_gets(tmp_path) -> None:
    paths = files(tmp_path)
    refusals = {name: device_refusal(jpeg_info(p.read_bytes())) for name, p in paths.items() if name != "empty.jpg"}
    assert {n for n, r in refusals.items() if r is None} == set(DEVICE_OK) | {"no_tables.jpg"}  # markers look fine
    assert refusals["progressive.jpg"] == "progressive JPEG"
    assert refusals["cmyk.jpg"] == "4 components (CMYK/YCCK)"
    assert refusals["rotated.jpg"] == "EXIF orientation 6"
    assert refusals["truncated.jpg"].startswith("no end-of-image marker")
    assert refusals["plain.png"] == "not a JPEG stream"
    assert jpeg_info(paths["420.jpg"].read_bytes()).sampling == ((2, 2), (1, 1), (1, 1))
    assert jpeg_info(paths["422.jpg"].read_bytes()).sampling == ((2, 1), (1, 1), (1, 1))
    assert device_refusal(jpeg_info(paths["444.jpg"].read_bytes()), max_side=64) == "80x60 pixels"


def _samples(paths: dict[str, Path], encoded: bool) -> list[dict]:
    ds = MediaDataset([MediaItem(n, str(p)) for n, p in paths.items()], "image", PRE, encoded_jpegs=encoded)
    return [ds[i] for i in range(len(ds))]


def test_workers_pass_on_device_jpegs_and_decode_the_rest_as_before(tmp_path) -> None:
    paths = files(tmp_path)
    plain, enc = _samples(paths, False), _samples(paths, True)
    for a, b in zip(plain, enc, strict=True):
        if a["id"] in DEVICE_OK or a["id"] == "no_tables.jpg":  # the file's bytes, undecoded
            assert b["pixels"] is None and b["error"] is None
            assert bytes(b["encoded"].numpy()) == paths[a["id"]].read_bytes()
        else:  # progressive, CMYK, rotated, truncated, PNG, empty: PIL, the same pixels or the same error
            assert b["encoded"] is None and b["error"] == a["error"]
            assert (a["pixels"] is None) == (b["pixels"] is None)
            if a["pixels"] is not None:
                assert torch.equal(a["pixels"], b["pixels"])
    errors = {s["id"]: s["error"] for s in plain if s["error"]}
    assert set(errors) == {"truncated.jpg", "no_tables.jpg", "empty.jpg"}
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

    def refuse_422(data, device):  # nvjpeg failing on one file of the batch
        out = real(data, device)
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


def test_extraction_job_through_the_device_path(tmp_path, monkeypatch) -> None:
    """run_extraction with the device path (torchvision's CPU decoder standing in for nvjpeg): the
    features of the PIL path within float16 and decoder tolerance, the same failures."""
    paths = files(tmp_path / "img")
    items = [MediaItem(n, str(p)) for n, p in paths.items()]
    backbone = build_backbone(EncoderConfig(weights="none", image_size=64))
    cpu = {"accelerator": "cpu", "devices": 1}
    pil = extract_module.run_extraction(items, "image", backbone, tmp_path / "pil", trainer=cpu, batch_size=4,
                                        num_workers=0, progress=False)
    monkeypatch.setattr(extract_module, "resolve_jpeg_decoder", lambda choice, kind, accelerator: True)
    dev = extract_module.run_extraction(items, "image", backbone, tmp_path / "dev", trainer=cpu, batch_size=4,
                                        num_workers=0, progress=False)
    assert (dev.processed, dev.failed) == (pil.processed, pil.failed) == (len(items) - 3, 3)
    a, b = FeatureStore.open(tmp_path / "pil"), FeatureStore.open(tmp_path / "dev")
    assert b.meta["image_decoder"].startswith("nvjpeg") and a.meta["image_decoder"] == "PIL"
    assert _failures(a) == _failures(b)
    for item in a.ids:
        fa, fb = np.asarray(a[item].features, np.float32), np.asarray(b[item].features, np.float32)
        scale = np.abs(fa).mean()
        assert np.abs(fa - fb).mean() < (0.1 * scale if item in DEVICE_OK else 1e-6), item


def test_resolving_the_decoder() -> None:
    assert not resolve_jpeg_decoder("auto", "image", "cpu")
    assert not resolve_jpeg_decoder("pil", "image", "gpu")
    assert not resolve_jpeg_decoder("auto", "video", "gpu")
    with pytest.raises(Exception, match="jpeg_decoder='turbo'"):
        resolve_jpeg_decoder("turbo", "image", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(Exception, match="jpeg_decoder=nvjpeg but torchvision cannot decode JPEGs on a CUDA device"):
            resolve_jpeg_decoder("nvjpeg", "image", "cpu")


# ------------------------------------------------------------------------------------ on a GPU


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("name", DEVICE_OK)
def test_nvjpeg_pixels_equal_pils(tmp_path, name) -> None:
    """nvjpeg on 4:4:4, 4:2:2, 4:2:0 and grayscale JPEGs: PIL's pixels within the tolerance, decoded
    and after the store's resize/crop on the device."""
    path = files(tmp_path)[name]
    (got,) = decode_jpegs([torch.from_numpy(np.fromfile(path, dtype=np.uint8))], torch.device("cuda"))
    want = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)
    assert got.device.type == "cuda" and got.shape == want.shape
    assert (got.cpu().float() - want.float()).abs().mean() < TOLERANCE
    assert (resize_all([got], PRE)[0].cpu().float() - PRE(want).float()).abs().mean() < TOLERANCE


@pytest.mark.gpu
@CUDA
def test_nvjpeg_extraction_equals_the_pil_extraction(tmp_path) -> None:
    paths = files(tmp_path / "img")
    items = [MediaItem(n, str(p)) for n, p in paths.items()]
    backbone = build_backbone(EncoderConfig(weights="none", image_size=64))
    gpu = {"accelerator": "gpu", "devices": 1, "precision": "32-true"}
    runs = {d: extract_module.run_extraction(items, "image", backbone, tmp_path / d, trainer=gpu, batch_size=4,
                                             num_workers=2, progress=False, jpeg_decoder=d) for d in ("pil", "nvjpeg")}
    assert runs["nvjpeg"].failed == runs["pil"].failed == 3
    a, b = FeatureStore.open(tmp_path / "pil"), FeatureStore.open(tmp_path / "nvjpeg")
    assert _failures(a) == _failures(b) and b.meta["image_decoder"].startswith("nvjpeg")
    for item in a.ids:
        fa, fb = np.asarray(a[item].features, np.float32), np.asarray(b[item].features, np.float32)
        assert np.abs(fa - fb).mean() < 0.1 * np.abs(fa).mean(), item
