"""Output layer of ``captioning-caption``: its entries, figures, ``captions.json`` and ``index.html``.

``make_entry`` / ``result_entry`` build one ``captions.json`` entry (its attention as ``[T, N]``
rows in memory); ``write_gallery`` turns captions (``captioning.caption.api.CaptionResult``) into the
output folder of ``captioning-caption``: ``figures/<NNNN>_<name>.png``, ``captions.json`` with its
``attention.npy`` (the schema, validation, writing and reading: ``captioning.viz.captions_file``)
and ``index.html``.
"""

from __future__ import annotations

import html
import logging
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from captioning.errors import CaptioningError
from captioning.utils.io import atomic_write
from captioning.viz.captions_file import (
    CAPTIONS_SCHEMA,
    captions_errors,
    read_captions,
    validate_captions,
    write_captions_json,
)
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
    "read_captions",
]

FIGURES_DIR = "figures"


# ----------------------------------------------------------------------------------------------
# building entries
# ----------------------------------------------------------------------------------------------


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
    with a flat [T, N] attention needs ``attention_shape``. The weights are kept as a float32
    ``[T, N]`` array (written to ``attention.npy`` in float16). ``extra`` keys (e.g. ``score``) are
    copied as they are.
    """
    if hasattr(attention, "detach"):
        attention = attention.detach().float().cpu().numpy()
    a = np.asarray(attention, dtype=np.float32)
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
        "attention": a,
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


def _write_text(path: str | Path, text: str) -> Path:
    def write(p: Path) -> None:
        p.write_text(text, encoding="utf-8")
        os.chmod(p, 0o644)  # the atomic temp file is 0600; outputs are meant to be shared/served

    return atomic_write(path, write)



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
    if getattr(result, "token_log_probs", None):
        extra["token_log_probs"] = [round(float(x), 4) for x in result.token_log_probs]
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
