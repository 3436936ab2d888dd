"""The training stage, one value: ``xe`` (cross-entropy, teacher forcing), ``scst`` (self-critical
sequence training on CIDEr-D, ``captioning.train.scst``) or ``finetune`` (the encoder's last stages
trained with the decoder from raw images, ``captioning.train.finetune``).

``stage_of`` reads it from a training config, the one place that does: configs and checkpoints
written before the stage was one value carried ``scst.enabled`` / ``finetune.enabled`` instead,
which it reads the same way (``without_flags`` drops them before the stage's own config is built).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from captioning.errors import ConfigError

STAGES = ("xe", "scst", "finetune")


def stage_of(config: Mapping[str, Any]) -> str:
    """The stage of a training config (a plain dict, e.g. a checkpoint's ``config``)."""
    stage = config.get("stage")
    if stage is None:  # a config from before the stage was one value: its flags say it
        flags = [s for s in ("scst", "finetune") if (config.get(s) or {}).get("enabled")]
        stage = flags[0] if len(flags) == 1 else ("xe" if not flags else "scst+finetune")
    if stage not in STAGES:
        raise ConfigError(f"stage={stage!r}: use xe (cross-entropy), scst (self-critical, from an xe checkpoint) "
                          f"or finetune (the encoder too, from an xe checkpoint); one stage per run")
    return stage


def without_flags(section: Mapping[str, Any] | None) -> dict[str, Any]:
    """A stage's config section without the ``enabled`` flag of older configs."""
    return {k: v for k, v in (section or {}).items() if k != "enabled"}
