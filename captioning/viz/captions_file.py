"""``captions.json`` of ``captioning-caption``: its schema, its validation, writing and reading it.

``captions.json`` is a prediction file (``captioning.predictions``): a JSON list with one entry per
input, whose attention weights are rows of one float16 ``attention.npy`` beside it::

    {"input": "photos/cat.jpg", "kind": "image", "caption": "a cat on a mat",
     "tokens": ["a", "cat", "on", "a", "mat"], "token_log_probs": [-0.3, -1.2, -0.8, -0.2, -0.9, -0.1],
     "attention": [0, 5], "attention_shape": [7, 7], "figure": "figures/0000_cat.png", "score": -3.5}

``attention`` is ``[start, stop]``: rows ``start + i`` of ``attention.npy`` hold the weights used to
emit ``tokens[i]``: for an image, the row-major flattened ``H x W`` feature grid
(``attention_shape = [H, W]``), or for image regions (imported detector features) one weight per
region (``attention_shape = [n]``, ``attention_width = n`` when items have different counts) with,
when known, their pixel ``boxes`` ``[[x1, y1, x2, y2], ...]`` and the ``image_size`` ``[W, H]`` they
lie in; for a video, one weight per sampled frame (``attention_shape = [K]``) with the original frame
numbers in ``frame_indices``.  ``token_log_probs``: each word's log-probability under the model,
then <eos>'s when the caption ended with it.  ``read_captions`` gives the entries with ``attention``
as ``[T, N]`` float32 arrays (files with the weights inline, as written before, read the same).  A
failed input is ``{"input": ..., "kind": ..., "error": "one line"}`` (other keys optional).

Entries in memory (``captioning.viz.gallery.make_entry``, or read back) hold ``attention`` as rows (an
array or lists); ``captions_errors`` checks either form, and the weights of rows.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from captioning.errors import DataError
from captioning.predictions import ATTENTION_FILE, read_predictions, write_predictions

__all__ = ["CAPTIONS_SCHEMA", "captions_errors", "read_captions", "validate_captions", "write_captions_json"]

SUCCESS_KEYS = ["caption", "tokens", "attention", "attention_shape", "figure"]

_ROWS = {"type": "array", "items": {"type": "array", "items": {"type": "number", "minimum": 0}}}
_SPAN = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2, "maxItems": 2}

CAPTIONS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.invalid/captioning/captions.schema.json",
    "title": "captions.json written by captioning-caption",
    "type": "array",
    "items": {"$ref": "#/$defs/entry"},
    "$defs": {
        "entry": {
            "type": "object",
            "required": ["input", "kind"],
            "properties": {
                "input": {"type": "string", "minLength": 1},
                "kind": {"enum": ["image", "video"]},
                "caption": {"type": "string"},
                "tokens": {"type": "array", "items": {"type": "string"}},
                "token_log_probs": {"type": "array", "items": {"type": "number", "maximum": 0}},
                # rows [start, stop] of attention.npy, or (files of older versions) the rows inline; null: none (errors)
                "attention": {"anyOf": [_SPAN, _ROWS, {"type": "null"}]},
                "attention_width": {"type": "integer", "minimum": 1},
                "attention_shape": {"type": "array", "items": {"type": "integer", "minimum": 1},
                                    "minItems": 1, "maxItems": 2},
                "frame_indices": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "boxes": {"type": "array",
                          "items": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4}},
                "image_size": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 2,
                               "maxItems": 2},
                "figure": {"type": "string", "minLength": 1},
                "error": {"type": "string", "minLength": 1},
            },
            "allOf": [
                {  # a successful entry carries the caption, its attention and its figure
                    "if": {"not": {"required": ["error"]}},
                    "then": {"required": SUCCESS_KEYS},
                },
                {  # image attention is a 2-D grid or 1-D over regions; frame indices make no sense
                    "if": {"required": ["kind"], "properties": {"kind": {"const": "image"}}},
                    "then": {"properties": {"attention_shape": {"minItems": 1, "maxItems": 2}},
                             "not": {"required": ["frame_indices"]}},
                },
                {  # boxes are image regions: one per weight of a 1-D attention
                    "if": {"anyOf": [{"required": ["boxes"]}, {"required": ["image_size"]}]},
                    "then": {"properties": {"kind": {"const": "image"},
                                            "attention_shape": {"minItems": 1, "maxItems": 1}}},
                },
                {  # video attention is one weight per sampled frame, whose numbers are listed
                    "if": {"required": ["kind"], "properties": {"kind": {"const": "video"}}},
                    "then": {"properties": {"attention_shape": {"minItems": 1, "maxItems": 1}}},
                },
                {
                    "if": {"required": ["kind"], "properties": {"kind": {"const": "video"}},
                           "not": {"required": ["error"]}},
                    "then": {"required": ["frame_indices"]},
                },
            ],
        }
    },
}


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------


def _is_int(x: Any) -> bool:
    """JSON Schema's "integer": an int, or a float with no fractional part (7.0); never a bool."""
    if isinstance(x, bool):
        return False
    return isinstance(x, int) or (isinstance(x, float) and x.is_integer())


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_span(a: Any) -> bool:
    return isinstance(a, list) and len(a) == 2 and all(_is_int(x) and x >= 0 for x in a)


