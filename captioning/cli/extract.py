"""``captioning-extract``: CNN feature grids of every image/video of a dataset -> a FeatureStore.

    captioning-extract data=shapes encoder=efficientnet_lite0 trainer=cpu
    captioning-extract data=moving_shapes encoder=resnet152 trainer=gpu encoder.frames=28
    captioning-extract trainer=ddp_cpu            # 2 CPU processes (gloo), each writing its own shards

The job is ``captioning.features.job.extract``.  Unreadable files are recorded in the store's
failures and the exit status is 1; configuration errors exit with status 2.
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from captioning.config import CONF_DIR, register_schema, to_config
from captioning.features.job import ExtractConfig, extract
from captioning.jobs import cli_errors, composition_errors

__all__ = ["ExtractConfig", "main"]

log = logging.getLogger("captioning.extract")

register_schema("extract_schema", ExtractConfig)


@composition_errors
@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="extract")
@cli_errors
def main(raw: DictConfig) -> None:
    cfg = to_config(raw, ExtractConfig)
    log.info("config:\n%s", OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    summary = extract(cfg)
    # Under DDP, Lightning kills every process when a relaunched rank exits non-zero, so only the
    # launching process (local rank 0) reports failures through its exit status.
    if summary["failed"] and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(f"extraction finished with {summary['failed']} failed item(s); see the log and the store's "
              f"failures in {cfg.features_dir}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
