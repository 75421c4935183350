"""The control messages a DPU rank receives and answers: the DPU side of the job's end (the host
side is `host.control`; the layout and the handshake, `common.runtime.messages.ControlKind`).

The receive is posted once and tested from the rank's main loop (`LoaderService.run`, the idle
wait, a script's validation), never waited on with a blocking `Recv`, which Open MPI spins in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from dpuoffload.common.runtime.messages import CONTROL, ControlKind
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait_unless_lost

if TYPE_CHECKING:
    from mpi4py import MPI


def post_control(topo: Topology, buf: np.ndarray, any_host: bool) -> "MPI.Request":
    """The receive of the next control message: from host rank 0, or (`any_host`: --recovery)
    from whichever host rank is the lowest alive at the end."""
    from mpi4py import MPI

    return topo.world.Irecv(buf, source=MPI.ANY_SOURCE if any_host else topo.host_ranks[0], tag=CONTROL.tag)


def control_arrived(topo: Topology, req: "MPI.Request") -> bool:
    """Whether the control message came. A death elsewhere leaves a receive from any source
    pending with an error until acknowledged (ULFM): acknowledge it, and the receive goes on."""
    from mpi4py import MPI

    try:
        return bool(req.Test())
    except MPI.Exception as e:
        if e.Get_error_class() != MPI.ERR_PROC_FAILED_PENDING:
            raise
        topo.world.Ack_failed()
        return False


class ControlInbox:
    """This DPU rank's part in the job's end: it learns of SHUTDOWN (`shut_down`, polled), replies
    ENDING once its failure watch judges no more (`reply`), and leaves only on RELEASE (`released`),
    which the sender sends once every living DPU rank replied. `any_host`: under --recovery the
    sender is whichever host rank is the lowest living one in a seat, so the receive is from any
    source; otherwise it is host rank 0."""

    def __init__(self, topo: Topology, any_host: bool) -> None:
        self.topo = topo
        self.buf = CONTROL.empty()
        self.req = post_control(topo, self.buf, any_host)
        self.sender: Optional[int] = None   # the world rank SHUTDOWN came from, once it came

    def shut_down(self) -> bool:
        """Whether SHUTDOWN arrived (a non-blocking test). It is the only control message a DPU rank
        gets before it replies (RELEASE comes after, on its own receive)."""
        if self.sender is None and control_arrived(self.topo, self.req):
            self.sender = CONTROL.unpack(self.buf)["value"]
        return self.sender is not None

    def reply(self, timeout: float) -> None:
        """ENDING to the sender: call once this rank's `Faults.ending` is set. A sender that died
        meanwhile needs no reply."""
        sender = self._sender()
        req = self.topo.world.Isend(CONTROL.pack(kind=ControlKind.ENDING), dest=sender, tag=CONTROL.tag)
        wait_unless_lost(req, timeout, f"the reply to {self.topo.describe(sender)}'s shutdown message")

    def released(self, timeout: float) -> None:
        """Wait for RELEASE: every living DPU rank has replied, so a rank that leaves from now on
        leaves, for every rank's failure watch. A sender that died releases this rank too."""
        sender, buf = self._sender(), CONTROL.empty()
        wait_unless_lost(self.topo.world.Irecv(buf, source=sender, tag=CONTROL.tag), timeout,
                         f"{self.topo.describe(sender)}'s release after the shutdown")

    def _sender(self) -> int:
        if self.sender is None:
            raise RuntimeError("the job's end before its shutdown message: shut_down() must have returned True")
        return self.sender
