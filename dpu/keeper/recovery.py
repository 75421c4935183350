"""Routes under `--recovery`: host ranks may die, so hand-offs and reports may be missing or late.

`SurvivingRoute` (lossy forward): each hand-off is sliced among the living host ranks; a keeper
none of whose host ranks is left gets a header-only notice instead (so every keeper hears of every
checkpoint), and a keeper drops a host rank whose header receive reports it dead. A host rank that
dies between a checkpoint's step and its hand-off tears that checkpoint: its keeper never hears of
it and reports a later one first. The committer keeps such early reports for their turn, counts
the missing part as a dead host rank's, and settles by name a checkpoint it never heard of itself.

`SeatsRoute` (rollback): a spare takes the dead rank's seat and sends its part instead. It tells
the seat's keeper where it starts (JOIN) and re-sends the hand-off due there, so a death next to a
checkpoint does not tear it; a copy of a part that had come whole is dropped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, cast

from dpuoffload.common.errors import PeerError, PeerLost
from dpuoffload.common.runtime.messages import StateKind, Tag
from dpuoffload.common.runtime.waits import wait_object
from dpuoffload.common.state.ckptfiles import Received
from dpuoffload.dpu.keeper.commit import Death, KeeperReport, ReportSet
from dpuoffload.dpu.keeper.inbox import (
    HANDOFF_POLL_MAX_SLEEP,
    SLICE_POLL_MAX_SLEEP,
    PostedHeaders,
    handoff_order,
    header_only,
)
from dpuoffload.dpu.keeper.routes import Collected, Handoff, Route

if TYPE_CHECKING:
    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.faults.watch import Faults
    from dpuoffload.common.runtime.roles import Topology
    from dpuoffload.dpu.keeper.inbox import Inbox


class SurvivingRoute(Route):
    """Hand-offs from this keeper's host ranks still alive; reports that may come late or early."""

    reports_meta = True

    def __init__(self, cfg: "RunConfig", topo: "Topology", inbox: "Inbox", faults: "Faults") -> None:
        """`faults`: the run's failure record (the host ranks its watch found dead)."""
        super().__init__(cfg, topo, inbox)
        self.faults = faults
        self.headers = PostedHeaders(topo, self.senders(), drop_dead=True, timeout=cfg.peer_timeout)
        self.early: dict[int, list[KeeperReport]] = {}   # (committer) keeper -> its reports of a later step

    def senders(self) -> tuple[int, ...]:
        """Every host rank (its keeper may change)."""
        return tuple(self.assign.keepers)

    def receive(self) -> Handoff:
        heads = self.headers.next_heads()
        return self.take(min(heads.values(), key=handoff_order), heads)

    def take(self, first: Mapping[str, int], heads: Mapping[int, Mapping[str, int]]) -> Handoff:
        """The hand-off `first` belongs to, from this keeper's host ranks still alive (or the notice
        that none of them hands it off). A host rank that dies before its part came is missed."""
        if first["sender"] < 0:
            self.headers.take(next(h for h, head in heads.items() if head == first))
            return Handoff([header_only(first)])
        parts, missed = [], []
        for h in [h for h in self.hosts if h not in self.headers.gone]:
            try:
                self.headers.wait(h)
                parts.append(self.inbox.parts(h, self.headers.take(h)))
            except PeerLost:
                self.headers.lose(h)
                missed.append(h)
        if len(parts) < first["to_me"] and not missed:  # (a death this keeper had learnt of before)
            missed = [h for h in self.hosts if h in self.headers.gone]
        return Handoff(parts or [header_only({**first, "sender": -1})], missed)

    def collect(self, step: int, others: Sequence[int]) -> Collected:
        return self.settle(step, others)

    def finish(self, committer: int) -> list[ReportSet]:
        """Every keeper tells the committer it is done, which settles the checkpoints a keeper
        never heard of (`next_report`)."""
        self.headers.cancel()
        if not self.cfg.checkpointing:
            return []
        if self.topo.world_rank != committer:
            req = self.topo.world.isend(KeeperReport.end_of_run().to_wire(), dest=committer, tag=Tag.CKPT_REPORT)
            wait_object(req, self.cfg.peer_timeout, "the committing keeper to take the end report")
            return []
        return self.settle(None, [k for k in self.assign.keeper_ranks if k != committer]).earlier

    def summary_to(self, head: Mapping[str, int]) -> int:
        """The senders' rank 0 (another one once host rank 0 died)."""
        return head["leader"]

    def settle(self, step: Optional[int], others: Sequence[int]) -> Collected:
        """The committer at its hand-off `step` (or at the end, None): the other keepers' reports of
        it. A report of an earlier step is of one this keeper never heard of (its host ranks died
        before handing it over): that checkpoint is torn, and is settled first."""
        missed: dict[int, list[KeeperReport]] = {}
        reports = []
        for source in others:
            what = f"{self.topo.describe(source)}'s report of checkpoint step {step}"
            while (report := self.next_report(source, step, what)).step not in (step, -1):
                missed.setdefault(report.step, []).append(report)
            reports.append(report)
        mine = ", ".join(self.topo.describe(h) for h in self.hosts if h in self.headers.gone | self.faults.dead_ranks())
        earlier = [ReportSet(next(r.meta for r in theirs if r.meta), theirs + [KeeperReport.lost(
                       early, Death.HOST, f"{mine} died before handing the state of step {early} over")])
                   for early, theirs in sorted(missed.items())]
        return Collected(reports, earlier)

    def next_report(self, source: int, step: Optional[int], what: str) -> KeeperReport:
        """Keeper `source`'s next report up to `step` (None: to the end). If its host ranks died
        before handing `step` over, it never heard of it and reports a later step (or the end)
        first: that one is kept for its turn and this step is missing their part."""
        early = self.early.setdefault(source, [])
        report = early.pop(0) if early else self.receive_report(source, what)
        if step is not None and (report.end or report.step > step):
            early.insert(0, report)
            hosts = ", ".join(self.topo.describe(h) for h in self.assign.hosts_kept_by(source))
            return KeeperReport.lost(step, Death.HOST, f"{hosts} died before handing the state of step {step} over")
        return report

    def receive_report(self, source: int, what: str) -> KeeperReport:
        """While `source` may be waiting on dead host ranks (`may_wait_long`) the wait has no
        deadline: some later report comes."""
        req = self.topo.world.irecv(source=source, tag=Tag.CKPT_REPORT)
        deadline = time.monotonic() + self.cfg.peer_timeout
        while True:
            done, report = req.test()
            if done:  # (mpi4py's stubs type the message Optional: done, it is the report's `to_wire` dict)
                return KeeperReport.from_wire(cast("Mapping[str, Any]", report))
            if self.may_wait_long([h in self.faults.dead_ranks() for h in self.assign.hosts_kept_by(source)]):
                deadline = float("inf")
            if time.monotonic() > deadline:
                raise PeerError(f"timed out after {self.cfg.peer_timeout:.0f} s waiting for {what}")
            time.sleep(HANDOFF_POLL_MAX_SLEEP)

    def may_wait_long(self, dead: Sequence[bool]) -> bool:
        """Whether a keeper whose host ranks are `dead` (one flag each) may report late: all dead."""
        return all(dead)


