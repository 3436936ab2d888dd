"""Output layer of ``captioning-caption``: ``captions.json`` (schema + validation) and ``index.html``.

``captions.json`` is a JSON list with one entry per input::

    {"input": "photos/cat.jpg", "kind": "image", "caption": "a cat on a mat",
     "tokens": ["a", "cat", "on", "a", "mat"],
     "attention": [[...49 floats...], ...one row per token...], "attention_shape": [7, 7],
     "figure": "figures/0000_cat.png"}

``attention[i]`` holds the weights used to emit ``tokens[i]``: for an image, the row-major flattened
``H x W`` feature grid (``attention_shape = [H, W]``), or for image regions (imported detector
features) one weight per region (``attention_shape = [n]``) with, when known, their pixel ``boxes``
``[[x1, y1, x2, y2], ...]`` and the ``image_size`` ``[W, H]`` they lie in; for a video, one weight per
sampled frame (``attention_shape = [K]``) with the original frame numbers in ``frame_indices``. A
failed input is ``{"input": ..., "kind": ..., "error": "one line"}`` (other keys optional).

``write_gallery`` turns captions (``captioning.caption.api.CaptionResult``) into the output folder of
``captioning-caption``: ``figures/<NNNN>_<name>.png``, ``captions.json`` and ``index.html``.
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from captioning.errors import CaptioningError, DataError
from captioning.utils.io import atomic_write
from captioning.viz.heatmaps import plot_result

log = logging.getLogger(__name__)

__all__ = [
    "CAPTIONS_SCHEMA",
    "make_entry",
    "error_entry",
    "figure_name",
    "captions_errors",
    "validate_captions",
    "write_captions_json",
    "write_index_html",
    "result_entry",
    "write_gallery",
    "error_line",
]

FIGURES_DIR = "figures"

_SUCCESS_KEYS = ["caption", "tokens", "attention", "attention_shape", "figure"]

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
                "attention": {
                    "type": "array",
                    "items": {"type": "array", "items": {"type": "number", "minimum": 0}},
                },
                "attention_shape": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1},
                    "minItems": 1,
                    "maxItems": 2,
                },
                "frame_indices": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "boxes": {
                    "type": "array",
                    "items": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4},
                },
                "image_size": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 1},
                    "minItems": 2,
                    "maxItems": 2,
                },
                "figure": {"type": "string", "minLength": 1},
                "error": {"type": "string", "minLength": 1},
            },
            "allOf": [
                {  # a successful entry carries the caption, its attention and its figure
                    "if": {"not": {"required": ["error"]}},
                    "then": {"required": _SUCCESS_KEYS},
                },
                {  # image attention is a 2-D grid or 1-D over regions; frame indices make no sense
                    "if": {"required": ["kind"], "properties": {"kind": {"const": "image"}}},
                    "then": {
                        "properties": {"attention_shape": {"minItems": 1, "maxItems": 2}},
                        "not": {"required": ["frame_indices"]},
                    },
                },
                {  # boxes are image regions: one per weight of a 1-D attention
                    "if": {"anyOf": [{"required": ["boxes"]}, {"required": ["image_size"]}]},
                    "then": {
                        "properties": {"kind": {"const": "image"},
                                       "attention_shape": {"minItems": 1, "maxItems": 1}},
                    },
                },
                {  # video attention is one weight per sampled frame, whose numbers are listed
                    "if": {"required": ["kind"], "properties": {"kind": {"const": "video"}}},
                    "then": {"properties": {"attention_shape": {"minItems": 1, "maxItems": 1}}},
                },
                {
                    "if": {
                        "required": ["kind"],
                        "properties": {"kind": {"const": "video"}},
                        "not": {"required": ["error"]},
                    },
                    "then": {"required": ["frame_indices"]},
                },
            ],
        }
    },
}


# ----------------------------------------------------------------------------------------------
# building entries
# ----------------------------------------------------------------------------------------------


def _round(x: float) -> float:
    return float(f"{float(x):.6g}")


def make_entry(
    input: str,
    tokens: Sequence[str],
    attention: Any,
    *,
    kind: str,
    figure: str,
    attention_shape: Sequence[int] | None = None,
    frame_indices: Sequence[int] | None = None,
    caption: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Build one successful ``captions.json`` entry from model outputs.

    attention: [T, h*w] / [T, h, w] (image) or [T, K] (video), numpy or torch (moved to CPU);
    attention_shape defaults to [h, w] for a 3-D image attention, else [K] for video; an image
    with a flat [T, N] attention needs ``attention_shape``. Weights are stored with 6
    significant digits. ``extra`` keys (e.g. ``score``) are copied as they are.
    """
    if hasattr(attention, "detach"):
        attention = attention.detach().float().cpu().numpy()
    a = np.asarray(attention, dtype=np.float64)
    if a.ndim == 3:
        shape = list(a.shape[1:]) if attention_shape is None else [int(s) for s in attention_shape]
        a = a.reshape(a.shape[0], -1)
    elif a.ndim == 2:
        if attention_shape is None:
            if kind == "image":
                raise ValueError("image attention given as [T, N]: pass attention_shape=[h, w]")
            shape = [a.shape[1]]
        else:
            shape = [int(s) for s in attention_shape]
    elif a.ndim == 1 and a.size == 0:  # empty caption
        a = a.reshape(0, 0)
        shape = [int(s) for s in attention_shape] if attention_shape is not None else []
    else:
        raise ValueError(f"attention must be [T, N] or [T, h, w], got shape {a.shape}")
    tokens = [str(t) for t in tokens]
    entry: dict[str, Any] = {
        "input": str(input),
        "kind": kind,
        "caption": caption if caption is not None else " ".join(tokens),
        "tokens": tokens,
        "attention": [[_round(x) for x in row] for row in a],
        "attention_shape": shape,
    }
    if frame_indices is not None:
        entry["frame_indices"] = [int(f) for f in frame_indices]
    entry["figure"] = str(figure)
    entry.update(extra)
    return entry


