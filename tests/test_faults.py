"""Faults in real MPMD jobs end the whole job with a message naming the rank, and never hang."""

import os
import subprocess
import time

import psutil
import pytest

from tests.mpijobs import DPURUN, REPO, dpurun, job_env

pytestmark = pytest.mark.mpi


def test_rank_that_raises_ends_the_job_with_its_label():
    res = dpurun(["--host-ranks", "2", "--dpu-ranks", "1", "--oversubscribe"],
                 ["--dataset", "fake", "--model", "tests.user_factories:failing_model", "--epochs", "1",
                  "--no-progress"], timeout=120)
    assert res.returncode != 0
    assert "[dpuoffload] host rank 1 (world rank 1, node " in res.stderr
    assert "RuntimeError: boom in user model on purpose" in res.stderr


def test_bad_flag_inside_ranks_gives_one_message():
    """Started without dpurun's checks (hand-written mpirun line): the ranks still agree on one error."""
    from tests.mpijobs import PY, mpmd

    args = ["--dataset", "cifar10", "--data", "/nonexistent/cifar10"]
    res = mpmd(2, [PY, "-m", "dpuoffload.host", *args], 1, [PY, "-m", "dpuoffload.dpu", *args])
    assert res.returncode != 0
    assert res.stderr.count("--data /nonexistent/cifar10: no such directory") == 1, res.stderr
    assert "error on 2 ranks (host rank 0 (world rank 0" in res.stderr  # DPU ranks need no data in mode none


def _find_dpu_rank(parent: psutil.Process, deadline: float) -> psutil.Process:
    while time.monotonic() < deadline:
        for p in parent.children(recursive=True):
            try:
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if "dpuoffload.dpu" in cmd and "python" in os.path.basename(cmd[0]):
                return p
        time.sleep(0.2)
    raise AssertionError("DPU rank process did not appear")


def test_killed_dpu_rank_ends_job_within_30s_and_is_named(tmp_path):
    proc = subprocess.Popen([DPURUN, "--host-ranks", "1", "--dpu-ranks", "1", "--", "--dataset", "fake",
                             "--epochs", "100", "--no-progress", "--log-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_env(), cwd=REPO)
    try:
        victim = _find_dpu_rank(psutil.Process(proc.pid), time.monotonic() + 60)
        deadline = time.monotonic() + 90  # let training start: the host has written an epoch record
        while not (tmp_path / "metrics.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        victim.kill()
        killed_at = time.monotonic()
        out, err = proc.communicate(timeout=30)
        ended_after = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "dpurun: world rank 1 = DPU rank 0 (DPU program)" in err and "killed by signal 9" in err, err
    assert ended_after < 30
