"""A keeper's receiving end: a host rank's hand-off after its header, into warm buffers, and the
header receives a keeper keeps posted when who sends to it may change.

Every route (`routes.Route`) receives through these two: `Inbox.parts` takes the rest of a hand-off
once its header is in, and `PostedHeaders` keeps a header receive posted for every rank that may
send one (a host rank sends only to its keeper of the moment, and its next message to a keeper is
always a header), so the earliest hand-off among the headers that landed says what comes next.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional

import numpy as np

from dpuoffload.common.runtime.messages import CKPT_HEADER, StateKind, Tag
from dpuoffload.common.runtime.waits import is_failure, wait, wait_all
from dpuoffload.common.state import ckptfiles
from dpuoffload.common.state.ckptfiles import Received
from dpuoffload.common.state.sharding import byte_buffer

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.runtime.roles import Topology

HANDOFF_POLL_MAX_SLEEP = 0.01   # between hand-offs (may be hours apart): ~100 cheap polls/s, 10 ms latency
SLICE_POLL_MAX_SLEEP = 0.002    # a hand-off in flight: each poll lets Open MPI pull the next pieces
RELAY_POLL_MAX_SLEEP = 0.0005   # a hand-off passed on part by part: each part's wait adds to the clone's readiness


def header_only(head: Mapping[str, int]) -> Received:
    """A hand-off that is its header alone (END, PREPARE, a notice under --recovery)."""
    return Received(dict(head), byte_buffer(0), byte_buffer(0))


def handoff_order(head: Mapping[str, int]) -> float:
    """Where a hand-off falls in the sequence every host rank goes through: PREPARE, the state
    hand-offs by global step, END."""
    return float("inf") if head["kind"] == StateKind.END else head["global_step"]


PartSink = Callable[[np.ndarray], None]   # takes each part of a hand-off's shared bytes, in order, as it lands
Relay = Callable[[int, Received], Optional[PartSink]]  # (host, hand-off with its header and small part) -> a sink


class Inbox:
    """Receives hand-offs into reused buffers: a hand-off of hundreds of MB lands in memory faulted
    in beforehand (DPU cores fault pages slowly), and the latest one stays intact while the next one
    arrives (double buffering: the previous hand-off's buffers become the next one's).

    Args:
        relay: asked once per hand-off, when its header and small part are in; a sink it returns
            gets each shared part as soon as that part (and every one before it) landed, while the
            later parts are still arriving (the clone forwarder's cut-through, `dpu.keeper.clone`).
    """

    def __init__(self, topo: "Topology", timeout: float, relay: Optional[Relay] = None) -> None:
        self.topo, self.timeout, self.relay = topo, timeout, relay
        self.warm: dict[int, np.ndarray] = {}   # host rank -> warm receive buffer for its next hand-off

    def parts(self, host: int, header: np.ndarray) -> Received:
        """The rest of `host`'s hand-off, after its header."""
        world = self.topo.world
        head = dict(CKPT_HEADER.unpack(header))
        if head["kind"] in (StateKind.END, StateKind.PREPARE):  # a header only
            return header_only(head)
        small = byte_buffer(head["small_nbytes"])
        what = f"the state slices of {self.topo.describe(host)}"
        wait(world.Irecv(small, source=host, tag=Tag.CKPT), self.timeout, what)
        got = Received(head, small, self.buffer(host, head["shared_nbytes"]))
        views = [got.shared[a:b] for a, b in ckptfiles.part_bounds(ckptfiles.part_sizes(got))]
        reqs = [world.Irecv(view, source=host, tag=Tag.CKPT) for view in views]
        sink = self.relay(host, got) if self.relay is not None else None
        if sink is None:
            wait_all(reqs, self.timeout, what, max_sleep=SLICE_POLL_MAX_SLEEP)
            return got
        for req, view in zip(reqs, views):   # (in order: the sink's sends to one rank must keep it)
            wait(req, self.timeout, what, max_sleep=RELAY_POLL_MAX_SLEEP)
            sink(view)
        return got

    def warm_up(self, batch: Iterable[Received]) -> None:
        """PREPARE: fault in a receive buffer per host rank now, off the critical path."""
        for r in batch:
            self.warm[self.host_of(r)] = byte_buffer(r.head["shared_nbytes"], touch=True)

    def buffer(self, host: int, nbytes: int) -> np.ndarray:
        """A receive buffer for `host`'s shared bytes: the warm one when its size fits."""
        warm = self.warm.pop(host, None)
        return warm if warm is not None and warm.nbytes == nbytes else byte_buffer(nbytes)

    def recycle(self, batch: Optional[Iterable[Received]]) -> None:
        """The previous hand-off's buffers become the warm ones of the next."""
        for r in batch or []:
            self.warm.setdefault(self.host_of(r), r.shared)

    def host_of(self, r: Received) -> int:
        """The world rank of the host rank that handed `r` over (the one in whose seat it trains)."""
        return self.topo.host_ranks[r.head["seat"]]


class PostedHeaders:
    """A header receive kept posted for every rank in `senders` that is not known dead.

    Args:
        senders: the ranks that may hand off to this keeper (every host rank; spares too under rollback).
        drop_dead: a receive that reports its rank dead drops that rank (host ranks may die); without,
            the failure is raised (a dead host rank ends the job).
    """

    def __init__(self, topo: "Topology", senders: Iterable[int], drop_dead: bool, timeout: float) -> None:
        self.topo, self.senders, self.drop_dead, self.timeout = topo, tuple(senders), drop_dead, timeout
        self.posted: dict[int, tuple[np.ndarray, "MPI.Request"]] = {}   # rank -> its posted header receive
        self.gone: set[int] = set()   # ranks known dead here: no header receive for them

    def next_heads(self, keep: Optional[Callable[[int], bool]] = None) -> dict[int, Mapping[str, int]]:
        """Block until some header landed (no deadline: checkpoints may be hours apart); rank ->
        header of each that landed. `keep`: takes a landed header aside when it returns False."""
        sleep = 0.0
        while not (landed := self.landed(keep)):
            time.sleep(sleep)
            sleep = min(max(2 * sleep, 1e-4), HANDOFF_POLL_MAX_SLEEP)
        return {rank: self.head(rank) for rank in landed}

    def landed(self, keep: Optional[Callable[[int], bool]] = None) -> list[int]:
        """The ranks whose posted header receive completed (receives posted first)."""
        self.post()
        landed = [rank for rank in list(self.posted) if self._test(rank)]
        return [rank for rank in landed if keep(rank)] if keep is not None else landed

    def post(self) -> None:
        for rank in self.senders:
            if rank not in self.posted and rank not in self.gone:
                header = CKPT_HEADER.empty()
                self.posted[rank] = (header, self.topo.world.Irecv(header, source=rank, tag=Tag.CKPT))

    def head(self, rank: int) -> Mapping[str, int]:
        return CKPT_HEADER.unpack(self.posted[rank][0])

    def wait(self, rank: int) -> None:
        """Wait for `rank`'s header: its hand-off has begun elsewhere, so this one is due too."""
        wait(self.posted[rank][1], self.timeout, f"the hand-off header of {self.topo.describe(rank)}",
             max_sleep=SLICE_POLL_MAX_SLEEP)

    def take(self, rank: int) -> np.ndarray:
        """`rank`'s landed header; the next `post` posts a new receive for it."""
        return self.posted.pop(rank)[0]

    def lose(self, rank: int) -> None:
        """`rank` died: no receive is posted for it again."""
        self.posted.pop(rank, None)
        self.gone.add(rank)

    def cancel(self) -> None:
        """At the end: the header receives still posted (spares never called in) are cancelled."""
        for _, req in self.posted.values():
            try:
                req.Cancel()
            except Exception:  # noqa: BLE001 - (a dead rank's receive may refuse; nothing waits on it)
                pass
        self.posted.clear()

    def _test(self, rank: int) -> bool:
        """Whether `rank`'s posted header receive completed; one that reports its rank dead drops it."""
        from mpi4py import MPI

        try:
            return bool(self.posted[rank][1].Test())
        except MPI.Exception as e:
            if not (self.drop_dead and is_failure(e)):
                raise
            self.lose(rank)
            return False
