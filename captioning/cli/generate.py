"""``captioning-generate``: write an embedded synthetic dataset (deterministic from ``seed``).

    captioning-generate dataset=shapes                      # -> data/shapes
    captioning-generate dataset=moving_shapes num_items=200 root=/tmp/ms
    captioning-generate dataset=shapes force=true           # regenerate even if up to date

The job is ``captioning.data.synthetic.job.generate``.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from captioning.config import CONF_DIR, register_schema, to_config
from captioning.data.synthetic.job import GenerateConfig, generate
from captioning.jobs import cli_errors, composition_errors

__all__ = ["GenerateConfig", "main"]

register_schema("generate_schema", GenerateConfig)


@composition_errors
@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="generate")
@cli_errors
def main(raw: DictConfig) -> None:
    cfg = to_config(raw, GenerateConfig)
    generate(cfg)


if __name__ == "__main__":
    main()
