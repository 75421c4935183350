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
