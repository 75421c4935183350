"""A rank lost while the job starts, under MPI's fault tolerance: bounded, named, non-zero.

Under `--recovery` (and `--dpu-failure fallback`) mpirun runs with ULFM, which does not end a job for a
dead rank; a rank that dies before every rank has finished MPI init left the others waiting in init
forever. Each rank now bounds its MPI init (`common.runtime.roles.init_mpi`: `--peer-timeout`, at
least 120 s; `DPUOFFLOAD_INIT_TIMEOUT` here)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.mpijobs import PY, dpurun

pytestmark = pytest.mark.mpi

DIES_BEFORE_INIT = """#!/bin/sh
# host rank 1 dies (SIGKILL) before MPI init: a machine lost while the job starts
if [ "$OMPI_COMM_WORLD_RANK" = "1" ]; then kill -9 $$; fi
exec {python} "$@"
"""


@pytest.mark.timeout(200)
def test_a_rank_lost_before_mpi_init_ends_the_job_within_the_init_bound(bundled_data, tmp_path, monkeypatch):
    wrapper = tmp_path / "python"
    wrapper.write_text(DIES_BEFORE_INIT.format(python=PY))
    wrapper.chmod(0o755)
    log = tmp_path / "log"
    monkeypatch.setenv("DPUOFFLOAD_INIT_TIMEOUT", "15")  # (the default: --peer-timeout, at least 120 s)
    t0 = time.monotonic()
    res = dpurun(["--host-ranks", "2", "--dpu-ranks", "2", "--python", str(wrapper), "--dpu-python", PY],
                 ["--preset", "debug", "--no-progress", "--mode", "da", "--data", str(bundled_data / "cifar10"),
                  "--train-subset", "64", "--epochs", "1", "--batch-size", "16", "--log-dir", str(log),
                  "--recovery", "lossy-forward"], timeout=150)
    took = time.monotonic() - t0
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "Timeout (0:00:15)!" in out and "in init_mpi" in out, out[-3000:]  # (where each rank waited)
    assert "dpurun: the job failed" in out, out[-3000:]
    assert took < 120, took  # (15 s of init, then the ranks' exit and mpirun's end: no hang)
    left = subprocess.run(["pgrep", "-f", str(log)], capture_output=True, text=True).stdout.split()
    assert [p for p in left if int(p) != os.getpid()] == []
