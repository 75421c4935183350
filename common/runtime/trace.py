"""One Chrome trace-event file of all ranks (`--trace PATH`), to *see* the overlap in Perfetto.

Every timed phase (`metrics.PhaseTimer`: a host step's data wait / forward_backward / allreduce /
optimizer, a DPU rank's augment / buffer_wait / send, wait_state / evaluate, validation) becomes a
complete event ("ph": "X") on the rank's own track. Timestamps are wall-clock microseconds
(`time.time_ns`), shared by all ranks of a machine and NTP-close across nodes. Events stay in
memory and are gathered to world rank 0 once, at the very end, which writes the file atomically
(temp file, fsync, rename); open it at https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Optional

from dpuoffload.common.errors import InternalError
from dpuoffload.common.files import write_atomic

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.runtime.roles import Topology

_tracer: Optional["Tracer"] = None


class Tracer:
    def __init__(self, pid: int, name: str) -> None:
        self.pid, self.name = pid, name
        self.events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
        self.position: dict[str, int] = {}  # where training is (epoch, step): every span's args

    def complete(self, name: str, start_ns: int, end_ns: int, args: Optional[dict[str, Any]] = None) -> None:
        event = {"name": name, "ph": "X", "pid": self.pid, "tid": 0, "ts": start_ns / 1e3,
                 "dur": (end_ns - start_ns) / 1e3}
        if args or self.position:
            event["args"] = {**self.position, **(args or {})}
        self.events.append(event)


def set_position(**position: int) -> None:
    """Tag the spans recorded from now on with `position` (e.g. epoch=0, step=12: the global step
    being run), so Perfetto shows which step a slow span belongs to. Free without --trace."""
    if _tracer is not None:
        _tracer.position = position


def start(topo: "Topology", enabled: bool) -> None:
    """Begin recording on this rank (called by every rank after start-up when --trace is given)."""
    global _tracer
    _tracer = Tracer(topo.world_rank, topo.describe()) if enabled else None


def current() -> Optional[Tracer]:
    return _tracer


def now_ns() -> int:
    return time.time_ns()


def finish(world: "MPI.Comm", path: Optional[str]) -> None:
    """Collective over `world`: gather every rank's events; world rank 0 writes one file."""
    if path is None:
        return
    gathered = world.gather(_tracer.events if _tracer else [], root=0)
    if world.Get_rank() != 0:
        return
    if gathered is None:
        raise InternalError("the trace's gather returned nothing on world rank 0")
    events = [e for part in gathered for e in part]
    write_atomic(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}).encode(), parents=True)
