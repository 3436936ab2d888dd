"""Optimisation: Adam/AdamW and the learning-rate schedule (Lightning's ``configure_optimizers`` form).

``cosine``: linear warm-up over ``warmup_steps``, then a half cosine from ``lr`` down to
``lr * min_lr_ratio`` over the schedule's length in optimizer steps (``schedule_steps``, resolved
once per run); ``step``: ``gamma`` every ``step_epochs`` epochs; ``plateau``: ``gamma`` when the
validation CIDEr-D stops rising; ``none``: a constant ``lr``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from captioning.errors import CaptioningError

__all__ = ["OptimConfig", "configure_optimization"]


@dataclass
class OptimConfig:
    """Optimisation: Adam/AdamW, learning-rate schedule, label smoothing."""

    optimizer: str = "adamw"  # adam | adamw
    lr: float = 4e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    scheduler: str = "cosine"  # none | cosine | step | plateau
    warmup_steps: int = 0
    step_epochs: int = 5  # step: decay every step_epochs epochs
    gamma: float = 0.5  # step/plateau decay factor
    min_lr_ratio: float = 0.05  # cosine: final lr = lr * min_lr_ratio
    # cosine: its length in optimizer steps; null: the budget's (resolved once at the start and
    # stored in every checkpoint). Fixed, a larger budget continues the run on the same schedule
    schedule_steps: int | None = None
    label_smoothing: float = 0.0
    nonfinite: str = "skip"  # a NaN/inf loss: skip the optimizer step (and say which batch) | stop


def configure_optimization(params: Iterable[torch.nn.Parameter], cfg: OptimConfig,
                           schedule_steps: Callable[[], int]) -> Any:
    """The optimizer over ``params`` and its schedule, as Lightning's configure_optimizers returns
    them; ``schedule_steps()`` gives the cosine schedule's length (asked only for it)."""
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(cfg.optimizer)
    if kind is None:
        raise CaptioningError(f"optim.optimizer={cfg.optimizer!r} is not one of adam, adamw")
    optimizer = kind(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    if cfg.scheduler == "none":
        return optimizer
    if cfg.scheduler == "cosine":
        total = schedule_steps()

        def factor(step: int) -> float:
            if step < cfg.warmup_steps:
                return (step + 1) / cfg.warmup_steps
            progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
            return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
    if cfg.scheduler == "step":
        sched = torch.optim.lr_scheduler.StepLR(optimizer, cfg.step_epochs, cfg.gamma)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}
    if cfg.scheduler == "plateau":
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=cfg.gamma, patience=2)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": sched, "monitor": "val/CIDEr", "interval": "epoch"}}
    raise CaptioningError(f"optim.scheduler={cfg.scheduler!r} is not one of none, cosine, step, plateau")
