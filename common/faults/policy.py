"""What a run survives, decided once: `--recovery` and `--dpu-failure` as one frozen policy.

Every place that acts on a death (the failure watch's verdict, the keepers, the DPU feeders and
validators, the host program's group, the launcher's checks) asks the policy a question
(`policy.survives_host_loss`, `policy.uses_spares`) instead of comparing flag strings, so the
meaning of each recovery is written here once and a new one is added here once.

One vocabulary for the strategies, the recovery study's (`../shared/papers/low-overhead-resilience-
rollback-lossy-forward.txt`): **lossy forward** (the survivors go on without the dead replica's
samples) and **rollback** (the lost step is replayed, by a spare in the dead rank's seat; the study's
immediate mini-batch rollback). `--simulate-recovery` (no process lost) names the same two; its old
spellings `lf` / `ir` are still read, with a deprecation message.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpuoffload.common.modes import FlagValue

if TYPE_CHECKING:
    from dpuoffload.common.config import RunConfig


class Recovery(FlagValue):
    """`--recovery`: what a dead host rank does to the run."""

    STOP = "stop"                    # the job ends, naming the rank
    LOSSY_FORWARD = "lossy-forward"  # the survivors shrink their group and go on
    ROLLBACK = "rollback"            # a spare rank takes the seat and the lost step is replayed


class DpuFailure(FlagValue):
    """`--dpu-failure`: what a dead DPU rank does to the run."""

    STOP = "stop"          # the job ends, naming the rank
    FALLBACK = "fallback"  # its host ranks load (or validate) themselves from then on


class SimulatedRecovery(FlagValue):
    """`--simulate-recovery`: the recovery that `--inject-simulate`'s failures (no process lost) use."""

    LOSSY_FORWARD = "lossy-forward"
    ROLLBACK = "rollback"

    @classmethod
    def parse(cls, value: str) -> "SimulatedRecovery":
        """The flag's value, reading the old spellings `lf` / `ir` with a deprecation message."""
        old = _OLD_SIMULATED.get(value)
        if old is None:
            return cls(value)
        print(f"dpuoffload: --simulate-recovery {value} is deprecated: say --simulate-recovery {old}", file=sys.stderr)
        return old


_OLD_SIMULATED = {"lf": SimulatedRecovery.LOSSY_FORWARD, "ir": SimulatedRecovery.ROLLBACK}
SIMULATED_SPELLINGS = tuple(r.value for r in SimulatedRecovery) + tuple(_OLD_SIMULATED)


@dataclass(frozen=True)
class RecoveryPolicy:
    """What the run survives. Derived from the config (`RecoveryPolicy.of(cfg)`, or `cfg.recovery_policy`)."""

    host_loss: Recovery = Recovery.STOP
    dpu_loss: DpuFailure = DpuFailure.STOP
    clones: bool = False  # clone ranks wait for every keeper's slice of the clone state

    @classmethod
    def of(cls, cfg: "RunConfig") -> "RecoveryPolicy":
        return cls(Recovery(cfg.recovery), DpuFailure(cfg.dpu_failure), cfg.clone_at is not None)

    @property
    def survives_host_loss(self) -> bool:
        """A dead host rank is survived: the host group may change, so every peer of the host ranks (DPU
        feeders, keepers, validators) takes state and requests from whichever host ranks are alive."""
        return self.host_loss is not Recovery.STOP

    @property
    def shrinks_group(self) -> bool:
        """The survivors go on as a smaller group (lossy forward)."""
        return self.host_loss is Recovery.LOSSY_FORWARD

    @property
    def uses_spares(self) -> bool:
        """Spare ranks stand by and take dead host ranks' seats at once, to replay the step (rollback,
        which needs them)."""
        return self.host_loss is Recovery.ROLLBACK

    def fills_seats(self, spare_ranks: int) -> bool:
        """Spare ranks (`dpurun --spare-ranks`, `spare_ranks` of them) take dead host ranks' seats: under
        rollback at once, under lossy forward at the next epoch's start (the group grows back to full
        size). Every peer of the host ranks then takes a seat's requests from the spare in it."""
        return self.uses_spares or (self.shrinks_group and spare_ranks > 0)

    @property
    def survives_dpu_loss(self) -> bool:
        """A dead augmentation or validation DPU rank is survived: its host ranks do its work from then on."""
        return self.dpu_loss is DpuFailure.FALLBACK

    @property
    def survives_keeper_loss(self) -> bool:
        """A dead checkpoint keeper is survived: under `--dpu-failure fallback`, unless clone ranks wait
        for its slice of the clone state (a clone rank waits for its own keeper's forward). With
        `--ckpt-mem-keep` the dead keeper's DPU memory stops at its death, so a relaunch finds no newer
        step every keeper holds than the disk's and reads the disk (`memstore.restart_step`)."""
        return self.survives_dpu_loss and not self.clones

    @property
    def needs_ulfm(self) -> bool:
        """Some death is survived, so MPI must be started with fault tolerance (ULFM)."""
        return self.survives_dpu_loss or self.survives_host_loss

    @property
    def flag(self) -> str:
        """The flag(s) that asked for fault tolerance, as the user wrote them (for messages)."""
        flags = ([f"--dpu-failure {self.dpu_loss}"] if self.survives_dpu_loss else []) + \
                ([f"--recovery {self.host_loss}"] if self.survives_host_loss else [])
        return " and ".join(flags) or "no fault tolerance"
