"""Evaluation report pieces: metrics by reference length, vocabulary usage, report.json/report.md.

- :func:`metrics_by_length` groups items by the mean length (tokens) of their reference captions
  and scores each group as its own corpus (BLEU-4 / ROUGE_L / CIDEr via
  ``captioning.metrics.compute_metrics``).  CIDEr's document frequencies then come from
  the group alone, so compare groups across models, not CIDEr of a group with the overall CIDEr.
- :func:`plot_metrics_by_length` draws the score-vs-length figure of Bahdanau et al. (2015, Fig. 2):
  one line per metric for one model, or one panel per metric with one line per model.
- :func:`vocabulary_usage`: how much of the vocabulary the decoder actually uses.
- :func:`write_report` writes ``report.json``, ``report.md`` and the plot (atomic writes).

References and hypotheses are already tokenized, tokens joined by single spaces.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from captioning.errors import DataError
from captioning.metrics import compute_metrics
from captioning.utils.io import atomic_write, atomic_write_json, atomic_write_text

DEFAULT_BINS: tuple[int, ...] = (6, 8, 10, 12, 15)  # <=6, 7-8, 9-10, 11-12, 13-15, 16+
BY_LENGTH_METRICS: tuple[str, ...] = ("bleu", "rouge", "cider")
BY_LENGTH_KEYS: tuple[str, ...] = ("Bleu_4", "ROUGE_L", "CIDEr")
PLOT_KEYS: tuple[str, ...] = ("Bleu_4", "CIDEr")
PLOT_NAME = "metrics_by_length.png"
SPECIAL_TOKENS = frozenset({"<pad>", "<bos>", "<eos>", "<unk>"})


def _compute_metrics(references: Mapping[Any, Sequence[str]], hypotheses: Mapping[Any, str],
                     metrics: Sequence[str]) -> dict[str, float]:

    result = compute_metrics(references, hypotheses, metrics=tuple(metrics), tokenize=False)
    return {k: float(v) for k, v in result.scores.items()}


# -------------------------------------------------------------------------------- by length


def length_bins(bins: Sequence[int] = DEFAULT_BINS) -> list[tuple[str, float, float | None]]:
    """(label, lo, hi) per bin from increasing upper edges: (6, 8) -> <=6, 7-8, 9+.

    A mean length m falls in the first bin with ``m <= hi`` (the open last bin otherwise), so a
    mean of 6.4 goes to "7-8".
    """
    edges = [int(b) for b in bins]
    if not edges or any(b >= c for b, c in zip(edges, edges[1:], strict=False)) or edges[0] < 1:
        raise DataError(f"length bins {list(bins)} must be strictly increasing upper edges >= 1, e.g. (6, 8, 10)")
    out: list[tuple[str, float, float | None]] = [(f"<={edges[0]}", 0.0, float(edges[0]))]
    for lo, hi in zip(edges, edges[1:], strict=False):
        label = f"{hi}" if hi == lo + 1 else f"{lo + 1}-{hi}"
        out.append((label, float(lo), float(hi)))
    out.append((f"{edges[-1] + 1}+", float(edges[-1]), None))
    return out


def _bin_index(mean_len: float, edges: Sequence[int]) -> int:
    for i, hi in enumerate(edges):
        if mean_len <= hi:
            return i
    return len(edges)


def metrics_by_length(
    references: Mapping[Any, Sequence[str]],
    hypotheses: Mapping[Any, str],
    bins: Sequence[int] = DEFAULT_BINS,
    metrics: Sequence[str] = BY_LENGTH_METRICS,
) -> list[dict[str, Any]]:
    """Corpus scores per bin of mean reference length (tokens).

    ``references``: key -> tokenized reference captions; ``hypotheses``: key -> tokenized caption
    (every hypothesis needs references).  Returns one row per bin: ``bin`` (label), ``lo``/``hi``
    (the bin holds lo < mean <= hi; hi None for the open bin), ``count``, ``mean_ref_length``,
    ``mean_hyp_length`` and the score keys (e.g. Bleu_4, ROUGE_L, CIDEr; None for empty bins).
    """
    edges = [int(b) for b in bins]
    spec = length_bins(edges)
    groups: list[list[Any]] = [[] for _ in spec]
    ref_len: dict[Any, float] = {}
    for key in hypotheses:
        refs = references.get(key)
        if not refs:
            raise DataError(f"metrics_by_length: hypothesis {key!r} has no reference captions")
        ref_len[key] = float(np.mean([len(r.split()) for r in refs]))
        groups[_bin_index(ref_len[key], edges)].append(key)
    rows: list[dict[str, Any]] = []
    for (label, lo, hi), keys in zip(spec, groups, strict=True):
        row: dict[str, Any] = {"bin": label, "lo": lo, "hi": hi, "count": len(keys),
                               "mean_ref_length": None, "mean_hyp_length": None}
        if keys:
            row["mean_ref_length"] = float(np.mean([ref_len[k] for k in keys]))
            row["mean_hyp_length"] = float(np.mean([len(hypotheses[k].split()) for k in keys]))
            scores = _compute_metrics({k: list(references[k]) for k in keys},
                                      {k: hypotheses[k] for k in keys}, metrics)
            row.update(scores)
        rows.append(row)
    keys_seen = sorted({k for r in rows for k in r if k not in ("bin", "lo", "hi", "count", "mean_ref_length",
                                                                 "mean_hyp_length")})
    for r in rows:  # empty bins: the same keys, None
        for k in keys_seen:
            r.setdefault(k, None)
    return rows


def _models(rows: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]]
            ) -> dict[str, list[Mapping[str, Any]]]:
    if isinstance(rows, Mapping):
        return {str(k): list(v) for k, v in rows.items()}
    return {"model": list(rows)}


def plot_metrics_by_length(
    rows: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
    out_png: str | Path,
    title: str = "Scores by mean reference length",
    metrics: Sequence[str] = PLOT_KEYS,
    min_count: int = 1,
    dpi: int = 120,
) -> Path:
    """Score vs reference-length bin, as a PNG.

    ``rows``: the rows of :func:`metrics_by_length` (one model: one line per metric, item counts as
    grey bars) or ``{model_name: rows}`` (one panel per metric, one line per model).  Bins with fewer
    than ``min_count`` items are left out of the lines.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    models = _models(rows)
    if not models or not any(models.values()):
        raise DataError("plot_metrics_by_length: no rows to plot")
    first = next(r for r in models.values() if r)
    labels = [str(r["bin"]) for r in first]
    x = np.arange(len(labels))

    def series(model_rows: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
        by_bin = {str(r["bin"]): r for r in model_rows}
        vals = []
        for lab in labels:
            r = by_bin.get(lab)
            v = None if r is None or (r.get("count") or 0) < min_count else r.get(key)
            vals.append(np.nan if v is None else float(v))
        return np.asarray(vals)

    single = len(models) == 1
    panels = [None] if single else list(metrics)
    fig = Figure(figsize=(6.4 if single else 4.6 * len(panels), 4.2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    markers = "osD^vP*X"
    for ax, panel in zip(axes, panels, strict=True):
        if single:
            name, model_rows = next(iter(models.items()))
            counts = [int(r.get("count") or 0) for r in model_rows]
            twin = ax.twinx()
            twin.bar(x, counts, width=0.6, color="0.88", zorder=0)
            twin.set_ylabel("items", color="0.45")
            twin.tick_params(axis="y", colors="0.45")
            ax.set_zorder(twin.get_zorder() + 1)
            ax.patch.set_visible(False)
            for i, key in enumerate(metrics):
                ax.plot(x, series(model_rows, key), marker=markers[i % len(markers)], label=key)
            ax.set_ylabel("score")
        else:
            for i, (name, model_rows) in enumerate(models.items()):
                ax.plot(x, series(model_rows, panel), marker=markers[i % len(markers)], label=name)
            ax.set_title(str(panel))
            ax.set_ylabel(str(panel))
        ax.set_xticks(x)
        ax.set_xticklabels(labels)
        ax.set_xlabel("mean reference length (tokens)")
        ax.set_ylim(bottom=0.0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()

    def write(p: Path) -> None:
        fig.savefig(p, format="png", dpi=dpi, facecolor="white")

    return atomic_write(out_png, write)


# ------------------------------------------------------------------------------- vocabulary


def vocabulary_usage(
    hypotheses: Mapping[Any, str],
    references: Mapping[Any, Sequence[str]],
    vocab_size: int,
    train_captions: Iterable[str] | None = None,
    top_k: int = 20,
    num_special: int = 4,
) -> dict[str, Any]:
    """How much of the vocabulary the captions use.

    ``vocab_size``: the model's vocabulary size including its ``num_special`` special tokens
    (<pad> <bos> <eos> <unk>).  ``train_captions``: tokenized training captions; when given,
    ``novel_captions`` is the share of hypotheses identical to none of them (else None).
    Special tokens in hypotheses are not counted as words; ``unk_tokens`` counts <unk>.
    """
    hyp_tokens = [h.split() for h in hypotheses.values()]
    words = Counter(t for toks in hyp_tokens for t in toks if t not in SPECIAL_TOKENS)
    ref_caps = [r for refs in references.values() for r in refs]
    ref_words = {t for r in ref_caps for t in r.split()}
    used = set(words)
    real_vocab = max(1, int(vocab_size) - int(num_special))
    n = len(hyp_tokens)
    novel = None
    if train_captions is not None:
        seen = {" ".join(c.split()) for c in train_captions}
        novel = float(np.mean([" ".join(t) not in seen for t in hyp_tokens])) if n else None
    return {
        "captions": n,
        "distinct_words": len(used),
        "vocab_size": int(vocab_size),
        "vocab_used": len(used) / real_vocab,
        "reference_words": len(ref_words),
        "reference_vocab_covered": len(used & ref_words) / len(ref_words) if ref_words else None,
        "words_not_in_references": len(used - ref_words),
        "mean_length": float(np.mean([len(t) for t in hyp_tokens])) if n else None,
        "mean_reference_length": float(np.mean([len(r.split()) for r in ref_caps])) if ref_caps else None,
        "distinct_captions": len({" ".join(t) for t in hyp_tokens}) / n if n else None,
        "novel_captions": novel,
        "unk_tokens": sum(t.count("<unk>") for t in hyp_tokens),
        "top_words": [[w, c] for w, c in words.most_common(top_k)],
    }


# ----------------------------------------------------------------------------------- report


def _jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy -> python, dataclasses/tuples/Paths converted, NaN/inf -> None."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "items"):  # DictConfig and friends
        return _jsonable(dict(obj.items()))
    return str(obj)


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    return text.replace("|", "\\|")


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c) for c in r) + " |" for r in rows]
    return lines + [""]


def _by_length_md(models: dict[str, list[Mapping[str, Any]]]) -> list[str]:
    out: list[str] = []
    fixed = ("bin", "lo", "hi", "count", "mean_ref_length", "mean_hyp_length")
    for name, rows in models.items():
        if len(models) > 1:
            out.append(f"**{name}**\n")
        score_keys = [k for k in BY_LENGTH_KEYS if any(k in r for r in rows)]
        score_keys += sorted({k for r in rows for k in r if k not in fixed and k not in score_keys})
        out += _table(["ref length", "items", "mean ref len", "mean hyp len", *score_keys],
                      [[r["bin"], r.get("count"), r.get("mean_ref_length"), r.get("mean_hyp_length"),
                        *(r.get(k) for k in score_keys)] for r in rows])
    return out


def _grounding_md(g: Mapping[str, Any]) -> list[str]:
    out = _table(["measure", "model", "chance (uniform attention)"], [
        ["attention in object", g.get("attention_in_object"), g.get("chance_attention_in_object")],
        ["pointing accuracy", g.get("pointing_accuracy"), g.get("chance_pointing_accuracy")],
    ])
    counts = [(k, g[k]) for k in ("items", "items_missing", "words_evaluated", "words_ambiguous",
                                  "words_not_in_item", "words_unobservable") if k in g]
    out += _table(["count", "value"], counts)
    by_class = g.get("by_class") or {}
    if by_class:
        out += ["Per word class:", ""]
        out += _table(["class", "words", "attention in object", "chance", "pointing", "chance",
                       "ambiguous", "not in item"],
                      [[c, d.get("words_evaluated"), d.get("attention_in_object"),
                        d.get("chance_attention_in_object"), d.get("pointing_accuracy"),
                        d.get("chance_pointing_accuracy"), d.get("words_ambiguous"), d.get("words_not_in_item")]
                       for c, d in by_class.items()])
    return out


def write_report(
    out_dir: str | Path,
    metrics: Mapping[str, float],
    by_length: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
    vocab_usage: Mapping[str, Any] | None,
    grounding: Mapping[str, Any] | None,
    meta: Mapping[str, Any] | None,
    *,
    structure: Mapping[str, Any] | None = None,
    title: str = "Evaluation report",
    plot: bool = True,
) -> Path:
    """Write ``report.json``, ``report.md`` and ``metrics_by_length.png`` into ``out_dir``.

    ``by_length``: rows of :func:`metrics_by_length` (or ``{model: rows}``).  Returns the path of
    ``report.md``.  The plot is skipped (``plot_file`` None) when no bin has items.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    models = _models(by_length)
    plot_file = None
    if plot and any((r.get("count") or 0) > 0 for rows in models.values() for r in rows):
        plot_metrics_by_length(models if len(models) > 1 else next(iter(models.values())), out / PLOT_NAME,
                               title=f"{title}: scores by reference length")
        plot_file = PLOT_NAME
    report = _jsonable({
        "meta": dict(meta or {}),
        "metrics": dict(metrics),
        "by_length": models if len(models) > 1 else next(iter(models.values()), []),
        "vocabulary": dict(vocab_usage) if vocab_usage is not None else None,
        "grounding": dict(grounding) if grounding is not None else None,
        "structure": dict(structure) if structure is not None else None,
        "plot": plot_file,
    })
    atomic_write_json(out / "report.json", report)

    md: list[str] = [f"# {title}", ""]
    meta_rows = []
    for k, v in report["meta"].items():
        text = _fmt(v)
        if len(text) > 200:
            text = "(see report.json)"
        meta_rows.append([k, text])
    if meta_rows:
        md += _table(["key", "value"], meta_rows)
    md += ["## Metrics", ""]
    md += _table(["metric", "value"], report["metrics"].items()) if report["metrics"] else ["(none)", ""]
    md += ["## Metrics by mean reference length", ""]
    md += _by_length_md(models)
    if plot_file:
        md += [f"![scores by reference length]({plot_file})", ""]
    vocab = report["vocabulary"]
    if vocab:
        md += ["## Vocabulary usage", ""]
        md += _table(["measure", "value"], [[k, v] for k, v in vocab.items() if k != "top_words"])
        top = vocab.get("top_words") or []
        if top:
            md += ["Top words: " + ", ".join(f"{w} ({c})" for w, c in top), ""]
    if report["structure"]:
        md += ["## Structured accuracy (binding / order, with chance)", ""]
        md += _table(["measure", "value"], [[k, v] for k, v in report["structure"].items()
                                             if not isinstance(v, (dict, list))])
    if report["grounding"]:
        md += ["## Attention grounding", ""]
        md += _grounding_md(report["grounding"])
    path = out / "report.md"
    atomic_write_text(path, "\n".join(md).rstrip() + "\n")
    return path
