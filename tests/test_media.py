"""load_image on awkward files (all generated in tmp_path), media_kind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from captioning.data.media import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, load_image, media_kind
from captioning.errors import DataError


def _rgb(im: Image.Image, xy: tuple[int, int] = (0, 0)) -> tuple[int, int, int]:
    assert im.mode == "RGB"
    return im.getpixel(xy)


def _close(a, b, tol: int = 6) -> bool:
    return all(abs(int(x) - int(y)) <= tol for x, y in zip(a, b, strict=True))


def test_media_kind() -> None:
    assert media_kind("a/b.JPG") == "image"
    assert media_kind("x.png") == "image"
    assert media_kind("clip.MP4") == "video"
    assert media_kind("clip.webm") == "video"
    assert media_kind("notes.txt") is None
    assert media_kind("noext") is None
    assert ".jpg" in IMAGE_EXTENSIONS and ".mkv" in VIDEO_EXTENSIONS
    assert not IMAGE_EXTENSIONS & VIDEO_EXTENSIONS


def test_plain_jpeg_and_1x1(tmp_path: Path) -> None:
    p = tmp_path / "a.jpg"
    Image.new("RGB", (40, 30), (10, 200, 30)).save(p, quality=95)
    im = load_image(p)
    assert im.size == (40, 30) and _close(_rgb(im, (20, 15)), (10, 200, 30))
    one = tmp_path / "one.png"
    Image.new("RGB", (1, 1), (1, 2, 3)).save(one)
    im = load_image(one)
    assert im.size == (1, 1) and _rgb(im) == (1, 2, 3)


def test_png_alpha_is_composited_on_white(tmp_path: Path) -> None:
    im = Image.new("RGBA", (4, 2), (0, 0, 0, 0))  # fully transparent black
    im.putpixel((1, 0), (255, 0, 0, 255))  # opaque red
    im.putpixel((2, 0), (0, 0, 255, 128))  # half-transparent blue
    p = tmp_path / "alpha.png"
    im.save(p)
    out = load_image(p)
    assert _rgb(out, (0, 0)) == (255, 255, 255)
    assert _rgb(out, (1, 0)) == (255, 0, 0)
    assert _close(_rgb(out, (2, 0)), (127, 127, 255), tol=2)
    la = Image.new("LA", (2, 2), (0, 0))
    la.save(tmp_path / "la.png")
    assert _rgb(load_image(tmp_path / "la.png")) == (255, 255, 255)


def test_palette_with_transparency(tmp_path: Path) -> None:
    im = Image.new("P", (3, 1))
    im.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)
    im.putpixel((1, 0), 1)
    p = tmp_path / "pal.gif"
    im.save(p, transparency=0)
    out = load_image(p)
    assert _rgb(out, (0, 0)) == (255, 255, 255) and _rgb(out, (1, 0)) == (0, 255, 0)


def test_grayscale_bilevel_and_16_bit(tmp_path: Path) -> None:
    Image.new("L", (3, 3), 77).save(tmp_path / "g.png")
    assert _rgb(load_image(tmp_path / "g.png")) == (77, 77, 77)
    Image.new("1", (3, 3), 1).save(tmp_path / "b.png")
    assert _rgb(load_image(tmp_path / "b.png")) == (255, 255, 255)
    arr = np.array([[0, 65535, 32768, 257 * 100]], dtype=np.uint16)
    Image.fromarray(arr).save(tmp_path / "16.png")  # a 16-bit grayscale PNG
    assert Image.open(tmp_path / "16.png").mode in ("I;16", "I")
    out = load_image(tmp_path / "16.png")
    assert [out.getpixel((x, 0))[0] for x in range(4)] == [0, 255, 128, 100]


def test_cmyk_jpeg(tmp_path: Path) -> None:
    p = tmp_path / "cmyk.jpg"
    Image.new("CMYK", (16, 16), (0, 255, 255, 0)).save(p, quality=95)  # red
    assert Image.open(p).mode == "CMYK"
    out = load_image(p)
    assert _close(_rgb(out, (8, 8)), (255, 0, 0), tol=8)


def test_exif_orientation_swaps_dimensions(tmp_path: Path) -> None:
    im = Image.new("RGB", (60, 20), (0, 0, 0))
    im.paste((255, 255, 255), (0, 0, 10, 20))  # white stripe on the left
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 CW to display
    p = tmp_path / "rot.jpg"
    im.save(p, exif=exif.tobytes(), quality=95)
    out = load_image(p)
    assert out.size == (20, 60)
    assert _rgb(out, (10, 3))[0] > 200 and _rgb(out, (10, 56))[0] < 50  # the stripe is now on top


def test_downscale_keeps_aspect(tmp_path: Path) -> None:
    Image.new("RGB", (1000, 250), (5, 6, 7)).save(tmp_path / "w.png")
    assert load_image(tmp_path / "w.png", max_side=100).size == (100, 25)
    Image.new("RGB", (800, 1600), (5, 6, 7)).save(tmp_path / "t.jpg")
    assert load_image(tmp_path / "t.jpg", max_side=64).size == (32, 64)
    assert load_image(tmp_path / "t.jpg", max_side=None).size == (800, 1600)


def test_decompression_bomb_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Image.new("RGB", (100, 100), (9, 9, 9)).save(tmp_path / "big.png")
    Image.new("RGB", (100, 100), (9, 9, 9)).save(tmp_path / "big.jpg")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 400)  # errors above 800 pixels
    with pytest.raises(DataError, match=r"big\.png.*too large"):
        load_image(tmp_path / "big.png")
    # A JPEG is decoded at 1/4 (25x25 = 625 pixels) and comes through.
    assert load_image(tmp_path / "big.jpg", max_side=16).size == (16, 16)
    with pytest.raises(DataError, match=r"big\.jpg.*too large"):
        load_image(tmp_path / "big.jpg", max_side=None)


def test_huge_jpeg_is_downscaled_with_bounded_memory(tmp_path: Path) -> None:
    """12000x12000 JPEG: decoded at 1/2 scale (draft), far below the ~1.1 GB of a full decode."""
    p = tmp_path / "huge.jpg"
    make = f"from PIL import Image; Image.new('RGB', (12000, 12000), (200, 30, 30)).save({str(p)!r}, quality=50)"
    subprocess.run([sys.executable, "-c", make], check=True, timeout=120)
    probe = textwrap.dedent(f"""
        import resource
        from captioning.data.media import load_image
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        im = load_image({str(p)!r})
        r1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(im.size[0], im.size[1], (r1 - r0) // 1024, *im.getpixel((5, 5)))
    """)
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=120)
    w, h, peak_mb, r, g, b = (int(x) for x in out.stdout.split())
    assert (w, h) == (4096, 4096)
    assert _close((r, g, b), (200, 30, 30), tol=8)
    assert peak_mb < 600, f"peak memory grew by {peak_mb} MB"


@pytest.mark.parametrize("content", [b"", b"this is not an image\n" * 5, b"\x89PNG\r\n\x1a\n\x00\x00"])
def test_bad_files_raise_data_error_naming_the_file(tmp_path: Path, content: bytes) -> None:
    p = tmp_path / "bad.jpg"
    p.write_bytes(content)
    with pytest.raises(DataError, match=r"bad\.jpg"):
        load_image(p)


def test_truncated_jpeg_and_missing_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    good = tmp_path / "good.jpg"
    Image.fromarray(rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)).save(good, quality=90)
    data = good.read_bytes()
    bad = tmp_path / "trunc.jpg"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"trunc\.jpg.*truncated"):
        load_image(bad)
    with pytest.raises(DataError, match=r"not found.*nope\.jpg"):
        load_image(tmp_path / "nope.jpg")
    with pytest.raises(DataError, match="not a regular file"):
        load_image(tmp_path)