def error_entry(input: str, kind: str, error: str | BaseException, **extra: Any) -> dict[str, Any]:
    """A ``captions.json`` entry for an input that could not be captioned (one-line error)."""
    msg = (
        str(error) if not isinstance(error, BaseException) else (str(error) or type(error).__name__)
    )
    msg = " ".join(msg.split()) or "unknown error"
    return {"input": str(input), "kind": kind, "error": msg, **extra}


def figure_name(input: str, index: int, suffix: str = ".png") -> str:
    """A safe, unique file name for the figure of input number ``index``: ``0007_cat_photo.png``."""
    stem = PurePosixPath(str(input).replace("\\", "/")).stem
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._-")[:60] or "input"
    return f"{index:04d}_{slug}{suffix}"


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


def _structure_errors_fallback(entry: Any) -> list[str]:
    """Hand-written equivalent of ``CAPTIONS_SCHEMA`` for one entry (used without jsonschema)."""
    if not isinstance(entry, Mapping):
        return [f"entry must be an object, got {type(entry).__name__}"]
    errs: list[str] = []
    for key in ("input", "kind"):
        if key not in entry:
            errs.append(f"missing required key {key!r}")
    has_error = "error" in entry
    if not has_error:
        errs += [f"missing required key {k!r}" for k in _SUCCESS_KEYS if k not in entry]
    kind = entry.get("kind")
    if "kind" in entry and kind not in ("image", "video"):
        errs.append(f"'kind' must be 'image' or 'video', got {kind!r}")
    for key in ("input", "figure", "error"):
        if key in entry and not (isinstance(entry[key], str) and entry[key]):
            errs.append(f"{key!r} must be a non-empty string")
    if "caption" in entry and not isinstance(entry["caption"], str):
        errs.append("'caption' must be a string")
    if "tokens" in entry:
        t = entry["tokens"]
        if not isinstance(t, list) or not all(isinstance(x, str) for x in t):
            errs.append("'tokens' must be a list of strings")
    if "attention" in entry:
        a = entry["attention"]
        if not isinstance(a, list) or not all(isinstance(r, list) for r in a):
            errs.append("'attention' must be a list of lists of numbers")
        elif not all(_is_number(x) and x >= 0 for r in a for x in r):
            errs.append("'attention' weights must be numbers >= 0")
    if "attention_shape" in entry:
        s = entry["attention_shape"]
        lo, hi = {"image": (1, 2), "video": (1, 1)}.get(kind, (1, 2))
        if not isinstance(s, list) or not all(_is_int(x) and x >= 1 for x in s):
            errs.append("'attention_shape' must be a list of positive integers")
        elif not lo <= len(s) <= hi:
            errs.append(
                f"'attention_shape' of a {kind or 'any'} entry must have {lo}..{hi} dims, got {len(s)}"
            )
    if "frame_indices" in entry:
        f = entry["frame_indices"]
        if not isinstance(f, list) or not all(_is_int(x) and x >= 0 for x in f):
            errs.append("'frame_indices' must be a list of integers >= 0")
        if kind == "image":
            errs.append("'frame_indices' is only allowed for video entries")
    elif kind == "video" and not has_error:
        errs.append("missing required key 'frame_indices' (video)")
    errs += _region_structure_errors(entry)
    return errs


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


