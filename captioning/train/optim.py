"""Optimisation: Adam/AdamW, the learning-rate schedule and the update, decided on the device.

``configure_optimization`` returns the optimizer over parameter groups (each with its own base
``lr``: fine-tuning gives the encoder a group of its own) and its schedule in Lightning's
``configure_optimizers`` form.  ``cosine``: linear warm-up over ``warmup_steps``, then a half cosine
from ``lr`` down to ``lr * min_lr_ratio`` over the schedule's length in optimizer steps
(``schedule_steps``, resolved once before a run starts); ``step``: ``gamma`` every ``step_epochs``
epochs; ``plateau``: ``gamma`` when the validation CIDEr-D stops rising; ``none``: a constant ``lr``.

``apply_update`` is one update with no host read: the gradients clipped, and the step skipped by
the fused optimizer itself when a loss or a gradient is not finite (its ``found_inf`` input, what
AMP's GradScaler uses), so a NaN never reaches the weights and nothing waits for the device.
``NonFiniteSteps`` keeps the updates' verdicts until a logging step reads them all at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

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


def build_optimizer(groups: Iterable[dict[str, Any]], cfg: OptimConfig) -> torch.optim.Optimizer:
    """Adam or AdamW over parameter groups, the fused implementation where the parameters' device
    has one (CUDA, CPU): one kernel for all parameters, and ``found_inf`` honoured (``apply_update``)."""
    kind = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}.get(cfg.optimizer)
    if kind is None:
        raise CaptioningError(f"optim.optimizer={cfg.optimizer!r} is not one of adam, adamw")
    groups = [dict(g) for g in groups]
    devices = {p.device.type for g in groups for p in g["params"]}
    fused = devices <= {"cuda", "cpu"} and all(p.is_floating_point() for g in groups for p in g["params"])
    return kind(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, fused=fused or None)


def configure_optimization(groups: Iterable[dict[str, Any]], cfg: OptimConfig, schedule_steps: int | None) -> Any:
    """The optimizer over parameter ``groups`` and its schedule, as Lightning's configure_optimizers
    returns them; ``schedule_steps``: the cosine schedule's length (resolved before the run)."""
    optimizer = build_optimizer(groups, cfg)
    if cfg.scheduler == "none":
        return optimizer
    if cfg.scheduler == "cosine":
        if schedule_steps is None or int(schedule_steps) < 1:
            raise CaptioningError(f"optim.schedule_steps={schedule_steps}: the cosine schedule needs at least 1 step")
        total = int(schedule_steps)

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


def apply_update(optimizer: torch.optim.Optimizer, finite: torch.Tensor | None, clip_val: float | None,
                 clip_algorithm: str | None = "norm") -> torch.Tensor:
    """One update: gradients clipped (``norm``: to total norm ``clip_val``; ``value``: each entry),
    then the step, skipped when ``finite`` (the update's losses, on the device) is False or a
    gradient is not finite.  Returns that verdict (``found_inf``, a device bool) unread.  Under DDP the
    ranks agree on it (one all-reduce of a flag).  An optimizer without ``found_inf`` (not fused)
    reads it on the host."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if clip_val:
        if clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, clip_val)
        else:
            torch.nn.utils.clip_grads_with_norm_(params, clip_val, norm)
    found = ~torch.isfinite(norm)
    if finite is not None:
        found = found | ~finite.to(found.device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        flag = found.to(torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        found = flag.bool()
    if getattr(optimizer, "_step_supports_amp_scaling", False) and optimizer.defaults.get("fused"):
        optimizer.found_inf = found.to(torch.float32)
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif not bool(found):
        optimizer.step()
    return found


@dataclass
class NonFiniteSteps:
    """The updates since the last logging step, their verdicts unread on the device: per update
    ``(found_inf, loss, epoch, batch, global step, item indices)``.  ``read`` reads them at once."""

    pending: list[tuple[torch.Tensor, torch.Tensor, int, int, int, torch.Tensor]] = field(default_factory=list)
    total: int = 0  # skipped updates since the run started (in this process)

    def add(self, found: torch.Tensor, loss: torch.Tensor, epoch: int, batch: int, step: int,
            index: torch.Tensor) -> None:
        self.pending.append((found, loss, epoch, batch, step, index))

    def read(self) -> list[str]:
        """One line per skipped update since the last read (its loss, epoch, batch, global step and
        first items); one transfer, two when an update was skipped."""
        pending, self.pending = self.pending, []
        if not pending:
            return []
        values = torch.stack([torch.stack([f.float(), loss.float()]) for f, loss, *_ in pending]).tolist()
        skipped = [(loss, e, b, s, index) for (flag, loss), (_, _, e, b, s, index) in zip(values, pending, strict=True)
                   if flag]
        self.total += len(skipped)
        items = [index[:8].tolist() for *_, index in skipped]
        return [(f"non-finite loss ({loss:g})" if not math.isfinite(loss) else f"non-finite gradient (loss {loss:.4g})")
                + f" at epoch {e}, batch {b} (global step {s}), items {i}"
                for (loss, e, b, s, _), i in zip(skipped, items, strict=True)]
