"""JPEG decoding where the backbone runs: the extraction job's images decoded by nvJPEG on the GPU.

On a CPU, JPEG decoding and resizing in DataLoader workers feed a GPU backbone a fraction of what it
can take (docs/benchmarks.md).  With ``jpeg_decoder=nvjpeg`` the workers only read the files' bytes
(``MediaDataset(encoded_jpegs=True)``: the JPEGs ``captioning.data.jpeg.device_refusal`` lets through,
as ``captioning.data.jpeg.decodable_jpeg`` gives them to every decoder); ``decode_on_device`` decodes
a batch of them in one call (``decode_jpegs``: torchcodec's ``decode_jpeg`` of a list, one batched
nvJPEG decode, or torchvision's list form: ``JPEG_LIBRARIES``), applies the store's resize/crop there
(``Preprocessing`` on the device, images of one size together) and puts them among the
worker-decoded pixels in item order.  ``captioning.features.decode_ahead`` runs it on a thread, a
batch ahead.  A file the device decoder refuses is decoded by PIL (``load_image``), and a file PIL
refuses too becomes a failure with ``load_image``'s one-line error, under the job's usual policy.

nvJPEG and libjpeg-turbo (PIL) differ in their inverse DCT and chroma upsampling (nvJPEG replicates
each chroma sample, libjpeg-turbo interpolates with a triangle filter): ``tests/test_device_decode.py``
states the bound of each subsampling and why; the store records which decoder made its features
(meta ``image_decoder``).
"""

from __future__ import annotations

import functools
import io
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from captioning.data.media import load_image
from captioning.errors import ConfigError
from captioning.features.backbones import Preprocessing
from captioning.features.media_dataset import error_text

__all__ = ["DECODERS", "JPEG_LIBRARIES", "decode_jpegs", "decode_on_device", "nvjpeg_works", "resolve_jpeg_decoder",
           "resize_all"]

log = logging.getLogger("captioning.extract")

DECODERS = ("auto", "pil", "nvjpeg")