def _semantic_errors(entry: Mapping[str, Any]) -> list[str]:
    """Checks a JSON schema cannot express: counts, row lengths, finite weights, safe figure path."""
    errs: list[str] = []
    if "figure" in entry and isinstance(entry["figure"], str):
        fig = entry["figure"]
        parts = PurePosixPath(fig.replace("\\", "/")).parts
        if (
            fig.startswith(("/", "\\"))
            or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", fig)
            or ".." in parts
        ):
            errs.append(f"'figure' must be a relative path inside the output folder, got {fig!r}")
    if "error" in entry:
        return errs
    tokens, att, shape = entry["tokens"], entry["attention"], entry["attention_shape"]
    if len(tokens) != len(att):
        errs.append(f"{len(tokens)} tokens but {len(att)} attention rows (need one row per token)")
    n = math.prod(shape)
    bad = [i for i, row in enumerate(att) if len(row) != n]
    if bad:
        errs.append(
            f"attention row {bad[0]} has {len(att[bad[0]])} weights, attention_shape {shape} needs {n}"
        )
    if any(not math.isfinite(x) for row in att for x in row):
        errs.append("attention contains NaN or infinity")
    if entry.get("kind") == "video" and len(entry["frame_indices"]) != shape[0]:
        errs.append(
            f"{len(entry['frame_indices'])} frame_indices but attention_shape {shape} has {shape[0]} frames"
        )
    boxes = entry.get("boxes")
    if boxes is not None and len(boxes) != shape[0]:
        errs.append(f"{len(boxes)} boxes but attention_shape {shape} has {shape[0]} regions")
    if boxes is not None and any(b[2] < b[0] or b[3] < b[1] for b in boxes):
        errs.append("a box has x2 < x1 or y2 < y1 (boxes are [x1, y1, x2, y2])")
    return errs


def captions_errors(entries: Any, *, use_jsonschema: bool = True) -> list[str]:
    """All problems of a ``captions.json`` list, each as ``"entry N (input): message"``; [] if valid.

    Structure is checked against ``CAPTIONS_SCHEMA`` (with ``jsonschema`` when installed and
    ``use_jsonschema``, else a hand-written equivalent); then per entry: len(tokens) ==
    len(attention), every row has prod(attention_shape) weights, weights are finite, video
    frame_indices match attention_shape, and the figure path is relative without ``..``.
    """
    if not isinstance(entries, list):
        return [f"captions must be a JSON list of entries, got {type(entries).__name__}"]
    validator = _entry_validator() if use_jsonschema else None
    problems: list[str] = []
    for i, entry in enumerate(entries):
        if validator is not None:
            errs = _structure_errors_jsonschema(entry, validator)
        else:
            errs = _structure_errors_fallback(entry)
        if not errs:
            errs = _semantic_errors(entry)
        name = entry.get("input") if isinstance(entry, Mapping) else None
        label = f"entry {i}" + (f" ({name!r})" if isinstance(name, str) else "")
        problems += [f"{label}: {e}" for e in errs]
    return problems


