"""Routes while every host rank lives: each keeper reports each checkpoint once, of that step.

`FixedRoute` (nothing survived): a keeper hears from its own host ranks only, and a dead peer ends
the job. `ReroutedRoute` (`--dpu-failure fallback`, checkpoints without clones or DPU memory): a
keeper may die. The checkpoint it was part of is never committed; from the next hand-off on its
host ranks send to the surviving keepers (`StateAssignment.survivors`) and the lowest living keeper
commits. Every hand-off's header names the keepers the host ranks agreed are dead, so a keeper
keeps a header receive posted for every host rank and learns the routes from the headers that land.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from dpuoffload.common.errors import PeerError, PeerLost
from dpuoffload.common.runtime.messages import CKPT_HEADER, Tag
from dpuoffload.common.runtime.waits import lost_peer, wait, wait_object
from dpuoffload.common.state.ckptfiles import Received
from dpuoffload.dpu.keeper.commit import Death, KeeperReport, ReportSet
from dpuoffload.dpu.keeper.inbox import HANDOFF_POLL_MAX_SLEEP, PostedHeaders, handoff_order
from dpuoffload.dpu.keeper.routes import Collected, Handoff, Route

if TYPE_CHECKING:
    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.runtime.roles import Topology
    from dpuoffload.dpu.keeper.inbox import Inbox


class OneReportEach(Route):
    """The committer collects one report of the step from every other living keeper."""

    def collect(self, step: int, others: Sequence[int]) -> Collected:
        return Collected([self._report_of(source, step) for source in others])

    def _report_of(self, source: int, step: int) -> KeeperReport:
        """Keeper `source`'s report; one that died before reporting (a dead keeper survived) gets
        an error report in its name, so the checkpoint is not committed."""
        what = f"{self.topo.describe(source)}'s report of checkpoint step {step}"
        req = self.topo.world.irecv(source=source, tag=Tag.CKPT_REPORT)
        try:
            with lost_peer(what):
                report = KeeperReport.from_wire(wait_object(req, self.cfg.peer_timeout, what))
        except PeerLost:
            if not self.keeper_loss:
                raise
            report = KeeperReport.lost(step, Death.KEEPER, f"{self.topo.describe(source)} died before writing its part")
        if report.step != step:
            raise PeerError(f"keeper {source} reported checkpoint step {report.step}, expected {step}")
        return report


class FixedRoute(OneReportEach):
    """Each keeper hears from its own host ranks, in host rank order. Until the clone is served,
    `idle` runs between polls for the next hand-off (the clone ranks' heartbeats)."""

    def __init__(self, cfg: "RunConfig", topo: "Topology", inbox: "Inbox", idle: Callable[[], None]) -> None:
        super().__init__(cfg, topo, inbox)
        self.idle = idle

    def receive(self) -> Handoff:
        return Handoff([self._from(host) for host in self.hosts])

    def _from(self, host: int) -> Received:
        header = CKPT_HEADER.empty()
        wait(self.topo.world.Irecv(header, source=host, tag=Tag.CKPT), None, f"state from {self.topo.describe(host)}",
             max_sleep=HANDOFF_POLL_MAX_SLEEP, on_poll=self.idle)
        return self.inbox.parts(host, header)


class ReroutedRoute(OneReportEach):
    """Hand-offs from the host ranks this keeper keeps while the keepers in each header's
    `lost_keepers` are dead (a host rank may already be a hand-off ahead of another)."""

    def __init__(self, cfg: "RunConfig", topo: "Topology", inbox: "Inbox") -> None:
        super().__init__(cfg, topo, inbox)
        self.headers = PostedHeaders(topo, self.assign.keepers, drop_dead=False, timeout=cfg.peer_timeout)

    def receive(self) -> Handoff:
        heads = self.headers.next_heads()
        first = min(heads.values(), key=handoff_order)   # (the earliest hand-off that landed)
        lost = self.assign.lost_of(first["lost_keepers"])
        hosts = self.assign.hosts_kept_by(self.topo.world_rank, lost)
        self._check_stray(heads, first, hosts, lost)
        for host in hosts:
            self.headers.wait(host)
        return Handoff([self.inbox.parts(host, self.headers.take(host)) for host in hosts])

    def _check_stray(self, heads: Mapping[int, Mapping[str, int]], first: Mapping[str, int],
                     hosts: Sequence[int], lost: frozenset[int]) -> None:
        """A host rank that sent this hand-off here though the routes say otherwise: the host
        ranks and the keepers disagree on who is dead, which must never be left to hang."""
        stray = [h for h, head in heads.items() if h not in hosts and handoff_order(head) == handoff_order(first)]
        if stray:
            raise PeerError(f"{self.topo.describe(stray[0])} handed its state here, but with the keepers "
                            f"{sorted(lost)} dead this keeper keeps {hosts}")

    def finish(self, committer: int) -> list[ReportSet]:
        self.headers.cancel()
        return []
