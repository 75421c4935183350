"""Control messages the host side sends to DPU ranks (layouts in `common.messages`)."""

from __future__ import annotations

from typing import Optional, Sequence

from dpuoffload.common.errors import PeerLost
from dpuoffload.common.runtime.messages import CONTROL, ControlKind
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait


def shutdown_dpus(topo: Topology, timeout: float, gone: frozenset[int],
                  seated: Optional[frozenset[int]] = None) -> None:
    """The lowest living host rank (host rank 0 but under --recovery; under rollback the lowest living
    rank in a seat, `shutdown_sender`) tells every living DPU rank that training is over; returns
    once all sends completed. `gone`: the world ranks known dead
    (`Faults.dead_ranks`: under --dpu-failure fallback and --recovery some ranks may be gone).
    `seated`: under --recovery rollback, the world ranks in the host ranks' seats (`Faults.seated`),
    which every one of them calls this with: once every original host rank has died, the spares in
    their seats are the host side, and without this a DPU rank waited for a message no one sent,
    then took the seated spares' normal exit for the death of the last host rank."""
    if topo.world_rank != shutdown_sender(topo.host_ranks, gone, seated):
        return
    header = CONTROL.pack(kind=ControlKind.SHUTDOWN)
    alive = [d for d in topo.dpu_ranks if d not in gone]
    reqs = [topo.world.Isend(header, dest=d, tag=CONTROL.tag) for d in alive]
    for d, req in zip(alive, reqs):
        try:
            wait(req, timeout, f"the shutdown message to {topo.describe(d)}")
        except PeerLost:  # died at the very end: it needs no shutdown message any more
            pass


def shutdown_sender(host_ranks: Sequence[int], gone: frozenset[int], seated: Optional[frozenset[int]]) -> Optional[int]:
    """The world rank that sends the shutdown: the lowest living one in a host rank's seat (`seated`,
    under --recovery rollback), else the lowest living host rank; None if none lives."""
    living = [r for r in (host_ranks if seated is None else sorted(seated)) if r not in gone]
    return living[0] if living else None
