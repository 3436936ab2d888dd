"""What the LightningModule reads of a training config, typed: ``ModuleSettings``.

The training job builds it from its ``TrainConfig`` (``ModuleSettings.of``) with the schedule's
length it resolves before the run starts; a checkpoint, whose
hyper-parameters are plain data (``torch.load(weights_only=True)``), has it rebuilt from its
``config`` by ``ModuleSettings.from_config``.  An unknown key in a section fails there (a
TypeError, which the checkpoint loader reports in one line).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from captioning.models.decoders import decoder_config
from captioning.models.search import DecodeConfig
from captioning.train.compiled import compile_setting
from captioning.train.optim import OptimConfig
from captioning.train.scst import ScstConfig
from captioning.train.stage import Stage, stage_named

__all__ = ["ModuleSettings"]


@dataclass(frozen=True)
class ModuleSettings:
    """The typed pieces of a training config the LightningModule reads."""

    model: Any  # the registered decoder's typed config (captioning.models.decoders.decoder_config)
    optim: OptimConfig
    decode: DecodeConfig  # how validation decodes (an evaluation passes its own to the decode call)
    stage: Stage  # captioning.train.stage.STAGES
    scst: ScstConfig  # stage=scst's settings (validated)
    compile: str  # auto | true | false (captioning.train.compiled)
    max_length: int  # data.max_length: a caption's words (tokens: + <bos>, <eos>)
    batch_size: int  # data.batch_size: a compiled run's batch shape without a data module that knows it
    schedule_steps: int | None = None  # the cosine schedule's length, resolved before the run starts

    @classmethod
    def of(cls, cfg: Any) -> ModuleSettings:
        """From a ``TrainConfig`` (``captioning.train.job``), by attribute; ``resolved`` adds the
        schedule's length once the job knows the data."""
        return cls(model=decoder_config(cfg.model), optim=cfg.optim, decode=cfg.decode, stage=stage_named(cfg.stage),
                   scst=cfg.scst.validate(), compile=compile_setting(cfg.compile), max_length=int(cfg.data.max_length),
                   batch_size=int(cfg.data.batch_size), schedule_steps=cfg.optim.schedule_steps)

    def resolved(self, schedule_steps: int | None) -> ModuleSettings:
        """With the schedule's length the job resolved."""
        return replace(self, schedule_steps=schedule_steps)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModuleSettings:
        """From a checkpoint's ``hyper_parameters["config"]`` (plain dicts; sections left out take
        their defaults)."""
        def section(name: str) -> dict[str, Any]:
            return dict(config.get(name) or {})

        data, optim = section("data"), OptimConfig(**section("optim"))
        return cls(model=decoder_config(config["model"]), optim=optim, decode=DecodeConfig(**section("decode")),
                   stage=stage_named(config.get("stage", "xe")), scst=ScstConfig(**section("scst")).validate(),
                   compile=compile_setting(config.get("compile", "auto")), max_length=int(data.get("max_length", 20)),
                   batch_size=int(data.get("batch_size", 64)), schedule_steps=optim.schedule_steps)
