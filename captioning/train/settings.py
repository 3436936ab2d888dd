"""What the LightningModule reads of a training config, typed: ``ModuleSettings``.

The training job builds it from its ``TrainConfig`` (``ModuleSettings.of``); a checkpoint, whose
hyper-parameters are plain data (``torch.load(weights_only=True)``), has it rebuilt from its
``config`` by ``ModuleSettings.from_config``, the one place that reads a checkpoint's config
layout, older ones included (the stage as ``scst.enabled``/``finetune.enabled`` flags, ``compile``
as a bool).  An unknown key in a section fails there (a TypeError, which the checkpoint loader reports in one line).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from captioning.models.decoders import decoder_config
from captioning.models.search import DecodeConfig
from captioning.train.compiled import compile_setting
from captioning.train.optim import OptimConfig
from captioning.train.scst import ScstConfig
from captioning.train.stage import Stage, stage_named, stage_of, without_flags

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
    batch_size: int  # data.batch_size: the rows of a compiled run's one batch shape
    max_length: int  # data.max_length: its captions' words (tokens: + <bos>, <eos>)

    @classmethod
    def of(cls, cfg: Any) -> ModuleSettings:
        """From a ``TrainConfig`` (``captioning.train.job``), by attribute."""
        return cls(model=decoder_config(cfg.model), optim=cfg.optim, decode=cfg.decode, stage=stage_named(cfg.stage),
                   scst=cfg.scst.validate(), compile=compile_setting(cfg.compile), batch_size=int(cfg.data.batch_size),
                   max_length=int(cfg.data.max_length))

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModuleSettings:
        """From a checkpoint's ``hyper_parameters["config"]`` (plain dicts; any layout this code wrote)."""
        def section(name: str) -> dict[str, Any]:  # a section an older checkpoint may lack
            return dict(config.get(name) or {})

        data = section("data")
        return cls(model=decoder_config(config["model"]), optim=OptimConfig(**section("optim")),
                   decode=DecodeConfig(**section("decode")), stage=stage_of(config),
                   scst=ScstConfig(**without_flags(section("scst"))).validate(),
                   compile=compile_setting(config.get("compile", "auto")),  # a bool in older checkpoints
                   batch_size=int(data.get("batch_size", 0)), max_length=int(data.get("max_length", 0)))
