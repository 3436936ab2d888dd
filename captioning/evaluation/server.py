"""Evaluation-server files: COCO caption results named, shaped, complete and zipped as the server takes them.

What the COCO caption evaluation server takes (its upload instructions, cocodataset.org
"Captions Upload", source ``cocodataset/cocodataset.github.io:dataset/captions-upload.htm``; the
server is described in Chen et al. 2015, "Microsoft COCO Captions: Data Collection and Evaluation
Server"): ONE ``results.zip`` holding two JSON files, ``captions_val2014_<alg>_results.json`` and
``captions_test2014_<alg>_results.json`` ("Both sets of results are required for submission"),
each a list of ``{"image_id": int, "caption": str}`` entries (the results format; the caption
toolkit's example ``captions_val2014_fakecap_results.json`` has exactly these two keys).  The
server scores a file against its whole image set, as the toolkit's ``COCOEvalCap`` does unless it is
told to score a subset (its demo sets ``params['image_id']`` to the 1,000 fakecap images and warns to
remove that line "when evaluating the full validation set"): every one of the 40,504 val2014 and
40,775 test2014 images (``captions_val2014.json``; ``image_info_test2014.json``) needs its caption.

``captioning-evaluate ... server=coco`` writes the file of the split it decoded when the split
holds every image of its COCO set that the data know, and refuses before decoding otherwise
(``check_image_set``: how many are missing, which ones, and how to caption the whole set).
Karpathy's val and test splits are 5,000 val2014 images each: no server file, for the server
scores a val2014 file against all 40,504.  The whole sets are captioned from their image files
with the Python API (``image_set_files`` lists a set's images from its COCO json, checked;
``write_coco_results`` writes each file, checked against that json; ``pack`` zips the two into
the upload; docs/configuration.md, "Evaluation-server files").  ``validate_results`` checks any file.
The ``<set>`` of a split is the one its image files name (``COCO_val2014_000000391895.jpg`` ->
``val2014``).
"""

from __future__ import annotations

import json
import logging
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from captioning.errors import ConfigError, DataError
from captioning.utils.io import atomic_write, atomic_write_json, read_json

log = logging.getLogger(__name__)

__all__ = [
    "SERVERS",
    "SERVER_SETS",
    "algorithm_name",
    "check_image_set",
    "check_request",
    "coco_image_set",
    "coco_results_name",
    "image_set_files",
    "pack",
    "read_zip",
    "validate_results",
    "write_coco_results",
]

SERVERS = ("coco",)
#: The image sets the COCO server scores, and their sizes (captions_val2014.json, image_info_test2014.json)
SERVER_SETS = {"val2014": 40504, "test2014": 40775}
_COCO_SET = re.compile(r"(?<![a-z])(train|val|test)(2014|2015|2017)(?![0-9])")
_RESULTS_NAME = re.compile(r"^captions_([a-z]+[0-9]*)_([A-Za-z0-9-]+)_results\.json$")


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


def _set_of(path: str) -> str | None:
    m = _COCO_SET.search(str(path))
    return m.group(0) if m else None


def coco_image_set(image_paths: Iterable[str], split: str) -> str:
    """The COCO image set (``val2014``, ``test2014``, ...) every image path names, else ``split``."""
    sets = {_set_of(p) for p in image_paths}
    if len(sets) > 1:
        named = sorted(s for s in sets if s)
        raise ConfigError(f"split {split!r} mixes images of {named or ['no COCO set']} and others: a server file "
                          f"holds one image set; evaluate each set as its own split")
    return next(iter(sets)) or split


