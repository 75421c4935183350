"""Ranks leave without Python's teardown after their work (common/runtime/fastexit.py): the exit
code, output, atexit hooks and MPI_Finalize must be exactly those of an ordinary exit, only sooner,
and the ranks still finishing must not be taken down with it."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import atexit, sys, threading, time
    from dpuoffload.common.runtime.fastexit import run_and_exit_fast

    def program():
        atexit.register(lambda: open(sys.argv[1] + ".hook", "w").write("ran"))
        threading.Thread(target=lambda: (time.sleep(0.2), open(sys.argv[1] + ".thread", "w").write("done"))).start()
        if sys.argv[3] == "mpi":
            from mpi4py import MPI
            MPI.COMM_WORLD.Barrier()
        print("unflushed output", end="")
        sys.exit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])

    run_and_exit_fast(program)
""")


def run(tmp_path, code: str, mpi: bool = False, fast: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "DPUOFFLOAD_FAST_EXIT": "1" if fast else "0"}
    cmd = [sys.executable, "-c", SCRIPT, str(tmp_path / "mark"), code, "mpi" if mpi else "-"]
    if mpi:  # mpirun fails a rank that exits without MPI_Finalize ("exiting improperly")
        from tests.mpijobs import MPIRUN, job_env

        cmd, env = [MPIRUN, "-np", "1", *cmd], {**job_env(), "DPUOFFLOAD_FAST_EXIT": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("fast", [True, False])
def test_exit_code_output_hooks_and_threads_as_an_ordinary_exit(tmp_path, fast):
    res = run(tmp_path, "3", fast=fast)
    assert res.returncode == 3 and res.stdout == "unflushed output"
    assert (tmp_path / "mark.hook").read_text() == "ran"
    assert (tmp_path / "mark.thread").read_text() == "done"  # non-daemon threads are joined first


def test_a_message_exit_prints_it_and_exits_1(tmp_path):
    res = run(tmp_path, "stopped: bad flag")
    assert res.returncode == 1 and res.stderr.strip().endswith("stopped: bad flag")


@pytest.mark.mpi
def test_mpi_is_finalized_before_leaving(tmp_path):
    res = run(tmp_path, "0", mpi=True)
    assert res.returncode == 0 and "improperly" not in res.stderr, res.stderr
    assert (tmp_path / "mark.hook").read_text() == "ran"


LEAVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from dpuoffload.common.runtime.fastexit import run_and_exit_fast

    def program():
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_rank() == 1:  # a rank still finishing when rank 0 has left
            MPI.Finalize()
            time.sleep(1.0)
            Path(sys.argv[1]).write_text("finished")
        else:
            import torch  # noqa: F401 (as a host rank has: it leaves without Python's teardown)
        sys.exit(0)

    run_and_exit_fast(program)
""")


def leave_fast_beside_a_slower_rank(launcher: list[str], python: str, env: dict[str, str],
                                    tmp_path) -> tuple[subprocess.CompletedProcess, bool]:
    """A 2-rank job whose rank 0 leaves fast while rank 1, finalized, works on for 1 s: the job's
    result, and whether rank 1 finished (wrote its file)."""
    mark = tmp_path / "rank1"
    res = subprocess.run([*launcher, python, "-c", LEAVER, str(mark)], capture_output=True, text=True,
                         env={**env, "DPUOFFLOAD_FAST_EXIT": "1"}, timeout=120)
    return res, mark.exists() and mark.read_text() == "finished"


@pytest.mark.mpi
def test_a_rank_leaving_fast_does_not_kill_the_ranks_still_finishing(tmp_path):
    """Open MPI's side of tests/jobs/test_mpich.py's test of the same name (there rank 0 leaves through
    the C library's exit(), here by os._exit)."""
    from tests.mpijobs import MPIRUN, job_env

    res, finished = leave_fast_beside_a_slower_rank([MPIRUN, "--mca", "btl", "^ofi", "-np", "2"], sys.executable,
                                                    job_env(), tmp_path)
    assert res.returncode == 0 and finished, res.stdout + res.stderr
