"""``captioning-train``: fit a caption decoder on a FeatureStore (Lightning; CPU, GPU, DDP, SLURM).

    captioning-train data=shapes model=soft_attention trainer=cpu
    captioning-train experiment=yao2015_temporal trainer=ddp
    captioning-train -m model=soft_attention,mean_pool seed=0,1,2

The run directory is ``outputs/train/<run_name>``; running the same command again resumes
from its ``checkpoints/last.ckpt``; the same folder with other settings is refused (a run is its
config: ``captioning.train.identity``).  Sweep jobs run in ``<sweep dir>/<run_name>-<fingerprint>``.
The job is ``captioning.train.job.train``.
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig, OmegaConf

from captioning.config import CONF_DIR, register_schema, to_config
from captioning.jobs import cli_errors, composition_errors
from captioning.models.decoders import register_schemas, run_tag
from captioning.train.job import TrainConfig, train
from captioning.train.sweep import sweep_job_folder

__all__ = ["TrainConfig", "main"]

log = logging.getLogger("captioning.train")

register_schema("train_schema", TrainConfig)
register_schemas()  # model/<decoder>_schema: what each conf/model/*.yaml extends
# ${model_tag:${model}} in conf/train.yaml: the run folder's name part for the model
OmegaConf.register_new_resolver("model_tag", run_tag, replace=True)

# ${sweep_job_folder:} in conf/train.yaml: a sweep job's folder, <run_name>-<run fingerprint>
OmegaConf.register_new_resolver("sweep_job_folder", sweep_job_folder, replace=True)


@composition_errors
@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
@cli_errors
def main(raw: DictConfig) -> float | None:
    cfg = to_config(raw, TrainConfig)
    log.info("config:\n%s", OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    summary = train(cfg)
    return summary["best_val_CIDEr"]  # for Hydra sweepers


if __name__ == "__main__":
    main()
