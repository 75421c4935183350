"""`--mode none`: DPU ranks take part in start-up, then sleep until host rank 0 says training ended.

The wait polls a non-blocking receive with a sleeping back-off (`common.waits.wait`) instead of a
blocking `Recv`, which Open MPI implements as a busy spin that would steal a core from host ranks.
There is no deadline: training may run for days. If a host rank dies, Open MPI aborts the job and
this rank with it; under `--recovery` the message comes from the lowest living host rank in a seat
instead (`host.control.end_with_dpus`), so it is received from any source (`dpu.control.ControlInbox`).
"""

from __future__ import annotations

import resource
import time
from typing import Any

from dpuoffload.dpu.control import ControlInbox

IDLE_POLL_SECONDS = 0.2


def idle_until_shutdown(inbox: ControlInbox) -> dict[str, Any]:
    """Block (sleeping) until SHUTDOWN arrives; return wall and CPU seconds spent idle."""
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0, sleep = time.perf_counter(), 0.0
    while not inbox.shut_down():  # (no deadline, see above; sleeping, not spinning)
        time.sleep(sleep)
        sleep = min(max(2 * sleep, 1e-3), IDLE_POLL_SECONDS)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"idle_wall": time.perf_counter() - t0, "idle_cpu": cpu}
