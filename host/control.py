"""Control messages the host side sends to DPU ranks (layouts in `common.messages`)."""

from __future__ import annotations

from dpuoffload.common.runtime.messages import CONTROL, ControlKind
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait


def shutdown_dpus(topo: Topology, timeout: float) -> None:
    """Host rank 0 tells every DPU rank that training is over; returns once all sends completed."""
    if topo.side_rank != 0:
        return
    header = CONTROL.pack(kind=ControlKind.SHUTDOWN)
    reqs = [topo.world.Isend(header, dest=d, tag=CONTROL.tag) for d in topo.dpu_ranks]
    for d, req in zip(topo.dpu_ranks, reqs):
        wait(req, timeout, f"the shutdown message to {topo.describe(d)}")
