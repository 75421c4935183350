"""`--mode none`: DPU ranks take part in start-up, then sleep until host rank 0 says training ended.

The wait polls a non-blocking receive with a sleeping back-off (`common.waits.wait`) instead of a
blocking `Recv`, which Open MPI implements as a busy spin that would steal a core from host ranks.
There is no deadline: training may run for days. If a host rank dies, Open MPI aborts the job and
this rank with it; under `--recovery` the message comes from the lowest living host rank instead
(`host.control.shutdown_dpus`), so it is received from any source.
"""

from __future__ import annotations

import resource
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from dpuoffload.common.runtime.messages import CONTROL, ControlKind
from dpuoffload.common.runtime.roles import Topology

if TYPE_CHECKING:
    from mpi4py import MPI

IDLE_POLL_SECONDS = 0.2


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


def idle_until_shutdown(topo: Topology, any_host: bool = False) -> dict[str, Any]:
    """Block (sleeping) until SHUTDOWN arrives; return wall and CPU seconds spent idle."""
    buf = CONTROL.empty()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    while True:
        req, sleep = post_control(topo, buf, any_host), 0.0
        while not control_arrived(topo, req):  # (no deadline, see above; sleeping, not spinning)
            time.sleep(sleep)
            sleep = min(max(2 * sleep, 1e-3), IDLE_POLL_SECONDS)
        if CONTROL.unpack(buf)["kind"] == ControlKind.SHUTDOWN:
            break
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"idle_wall": time.perf_counter() - t0, "idle_cpu": cpu}
