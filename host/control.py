"""Control messages the host side sends to DPU ranks (layouts in `common.messages`)."""

from __future__ import annotations

from dpuoffload.common.errors import PeerLost
from dpuoffload.common.runtime.messages import CONTROL, ControlKind
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait


def shutdown_dpus(topo: Topology, timeout: float, gone: frozenset[int]) -> None:
    """The lowest living host rank (host rank 0 but under --recovery) tells every living DPU rank
    that training is over; returns once all sends completed. `gone`: the world ranks known dead
    (`Faults.dead_ranks`: under --dpu-failure fallback and --recovery some ranks may be gone)."""
    if topo.world_rank != min(h for h in topo.host_ranks if h not in gone):
        return
    header = CONTROL.pack(kind=ControlKind.SHUTDOWN)
    alive = [d for d in topo.dpu_ranks if d not in gone]
    reqs = [topo.world.Isend(header, dest=d, tag=CONTROL.tag) for d in alive]
    for d, req in zip(alive, reqs):
        try:
            wait(req, timeout, f"the shutdown message to {topo.describe(d)}")
        except PeerLost:  # died at the very end: it needs no shutdown message any more
            pass