def validate_captions(
    entries: Any, *, source: str = "captions", use_jsonschema: bool = True
) -> None:
    """Raise ``DataError`` naming the first problems if ``entries`` is not a valid captions.json list."""
    problems = captions_errors(entries, use_jsonschema=use_jsonschema)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise DataError(f"{source} is not valid captions.json: " + "; ".join(problems[:3]) + more)


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


def _write_text(path: str | Path, text: str) -> Path:
    def write(p: Path) -> None:
        p.write_text(text, encoding="utf-8")
        os.chmod(p, 0o644)  # the atomic temp file is 0600; outputs are meant to be shared/served

    return atomic_write(path, write)


def write_captions_json(entries: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Validate and atomically write ``captions.json`` (one entry per line, strict JSON: no NaN).

    numpy arrays / scalars and torch tensors in entries are converted to lists / numbers.
    Raises ``DataError`` (nothing written) when an entry is invalid.
    """
    data = [_jsonable(e) for e in entries]
    validate_captions(data, source=str(path))
    body = ",\n".join(json.dumps(e, ensure_ascii=False, allow_nan=False) for e in data)
    return _write_text(path, "[\n" + body + "\n]\n" if data else "[]\n")


# ----------------------------------------------------------------------------------------------
# HTML gallery
# ----------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5rem;
       color: #1d1d1f; background: #fafafa; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
.summary { color: #555; margin-bottom: 1.2rem; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 8px; padding: 1rem;
        margin-bottom: 1.5rem; }
.card h2 { font-size: 1rem; font-weight: 600; margin: 0 0 .3rem; word-break: break-all; }
.kind { display: inline-block; font-size: .75rem; padding: 0 .4rem; border-radius: 4px;
        background: #e6eefc; color: #234; margin-left: .4rem; vertical-align: middle; }
.caption { font-size: 1.3rem; margin: .3rem 0 .8rem; }
.meta { color: #666; font-size: .85rem; }
.card img { max-width: 100%; height: auto; border: 1px solid #eee; }
.missing { color: #a00; font-style: italic; }
table.failed { border-collapse: collapse; width: 100%; background: #fff; }
table.failed td, table.failed th { border: 1px solid #ddd; padding: .4rem .6rem; text-align: left;
        vertical-align: top; word-break: break-word; }
table.failed th { background: #fbeaea; }
"""


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _safe_rel(fig: Any) -> str | None:
    if not isinstance(fig, str) or not fig:
        return None
    norm = fig.replace("\\", "/")
    if (
        norm.startswith("/")
        or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", norm)
        or ".." in PurePosixPath(norm).parts
    ):
        return None
    return norm


def write_index_html(
    entries: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    title: str = "Captions",
    *,
    captions_json: str | None = "captions.json",
) -> Path:
    """Write ``out_dir/index.html``: every caption with its figure, then the failed inputs.

    Figures are linked by their relative path (URL-quoted, so odd file names work); all text is
    HTML-escaped; the page is self-contained (inline CSS, no scripts, no external resources).
    Returns the path of index.html.
    """
    out_dir = Path(out_dir)
    ok = [e for e in entries if "error" not in e]
    failed = [e for e in entries if "error" in e]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{_esc(title)}</h1>",
    ]
    summary = f"{len(ok)} captioned, {len(failed)} failed"
    if captions_json:
        link = _esc(urllib.parse.quote(captions_json, safe="/"))
        summary += f' &middot; data: <a href="{link}">{_esc(captions_json)}</a>'
    parts.append(f'<p class="summary">{summary}</p>')
    if failed:
        parts.append('<p class="summary"><a href="#failed">jump to failed inputs</a></p>')

    for i, e in enumerate(ok):
        kind = e.get("kind", "")
        parts.append(f'<div class="card" id="item-{i}">')
        parts.append(f'<h2>{_esc(e.get("input", "?"))}<span class="kind">{_esc(kind)}</span></h2>')
        parts.append(f'<p class="caption">{_esc(e.get("caption", ""))}</p>')
        meta = []
        if isinstance(e.get("score"), (int, float)) and not isinstance(e.get("score"), bool):
            meta.append(f"score {float(e['score']):.3f}")
        if e.get("attention_shape"):
            meta.append("attention " + " &times; ".join(_esc(s) for s in e["attention_shape"]))
        if meta:
            parts.append(f'<p class="meta">{" &middot; ".join(meta)}</p>')
        rel = _safe_rel(e.get("figure"))
        if rel is None:
            parts.append('<p class="missing">no figure</p>')
        else:
            src = _esc(urllib.parse.quote(rel, safe="/"))
            if (out_dir / rel).is_file():
                parts.append(
                    f'<a href="{src}"><img src="{src}" loading="lazy" '
                    f'alt="{_esc("attention for: " + str(e.get("caption", "")))}"></a>'
                )
            else:
                parts.append(f'<p class="missing">figure not found: {_esc(rel)}</p>')
        parts.append("</div>")

    if failed:
        parts.append('<h2 id="failed">Failed inputs</h2>')
        parts.append('<table class="failed"><tr><th>input</th><th>kind</th><th>error</th></tr>')
        for e in failed:
            parts.append(
                f"<tr><td>{_esc(e.get('input', '?'))}</td><td>{_esc(e.get('kind', ''))}</td>"
                f"<td>{_esc(e.get('error', ''))}</td></tr>"
            )
        parts.append("</table>")
    parts += ["</body>", "</html>", ""]
    return _write_text(out_dir / "index.html", "\n".join(parts))


