"""The job's end, as the host side runs it with the DPU ranks (the handshake: `common.runtime.messages.ControlKind`;
the DPU side: `dpu.control`)."""

from __future__ import annotations

from typing import Optional, Sequence

from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.runtime.hostgroup import HostGroup
from dpuoffload.common.runtime.messages import CONTROL, ControlKind
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait_unless_lost


def end_with_dpus(topo: Topology, timeout: float, faults: Faults, group: HostGroup) -> None:
    """End the job with the DPU ranks, on every host rank (and seated spare) once past the barrier
    after which none trains (with `faults.ending()` set). `group`: that barrier's communicator
    (`HostGroup`: a plain one, or a `SurvivorGroup` under --recovery).

    The sender (`shutdown_sender`) sends every living DPU rank SHUTDOWN and waits for each one's
    ENDING, then RELEASEs them; every host rank leaves only after a last barrier that waits for the
    sender. So no rank leaves while another can still take it for a dead one: a DPU rank that read
    its SHUTDOWN seconds late (a busy main loop, a starved core) used to wait 1 s for it, then
    judge the host ranks' normal exit a death and end a finished job. A rank that dies meanwhile
    costs nothing: the others go on without it (`PeerLost`)."""
    gone = faults.dead_ranks()
    sender = topo.world_rank == shutdown_sender(topo.host_ranks, gone, faults.seated())
    replied = shutdown_dpus(topo, timeout, gone) if sender else []
    for d in replied:
        wait_unless_lost(topo.world.Isend(CONTROL.pack(kind=ControlKind.RELEASE), dest=d, tag=CONTROL.tag), timeout,
                         f"the release to {topo.describe(d)}")
    # (a plain barrier, not the group's: a death now is no one's to recover, the training is over)
    wait_unless_lost(group.comm.Ibarrier(), timeout, "the host ranks' last barrier")


def shutdown_dpus(topo: Topology, timeout: float, gone: frozenset[int]) -> list[int]:
    """SHUTDOWN to every living DPU rank, naming this rank as the one to reply to; returns the DPU
    ranks that replied ENDING (a rank that died meanwhile did not). `gone`: the world ranks known
    dead (`Faults.dead_ranks`: under --dpu-failure fallback and --recovery some ranks may be gone)."""
    header = CONTROL.pack(kind=ControlKind.SHUTDOWN, value=topo.world_rank)
    alive = [d for d in topo.dpu_ranks if d not in gone]
    sends = [topo.world.Isend(header, dest=d, tag=CONTROL.tag) for d in alive]
    replies = [CONTROL.empty() for _ in alive]
    recvs = [topo.world.Irecv(buf, source=d, tag=CONTROL.tag) for d, buf in zip(alive, replies)]
    replied = []
    for d, send, recv in zip(alive, sends, recvs):
        if wait_unless_lost(send, timeout, f"the shutdown message to {topo.describe(d)}") and \
                wait_unless_lost(recv, timeout, f"{topo.describe(d)}'s reply to the shutdown message"):
            replied.append(d)
    return replied


def shutdown_sender(host_ranks: Sequence[int], gone: frozenset[int], seated: Optional[frozenset[int]]) -> Optional[int]:
    """The world rank that sends the shutdown: the lowest living one in a host rank's seat (`seated`,
    under --recovery rollback), else the lowest living host rank; None if none lives. Under
    rollback every seated rank ends the job this way, so once every original host rank has died
    the spares in their seats are the host side, and one of them sends."""
    living = [r for r in (host_ranks if seated is None else sorted(seated)) if r not in gone]
    return living[0] if living else None
