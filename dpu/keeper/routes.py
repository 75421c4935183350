"""The routes interface: how hand-offs reach a keeper, and how keepers' reports reach the committer.

Which host ranks hand their state to which keeper, and which keepers report to which, depends on
what the run survives (`common.faults.policy.RecoveryPolicy`). Each answer is one `Route`, chosen
once per run (`keeper.route_for`):

- `direct.FixedRoute`: nothing is survived; each keeper hears from its own host ranks only.
- `direct.ReroutedRoute`: `--dpu-failure fallback`; a dead keeper's host ranks go to the living ones.
- `recovery.SurvivingRoute`: `--recovery lossy-forward`; hand-offs come from the surviving host ranks.
- `recovery.SeatsRoute`: `--recovery rollback`; a spare sends the dead host rank's part from its seat.

The keeper (`keeper.Keeper`) does the same on every route: write what came, commit or report it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

from dpuoffload.common.errors import PeerLost
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.runtime.messages import Tag
from dpuoffload.common.runtime.waits import lost_peer, wait_object
from dpuoffload.common.state.ckptfiles import Received
from dpuoffload.dpu.keeper.commit import KeeperReport, ReportSet

if TYPE_CHECKING:
    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.runtime.roles import Topology
    from dpuoffload.dpu.keeper.inbox import Inbox


@dataclass
class Handoff:
    """This keeper's part of one hand-off.

    Attributes:
        parts: one per host rank that handed off here, in seat order; a header-only notice (`sender`
            -1) when none did (`--recovery`: every keeper hears of every checkpoint).
        missed: host ranks whose part did not come (they died first): the checkpoint is torn.
    """

    parts: list[Received]
    missed: list[int] = field(default_factory=list)

    @property
    def head(self) -> Mapping[str, int]:
        return self.parts[0].head

    @property
    def real(self) -> list[Received]:
        """The parts that carry state (without a notice)."""
        return [r for r in self.parts if r.head["sender"] >= 0]


@dataclass
class Collected:
    """What the committer collected at a checkpoint: the other keepers' reports of it, and before
    them the checkpoints found torn on the way (to settle first, oldest first)."""

    reports: list[KeeperReport]
    earlier: list[ReportSet] = field(default_factory=list)


class Route(ABC):
    """How hand-offs reach this keeper and how the keepers' reports reach the committer.

    Call order, on every keeper DPU rank, in its keeper thread:

    1. `receive()`, once per hand-off, in the order every host rank goes through them (PREPARE,
       the CHECKPOINT / CLONE hand-offs by global step, END). It returns when this keeper's part
       of the next hand-off is in; the wait has no deadline (checkpoints may be hours apart).
    2. At a CHECKPOINT, after writing its part: `living(head)` names the committer (first). The
       committer calls `collect(step, others)`; every other living keeper calls `report(...)`
       once, to the committer.
    3. At END, once: `finish(committer)` (the committer commits what it returns), then
       `summary_to(head)` names the host rank that gets the run's checkpoint summary. No call after.

    Attributes:
        reports_meta: a keeper's report carries the checkpoint's meta, because the committer may
            have no part of it (its host ranks may be dead).
    """

    reports_meta = False

    def __init__(self, cfg: "RunConfig", topo: "Topology", inbox: "Inbox") -> None:
        self.cfg, self.topo, self.inbox = cfg, topo, inbox
        self.assign = StateAssignment.of(topo)
        self.hosts = self.assign.hosts_kept_by(topo.world_rank)   # the host ranks this keeper keeps at first
        # A dead keeper is survived (--dpu-failure fallback): the committer changes, reports may not come.
        self.keeper_loss = cfg.recovery_policy.survives_keeper_loss

    @abstractmethod
    def receive(self) -> Handoff:
        """This keeper's part of the next hand-off."""

    @abstractmethod
    def collect(self, step: int, others: Sequence[int]) -> Collected:
        """The committer, at checkpoint `step`: the reports of keepers `others` (world ranks)."""

    def living(self, head: Mapping[str, int]) -> list[int]:
        """The keepers alive as this hand-off's header says, lowest (the committer) first (all of
        them where a keeper's loss is not survived: its death ends the job)."""
        lost = self.assign.lost_of(head["lost_keepers"]) if self.keeper_loss else frozenset()
        return [k for k in self.assign.keeper_ranks if k not in lost]

    def report(self, report: KeeperReport, committer: int) -> None:
        """A keeper other than the committer: send it this keeper's report. A committer that died
        (a dead keeper survived) never commits this checkpoint; the next one has another committer."""
        what = "the committing keeper to take the checkpoint report"
        req = self.topo.world.isend(report.to_wire(), dest=committer, tag=Tag.CKPT_REPORT)
        try:
            with lost_peer(what):
                wait_object(req, self.cfg.peer_timeout, what)
        except PeerLost:
            if not self.keeper_loss:
                raise

    def finish(self, committer: int) -> list[ReportSet]:
        """After END: stop receiving; the checkpoints the committer must still settle (none here)."""
        return []

    def summary_to(self, head: Mapping[str, int]) -> int:
        """The world rank that takes the checkpoint summary: host rank 0."""
        return self.topo.host_ranks[0]
