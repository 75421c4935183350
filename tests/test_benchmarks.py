"""The benchmark commands keep working (quick variants; the numbers themselves go to RESULTS.md)."""

import json
import subprocess
import sys

import pytest

from tests.mpijobs import REPO, job_env

pytestmark = pytest.mark.mpi


def test_modes_benchmark_quick(tmp_path):
    out = tmp_path / "modes.json"
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "modes.py"), "--quick", "--out", str(out)],
                         capture_output=True, text=True, env=job_env(), cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())["report"]["resnet20/cifar10"]
    assert set(rows) == {"none", "da", "mv", "hybrid", "naive"}
    assert rows["none"]["ratio_to_none"] == 1.0
    assert all(r["epoch_s"] > 0 and 0 <= r["dpu_busy"] for r in rows.values())
    assert "| hybrid |" in res.stdout


def test_transport_benchmark_quick(tmp_path):
    out = tmp_path / "transport.json"
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "transport.py"), "--quick", "--out", str(out)],
                         capture_output=True, text=True, env=job_env(), cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stderr
    results = json.loads(out.read_text())["results"]
    assert [r["size"] for r in results] == ["cifar 16x3x32x32", "cifar 64x3x32x32"]
    assert all(r["raw_GBps"] > 0 and r["ours_GBps"] > 0 for r in results)
    assert "| ours / raw |" in res.stdout
