"""``captioning-score``: COCO caption metrics of a results file, like the COCO toolkit.

    captioning-score results=results.json annotations=captions_val2014.json
    captioning-score results=r.json annotations=videodatainfo.json metrics=[bleu,cider] tokenize=false
    captioning-score results=r.json annotations=a.json output=metrics.json per_item=true

Scores only the ids present in the results (``image_id`` or ``video_id``).  Prints a table and,
with ``output``, writes ``{"Bleu_1": ..., "METEOR": ..., "ROUGE_L": ..., "CIDEr": ...}``
(+ ``"per_item": {id: {...}}`` with ``per_item=true``).  Errors exit with status 2 and one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hydra
from omegaconf import MISSING, DictConfig

from captioning.config import CONF_DIR, cli_errors, register_schema, to_config


@dataclass
class ScoreConfig:
    results: str = MISSING
    annotations: str = MISSING
    metrics: list[str] = field(default_factory=lambda: ["bleu", "meteor", "rouge", "cider"])
    tokenize: bool = True
    output: str | None = None
    per_item: bool = False


register_schema("score_schema", ScoreConfig)


def score(cfg: ScoreConfig) -> dict:
    """Score, print, optionally write; returns the JSON-ready dict."""
    from rich.console import Console
    from rich.table import Table

    from captioning.errors import ConfigError
    from captioning.evaluation.metrics import METRICS
    from captioning.evaluation.scoring import score_files
    from captioning.utils.io import atomic_write_json

    unknown = [m for m in cfg.metrics if m not in METRICS]
    if unknown or not cfg.metrics:
        what = f"unknown metric {unknown[0]!r}" if unknown else "no metric"
        raise ConfigError(f"metrics: {what}; choose from {', '.join(METRICS)}, e.g. metrics=[bleu,cider]")
    result = score_files(cfg.results, cfg.annotations, metrics=cfg.metrics, tokenize=cfg.tokenize)
    out: dict = dict(result.scores)
    if cfg.per_item:
        out["per_item"] = {str(k): v for k, v in result.per_item.items()}

    table = Table(title=f"{len(result.per_item)} items - {cfg.results}")
    table.add_column("metric")
    table.add_column("score", justify="right")
    for name, value in result.scores.items():
        table.add_row(name, f"{value:.4f}")
    console = Console(soft_wrap=True)
    console.print(table)
    if result.bleu_stats is not None:
        s = result.bleu_stats
        console.print(
            f"BLEU: testlen {s['testlen']}, reflen {s['reflen']}, ratio {s['ratio']:.6f}, "
            f"guess {s['guess']}, correct {s['correct']}",
            highlight=False,
        )
    if cfg.output:
        atomic_write_json(cfg.output, out)
        console.print(f"wrote {cfg.output}", highlight=False)
    return out


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="score")
@cli_errors
def main(raw: DictConfig) -> None:
    cfg = to_config(raw, ScoreConfig)
    score(cfg)


if __name__ == "__main__":
    main()
