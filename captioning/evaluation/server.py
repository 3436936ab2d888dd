"""Evaluation-server files: COCO caption results named, shaped and zipped the way the server takes them.

The COCO caption evaluation server (Chen et al. 2015, "Microsoft COCO Captions: Data Collection
and Evaluation Server") reads one JSON list per image set, named
``captions_<set>_<alg>_results.json`` (``<set>``: ``val2014`` or ``test2014``; ``<alg>``: your
method's name), each entry exactly ``{"image_id": int, "caption": str}``, ONE caption per image
of the set, uploaded as a zip of those files (the toolkit's own example:
``captions_val2014_fakecap_results.json``).

``captioning-evaluate ... server=coco`` writes that file for the split it decoded, checks it
against the split's image ids (every id exactly once, integer ids, non-empty captions) and
zips it (``results.zip``); ``validate_results`` checks any file (yours too) the same way, and
``pack`` zips several checked files (val2014 + test2014) into one upload.  The ``<set>`` is the
one the split's image files name (``COCO_val2014_000000391895.jpg`` -> ``val2014``; Karpathy's
val and test splits are val2014 images, so their file is a ``val2014`` file holding those 5,000
images), or the split's name when the file names name no COCO set (e.g. the synthetic data).
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from captioning.errors import ConfigError, DataError
from captioning.utils.io import atomic_write, atomic_write_json, read_json

__all__ = [
    "SERVERS",
    "algorithm_name",
    "check_request",
    "coco_image_set",
    "coco_results_name",
    "pack",
    "read_zip",
    "validate_results",
    "write_coco_results",
]

SERVERS = ("coco",)
_COCO_SET = re.compile(r"(?<![a-z])(train|val|test)(2014|2015|2017)(?![0-9])")
_RESULTS_NAME = re.compile(r"^captions_[a-z]+[0-9]*_[A-Za-z0-9-]+_results\.json$")


def check_request(server: str | None, kind: str, max_items: int | None) -> None:
    """Refuse, before any decoding, a server file that could not be complete or is not known."""
    if server is None:
        return
    if server not in SERVERS:
        raise ConfigError(f"server={server!r} is not a known evaluation server: use {', '.join(SERVERS)} "
                          f"(or server=null)")
    if kind != "image":
        raise ConfigError(f"server={server} takes image captions but the data are {kind}s: drop server=")
    if max_items:
        raise ConfigError(f"server={server} needs a caption for every image of the split: unset max_items")


def algorithm_name(name: str) -> str:
    """``name`` as the ``<alg>`` of a server file name: letters, digits and ``-`` (others -> ``-``)."""
    alg = re.sub(r"-+", "-", re.sub(r"[^A-Za-z0-9-]", "-", str(name))).strip("-")
    if not alg:
        raise ConfigError(f"server_alg={name!r} has no letter or digit: name your method, e.g. server_alg=myattn")
    return alg


def coco_image_set(image_paths: Iterable[str], split: str) -> str:
    """The COCO image set (``val2014``, ``test2014``, ...) every image path names, else ``split``."""
    sets = {m.group(0) if (m := _COCO_SET.search(str(p))) else None for p in image_paths}
    if len(sets) > 1:
        named = sorted(s for s in sets if s)
        raise ConfigError(f"split {split!r} mixes images of {named or ['no COCO set']} and others: a server file "
                          f"holds one image set; evaluate each set as its own split")
    return next(iter(sets)) or split


def coco_results_name(image_set: str, alg: str) -> str:
    """``captions_<set>_<alg>_results.json``."""
    return f"captions_{image_set}_{algorithm_name(alg)}_results.json"


def _expected_ids(annotations: str | Path | Iterable[int]) -> tuple[set[int], str]:
    """The image ids of a COCO annotation file (its ``images``) or of an iterable, and a name for them."""
    if isinstance(annotations, (str, Path)):
        data = read_json(annotations, "annotation file")
        images = data.get("images") if isinstance(data, dict) else None
        if not isinstance(images, list):
            raise DataError(f"{annotations} has no 'images' list: pass a COCO captions/image-info file")
        return {int(im["id"]) for im in images}, str(annotations)
    return {int(i) for i in annotations}, "the split"


def validate_results(results: str | Path | Sequence[Any], annotations: str | Path | Iterable[int] | None = None,
                     ) -> list[dict[str, Any]]:
    """Check a COCO caption results file (path) or list: entries exactly ``{"image_id": int,
    "caption": non-empty str}``, each id once and, with ``annotations`` (a COCO json or the ids),
    every image of it and no other.  Returns the entries; a ``DataError`` (one line) otherwise."""
    where = str(results) if isinstance(results, (str, Path)) else "results"
    entries = read_json(results, "results file") if isinstance(results, (str, Path)) else results
    if not isinstance(entries, list):
        raise DataError(f"{where}: a results file is a JSON list of {{'image_id', 'caption'}} entries")
    seen: set[int] = set()
    for n, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) != {"image_id", "caption"}:
            keys = sorted(e) if isinstance(e, dict) else type(e).__name__
            raise DataError(f"{where}: entry {n} has {keys}; each entry holds exactly image_id and caption")
        i, c = e["image_id"], e["caption"]
        if not isinstance(i, int) or isinstance(i, bool):
            raise DataError(f"{where}: entry {n} has image_id {i!r}; image ids are integers (the COCO ids)")
        if not isinstance(c, str) or not c.strip():
            raise DataError(f"{where}: image {i} has caption {c!r}; every caption is a non-empty string")
        if i in seen:
            raise DataError(f"{where}: image {i} has two captions; the server takes one caption per image")
        seen.add(i)
    if annotations is not None:
        want, source = _expected_ids(annotations)
        missing, extra = sorted(want - seen), sorted(seen - want)
        if missing or extra:
            raise DataError(f"{where}: {len(missing)} image(s) of {source} have no caption (e.g. {missing[:3]}) and "
                            f"{len(extra)} caption(s) are for images not in it (e.g. {extra[:3]}); caption every "
                            f"image of the set, and only those")
    return list(entries)


def _zip(files: Sequence[Path], zip_path: Path) -> Path:
    def write(tmp: Path) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for f in files:
                z.write(f, arcname=f.name)  # at the zip's root, as the server unpacks it

    return atomic_write(zip_path, write)


def write_coco_results(captions: Mapping[int, str], annotations: str | Path | Iterable[int], out_dir: str | Path,
                       image_set: str, alg: str) -> tuple[Path, Path]:
    """Write ``captions`` (image id -> caption) as ``<out_dir>/captions_<set>_<alg>_results.json``,
    checked against ``annotations`` (``validate_results``), and ``<out_dir>/results.zip`` holding it.
    Returns (json path, zip path); nothing is written when the check fails."""
    entries = [{"image_id": int(i), "caption": captions[i]} for i in sorted(captions)]
    validate_results(entries, annotations)
    path = atomic_write_json(Path(out_dir) / coco_results_name(image_set, alg), entries, indent=None)
    return path, _zip([path], Path(out_dir) / "results.zip")


def pack(files: Sequence[str | Path], zip_path: str | Path = "results.zip") -> Path:
    """Zip server files (e.g. the val2014 and the test2014 one) into one upload, each checked first:
    its name ``captions_<set>_<alg>_results.json`` and its entries (``validate_results``)."""
    paths = [Path(f) for f in files]
    for p in paths:
        if not _RESULTS_NAME.match(p.name):
            raise DataError(f"{p}: a server file is named captions_<set>_<alg>_results.json "
                            f"(e.g. captions_val2014_myattn_results.json)")
        validate_results(p)
    if len({p.name for p in paths}) != len(paths):
        raise DataError(f"two files named alike in {[str(p) for p in paths]}: the zip holds each name once")
    return _zip(paths, Path(zip_path))


def read_zip(zip_path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The results files of a server zip, by name (to check an upload before sending it)."""
    with zipfile.ZipFile(zip_path) as z:
        return {name: json.loads(z.read(name)) for name in z.namelist()}
