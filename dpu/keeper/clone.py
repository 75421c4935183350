"""A keeper's clone side: forward each host rank's hand-off, as received, to its clone rank (host rank
k's slice to clone rank k mod M), never touching disk (DeepClone's forwarding). Until the clone is
served, the keeper sends its clone ranks a heartbeat every peer_timeout/4 s while it waits
(`common.runtime.heartbeat`), so their stand-by can have a deadline without one of its own.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.runtime.heartbeat import Heartbeat, interval_for
from dpuoffload.common.runtime.messages import CKPT_HEADER, StateKind, Tag
from dpuoffload.common.runtime.waits import wait, wait_all
from dpuoffload.common.state.ckptfiles import Received

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.runtime.roles import Topology


class StandbyBeat:
    """Heartbeats from one keeper to the clone ranks it will serve, while they stand by.

    `poll` is called between the keeper's polls for the next hand-off; it sends a header-only
    HEARTBEAT to each clone rank when one is due (`common.runtime.heartbeat`). Small eager sends:
    they complete without the clone rank receiving them, which it does when it next looks."""

    def __init__(self, world: "MPI.Comm", clones: tuple[int, ...], interval: float) -> None:
        self.world, self.clones, self.schedule = world, clones, Heartbeat(interval)
        self.header = CKPT_HEADER.pack(kind=StateKind.HEARTBEAT, global_step=-1, sender=-1)
        self.inflight: list["MPI.Request"] = []

    def poll(self) -> None:
        if not self.schedule.take(time.monotonic()):
            return
        self.inflight = [r for r in self.inflight if not r.Test()]
        self.inflight += [self.world.Isend(self.header, dest=c, tag=Tag.CLONE) for c in self.clones]

    def close(self, timeout: float) -> None:
        """No more beats; the ones sent must have left before the keeper goes on (or ends)."""
        wait_all(self.inflight, timeout, "a clone rank to take a heartbeat")
        self.inflight = []


class CloneForwarder:
    """Forwards the clone state, and beats until it does, for the host ranks `hosts` this keeper keeps.

    Args:
        note: keeps a record of each forward (the keeper's records and its JSON-lines log).
    """

    def __init__(self, cfg: "RunConfig", topo: "Topology", hosts: Sequence[int],
                 note: Callable[[dict[str, Any]], None]) -> None:
        self.cfg, self.topo, self.hosts, self.note = cfg, topo, hosts, note
        self.assign = StateAssignment.of(topo)
        clones = self.assign.clone_targets_of(topo.world_rank) if cfg.clone_at is not None else ()
        self.standby: Optional[StandbyBeat] = StandbyBeat(topo.world, clones, interval_for(cfg.peer_timeout)) \
            if clones else None

    def poll(self) -> None:
        """Between polls for the next hand-off: a heartbeat when one is due (none once stopped)."""
        if self.standby is not None:
            self.standby.poll()

    def stop_beating(self) -> None:
        if self.standby is not None:
            self.standby.close(self.cfg.peer_timeout)
            self.standby = None

    def pass_sizes(self, batch: Sequence[Received]) -> None:
        """PREPARE: pass each hand-off's size on to its clone rank, so its buffer is warm too."""
        if not (self.topo.clone_ranks and self.cfg.clone_at is not None):
            return
        reqs = [self.topo.world.Isend(CKPT_HEADER.pack(**r.head), dest=self.assign.clone_target(host), tag=Tag.CLONE)
                for host, r in zip(self.hosts, batch)]
        wait_all(reqs, self.cfg.peer_timeout, "a clone rank to receive the hand-off size")

    def forward(self, batch: Sequence[Received], received: float) -> None:
        """Send each host rank's hand-off, unchanged, to its clone rank. `received`: wall-clock time
        the hand-off was complete here (with `forwarded_time`, it splits the clone's readiness)."""
        t0 = time.perf_counter()
        self.stop_beating()  # the state itself goes out next and ends the clone ranks' stand-by
        reqs = []
        for host, r in zip(self.hosts, batch):
            dest = self.assign.clone_target(host)
            header = CKPT_HEADER.pack(**{**r.head, "shared_parts": 1})  # forwarded as one buffer
            reqs += [self.topo.world.Isend(buf, dest=dest, tag=Tag.CLONE) for buf in (header, r.small, r.shared)]
        for req in reqs:
            wait(req, self.cfg.peer_timeout, "a clone rank to receive the forwarded state")
        self.note({"forwarded_step": batch[0].head["global_step"], "forward_s": time.perf_counter() - t0,
                   "received_time": received, "forwarded_time": time.time()})
