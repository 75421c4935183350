"""The control messages a DPU rank receives and answers: the DPU side of the job's end (the host
side is `host.control`; the layout and the handshake, `common.runtime.messages.ControlKind`).

The message is polled for from the rank's main loop (`LoaderService.run`, the idle wait, a
script's validation), never waited on with a blocking `Recv`, which Open MPI spins in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from dpuoffload.common.runtime.messages import CONTROL, ControlKind
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import probe_any, wait_unless_lost

if TYPE_CHECKING:
    from mpi4py import MPI


def post_control(topo: Topology, buf: np.ndarray, any_host: bool) -> Optional["MPI.Request"]:
    """The receive of the next control message from host rank 0, posted once; None with `any_host`
    (--recovery: from whichever host rank is the lowest alive at the end), whose message is probed
    for at each poll instead (`control_arrived`)."""
    return None if any_host else topo.world.Irecv(buf, source=topo.host_ranks[0], tag=CONTROL.tag)


def control_arrived(topo: Topology, req: Optional["MPI.Request"], buf: np.ndarray) -> bool:
    """Whether the control message came (into `buf`). From any host rank it is a matched probe of
    what has arrived, then its receive, never a receive from any source posted ahead: one posted
    before a host rank died (under ULFM such a receive is held while the death is unacknowledged)
    sometimes never completed on a loaded box (a rollback job whose host rank died 3 steps before
    the end, in loops), though its SHUTDOWN had been sent: the host ranks waited for the reply and
    the job hung at its end. A probe looks again
    each time (`probe_any` acknowledges a death it meets and reports nothing that time)."""
    from mpi4py import MPI

    if req is not None:
        return bool(req.Test())
    message = probe_any(topo.world, CONTROL.tag, MPI.Status(), matched=True)
    if message is None:
        return False
    message.Recv(buf)
    return True


class ControlInbox:
    """This DPU rank's part in the job's end: it learns of SHUTDOWN (`shut_down`, polled), replies
    ENDING once its failure watch judges no more (`reply`), and leaves only on RELEASE (`released`),
    which the sender sends once every living DPU rank replied. `any_host`: under --recovery the
    sender is whichever host rank is the lowest living one in a seat, so the message is probed for
    from any source (`control_arrived`); otherwise it is received from host rank 0."""

    def __init__(self, topo: Topology, any_host: bool) -> None:
        self.topo = topo
        self.buf = CONTROL.empty()
        self.req = post_control(topo, self.buf, any_host)
        self.sender: Optional[int] = None   # the world rank SHUTDOWN came from, once it came

    def shut_down(self) -> bool:
        """Whether SHUTDOWN arrived (a non-blocking test). It is the only control message a DPU rank
        gets before it replies (RELEASE comes after, on its own receive)."""
        if self.sender is None and control_arrived(self.topo, self.req, self.buf):
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
