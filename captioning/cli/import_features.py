"""``captioning-import``: features made elsewhere (bottom-up regions, per-item arrays, HDF5) -> a FeatureStore.

    captioning-import data=coco format=npz_dir source=data/cocobu_att boxes_dir=data/cocobu_box name=bottom_up max_regions=100
    captioning-import data=coco format=bottom_up_tsv source='data/trainval/*.tsv.*' name=bottom_up max_regions=100
    captioning-import data=msrvtt format=hdf5 source=data/msrvtt_features.h5 name=resnet152_msrvtt max_regions=40

The job is ``captioning.features.importing.import_features``.  Training then reads the store with
``features_dir=<the store>`` (default ``${data.root}/features/<name>``).  Corrupt or inconsistent records are recorded in the
store's failures and the exit status is 1; configuration errors exit with status 2.
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from captioning.config import CONF_DIR, register_schema, to_config
from captioning.features.formats import ImportConfig
from captioning.features.importing import import_features
from captioning.jobs import cli_errors, composition_errors

__all__ = ["ImportConfig", "main"]

log = logging.getLogger("captioning.import")

register_schema("import_schema", ImportConfig)


@composition_errors
@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="import")
@cli_errors
def main(raw: DictConfig) -> None:
    cfg = to_config(raw, ImportConfig)
    log.info("config:\n%s", OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    summary = import_features(cfg)
    print(f"imported {summary.imported}, {summary.skipped_done} already stored, {summary.failed} failed, "
          f"{summary.unknown} source ids not in data={cfg.data.name}, {summary.missing} annotation ids not in "
          f"the source -> {cfg.features_dir}", flush=True)
    if summary.failed:
        print(f"import finished with {summary.failed} failed item(s); see the log and the store's failures in "
              f"{cfg.features_dir}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