def _torchcodec(data: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    from torchcodec.decoders import decode_jpeg

    return list(decode_jpeg(list(data), mode="RGB", device=device))


def _torchvision(data: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    from torchvision.io import ImageReadMode, decode_jpeg

    return list(decode_jpeg(list(data), mode=ImageReadMode.RGB, device=device))


#: a batch of JPEG byte tensors -> RGB uint8 [3, H, W] each on the device, in one call: torchcodec's
#: (one nvjpegDecodeBatched, no process-wide lock) or torchvision's (deprecated since 0.29; a
#: process-wide mutex, its stream synchronized before each decode)
JPEG_LIBRARIES: dict[str, Callable[[Sequence[torch.Tensor], torch.device], list[torch.Tensor]]] = {
    "torchcodec": _torchcodec, "torchvision": _torchvision}


@functools.lru_cache(maxsize=8)
def nvjpeg_works(device: str, library: str = "torchcodec") -> bool:
    """Whether ``library`` decodes JPEGs on ``device`` (a CUDA device): one tiny JPEG tried."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return False
    try:
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (16, 16), (200, 40, 90)).save(buf, "JPEG")
        (out,) = JPEG_LIBRARIES[library]([torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)],
                                         torch.device(device))
        return tuple(out.shape) == (3, 16, 16) and out.device.type == "cuda"
    except Exception as e:  # an old library, a build without nvjpeg, a driver problem
        log.info("nvjpeg unavailable on %s (%s): JPEGs are decoded by PIL in the workers", device, error_text(e))
        return False


def resolve_jpeg_decoder(choice: str, kind: str, accelerator: str, library: str = "auto") -> str | None:
    """The library that decodes the job's JPEGs on the device (None: PIL in the workers): ``choice``
    ``nvjpeg`` (an error without one), ``pil`` (never) or ``auto`` (on a CUDA accelerator whose nvjpeg
    works; images only); ``library`` ``auto``: torchcodec where it decodes on the device, else torchvision."""
    if choice not in DECODERS:
        raise ConfigError(f"jpeg_decoder={choice!r}: use auto, pil or nvjpeg")
    if library != "auto" and library not in JPEG_LIBRARIES:
        raise ConfigError(f"jpeg_library={library!r}: use auto, {' or '.join(JPEG_LIBRARIES)}")
    cuda = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if kind != "image" or choice == "pil" or (choice == "auto" and not cuda):
        return None
    for name in JPEG_LIBRARIES if library == "auto" else (library,):
        if nvjpeg_works("cuda", name):
            return name
    if choice == "nvjpeg":
        raise ConfigError(f"jpeg_decoder=nvjpeg but {'no library' if library == 'auto' else library} can decode "
                          f"JPEGs on a CUDA device here (no GPU, or builds without nvjpeg): use jpeg_decoder=auto or pil")
    return None


def decode_jpegs(data: Sequence[torch.Tensor], device: torch.device,
                 library: str = "torchcodec") -> list[torch.Tensor | str]:
    """Decode JPEG byte tensors (CPU uint8 [n]) on ``device`` -> RGB uint8 [3, H, W] each, or the
    decoder's error text; all at once (nvjpeg's batched decode), one by one when that fails."""
    decode = JPEG_LIBRARIES[library]
    try:
        return list(decode(data, device))
    except (RuntimeError, TypeError, ValueError):
        out: list[torch.Tensor | str] = []
        for d in data:
            try:
                out.append(decode([d], device)[0])
            except (RuntimeError, TypeError, ValueError) as e:
                out.append(error_text(e))
        return out


def resize_all(images: Sequence[torch.Tensor], pre: Preprocessing) -> torch.Tensor:
    """``pre`` (resize + crop) of each image [3, H_i, W_i] -> [n, 3, S, S], the images of one size at once."""
    out = torch.empty((len(images), 3, pre.size, pre.size), dtype=torch.uint8, device=images[0].device)
    by_size: dict[tuple[int, int], list[int]] = {}
    for i, im in enumerate(images):
        by_size.setdefault((int(im.shape[1]), int(im.shape[2])), []).append(i)
    for rows in by_size.values():
        out[rows] = pre(torch.stack([images[i] for i in rows]))
    return out


def _pil(path: str) -> torch.Tensor:
    """The worker's decode of one file, here: ``load_image`` -> uint8 [3, H, W] (raises its DataError)."""
    img = load_image(path)
    return torch.from_numpy(np.array(img.convert("RGB") if img.mode != "RGB" else img)).permute(2, 0, 1)


def decode_on_device(batch: dict[str, Any], pre: Preprocessing, device: torch.device,
                     library: str = "torchcodec") -> dict[str, Any]:
    """``batch`` (``collate_media``'s) with its worker-decoded pixels moved to ``device`` and its
    ``encoded`` JPEGs decoded there, all in item order -> the batch ``predict_step`` reads; an item
    neither nvjpeg nor PIL decodes leaves ``ids`` for ``failures``."""
    encoded = batch.pop("encoded", None) or []
    batch["pixels"] = batch["pixels"].to(device, non_blocking=True)
    if not encoded:
        return batch
    where = [i for i, _, _ in encoded]
    decoded = decode_jpegs([data for _, data, _ in encoded], device, library)
    images: list[torch.Tensor | None] = []
    failed: set[int] = set()
    for (i, _, path), image in zip(encoded, decoded, strict=True):
        if isinstance(image, str):  # nvjpeg refused it: PIL, as a worker would have
            log.debug("nvjpeg could not decode %s (%s): decoding it with PIL", path, image)
            try:
                image = _pil(path).to(device)
            except Exception as e:  # load_image's one-line DataError, kept as the failure
                batch["failures"] = [*batch["failures"], (batch["ids"][i], path, error_text(e))]
                failed.add(i)
                image = None
        images.append(image)
    n = len(batch["ids"])
    pixels = torch.empty((n, 3, pre.size, pre.size), dtype=torch.uint8, device=device)
    worker_rows = sorted(set(range(n)) - set(where))
    if worker_rows:
        pixels[worker_rows] = batch["pixels"]
    rows = [i for i, im in zip(where, images, strict=True) if im is not None]
    if rows:
        pixels[rows] = resize_all([im for im in images if im is not None], pre)
    keep = [j for j in range(n) if j not in failed]
    batch["pixels"] = pixels[keep] if failed else pixels
    for key in ("ids", "counts", "valid", "real", "frame_indices"):
        batch[key] = [batch[key][j] for j in keep]
    return batch
