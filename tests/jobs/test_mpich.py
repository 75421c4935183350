"""The MPMD job under MPICH for real (PyPI's `mpich` wheel: Hydra's `mpiexec`), not only its
command line: scripts/test.sh sets up `.venv-mpich` (mpi4py's binary wheel on MPICH 5, torch shared
with `.venv`). dpurun detects the flavor from `mpirun --version` and writes Hydra's syntax; `da`
under MPICH trains to the bit as `none` does under Open MPI (the same batches, losses and weights).

(Here the tests that start processes; those that run in one process: tests/unit/test_mpich.py.)
"""

from __future__ import annotations

import contextlib
import subprocess

import pytest

from tests.jobs.test_fastexit import leave_fast_beside_a_slower_rank
from tests.mpijobs import REPO, job_env, read_jsonl, skip_or_fail, switched_off

pytestmark = pytest.mark.mpi
VENV = REPO / ".venv-mpich"


@pytest.fixture(scope="module")
def mpich_dpurun():
    if not (VENV / "bin" / "dpurun").exists() or not (VENV / "bin" / "mpiexec").exists():
        skip_or_fail(f"no MPICH venv at {VENV} (bash scripts/test.sh sets it up unless DPUOFFLOAD_TEST_MPICH=0)",
                     broken=not switched_off("DPUOFFLOAD_TEST_MPICH"))
    return str(VENV / "bin" / "dpurun")


def _run(dpurun: str, bundled_data, log, mode: str, venv=VENV) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = job_env()
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    res = subprocess.run([dpurun, "--host-ranks", "2", "--dpu-ranks", "2", "--share-cores", "--",
                          "--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs", "2",
                          "--mode", mode, "--train-subset", "128", "--val-subset", "64", "--allreduce", "torch",
                          "--digest-batches", "--no-progress", "--log-dir", str(log)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return res, read_jsonl(log / "metrics.jsonl")


@pytest.fixture(scope="module")
def runs(mpich_dpurun, bundled_data, tmp_path_factory) -> dict[str, tuple]:
    """`da` under MPICH and `none` under Open MPI (the project's main venv), the same flags otherwise, run
    once for the tests below: one job under each library, and the reference is the other library's."""
    log = tmp_path_factory.mktemp("mpich")
    ompi = str(REPO / ".venv" / "bin" / "dpurun")
    return {"mpich-da": (*_run(mpich_dpurun, bundled_data, log / "mpich-da", "da"), log / "mpich-da"),
            "ompi-none": (*_run(ompi, bundled_data, log / "ompi-none", "none", venv=REPO / ".venv"), log / "ompi-none")}


def _losses(records: list[dict]) -> list[list[float]]:
    return [e["step_losses"] for e in records if e["event"] == "epoch"]


def _weights(records: list[dict]) -> str:
    return next(e for e in records if e["event"] == "end")["weights_sha256"]


def test_da_under_mpich_equals_none(runs):
    """The DPU ranks under MPICH build the batches the host ranks build for themselves in `none`."""
    (da_res, da, da_log), (_, none, none_log) = runs["mpich-da"], runs["ompi-none"]
    launched = da_res.stderr.split("dpurun: running:")[1].splitlines()[0]
    assert launched.split()[0] == str(VENV / "bin" / "mpirun") and " -n 2 " in launched and " : -n 2 " in launched
    assert "--oversubscribe" not in launched and "--mca" not in launched  # Hydra's syntax, no Open MPI flags
    digests = [[e["batch_digest"] for e in read_jsonl(log / "phases-rank0.jsonl")] for log in (none_log, da_log)]
    assert digests[0] == digests[1] and len(digests[0]) == 2
    assert _losses(none) == _losses(da) and _weights(none) == _weights(da)


def test_da_under_mpich_equals_the_same_job_under_open_mpi(runs):
    """MPICH and Open MPI train the same job to the same losses and weights: the Open MPI run is `none`,
    which trains as `da` to the bit under Open MPI (tests/jobs/test_offload_modes.py), so one Open MPI job
    is the reference for both libraries and for the DPU path."""
    (_, mpich, _), (ompi_res, ompi, _) = runs["mpich-da"], runs["ompi-none"]
    assert "--mca" in ompi_res.stderr.split("dpurun: running:")[1].splitlines()[0]  # (Open MPI's syntax: its mpirun)
    assert _losses(ompi) == _losses(mpich) and len(_losses(ompi)) == 2
    assert _weights(ompi) == _weights(mpich)


def test_a_rank_leaving_fast_does_not_kill_the_ranks_still_finishing(mpich_dpurun, tmp_path):
    """MPICH says goodbye to Hydra from a C exit hook (`common.runtime.fastexit`): a rank leaving by
    os._exit skipped it, and Hydra SIGKILLed every rank still running (rank 1 never wrote its file)."""
    env = {**job_env(), "PATH": f"{VENV / 'bin'}:{job_env()['PATH']}"}
    res, finished = leave_fast_beside_a_slower_rank([str(VENV / "bin" / "mpiexec"), "-n", "2"],
                                                    str(VENV / "bin" / "python"), env, tmp_path)
    assert res.returncode == 0 and "BAD TERMINATION" not in res.stdout, res.stdout + res.stderr
    assert finished, res.stdout + res.stderr


@pytest.mark.timeout(180)
def test_a_dpurun_killed_outright_leaves_no_process_of_its_job_under_mpich(mpich_dpurun, tmp_path):
    """SIGKILL to dpurun (a batch system's hard limit, a harness's timeout) must leave no process of its
    job: Hydra's mpiexec, its proxy, every rank (once, an MPICH job's proxy and two DPU ranks spun for
    two hours after their dpurun was killed). Hydra ends its job by itself once the reader of its output
    is gone, so this passes without dpurun's parent-death signal too (tried): it guards the promise
    under MPICH; the signal itself is tested under Open MPI (`test_supervise.py`), which needs it."""
    import psutil

    env = {**job_env(), "PATH": f"{VENV / 'bin'}:{job_env()['PATH']}"}
    # one long, silent epoch: nothing the job prints after start-up lets Hydra notice that its reader is gone
    proc = subprocess.Popen([mpich_dpurun, "--host-ranks", "1", "--dpu-ranks", "1", "--share-cores", "--",
                             "--preset", "debug", "--dataset", "fake", "--train-subset", "100000", "--epochs", "1",
                             "--mode", "da", "--allreduce", "torch", "--no-progress", "--log-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
    job: list = []
    try:
        for line in proc.stdout:
            if line.startswith("[dpuoffload] mode da:"):  # (host rank 0, after start-up: every rank is up)
                break
        else:
            pytest.fail("the job never started training")
        job = psutil.Process(proc.pid).children(recursive=True)
        ranks = [p for p in job if "dpuoffload." in " ".join(p.cmdline())]
        assert len(ranks) >= 2, [p.cmdline() for p in job]
        proc.kill()
        _, alive = psutil.wait_procs(job, timeout=30)
        assert not alive, [" ".join(p.cmdline())[:120] for p in alive]
    finally:  # (whatever a failure left)
        if proc.poll() is None:
            proc.kill()
        for p in job:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
