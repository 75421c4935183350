"""`--recovery` built in one place, before the trainer: the host group, what the trainer does after
a death, and under rollback the spare pool and what rides in every step's allreduce.

Everything here is handed to the parts that use it at their construction (the gradient sync gets
the passenger, validation and the trainer the group, the trainer the hooks): nothing is wired into
another object afterwards. The decisions come from `common.faults.policy.RecoveryPolicy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from dpuoffload.common.data.loaders import Sampling
from dpuoffload.common.train.training_state import TrainingState
from dpuoffload.host.recovery.carried import Carried
from dpuoffload.host.recovery.growback import GrowBack
from dpuoffload.host.recovery.spares import Rollback, SparePool
from dpuoffload.host.recovery.survivors import LossyForward, SurvivorGroup

if TYPE_CHECKING:
    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.faults.watch import Faults
    from dpuoffload.common.runtime.roles import Topology
    from dpuoffload.common.train.loop import RecoveryHooks, TrainJob


@dataclass(frozen=True)
class HostRecovery:
    """What `--recovery` adds to a host rank (or a seated spare) for the run.

    `group`: the host ranks, which shrink to the survivors (lossy forward) or seat spares (rollback;
    lossy forward with spare ranks, at the next epoch); `hooks`: the trainer's side
    (`common.train.loop.RecoveryHooks`); with spare ranks `spares`, the pool the dead ranks' seats
    are filled from; under rollback `passenger`, what rides in each gradient allreduce.
    """

    group: SurvivorGroup
    hooks: "RecoveryHooks"
    spares: Optional[SparePool] = None
    passenger: Optional[Carried] = None

    @classmethod
    def build(cls, cfg: "RunConfig", topo: "Topology", job: "TrainJob", faults: "Faults",
              state: TrainingState) -> Optional["HostRecovery"]:
        """On a host rank, collective over the host ranks (and the spare ranks under rollback, who
        build their pool in `host.spare`): None without --recovery."""
        policy = cfg.recovery_policy
        if not policy.survives_host_loss:
            return None
        if policy.fills_seats(len(topo.spare_ranks)):
            pool = SparePool(topo, cfg.peer_timeout, faults)
            return cls.seated(cfg, topo, job, faults, state, pool, topo.side_rank)
        group = SurvivorGroup(topo, faults, cfg.peer_timeout)
        sampling = Sampling.of(cfg, len(topo.host_ranks), topo.side_rank)
        return cls(group, LossyForward(group, job.train.dataset, sampling, job.feed.steps(), cfg.reassign))

    @classmethod
    def seated(cls, cfg: "RunConfig", topo: "Topology", job: "TrainJob", faults: "Faults", state: TrainingState,
               pool: SparePool, seat: int) -> "HostRecovery":
        """For a rank in seat `seat` of `pool`: a host rank at the start, or a spare once called in.
        Rollback (a spare replays the step), or lossy forward with spares (a spare fills the seat at
        the next epoch: `host.recovery.growback`). Collective over the seated ranks."""
        group = SurvivorGroup(topo, faults, cfg.peer_timeout, pool)
        if not cfg.recovery_policy.uses_spares:
            growth = GrowBack(group, pool, state, cfg.epochs)
            sampling = Sampling.of(cfg, len(topo.host_ranks), seat)
            hooks = LossyForward(group, job.train.dataset, sampling, job.feed.steps(), cfg.reassign, growth)
            return cls(group, hooks, pool)
        carried = Carried(state.model, group)
        return cls(group, Rollback(group, pool, carried, state, topo, cfg.epochs), pool, carried)

    def joined(self, epoch: int) -> None:
        """On a spare called into a seat before `epoch` (lossy forward: it takes over its slice of the
        seats still vacant, as the rest of the group does)."""
        if isinstance(self.hooks, LossyForward):
            self.hooks.joined(epoch)