# ----------------------------------------------------------------------------------------------
# the output folder of captioning-caption
# ----------------------------------------------------------------------------------------------


def error_line(e: BaseException) -> str:
    """One line for a failed input: the message of our errors, ``Type: message`` for others."""
    text = " ".join(str(e).split())
    if isinstance(e, CaptioningError) and text:
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def result_entry(result: Any, figure: str) -> dict[str, Any]:
    """The ``captions.json`` entry of one ``CaptionResult`` whose figure is at ``figure`` (relative)."""
    if result.error is not None:
        return error_entry(result.input, result.kind, result.error)
    extra: dict[str, Any] = {"score": round(float(result.score), 4)}
    if not result.has_attention:
        extra["attention_note"] = "the model has no attention: uniform weights over the features"
    if result.kind == "image" and len(result.attention_shape) == 1:  # image regions, boxes when known
        if result.boxes is not None:
            extra["boxes"] = [[round(float(v), 2) for v in box] for box in np.asarray(result.boxes)]
        if result.image_size is not None:
            extra["image_size"] = [int(s) for s in result.image_size]
    if result.kind == "image":
        return make_entry(result.input, result.tokens, result.attention, kind="image", figure=figure,
                          attention_shape=list(result.attention_shape), **extra)
    return make_entry(result.input, result.tokens, result.attention, kind="video", figure=figure,
                      frame_indices=result.frame_indices, **extra)


def write_gallery(results: Iterable[Any], out_dir: str | Path, title: str = "Captions") -> list[dict[str, Any]]:
    """Draw each result's figure into ``out_dir/figures/``, then write ``captions.json`` and ``index.html``.

    ``results`` may be a stream (``Captioner.iter_caption``): each figure is drawn as its result
    arrives.  A figure that cannot be drawn makes its entry an error entry; the other captions are
    kept.  Returns the entries, in the order of ``results``.
    """

    out_dir = Path(out_dir)
    (out_dir / FIGURES_DIR).mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    for i, r in enumerate(results):
        if r.error is not None:
            entries.append(error_entry(r.input, r.kind, r.error))
            continue
        rel = f"{FIGURES_DIR}/{figure_name(r.input, i)}"
        try:
            plot_result(r, out_dir / rel)
            entries.append(result_entry(r, rel))
        except Exception as e:  # one bad figure must not lose the other captions
            log.exception("figure of %s failed", r.input)
            entries.append(error_entry(r.input, r.kind, error_line(e)))
    write_captions_json(entries, out_dir / "captions.json")
    write_index_html(entries, out_dir, title=title)
    return entries
