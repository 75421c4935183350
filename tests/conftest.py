"""Fixtures shared by several test files."""

import json
import os
import resource
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def bundled_data(tmp_path_factory) -> Path:
    """`dpurun make-data` output (cifar10/, svhn/, tinyimagenet/ of real digit images), written once
    per session; pass `bundled_data / "cifar10"` etc. as `--data`."""
    from dpuoffload.launch.make_data import make_data

    out = tmp_path_factory.mktemp("bundled")
    make_data(out, seed=0)
    return out


# Lanes (scripts/test.sh: three workers on two cores, one test file each at a time, `--dist loadfile`).
# The job files that keep the cores busy (CPU over wall 1.5-1.8 alone, `DPUOFFLOAD_TEST_TIMES`) go to
# two "busy" workers, longest first (seconds of wall in the thirty-first session's clean clone); every
# other file (the unit tier, and the jobs that mostly wait: emulated machines, Slurm, peer timeouts) to
# the last worker, the "waiting" lane, its longest first too. A worker whose lane has nothing left takes
# the other lane's next file, so no worker idles while a file waits.
# Why two busy lanes: with one (the twenty-ninth to thirty-first sessions' grouping) the suite was that
# one worker running the busy files one after another at 1.5-1.8 cores, the other worker idle for 12 of
# its 20 minutes. Eight busy files ran in 547 s with two workers side by side against 663 s with one
# (1,084 and 1,124 CPU s: no CPU lost to the contention), RESULTS.md, "The test suite's own time".
# Why a lane of its own for the waiting files: beside two busy workers they fill the cores' gaps instead
# of holding a busy worker through their waits.
BUSY = tuple(f"tests/jobs/test_{name}.py" for name in (
    "benchmarks", "checkpoint", "rollback", "offload_modes", "lossy_forward", "dpu_failure", "stream_trainer",
    "restart", "auto", "stream_jobs", "examples", "gpu_benchmark", "api_jobs", "naive", "mpich", "training",
    "nothing_lost", "numerics_jobs", "clone_standby", "simulate", "rank_errors", "progress", "trace",
    "partner_copies", "wire"))
WAITING = ("tests/cluster/test_multinode.py", "tests/cluster/test_slurm_cluster.py", "tests/jobs/test_faults.py",
           "tests/cluster/test_aarch64.py", "tests/jobs/test_startup_cost.py", "tests/jobs/test_prelaunch.py",
           "tests/jobs/test_startup_death.py", "tests/jobs/test_supervise.py")


def lane_rank(path: str, busy_lane: bool) -> tuple[int, int]:
    """Sort key of a test file for a worker of the busy lane (or not): its own lane's files first, each
    lane's longest first (`BUSY`, `WAITING`; the files they do not name after them)."""
    busy = path in BUSY
    order = BUSY if busy else WAITING
    return (0 if busy == busy_lane else 1, order.index(path) if path in order else len(order))


@pytest.hookimpl(optionalhook=True)  # (no xdist in the minimum-Python run: scripts/test-min-python.sh)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` in lanes (above): with N workers, the last one is the waiting lane and the others
    the busy lane (with one worker, it runs everything). A file is still one unit of work, so the jobs
    its tests share run once."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Lanes(LoadFileScheduling):
        waiting_lane = None  # the worker of the waiting lane, chosen once every worker has collected

        def schedule(self) -> None:
            if self.waiting_lane is None and len(self.nodes) > 1:
                self.waiting_lane = self.nodes[-1]
            super().schedule()

        def _assign_work_unit(self, node) -> None:
            """Hand `node` its lane's next file: moved to the front of the queue, which xdist pops."""
            busy_lane = node is not self.waiting_lane
            scope = min(self.workqueue, key=lambda path: lane_rank(path, busy_lane))
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return Lanes(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With DPUOFFLOAD_TEST_TIMES=FILE, append each test's wall seconds and the CPU seconds it and the
    processes it started used (set-up and tear-down included) to FILE, a JSON line per test.

    Why: a test's wall time alone cannot tell a job that fills the cores from one that waits (a peer
    timeout, Slurm), and which worker a test file should go to depends on that (docs/testing.md,
    "Where the suite's time goes")."""
    path = os.environ.get("DPUOFFLOAD_TEST_TIMES")
    if not path:
        yield
        return
    start, wall = _cpu_seconds(), time.perf_counter()
    yield
    line = {"test": item.nodeid, "wall_s": round(time.perf_counter() - wall, 2),
            "cpu_s": round(_cpu_seconds() - start, 2)}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def _cpu_seconds() -> float:
    """This process's CPU seconds and those of the children it has waited for (dpurun, mpirun and, through
    them, the ranks)."""
    return sum(getattr(resource.getrusage(who), field) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))
