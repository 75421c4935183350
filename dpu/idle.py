"""`--mode none`: DPU ranks take part in start-up, then sleep until host rank 0 says training ended.

The wait polls a non-blocking receive with a sleeping back-off (`common.waits.wait`) instead of a
blocking `Recv`, which Open MPI implements as a busy spin that would steal a core from host ranks.
There is no deadline: training may run for days. If a host rank dies, Open MPI aborts the job and
this rank with it.
"""

from __future__ import annotations

import resource
import time
from typing import Any

from dpuoffload.common.runtime.messages import CONTROL, ControlKind
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait

IDLE_POLL_SECONDS = 0.2


def idle_until_shutdown(topo: Topology) -> dict[str, Any]:
    """Block (sleeping) until SHUTDOWN arrives; return wall and CPU seconds spent idle."""
    buf = CONTROL.empty()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    while True:
        req = topo.world.Irecv(buf, source=topo.host_ranks[0], tag=CONTROL.tag)
        wait(req, None, "the shutdown message from host rank 0", max_sleep=IDLE_POLL_SECONDS)
        if CONTROL.unpack(buf)["kind"] == ControlKind.SHUTDOWN:
            break
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"idle_wall": time.perf_counter() - t0, "idle_cpu": cpu}