def _file_form(entry: Any) -> Any:
    """The entry as JSON holds it: attention rows held as an array become a span (checked apart)."""
    if isinstance(entry, Mapping) and isinstance(entry.get("attention"), np.ndarray):
        return {**entry, "attention": [0, int(entry["attention"].shape[0])]}
    return entry


def _structure_errors_fallback(entry: Any) -> list[str]:
    """Hand-written equivalent of ``CAPTIONS_SCHEMA`` for one entry (used without jsonschema)."""
    if not isinstance(entry, Mapping):
        return [f"entry must be an object, got {type(entry).__name__}"]
    errs = [f"missing required key {key!r}" for key in ("input", "kind") if key not in entry]
    has_error = "error" in entry
    if not has_error:
        errs += [f"missing required key {k!r}" for k in SUCCESS_KEYS if k not in entry]
    kind = entry.get("kind")
    if "kind" in entry and kind not in ("image", "video"):
        errs.append(f"'kind' must be 'image' or 'video', got {kind!r}")
    for key in ("input", "figure", "error"):
        if key in entry and not (isinstance(entry[key], str) and entry[key]):
            errs.append(f"{key!r} must be a non-empty string")
    if "caption" in entry and not isinstance(entry["caption"], str):
        errs.append("'caption' must be a string")
    if "tokens" in entry and not (isinstance(entry["tokens"], list) and all(isinstance(x, str) for x in entry["tokens"])):
        errs.append("'tokens' must be a list of strings")
    lps = entry.get("token_log_probs", [])
    if not (isinstance(lps, list) and all(_is_number(x) and x <= 0 for x in lps)):
        errs.append("'token_log_probs' must be a list of numbers <= 0")
    if entry.get("attention") is not None and not _is_span(entry["attention"]):
        a = entry["attention"]
        if not isinstance(a, list) or not all(isinstance(r, list) for r in a):
            errs.append("'attention' must be [start, stop] rows of attention.npy (or a list of lists of numbers)")
        elif not all(_is_number(x) and x >= 0 for r in a for x in r):
            errs.append("'attention' weights must be numbers >= 0")
    if "attention_width" in entry and not (_is_int(entry["attention_width"]) and entry["attention_width"] >= 1):
        errs.append("'attention_width' must be a positive integer")
    if "attention_shape" in entry:
        s = entry["attention_shape"]
        lo, hi = {"image": (1, 2), "video": (1, 1)}.get(kind, (1, 2))
        if not isinstance(s, list) or not all(_is_int(x) and x >= 1 for x in s):
            errs.append("'attention_shape' must be a list of positive integers")
        elif not lo <= len(s) <= hi:
            errs.append(f"'attention_shape' of a {kind or 'any'} entry must have {lo}..{hi} dims, got {len(s)}")
    if "frame_indices" in entry:
        f = entry["frame_indices"]
        if not isinstance(f, list) or not all(_is_int(x) and x >= 0 for x in f):
            errs.append("'frame_indices' must be a list of integers >= 0")
        if kind == "image":
            errs.append("'frame_indices' is only allowed for video entries")
    elif kind == "video" and not has_error:
        errs.append("missing required key 'frame_indices' (video)")
    return errs + _region_structure_errors(entry)


