"""Screenshots for the docs that carry the text of the page they show.

``save_screenshot`` writes a page's pixels with the page's text inside the image file (a JPEG
comment, a PNG text chunk) and refuses a page that prints an absolute path: a path of the machine
the screenshot was taken on is nothing a reader can open (docs/img/viewer.jpg once showed one).
``image_text`` reads that text back, so tests/test_docs.py checks every image of the docs that
carries one, and requires it of the viewer's screenshots.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from PIL import Image, PngImagePlugin

TEXT_KEY = "page text"
#: an absolute path: POSIX (``/tmp/x/predictions.json``, not ``../a/b`` or ``1/2``) or Windows (``C:\``)
ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/(?:[\w.-]+/)+[\w.-]*|\b[A-Za-z]:\\")


def save_screenshot(png: bytes, out: Path, text: str, quality: int = 85) -> Path:
    """``png`` (a browser's screenshot) to ``out`` (.jpg or .png) with ``text`` inside; refused (ValueError)
    when the text names an absolute path."""
    found = ABSOLUTE_PATH.search(text)
    if found:
        raise ValueError(f"the page prints a path of this machine ({found.group(0)}): not a screenshot for the docs")
    img = Image.open(io.BytesIO(png)).convert("RGB")
    body = f"{TEXT_KEY}:\n{text}"
    if out.suffix.lower() in (".jpg", ".jpeg"):
        img.save(out, format="JPEG", quality=quality, comment=body.encode("utf-8"))
    else:
        info = PngImagePlugin.PngInfo()
        info.add_itxt(TEXT_KEY, text)
        img.save(out, format="PNG", pnginfo=info)
    return out


def image_text(path: Path) -> str | None:
    """The page text a screenshot carries (None: the image carries none)."""
    with Image.open(path) as img:
        if img.format == "JPEG":
            comment = img.info.get("comment")
            text = comment.decode("utf-8", errors="replace") if isinstance(comment, bytes) else comment
            return text.split("\n", 1)[1] if text and text.startswith(f"{TEXT_KEY}:\n") else None
        return img.info.get(TEXT_KEY)
