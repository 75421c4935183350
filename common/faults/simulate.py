"""`--inject-simulate`: the recovery study's simulated failures, in which no process is lost.

The study (`../shared/papers/low-overhead-resilience-rollback-lossy-forward.txt`, section III-C)
simulates a failure during the backward pass of one step on some replicas, the *casualties*:
the gradients computed before the failure (the last layers, `progress` of them in backward order)
are averaged as usual, and those after it are zero on the casualties. Then one of two recoveries:

- **lossy forward** (`--simulate-recovery lossy-forward`): the survivors finish the step alone: every replica
  divides its remaining gradients by the number of survivors instead of all replicas (the
  casualties' are zero) and the allreduce sums them, i.e. the survivors' average; the casualties'
  samples of that step are dropped. Costs about one normal step.
- **immediate mini-batch rollback** (`--simulate-recovery rollback`): no survivors for the
  remaining gradients (zero on every replica), so those weights do not move; then the same
  mini-batch is replayed failure-free on the state the failed attempt left, as the study does
  (the layers updated before the failure get that step's update twice). Costs just under two steps.

Both are deterministic: the same flags give the same losses to the bit, so their effect on
accuracy can be compared with the failure-free run exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.inject import parse_simulated_all
from dpuoffload.common.faults.policy import SimulatedRecovery


@dataclass(frozen=True)
class StepFailure:
    """One simulated failure: the casualties (host ranks) of a global step and the recovery."""

    global_step: int
    casualties: tuple[int, ...]
    progress: float         # share of the step's gradients (backward order) computed before the failure
    recovery: SimulatedRecovery

    @property
    def replays(self) -> bool:
        return self.recovery is SimulatedRecovery.ROLLBACK

    def describe(self, size: int, lost: int, total: int) -> str:
        who = ", ".join(map(str, self.casualties))
        how = ("immediate rollback: those weights stay, then the mini-batch is replayed" if self.replays else
               f"lossy forward: the {size - len(self.casualties)} survivor(s) average them")
        return (f"simulated failure at global step {self.global_step}: host rank(s) {who} lost {lost} of "
                f"{total} gradients (after {self.progress:.0%} of the backward pass); {how}")


class FailureSimulator:
    """The simulated failures of a run, by global step (`at`)."""

    def __init__(self, specs: Sequence[str], recovery: "SimulatedRecovery | str", total_steps: int,
                 replicas: int) -> None:
        recovery = SimulatedRecovery.parse(recovery)
        by_step: dict[int, tuple[set[int], float]] = {}
        for sim in parse_simulated_all(specs):
            if sim.injection.index >= replicas:
                raise ConfigError(f"--inject-simulate {sim}: there is no host rank {sim.injection.index} "
                                  f"(this run has {replicas}: host:0..{replicas - 1})")
            step = sim.injection.at(total_steps)
            casualties, progress = by_step.setdefault(step, (set(), sim.progress))
            if progress != sim.progress:
                raise ConfigError(f"--inject-simulate {sim}: another spec fails step {step} after {progress:.0%} of "
                                  "the gradients; one failure per step (list its casualties with the same P)")
            casualties.add(sim.injection.index)
        survivors_needed = recovery is SimulatedRecovery.LOSSY_FORWARD
        for step, (casualties, _) in by_step.items():
            if survivors_needed and len(casualties) == replicas:
                raise ConfigError(f"--inject-simulate: every host rank is a casualty at step {step}, so lossy forward "
                                  "has no survivor to go on with; keep one, or use --simulate-recovery rollback")
        self.failures = {step: StepFailure(step, tuple(sorted(c)), p, recovery) for step, (c, p) in by_step.items()}

    def at(self, global_step: int) -> Optional[StepFailure]:
        return self.failures.get(global_step)


def lose_gradients(grads: Sequence[torch.Tensor], failure: StepFailure, rank: int, size: int) -> int:
    """Prepare this replica's gradients (in `model.parameters()` order) for the averaging allreduce
    of a failed step, in place; return how many of them the failure took."""
    backward = list(reversed(grads))           # the last layer's gradients are computed first
    lost = backward[math.floor(failure.progress * len(backward)):]
    survivors = size - len(failure.casualties)
    if failure.replays or rank in failure.casualties:
        for g in lost:
            g.zero_()
    else:                                       # average / size * (size / survivors) = sum / survivors
        for g in lost:
            g.mul_(size / survivors)
    return len(lost)