def _region_structure_errors(entry: Mapping[str, Any]) -> list[str]:
    """The fallback's checks of ``boxes`` / ``image_size`` (image regions only)."""
    errs: list[str] = []
    if "boxes" in entry:
        b = entry["boxes"]
        if not isinstance(b, list) or not all(isinstance(r, list) and len(r) == 4 and all(map(_is_number, r))
                                              for r in b):
            errs.append("'boxes' must be a list of [x1, y1, x2, y2] numbers")
    if "image_size" in entry:
        s = entry["image_size"]
        if not isinstance(s, list) or len(s) != 2 or not all(_is_int(x) and x >= 1 for x in s):
            errs.append("'image_size' must be [W, H] (positive integers)")
    if ("boxes" in entry or "image_size" in entry) and (
            entry.get("kind") != "image" or len(entry.get("attention_shape") or [0, 0]) != 1):
        errs.append("'boxes' / 'image_size' belong to image entries with a 1-D attention_shape (regions)")
    return errs


def _structure_errors_jsonschema(entry: Any, validator: Any) -> list[str]:
    out = []
    for e in sorted(validator.iter_errors(entry), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in e.absolute_path)
        out.append(f"{where + ': ' if where else ''}{e.message}")
    return out


def _entry_validator() -> Any | None:
    try:
        import jsonschema
    except ImportError:
        return None
    schema = dict(CAPTIONS_SCHEMA["$defs"]["entry"])
    schema["$schema"] = CAPTIONS_SCHEMA["$schema"]
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _attention_errors(entry: Mapping[str, Any], n: int) -> list[str]:
    """The attention against the tokens and ``n = prod(attention_shape)`` weights per row: a span's
    length (its weights are checked when read), or the rows' count, widths and values."""
    att, tokens = entry["attention"], entry["tokens"]
    if _is_span(att):
        errs = [] if att[1] - att[0] == len(tokens) else [
            f"{len(tokens)} tokens but attention rows {att[0]}:{att[1]} (need one row per token)"]
        width = entry.get("attention_width")
        if width is not None and width != n:
            errs.append(f"attention_width {width} but attention_shape {list(entry['attention_shape'])} needs {n}")
        return errs
    if att is None:
        return ["no attention rows (a model without attention gets uniform weights)"]
    errs = []
    if len(tokens) != len(att):
        errs.append(f"{len(tokens)} tokens but {len(att)} attention rows (need one row per token)")
    widths = [len(r) for r in att] if isinstance(att, list) else [int(np.shape(att)[-1])] * len(att)
    bad = [i for i, w in enumerate(widths) if w != n]
    if bad:
        return errs + [f"attention row {bad[0]} has {widths[bad[0]]} weights, attention_shape "
                       f"{list(entry['attention_shape'])} needs {n}"]
    rows = np.asarray(att, dtype=np.float64)
    if not np.isfinite(rows).all():
        errs.append("attention contains NaN or infinity")
    elif rows.size and rows.min() < 0:
        errs.append("'attention' weights must be numbers >= 0")
    return errs


def _semantic_errors(entry: Mapping[str, Any]) -> list[str]:
    """Checks a JSON schema cannot express: counts, row lengths, finite weights, safe figure path."""
    errs: list[str] = []
    if "figure" in entry and isinstance(entry["figure"], str):
        fig = entry["figure"]
        parts = PurePosixPath(fig.replace("\\", "/")).parts
        if fig.startswith(("/", "\\")) or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", fig) or ".." in parts:
            errs.append(f"'figure' must be a relative path inside the output folder, got {fig!r}")
    if "error" in entry:
        return errs
    shape = entry["attention_shape"]
    errs += _attention_errors(entry, math.prod(shape))
    lps = entry.get("token_log_probs")
    if lps is not None and len(lps) not in (len(entry["tokens"]), len(entry["tokens"]) + 1):
        errs.append(f"{len(lps)} token_log_probs for {len(entry['tokens'])} tokens (one per token, then <eos>'s)")
    if entry.get("kind") == "video" and len(entry["frame_indices"]) != shape[0]:
        errs.append(f"{len(entry['frame_indices'])} frame_indices but attention_shape {shape} has {shape[0]} frames")
    boxes = entry.get("boxes")
    if boxes is not None and len(boxes) != shape[0]:
        errs.append(f"{len(boxes)} boxes but attention_shape {shape} has {shape[0]} regions")
    if boxes is not None and any(b[2] < b[0] or b[3] < b[1] for b in boxes):
        errs.append("a box has x2 < x1 or y2 < y1 (boxes are [x1, y1, x2, y2])")
    return errs


