"""The MPMD job under MPICH for real (PyPI's `mpich` wheel: Hydra's `mpiexec`), not only its
command line: scripts/test.sh sets up `.venv-mpich` (mpi4py's binary wheel on MPICH 5, torch shared
with `.venv`). dpurun detects the flavor from `mpirun --version` and writes Hydra's syntax; `da`
trains to the bit as `none` does, and as the same run does under Open MPI."""

from __future__ import annotations

import subprocess

import pytest

from tests.mpijobs import REPO, job_env, read_jsonl

pytestmark = pytest.mark.mpi
VENV = REPO / ".venv-mpich"


@pytest.fixture(scope="module")
def mpich_dpurun():
    if not (VENV / "bin" / "dpurun").exists() or not (VENV / "bin" / "mpiexec").exists():
        pytest.skip(f"no MPICH venv at {VENV} (bash scripts/test.sh sets it up unless DPUOFFLOAD_TEST_MPICH=0)")
    return str(VENV / "bin" / "dpurun")


def _run(dpurun: str, bundled_data, log, mode: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = job_env()
    env["PATH"] = f"{VENV / 'bin'}:{env['PATH']}"
    res = subprocess.run([dpurun, "--host-ranks", "2", "--dpu-ranks", "2", "--share-cores", "--",
                          "--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs", "2",
                          "--mode", mode, "--train-subset", "128", "--val-subset", "64", "--allreduce", "torch",
                          "--digest-batches", "--no-progress", "--log-dir", str(log)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res, read_jsonl(log / "metrics.jsonl")


def test_da_under_mpich_equals_none(mpich_dpurun, bundled_data, tmp_path):
    none_res, none = _run(mpich_dpurun, bundled_data, tmp_path / "none", "none")
    da_res, da = _run(mpich_dpurun, bundled_data, tmp_path / "da", "da")
    launched = da_res.stderr.split("dpurun: running:")[1].splitlines()[0]
    assert launched.split()[0] == str(VENV / "bin" / "mpirun") and " -n 2 " in launched and " : -n 2 " in launched
    assert "--oversubscribe" not in launched and "--mca" not in launched  # Hydra's syntax, no Open MPI flags
    digests = [[e["batch_digest"] for e in read_jsonl(tmp_path / m / "phases-rank0.jsonl")] for m in ("none", "da")]
    assert digests[0] == digests[1] and len(digests[0]) == 2
    losses = [[e["step_losses"] for e in r if e["event"] == "epoch"] for r in (none, da)]
    assert losses[0] == losses[1]
    ends = [next(e for e in r if e["event"] == "end") for r in (none, da)]
    assert ends[0]["weights_sha256"] == ends[1]["weights_sha256"]
