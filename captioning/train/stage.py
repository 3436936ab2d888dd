"""The training stages, one table (``STAGES``): ``xe`` (cross-entropy, teacher forcing), ``scst``
(self-critical sequence training on CIDEr-D, ``captioning.train.scst``) and ``finetune`` (the
encoder's last stages trained with the decoder from raw images, ``captioning.train.finetune``).

A ``Stage`` says what its stage changes of a run: the loss a training step minimises, what the
training data are (one sample per caption or per item, stored features or raw images) and which
config section holds its own settings; its defaults (learning rate, schedule, run-name suffix) are
the preset ``conf/stage/<name>.yaml``.  The training job, the LightningModule and the checkpoint
loader read the table instead of comparing stage names.

``stage_of`` reads the stage from a training config, the one place that does: configs and
checkpoints written before the stage was one value carried ``scst.enabled`` / ``finetune.enabled``
instead, which it reads the same way (``without_flags`` drops them before the stage's own config
is built).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from captioning.errors import ConfigError


@dataclass(frozen=True)
class Stage:
    """What one training stage changes of a run."""

    name: str
    loss: str  # xe: teacher-forced cross-entropy | scst: self-critical (REINFORCE on CIDEr-D rewards)
    per_item: bool  # a training sample per item (its references reward its samples), else per caption
    from_images: bool  # batches of raw images through the encoder, which trains too (and is checkpointed)
    section: str | None  # the config section of the stage's own settings (ScstConfig, FinetuneConfig)
    about: str  # one line for the error that lists the stages


STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("xe", loss="xe", per_item=False, from_images=False, section=None, about="cross-entropy"),
    Stage("scst", loss="scst", per_item=True, from_images=False, section="scst",
          about="self-critical, from an xe checkpoint"),
    Stage("finetune", loss="xe", per_item=False, from_images=True, section="finetune",
          about="the encoder too, from an xe checkpoint"),
)}


def stage_named(name: str) -> Stage:
    """The stage called ``name``; an unknown name is a one-line ConfigError listing the stages."""
    if name not in STAGES:
        listed = ", ".join(f"{s.name} ({s.about})" for s in STAGES.values())
        raise ConfigError(f"stage={name!r}: use {listed}; one stage per run")
    return STAGES[name]


def stage_of(config: Mapping[str, Any]) -> Stage:
    """The stage of a training config given as a plain dict (a checkpoint's ``config``)."""
    name = config.get("stage")
    if name is None:  # a config from before the stage was one value: its flags say it
        flags = [s for s in ("scst", "finetune") if (config.get(s) or {}).get("enabled")]
        name = flags[0] if len(flags) == 1 else ("xe" if not flags else "scst+finetune")
    return stage_named(name)


def without_flags(section: Mapping[str, Any] | None) -> dict[str, Any]:
    """A stage's config section without the ``enabled`` flag of older configs."""
    return {k: v for k, v in (section or {}).items() if k != "enabled"}
