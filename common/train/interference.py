"""`--mode auto`'s profile of the host's training step beside working DPU ranks (`da`'s host term).

Why: `autoselect.step_costs` times the host ranks' steps while the DPU ranks wait, which is what
`none` and `mv` train beside. In `da` the DPU ranks build batches while the host trains. Where they
share a machine with it, that work may slow the host: whole `da` epochs on the emulated node (DPU
ranks on their own throttled core of a 2-core VM) showed the host's forward/backward 5-16 % slower
than in `none`, and da's predictions read 4.6 % low on average over two benchmark runs. Timed here,
step against step, the same node read 1.00-1.03 (RESULTS.md, 2026-11-27) while da's epochs still
showed 0-12 %: what slows da's host there is not only the DPU core's work (open; the real DPU rank
also polls every 2 ms while its rings are full). DPU ranks oversubscribed onto the host's core read
1.21-1.70. On a real node the DPU is another computer, and the ratio should read about 1.

How (collective over the world, after the costs are gathered, so every rank derives the same
`Schedule`): from one barrier every rank follows alternating windows, idle then busy. The host
ranks run forward/backward steps on a fixed batch throughout; the DPU ranks build training batches
in the busy windows at `da`'s duty cycle (their seconds of building per host step over the host's
step) and sleep in the idle ones. A host rank keeps the steps that lie wholly inside one window.
The slowdown is the median over the pairs of (busy median / idle median): each busy window is
compared with the idle window just before it, so the VM's own speed episodes (1-4 s) stay out of
the ratio. It is never below 1: work on other cores cannot speed the host up, and a reading below
is noise.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.sampling import PerSampleSeeded, collated
from dpuoffload.common.faults.abort import arrive
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.train.naive import forward_backward

# A window holds this many host steps, so that one or two lie wholly inside it, and as many of a DPU
# rank's batches (one that outlasts its window would run on into the idle one after it). Past
# LONG_WINDOW_S it holds 2 of the longer one only: with steps back to back, two steps' time always
# holds one whole step, and a 5 s step would otherwise make the schedule a minute long.
STEPS_PER_WINDOW = 3
LONG_WINDOW_S = 2.0
MIN_WINDOW_S = 0.4
# The whole schedule aims at this many seconds (the start-up's cost under --mode auto), in 2-4 pairs.
BUDGET_S = 3.0
MIN_PAIRS, MAX_PAIRS = 2, 4
# A step starting this soon after a window opens is not counted: the DPU ranks' first batch of a
# busy window (or their last of the one before) may still be starting or ending.
SETTLE_S = 0.02
START = "every rank to start the profile beside the DPU ranks"


@dataclass(frozen=True)
class Schedule:
    """Alternating windows from one barrier: even ones idle, odd ones busy (the DPU ranks build
    batches for `duty` of the time), `pairs` of each."""

    window: float
    pairs: int
    duty: float

    @classmethod
    def of(cls, host_step: float, dpu_busy: float, dpu_batch: float = 0.0) -> "Schedule":
        """The schedule for a host step of `host_step` seconds beside DPU ranks that build for
        `dpu_busy` seconds per host step in `da`, `dpu_batch` seconds a batch."""
        window = max(MIN_WINDOW_S, _fitting(host_step), _fitting(dpu_batch))
        pairs = min(MAX_PAIRS, max(MIN_PAIRS, round(BUDGET_S / (2 * window))))
        duty = min(1.0, dpu_busy / host_step) if host_step > 0 else 1.0
        return cls(window, pairs, duty)

    @property
    def end(self) -> float:
        return 2 * self.pairs * self.window

    def busy(self, k: int) -> bool:
        return k % 2 == 1 and self.duty > 0

    def window_of(self, start: float, end: float) -> Optional[int]:
        """The window that holds the step [start, end] (seconds from the barrier) past its settling
        time; None for a step across a window's edge."""
        k = int(start // self.window)
        if start - k * self.window < SETTLE_S or end > (k + 1) * self.window or k >= 2 * self.pairs:
            return None
        return k


def _fitting(seconds: float) -> float:
    """A window's length for a piece of work of `seconds`: 3 of them, or 2 past `LONG_WINDOW_S`."""
    return min(STEPS_PER_WINDOW * seconds, max(2 * seconds, LONG_WINDOW_S))


def slowdown(steps: Sequence[tuple[int, float]], schedule: Schedule) -> float:
    """The host step's slowdown beside busy DPU ranks, from (window, seconds) pairs: the median over
    pairs of windows of busy / idle medians, at least 1; 1.0 where no pair has steps in both."""
    ratios = []
    for pair in range(schedule.pairs):
        idle = [s for k, s in steps if k == 2 * pair]
        busy = [s for k, s in steps if k == 2 * pair + 1]
        if idle and busy:
            ratios.append(statistics.median(busy) / statistics.median(idle))
    return max(1.0, statistics.median(ratios)) if ratios else 1.0


def schedule_for(cfg: RunConfig, topo: Topology, costs: list[dict[str, Any]]) -> Optional[Schedule]:
    """The same schedule on every rank, from the gathered costs; None where there is nothing to
    measure: no DPU ranks, or host ranks on GPUs (their step is the GPU's, and the host's CPU work
    per step is small beside it)."""
    host = costs[topo.host_ranks[0]]
    if not topo.dpu_ranks or "gpu_step" in host:
        return None
    dpu = costs[topo.dpu_ranks[0]]
    b = cfg.batch_size
    host_step = b * (host["train"] + host.get("finish", 0.0)) + host["allreduce"] + host["opt"]
    fan_out = math.ceil(len(topo.host_ranks) / len(topo.dpu_ranks))
    send_aug = dpu["aug_wire"] if "finish" in host else dpu["aug"]
    return Schedule.of(host_step, fan_out * b * send_aug, b * dpu["aug"])  # (`build_batches` runs the whole transform)


def measure(cfg: RunConfig, topo: Topology, model: Any, train: PerSampleSeeded,
            costs: list[dict[str, Any]]) -> Optional[float]:
    """Collective over the world: host rank 0's slowdown (None on other ranks and where
    `schedule_for` finds nothing to measure)."""
    schedule = schedule_for(cfg, topo, costs)
    if schedule is None:
        return None
    if topo.role is Role.HOST:
        return host_slowdown(model, train, cfg.batch_size, schedule, topo)
    if topo.world_rank in topo.dpu_ranks:
        build_batches(train, cfg.batch_size, schedule, topo)
    else:  # (a rank standing by: idle in the run too)
        arrive(topo.world, START)
    return None


def host_slowdown(model: Any, train: PerSampleSeeded, batch_size: int, schedule: Schedule,
                  topo: Topology) -> Optional[float]:
    """Forward/backward steps on a copy of the model (the trainer's "forward_backward" phase) through
    the schedule; this rank's slowdown on host rank 0, None on the others."""
    from torch import nn

    probe, criterion = copy.deepcopy(model).train(), nn.CrossEntropyLoss()
    x, y = collated(train, 0, batch_size)
    forward_backward(probe, criterion, x, y)  # warm-up (the gradients allocated)
    arrive(topo.world, START)
    t0, steps = time.perf_counter(), []
    while (start := time.perf_counter() - t0) < schedule.end:
        forward_backward(probe, criterion, x, y)
        end = time.perf_counter() - t0
        if (k := schedule.window_of(start, end)) is not None:
            steps.append((k, end - start))
    return slowdown(steps, schedule) if topo.world_rank == topo.host_ranks[0] else None


def build_batches(train: PerSampleSeeded, batch_size: int, schedule: Schedule, topo: Topology) -> None:
    """A DPU rank's part: build training batches (load, augment, collate) for `duty` of every busy
    window, sleep through the idle ones. A batch is started only if the last one's time still fits
    in the window, so the work stays out of the idle window after it."""
    start, last = 0, 0.0
    arrive(topo.world, START)
    t0 = time.perf_counter()
    while (now := time.perf_counter() - t0) < schedule.end:
        k = int(now // schedule.window)
        close = (k + 1) * schedule.window
        if not schedule.busy(k) or now + last > close:
            time.sleep(max(close - now, 0.0))
            continue
        b0 = time.perf_counter()
        collated(train, start, batch_size)
        start, last = (start + batch_size) % len(train), time.perf_counter() - b0
        rest = last * (1 / schedule.duty - 1)
        time.sleep(max(min(rest, close - (time.perf_counter() - t0)), 0.0))
