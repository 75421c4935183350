"""Fixtures shared by several test files."""

import json
import os
import resource
import time
from pathlib import Path
from typing import Iterable, Optional

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
# The job files that keep the cores busy (CPU over wall 1.5-1.8 alone, `DPUOFFLOAD_TEST_TIMES`) go to the
# busy lanes, longest first (seconds of wall in the thirty-first session's clean clone); every other file
# (the unit tier, and the jobs that mostly wait: emulated machines, Slurm, peer timeouts) to the last
# worker, the waiting lane, its longest first too. A busy lane with no busy file left takes the waiting
# lane's next file; the waiting lane never takes a busy file. With N workers, N - 1 are busy lanes.
# Why (RESULTS.md, "The test suite's own time", thirty-second session). The VM's speed moved by half
# between runs, so the runs compare by wall seconds per CPU second of the suite: two busy lanes 0.597 and
# 0.600 (23:48 with 2,393 CPU s; 25:27 with 2,546), one busy lane 0.660 and 0.675 (23:27 with 2,132;
# 28:18 with 2,516). One busy lane leaves the other worker idle for the last half of the run. The waiting
# lane never takes a busy file because three busy files at once lost to two (six files: 536 s and
# 1,066 CPU s against 428 s and 835 s).
BUSY = tuple(f"tests/jobs/test_{name}.py" for name in (
    "benchmarks", "checkpoint", "rollback", "offload_modes", "lossy_forward", "dpu_failure", "stream_trainer",
    "restart", "auto", "stream_jobs", "examples", "gpu_benchmark", "api_jobs", "naive", "mpich", "training",
    "nothing_lost", "numerics_jobs", "clone_standby", "simulate", "rank_errors", "progress", "trace",
    "partner_copies", "wire"))
WAITING = ("tests/cluster/test_multinode.py", "tests/cluster/test_slurm_cluster.py", "tests/jobs/test_faults.py",
           "tests/cluster/test_aarch64.py", "tests/jobs/test_startup_cost.py", "tests/jobs/test_prelaunch.py",
           "tests/jobs/test_startup_death.py", "tests/jobs/test_supervise.py")


def next_file(queue: Iterable[str], busy_lane: bool) -> Optional[str]:
    """The test file a worker of the busy lane (or of the waiting lane) takes next from `queue`, or None
    (the waiting lane leaves the busy files to the busy lane, above). Each lane's longest first (`BUSY`,
    `WAITING`; the files they do not name after them, in the waiting lane)."""
    def rank(path: str) -> tuple[bool, int]:
        order = BUSY if path in BUSY else WAITING
        return (order is not (BUSY if busy_lane else WAITING), order.index(path) if path in order else len(order))

    return min((path for path in queue if busy_lane or path not in BUSY), key=rank, default=None)


@pytest.hookimpl(optionalhook=True)  # (no xdist in the minimum-Python run: scripts/test-min-python.sh)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` in lanes (above): with N workers, the last one is the waiting lane and the others
    the busy lane (one worker runs everything). A file is still one unit of work, so the jobs its tests
    share run once."""
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
            """Hand `node` its lane's next file (moved to the front of the queue, which xdist pops), or
            nothing: a waiting worker with no file of its lane left stays idle until the run ends."""
            path = next_file(self.workqueue, busy_lane=node is not self.waiting_lane)
            if path is not None:
                self.workqueue.move_to_end(path, last=False)
                super()._assign_work_unit(node)

    return Lanes(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With DPUOFFLOAD_TEST_TIMES=FILE, append each test's wall seconds and the CPU seconds it and the
    processes it started used (set-up and tear-down included), its xdist worker and the time it ended to
    FILE, a JSON line per test.

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
            "cpu_s": round(_cpu_seconds() - start, 2), "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
            "ended": round(time.time(), 1)}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def _cpu_seconds() -> float:
    """This process's CPU seconds and those of the children it has waited for (dpurun, mpirun and the
    ranks their own parents waited for: less than all, `tests/census.py` counts every process)."""
    return sum(getattr(resource.getrusage(who), field) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))
