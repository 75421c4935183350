"""A keeper's clone side: forward each host rank's hand-off to its clone rank (host rank k's slice to
clone rank k mod M), part by part as it arrives (cut-through), never touching disk (DeepClone's
forwarding). Until the clone is
served, the keeper sends its clone ranks a heartbeat every peer_timeout/4 s while it waits
(`common.runtime.heartbeat`), so their stand-by can have a deadline without one of its own.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from dpuoffload.common.errors import PeerError
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.runtime.heartbeat import Heartbeat, interval_for
from dpuoffload.common.runtime.messages import CKPT_HEADER, StateKind, Tag
from dpuoffload.common.runtime.waits import wait, wait_all
from dpuoffload.common.state.ckptfiles import Received
from dpuoffload.dpu.keeper.inbox import PartSink

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
        self.relayed: list["MPI.Request"] = []   # the sends of the clone state passed on so far

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

    def relay(self, host: int, handoff: Received) -> Optional[PartSink]:
        """Cut-through (the `Inbox`'s relay): a CLONE hand-off from `host` goes on to its clone rank
        as it arrives: its header and small part now, each shared part as soon as it landed here, so
        the clone rank pulls part i while this keeper still receives part i+1 (DeepClone forwards
        whole hand-offs; this keeps the hop from adding a second full copy to the clone's readiness).
        Other hand-offs: None (received whole)."""
        if handoff.head["kind"] != StateKind.CLONE or not self.topo.clone_ranks:
            return None
        self.stop_beating()  # the state itself goes out next and ends the clone ranks' stand-by
        dest = self.assign.clone_target(host)
        send = functools.partial(self.topo.world.Isend, dest=dest, tag=Tag.CLONE)
        self.relayed += [send(CKPT_HEADER.pack(**handoff.head)), send(handoff.small)]
        return lambda part: self.relayed.append(send(part))

    def forward(self, batch: Sequence[Received], received: float) -> None:
        """After the whole CLONE hand-off landed here (and went on, part by part, as it landed): wait
        until the clone ranks took the last parts. `received`: wall-clock time the hand-off was
        complete here (with `forwarded_time`, it splits the clone's readiness)."""
        t0 = time.perf_counter()
        if not self.relayed:
            raise PeerError("a clone state was received but not relayed to the clone ranks (no clone rank to "
                            "forward to, or the hand-off was not a CLONE one)")
        for req in self.relayed:
            wait(req, self.cfg.peer_timeout, "a clone rank to receive the forwarded state")
        self.relayed = []
        self.note({"forwarded_step": batch[0].head["global_step"], "forward_s": time.perf_counter() - t0,
                   "received_time": received, "forwarded_time": time.time(),
                   "relayed_parts": sum(r.head["shared_parts"] for r in batch)})