@dataclass
class SeatBook:
    """Who hands each seat's part of a hand-off over, by step: the seat's host rank, then each spare
    that joined it from the step its JOIN names on. Why by step: a hand-off the dead rank posted
    before it died (its part still on the way, or never whole) is that rank's to bring, not the
    spare's that took the seat after it; asking who holds the seat *now* had the keeper wait on a
    living spare for a part only the dead rank could send (a rollback run that hung at its end)."""

    hosts: dict[int, int]   # seat -> its host rank (world rank)
    joins: dict[int, list[tuple[int, int]]] = field(default_factory=dict)   # seat -> [(from step, rank)]

    def join(self, seat: int, rank: int, step: int) -> None:
        """`rank` (a spare) trains in `seat` from global step `step` on and hands its parts over."""
        self.joins.setdefault(seat, []).append((step, rank))

    def holder(self, seat: int, step: int) -> int:
        """The rank that hands `seat`'s part of the hand-off at `step` over: the last to join at or
        before `step` (a spare joining at `step` re-sends what was due there)."""
        return next((rank for start, rank in reversed(self.joins.get(seat, [])) if start <= step), self.hosts[seat])

    def last_join(self, seat: int) -> int:
        """The global step the seat's newest spare started from (-1: none joined)."""
        return self.joins[seat][-1][0] if self.joins.get(seat) else -1