def check_image_set(server: str | None, records: Sequence[Any], split: str) -> tuple[str, list[int]] | None:
    """Before decoding: the COCO set a server file of ``split`` would be for and its image ids, or
    a ``DataError`` (one line) when the file would not be taken: the split's images name no set the
    server scores, or the split lacks images of its set that the data hold (``records``: every
    record of the dataset, all splits; Karpathy's test split is 5,000 of the 40,504 val2014 images)."""
    if server is None:
        return None
    mine = [r for r in records if r.split == split]
    image_set = coco_image_set([r.path for r in mine], split)
    if image_set not in SERVER_SETS:
        raise DataError(f"server={server}: the images of split {split!r} name no COCO set the server scores "
                        f"({' or '.join(SERVER_SETS)}, e.g. COCO_val2014_000000391895.jpg); drop server=")
    whole = {r.source_id for r in records if _set_of(r.path) == image_set}
    missing = sorted(whole - {r.source_id for r in mine})
    if missing:
        raise DataError(
            f"server={server}: the server scores a captions_{image_set} file against every {image_set} image "
            f"({SERVER_SETS[image_set]:,}), but split {split!r} holds {len(mine):,} of the {len(whole):,} {image_set} "
            f"images of this data ({len(missing):,} missing, e.g. ids {missing[:3]}); caption the whole set from its "
            f"images (captioning.evaluation.server.image_set_files, docs/configuration.md#evaluation-server-files) "
            f"or drop server=")
    if len(whole) != SERVER_SETS[image_set]:
        log.warning("server file for %s: this data holds %d of its %d images; check the file against the official "
                    "image list (validate_results(file, '<captions_val2014.json | image_info_test2014.json>')) "
                    "before uploading", image_set, len(whole), SERVER_SETS[image_set])
    return image_set, sorted(whole)


def image_set_files(image_list: str | Path, media_dir: str | Path) -> tuple[list[int], list[Path]]:
    """(image ids, image files) of every image of a COCO json (``captions_val2014.json``,
    ``image_info_test2014.json``: its ``images``' ``id`` and ``file_name``) under ``media_dir``; a
    ``DataError`` (one line) naming how many files are missing, and which."""
    data = read_json(image_list, "image list", hint="the COCO annotations zip holds it (cocodataset.org/#download)")
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list) or not images:
        raise DataError(f"{image_list} has no 'images' list: pass a COCO captions/image-info file")
    ids = [int(im["id"]) for im in images]
    paths = [Path(media_dir, str(im["file_name"])) for im in images]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"{len(missing):,} of the {len(paths):,} images of {image_list} are not in {media_dir} "
                        f"(e.g. {missing[:2]}): unpack the set's images there (cocodataset.org/#download)")
    return ids, paths


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
                       image_set: str, alg: str) -> Path:
    """Write ``captions`` (image id -> caption) as ``<out_dir>/captions_<set>_<alg>_results.json``,
    checked against ``annotations`` (``validate_results``: every image of the set, no other; the
    set's COCO json or its ids).  Returns its path; nothing is written when the check fails.  The
    upload is both sets' files zipped by ``pack``."""
    if image_set not in SERVER_SETS:
        raise DataError(f"image set {image_set!r}: the COCO server scores {' and '.join(SERVER_SETS)} files only")
    entries = [{"image_id": int(i), "caption": captions[i]} for i in sorted(captions)]
    validate_results(entries, annotations)
    return atomic_write_json(Path(out_dir) / coco_results_name(image_set, alg), entries, indent=None)


def pack(files: Sequence[str | Path], zip_path: str | Path = "results.zip") -> Path:
    """Zip the val2014 and the test2014 server file of one method into the upload (the server takes
    both or nothing), each checked first: its name ``captions_<set>_<alg>_results.json`` and its
    entries (``validate_results``)."""
    paths = [Path(f) for f in files]
    for p in paths:
        if not _RESULTS_NAME.match(p.name):
            raise DataError(f"{p}: a server file is named captions_<set>_<alg>_results.json "
                            f"(e.g. captions_val2014_myattn_results.json)")
        validate_results(p)
    named = sorted(_RESULTS_NAME.match(p.name).group(1, 2) for p in paths)  # (set, alg)
    algs = {alg for _, alg in named}
    if [s for s, _ in named] != sorted(SERVER_SETS) or len(algs) != 1:
        raise DataError(f"{[p.name for p in paths]}: the upload holds one captions_test2014_<alg>_results.json and "
                        f"one captions_val2014_<alg>_results.json of the same <alg> (the server takes both or nothing)")
    return _zip(paths, Path(zip_path))


def read_zip(zip_path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The results files of a server zip, by name (to check an upload before sending it)."""
    with zipfile.ZipFile(zip_path) as z:
        return {name: json.loads(z.read(name)) for name in z.namelist()}
