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


# The test files whose jobs keep both cores busy (CPU seconds over wall seconds 1.3 or more, measured
# with DPUOFFLOAD_TEST_TIMES in a one-worker run) are one unit of work under `--dist loadfile`
# (scripts/test.sh): one worker runs them one after another, and every other file (the unit tier, the
# jobs that wait: emulated machines, Slurm, peer timeouts, the benchmarks' smoke runs) is a unit of its
# own for the other worker. Why: two such jobs side by side on 2 cores took longer than one after the
# other (one test alone 26 s; two at once 52 and 61 s, with a quarter more CPU between them), while a
# job that waits leaves room beside it. Moving four of them (naive, auto, nothing_lost, numerics_jobs)
# to the other worker to even the two workers' shares made the suite slower (21:56 against 20:22,
# RESULTS.md): they ran beside the busy ones. The benchmarks' smoke runs (benchmarks, gpu_benchmark:
# ~330 CPU s, most of the other worker's) joined them: beside them a 2+2 job that takes 8 s alone took
# 38 s (RESULTS.md, the thirtieth session's clean clones).
BOTH_CORES = frozenset(f"tests/jobs/test_{name}.py" for name in (
    "api_jobs", "auto", "benchmarks", "checkpoint", "clone_standby", "dpu_failure", "examples", "gpu_benchmark",
    "lossy_forward", "mpich", "naive", "nothing_lost", "numerics_jobs", "offload_modes", "partner_copies",
    "progress", "rank_errors", "restart", "rollback", "simulate", "stream_jobs", "stream_trainer", "trace",
    "training", "wire"))


@pytest.hookimpl(optionalhook=True)  # (no xdist in the minimum-Python run: scripts/test-min-python.sh)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the `BOTH_CORES` files as one unit (xdist's own `loadgroup` would take
    `xdist_group` marks, but it renames tests through an attribute pytest 9.2 no longer reads, so it
    spreads them test by test instead)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class BothCoresAsOne(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "both cores" if path in BOTH_CORES else path

    return BothCoresAsOne(config, log)


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
