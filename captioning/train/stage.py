"""The training stages, one table (``STAGES``): ``xe`` (cross-entropy, teacher forcing), ``scst``
(self-critical sequence training on CIDEr-D, ``captioning.train.scst``) and ``finetune`` (the
encoder's last stages trained with the decoder from raw images, ``captioning.train.finetune``).

A ``Stage`` says what its stage changes of a run: the loss a training step minimises, what the
training data are (captions, or one item with one reference, from stored features or raw images);
its defaults (learning rate, schedule, run-name suffix) are the preset ``conf/stage/<name>.yaml``.
The training job, the LightningModule and the checkpoint loader read the table instead of comparing
stage names.
"""

from __future__ import annotations

from dataclasses import dataclass

from captioning.errors import ConfigError


@dataclass(frozen=True)
class Stage:
    """What one training stage changes of a run."""

    name: str
    loss: str  # xe: teacher-forced cross-entropy | scst: self-critical (REINFORCE on CIDEr-D rewards)
    per_item: bool  # a training sample per item with one reference (its samples are rewarded), else captions
    from_images: bool  # batches of raw images through the encoder, which trains too (and is checkpointed)
    about: str  # one line for the error that lists the stages


STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("xe", loss="xe", per_item=False, from_images=False, about="cross-entropy"),
    Stage("scst", loss="scst", per_item=True, from_images=False, about="self-critical, from an xe checkpoint"),
    Stage("finetune", loss="xe", per_item=False, from_images=True, about="the encoder too, from an xe checkpoint"),
)}


def stage_named(name: str) -> Stage:
    """The stage called ``name``; an unknown name is a one-line ConfigError listing the stages."""
    if name not in STAGES:
        listed = ", ".join(f"{s.name} ({s.about})" for s in STAGES.values())
        raise ConfigError(f"stage={name!r}: use {listed}; one stage per run")
    return STAGES[name]