def captions_errors(entries: Any, *, use_jsonschema: bool = True) -> list[str]:
    """All problems of a ``captions.json`` list, each as ``"entry N (input): message"``; [] if valid.

    Structure is checked against ``CAPTIONS_SCHEMA`` (with ``jsonschema`` when installed and
    ``use_jsonschema``, else a hand-written equivalent); then per entry: one attention row per token,
    every row has prod(attention_shape) weights, weights are finite and >= 0 (rows held in memory),
    video frame_indices match attention_shape, and the figure path is relative without ``..``.
    """
    if not isinstance(entries, list):
        return [f"captions must be a JSON list of entries, got {type(entries).__name__}"]
    validator = _entry_validator() if use_jsonschema else None
    problems: list[str] = []
    for i, entry in enumerate(entries):
        form = _file_form(entry)
        errs = (_structure_errors_jsonschema(form, validator) if validator is not None
                else _structure_errors_fallback(form))
        if not errs:
            errs = _semantic_errors(entry)
        name = entry.get("input") if isinstance(entry, Mapping) else None
        label = f"entry {i}" + (f" ({name!r})" if isinstance(name, str) else "")
        problems += [f"{label}: {e}" for e in errs]
    return problems


def validate_captions(entries: Any, *, source: str = "captions", use_jsonschema: bool = True) -> None:
    """Raise ``DataError`` naming the first problems if ``entries`` is not a valid captions.json list."""
    problems = captions_errors(entries, use_jsonschema=use_jsonschema)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise DataError(f"{source} is not valid captions.json: " + "; ".join(problems[:3]) + more)


# ----------------------------------------------------------------------------------------------
# writing and reading
# ----------------------------------------------------------------------------------------------


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if hasattr(obj, "detach"):  # torch tensor
        obj = obj.detach().cpu().numpy()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return obj.as_posix()
    if isinstance(obj, (list, tuple)):
        return [_jsonable(x) for x in obj]
    return obj


def _as_rows(att: Any) -> Any:
    """Attention rows as they are (an array, lists) or a tensor's as an array."""
    return att.detach().float().cpu().numpy() if hasattr(att, "detach") else att


def _rows(entry: Mapping[str, Any]) -> np.ndarray | None:
    att = entry.get("attention")
    if "error" in entry or att is None:
        return None
    a = np.asarray(att, dtype=np.float32)
    return a.reshape(len(a), -1) if a.size else np.zeros((len(a), math.prod(entry["attention_shape"])), np.float32)


def write_captions_json(entries: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Validate and atomically write ``captions.json`` and its ``attention.npy`` (strict JSON: no NaN).

    ``entries`` hold their attention as rows (``[T, N]`` arrays, tensors or lists); numpy values and
    torch tensors elsewhere in entries are converted to lists / numbers.  Raises ``DataError``
    (nothing written) when an entry is invalid.  Both files are readable by others (0644: outputs
    are meant to be shared and served).
    """
    entries = [{k: (_as_rows(v) if k == "attention" else _jsonable(v)) for k, v in e.items()} for e in entries]
    validate_captions(entries, source=str(path))
    data = [{k: v for k, v in e.items() if k != "attention"} for e in entries]
    try:
        json.dumps(data, allow_nan=False)
    except ValueError as e:
        raise DataError(f"{path}: an entry holds a value JSON cannot (NaN or infinity: {e}); nothing written") from None
    path = Path(path)
    out = write_predictions(path.parent, data, [_rows(e) for e in entries], name=path.name)
    for written in (out, path.parent / ATTENTION_FILE):
        if written.is_file():
            os.chmod(written, 0o644)  # the atomic temp file was 0600
    return out


def read_captions(path: str | Path) -> list[dict[str, Any]]:
    """The entries of ``captions.json``, ``attention`` as ``[T, N]`` float32 arrays (``read_predictions``)."""
    return read_predictions(path)
