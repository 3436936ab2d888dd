"""``captioning-evaluate``: decode a split with a checkpoint and write numbers a paper can quote.

    captioning-evaluate ckpt_path=outputs/train/<run>/checkpoints/last.ckpt split=test decode.beam_size=5
    captioning-evaluate ckpt_path=[<run0>/checkpoints/last.ckpt,<run1>/checkpoints/last.ckpt]   # an ensemble
    captioning-evaluate ckpt_path=<ckpt> decode=diverse server=coco server_alg=myattn

Writes into ``output_dir`` (default ``<run>/eval/<split>-beam<k>``): ``results.json`` (COCO
results format; ``video_id`` for video), ``metrics.json`` (toolkit key names),
``predictions.json`` (tokens + per-token attention), and ``report.md``/``report.json`` with
metrics by reference length (plot), vocabulary usage and, on the synthetic data, grounding.
Under ``trainer=ddp`` every rank decodes a shard and rank 0 writes one results file.
The job is ``captioning.evaluation.job.evaluate``.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from captioning.config import CONF_DIR, register_schema, to_config
from captioning.evaluation.job import EvaluateConfig, evaluate
from captioning.jobs import cli_errors, composition_errors
from captioning.viz.viewer import viewer_switch

__all__ = ["EvaluateConfig", "main"]

register_schema("evaluate_schema", EvaluateConfig)


@viewer_switch  # viewer=true: conf/viewer/true.yaml (Hydra alone would read a boolean)
@composition_errors
@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="evaluate")
@cli_errors
def main(raw: DictConfig) -> None:
    evaluate(to_config(raw, EvaluateConfig))


if __name__ == "__main__":
    main()
