"""Every bad `dpurun` input fails fast, without MPI, with exit code 2 and a message naming the fix.

(Here the tests that start processes; those that run in one process: tests/unit/test_launch_errors.py.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpuoffload.launch import cli
from tests.unit.test_launch_errors import TRAIN, fails


@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
    """A 2-core box, not root, with a stand-in mpirun, so results do not depend on the machine."""
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)


# ---------------------------------------------------------------------------- training flags
def test_dpu_ranks_zero_with_a_dpu_mode(capsys):
    fails(capsys, ["--dpu-ranks", "0", "--", "--mode", "naive", "--dataset", "fake"],
          "--mode naive offloads work to DPU ranks, but --dpu-ranks is 0", "--dpu-ranks 1")


def test_hybrid_needs_two_dpu_ranks(capsys):
    fails(capsys, ["--dpu-ranks", "1", "--", "--mode", "hybrid", "--dataset", "fake"],
          "--mode hybrid needs at least one augmentation and one validation DPU rank", "--dpu-ranks")


# ------------------------------------------------------------------------- real processes
def run_cli(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


def test_python_dash_m_reports_error_without_traceback():
    proc = run_cli([sys.executable, "-m", "dpuoffload.launch", "--dpu-speed", "2", *TRAIN])
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("dpurun: error: --dpu-speed must be in (0, 1] (a fraction of a "
                                   "core's speed, e.g. 0.25), got 2.0")


def test_console_script():
    script = Path(sys.executable).parent / "dpurun"
    if not script.exists():
        script = shutil.which("dpurun")
    if not script:
        pytest.skip("the dpurun console script is not installed (pip install -e .)")
    proc = run_cli([str(script), "--", "--mode", "naive", "--dpu-batch-size", "0"])
    assert proc.returncode == 2
    assert "dpurun: error: --dpu-batch-size must be an integer >= 1 or 'auto', got 0" in proc.stderr