class SeatsRoute(SurvivingRoute):
    """Hand-offs one part per seat, from whoever trains in it: the host rank, or the spare that
    took its seat (`host.checkpoint.StateHandoff.join`)."""

    def __init__(self, cfg: "RunConfig", topo: "Topology", inbox: "Inbox", faults: "Faults") -> None:
        super().__init__(cfg, topo, inbox, faults)
        self.seats = tuple(topo.host_ranks.index(h) for h in self.hosts)   # the seats this keeper keeps
        self.book = SeatBook({s: topo.host_ranks[s] for s in self.seats})   # who hands each seat's part over
        self.last_order = float("-inf")    # the last hand-off received (a later copy is dropped)
        self.steps_per_epoch: Optional[int] = None   # from the first hand-off's meta: the run's last step

    def senders(self) -> tuple[int, ...]:
        """Every host rank and every spare rank."""
        return (*self.assign.keepers, *self.topo.spare_ranks)

    def receive(self) -> Handoff:
        heads = self.headers.next_heads(self.keep)
        first = min(heads.values(), key=handoff_order)
        handoff = self.from_seats(first) if first["sender"] >= 0 else self.take(first, heads)
        self.last_order = handoff_order(first)
        return handoff

    def may_wait_long(self, dead: Sequence[bool]) -> bool:
        """Any dead: that keeper may be waiting for a spare."""
        return any(dead)

    def keep(self, source: int) -> bool:
        """Whether `source`'s landed header is part of a hand-off still to come. If not, it is taken
        here: a spare's JOIN (it trains in that seat from that step on), or a copy of a hand-off this
        keeper has finished (a spare re-sent a part that had come whole: drained, dropped)."""
        head = self.headers.head(source)
        join = head["kind"] == StateKind.JOIN
        if not join and handoff_order(head) > self.last_order:
            return True
        header = self.headers.take(source)
        if join and head["seat"] in self.seats:
            self.book.join(head["seat"], source, head["global_step"])
        elif not join:
            try:
                self.inbox.parts(source, header)
            except PeerLost:
                self.headers.gone.add(source)
        return False

    def from_seats(self, first: Mapping[str, int]) -> Handoff:
        """The hand-off `first` belongs to, one part per seat of this keeper that the senders fill
        (`to_me`). A seat whose rank died before its part came whole gets it from the spare that
        takes the seat; the part is missed (the checkpoint torn) only when no spare brings it."""
        want = first["to_me"]
        got: dict[int, Received] = {}
        deadline, sleep = time.monotonic() + self.cfg.peer_timeout, 0.0
        while True:
            for source in self.headers.landed(self.keep):
                self.take_seat(source, first, got)
            waiting = [s for s in self.seats if s not in got]
            lost = [s for s in waiting if self.seat_dead(s, first) and self.no_spare_brings(s, first)]
            if len(got) + len(lost) >= want:
                break
            if time.monotonic() > deadline and not all(self.seat_dead(s, first) for s in waiting):
                raise PeerError(f"timed out after {self.cfg.peer_timeout:.0f} s waiting for the hand-off of step "
                                f"{first['global_step']} from " + ", ".join(
                                    self.topo.describe(self.book.holder(s, first["global_step"])) for s in waiting))
            time.sleep(sleep)
            sleep = min(max(2 * sleep, 1e-4), SLICE_POLL_MAX_SLEEP)
        missed = [self.topo.host_ranks[s] for s in lost] if len(got) < want else []
        return Handoff([got[s] for s in sorted(got)] or [header_only({**first, "sender": -1})], missed)

    def take_seat(self, source: int, first: Mapping[str, int], got: dict[int, Received]) -> None:
        """`source`'s part, if its landed header is of the hand-off `first` (a later hand-off waits
        for its turn; another group's copy is dropped then)."""
        head = self.headers.head(source)
        if handoff_order(head) != handoff_order(first) or head["senders"] != first["senders"]:
            return
        header = self.headers.take(source)
        try:
            part = self.inbox.parts(source, header)
        except PeerLost:
            self.headers.gone.add(source)   # (its spare sends the part again)
            return
        got.setdefault(head["seat"], part)
        if self.steps_per_epoch is None and part.head["small_nbytes"]:
            self.steps_per_epoch = part.meta.get("steps_per_epoch")

    def seat_dead(self, seat: int, first: Mapping[str, int]) -> bool:
        """Whether the rank that hands `seat`'s part of the hand-off `first` over is dead: the seat's
        holder at that step, not its holder now (a spare that joined after the step never sends it)."""
        source = self.book.holder(seat, first["global_step"])
        return source in self.headers.gone or source in self.faults.dead_ranks()

    def no_spare_brings(self, seat: int, first: Mapping[str, int]) -> bool:
        """Whether no spare will send `seat`'s part of the hand-off `first` (its rank is dead): a
        spare joined after that step, or the hand-off comes after the last point where a spare is
        called in (PREPARE, which spares skip; the run's last step; the end)."""
        step = first["global_step"]
        if first["kind"] in (StateKind.PREPARE, StateKind.END) or self.book.last_join(seat) > step:
            return True
        last = [s for s in (self.cfg.stop_at_step, self.steps_per_epoch and self.steps_per_epoch * self.cfg.epochs)
                if s]
        return bool(last) and step >= min(last)
