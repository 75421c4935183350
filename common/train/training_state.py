"""What a step changes and what a hand-off of the run carries: the model, its optimizer and LR
schedule, and the epoch records still waiting for their validation results.

Built before the trainer (`TrainingState.build`), so that what must see the same objects is handed
them at construction: the trainer steps them, `--recovery rollback` packs them for a spare
(`host.recovery.spares.Rollback`), a spare loads its call-in state into them before it trains
(`host.spare`), and resumes and clones restore into them (`common.state.load.Live`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dpuoffload.common.config import RunConfig
from dpuoffload.common.modes import LrSchedule


def build_optimizer(cfg: RunConfig, model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay)


def lr_factor(schedule: LrSchedule, step: int, total: int) -> float:
    """Multiplier of the peak LR at `step` of `total` (per-step schedules)."""
    if schedule == LrSchedule.COSINE:
        return 0.5 * (1.0 + math.cos(math.pi * step / max(total, 1)))
    if schedule == LrSchedule.STEP:
        return 0.1 ** sum(step >= total * m for m in (0.5, 0.75))
    return 1.0


@dataclass
class TrainingState:
    """The objects a step updates, and the epochs' records kept until validation completes them."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    pending: dict[int, dict[str, Any]] = field(default_factory=dict)  # epoch -> its record before validation

    @classmethod
    def build(cls, cfg: RunConfig, model: nn.Module, total_steps: int) -> "TrainingState":
        """SGD with `cfg`'s hyperparameters and its per-step LR schedule over `total_steps`."""
        optimizer = build_optimizer(cfg, model)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(cfg.lr_schedule, s, total_steps))
        return cls(model, optimizer, scheduler)
