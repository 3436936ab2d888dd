"""``captioning-score``: COCO caption metrics of a results file, like the COCO toolkit; or, with
``probes=``, forced-choice probes of a checkpoint on an annotation file.

    captioning-score results=results.json annotations=captions_val2014.json
    captioning-score results=r.json annotations=videodatainfo.json metrics=[bleu,cider] tokenize=false
    captioning-score ckpt_path=best.ckpt annotations=captions_test.json probes=[binding,order,shuffle]

The jobs are ``captioning.metrics.scoring.score`` and ``captioning.evaluation.probes.job.score_probes``.
Errors exit with status 2 and one line.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from captioning.config import CONF_DIR, register_schema, to_config
from captioning.errors import ConfigError
from captioning.evaluation.probes.job import ProbeScoreConfig, score_probes
from captioning.jobs import cli_errors, composition_errors
from captioning.metrics.scoring import ScoreConfig, score

__all__ = ["ProbeScoreConfig", "ScoreConfig", "main"]

register_schema("score_schema", ProbeScoreConfig)


@composition_errors
@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="score")
@cli_errors
def main(raw: DictConfig) -> None:
    cfg = to_config(raw, ProbeScoreConfig)
    if cfg.probes:
        score_probes(cfg)
    elif cfg.results:
        score(cfg)
    else:
        raise ConfigError("captioning-score needs results=<results.json> (metrics) or ckpt_path=<ckpt> "
                          "probes=[binding,order,shuffle] (probes)")


if __name__ == "__main__":
    main()
