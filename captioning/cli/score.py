"""``captioning-score``: COCO caption metrics of a results file, like the COCO toolkit.

    captioning-score results=results.json annotations=captions_val2014.json
    captioning-score results=r.json annotations=videodatainfo.json metrics=[bleu,cider] tokenize=false

The job is ``captioning.metrics.scoring.score``.  Errors exit with status 2 and one line.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from captioning.config import CONF_DIR, register_schema, to_config
from captioning.jobs import cli_errors
from captioning.metrics.scoring import ScoreConfig, score

__all__ = ["ScoreConfig", "main"]

register_schema("score_schema", ScoreConfig)


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="score")
@cli_errors
def main(raw: DictConfig) -> None:
    cfg = to_config(raw, ScoreConfig)
    score(cfg)


if __name__ == "__main__":
    main()
