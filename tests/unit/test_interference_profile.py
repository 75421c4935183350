"""`--mode auto`'s profile beside working DPU ranks (`common.train.interference`), in one process.

The MPI job test (`test_auto.py`) checks that the measured slowdown reaches the profile; here: the
schedule every rank derives, which steps count, the ratio's rule, and that a DPU rank's load is
the duty cycle asked for, in the busy windows only.
"""

import time
import types

import pytest
import torch
from mpi4py import MPI
from torch.utils.data import Dataset

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.runtime.roles import Role
from dpuoffload.common.train import interference
from dpuoffload.common.train.interference import SETTLE_S, Schedule, schedule_for, slowdown


def test_the_schedule_fits_the_host_step_and_asks_for_das_duty_cycle():
    fast = Schedule.of(host_step=0.1, dpu_busy=0.03)  # 3 steps = 0.3 s: the 0.4 s floor, 4 pairs in 3.2 s
    assert (fast.window, fast.pairs, fast.duty, fast.end) == (0.4, 4, pytest.approx(0.3), pytest.approx(3.2))
    slow = Schedule.of(host_step=0.5, dpu_busy=0.75)  # 1.5 s windows, 2 pairs at least; the DPU always busy
    assert (slow.window, slow.pairs, slow.duty) == (1.5, 2, 1.0)
    assert Schedule.of(host_step=0.1, dpu_busy=0.03, dpu_batch=0.5).window == 1.5  # 3 of the DPU's batches
    long = Schedule.of(host_step=5.0, dpu_busy=1.0)  # a 5 s step: windows of 2 steps, 2 pairs (40 s, not 60)
    assert (long.window, long.pairs, long.end) == (10.0, 2, 40.0)
    assert Schedule.of(host_step=0.9, dpu_busy=0.1).window == 2.0  # between: 2 s holds 2 steps at least
    assert [fast.busy(k) for k in range(4)] == [False, True, False, True]
    assert not Schedule.of(0.1, 0.0).busy(1)  # (a DPU rank with nothing to build)


def test_only_steps_wholly_inside_one_window_past_its_settling_time_count():
    s = Schedule(window=1.0, pairs=2, duty=0.5)
    assert s.window_of(0.1, 0.9) == 0 and s.window_of(1.5, 1.99) == 1
    assert s.window_of(0.9, 1.1) is None  # across an edge
    assert s.window_of(1.0 + SETTLE_S / 2, 1.5) is None  # the DPU ranks may still be switching
    assert s.window_of(4.1, 4.2) is None  # past the schedule


def test_the_slowdown_is_the_median_pairs_ratio_and_never_below_one():
    s = Schedule(window=1.0, pairs=3, duty=0.5)
    steps = [(0, 0.10), (0, 0.12), (1, 0.11), (1, 0.13),  # pair 0: 0.12 / 0.11
             (2, 0.20), (3, 0.30),                        # pair 1: 1.5 (a slow episode moves both)
             (4, 0.10), (5, 0.105)]                       # pair 2: 1.05
    assert slowdown(steps, s) == pytest.approx(0.12 / 0.11)
    assert slowdown([(0, 0.2), (1, 0.1)], s) == 1.0  # faster beside the load: noise, not a speed-up
    assert slowdown([(0, 0.2), (3, 0.1)], s) == 1.0  # no pair with steps on both sides


def test_schedule_for_reads_the_gathered_costs_of_the_runs_wire():
    """Host step = B*(train + finish) + allreduce + opt; the DPU builds fan-out x B x its part of the
    transform per step (the uint8 wire's where the host finishes); nothing on GPU hosts or with no
    DPU ranks."""
    topo = types.SimpleNamespace(host_ranks=(0, 1), dpu_ranks=(2,))
    host = {"train": 0.004, "finish": 0.001, "allreduce": 0.002, "opt": 0.001}
    costs = [host, host, {"aug": 0.003, "aug_wire": 0.002}]
    s = schedule_for(RunConfig(batch_size=10), topo, costs)
    assert s.duty == pytest.approx(2 * 10 * 0.002 / (10 * 0.005 + 0.003))
    float_wire = [{k: v for k, v in host.items() if k != "finish"}] * 2 + costs[2:]
    assert schedule_for(RunConfig(batch_size=10), topo, float_wire).duty == pytest.approx(1.0)  # 0.06 > 0.043
    assert schedule_for(RunConfig(), topo, [{**host, "gpu_step": 0.01}] * 2 + costs[2:]) is None
    assert schedule_for(RunConfig(), types.SimpleNamespace(host_ranks=(0,), dpu_ranks=()), [host]) is None


class Busy(Dataset):
    """Samples that take CPU time to build (a matmul each)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        a = torch.ones(160, 160)
        for _ in range(4):
            a = a @ a / 160
        return a[:4, :4].clone(), i % 2


def test_a_dpu_rank_builds_for_its_duty_share_of_the_busy_windows_only():
    """CPU time of the DPU rank's part over a schedule: at most about duty x the busy windows' time
    (half the schedule), well under what building through the whole schedule would take."""
    schedule = Schedule(window=0.4, pairs=2, duty=0.5)
    topo = types.SimpleNamespace(world=MPI.COMM_SELF)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (process CPU time counts every thread's)
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        interference.build_batches(PerSampleSeeded(Busy(), seed=0), 4, schedule, topo)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    # It follows the schedule to its end, and builds only in the busy windows at the duty share: its
    # CPU time stays well under building through the whole schedule (what another job's load can
    # change is how much CPU it gets, which only lowers that time: no lower bound is asserted).
    assert wall >= schedule.end - 0.05
    expected = schedule.duty * schedule.end / 2
    assert 0 < cpu < 1.6 * expected, (cpu, expected)


def test_a_host_rank_times_its_steps_through_the_schedule_and_host_rank_0_reports():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    schedule = Schedule(window=0.2, pairs=2, duty=0.5)
    topo = types.SimpleNamespace(world=MPI.COMM_SELF, world_rank=0, host_ranks=(0,), role=Role.HOST)
    ratio = interference.host_slowdown(model, PerSampleSeeded(Busy(), seed=0), 4, schedule, topo)
    assert ratio >= 1.0
    other = types.SimpleNamespace(world=MPI.COMM_SELF, world_rank=1, host_ranks=(0, 1), role=Role.HOST)
    assert interference.host_slowdown(model, PerSampleSeeded(Busy(), seed=0), 4, schedule, other) is None
