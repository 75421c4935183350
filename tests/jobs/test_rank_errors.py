"""Errors that still happen on the ranks: one line from the rank that failed (exception, message, the
user's file:line), the full traceback in `<log-dir>/errors-rank<N>.txt`, `dpurun` naming that rank
(not the ones that died after it), and no Open MPI abort banner (nor its NUL byte) in what the user
sees; the raw output stays in `<log-dir>/mpirun.log`. Real dpurun jobs on the tiny preset."""

import pytest

from tests.mpijobs import REPO, dpurun

pytestmark = pytest.mark.mpi
TINY = ["--preset", "debug", "--train-subset", "64", "--val-subset", "64", "--no-progress"]


def test_rank_that_raises_gives_one_line_a_traceback_file_and_is_named_first(tmp_path, bundled_data):
    log = tmp_path / "log"
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "1"],
                 [*TINY, "--data", str(bundled_data / "cifar10"), "--epochs", "1", "--mode", "da",
                  "--model", "tests.fault_factories:raises_at_step3", "--log-dir", str(log)], timeout=120)
    assert res.returncode == 1, res.stderr
    traceback_file = log / "errors-rank0.txt"
    raised = next(i for i, ln in enumerate((REPO / "tests" / "fault_factories.py").read_text().splitlines(), 1)
                  if "user model broke at step 3" in ln)  # (the line that raises: named in the error)
    expected = ("host rank 0 (world rank 0, node {}) failed: ValueError: user model broke at step 3 on purpose "
                f"(at tests/fault_factories.py:{raised} in forward); full traceback in {traceback_file}")
    own = [ln for ln in res.stderr.splitlines() if ln.startswith("[dpuoffload] ")]
    assert len(own) == 1, res.stderr
    node = own[0].split("node ", 1)[1].split(")", 1)[0]
    assert own[0] == "[dpuoffload] " + expected.format(node)
    assert res.stderr.splitlines()[-1] == ("dpurun: world rank 0 = host rank 0 (host program) failed first: "
                                           + expected.split(" failed: ", 1)[1])
    assert "Traceback" not in res.stderr and "MPI_ABORT" not in res.stderr and "\x00" not in res.stderr
    text = traceback_file.read_text()
    assert text.startswith("host rank 0 (world rank 0") and "Traceback (most recent call last)" in text
    assert 'tests/fault_factories.py", line 23, in forward' in text
    assert "MPI_ABORT was invoked on rank 0" in (log / "mpirun.log").read_text(errors="replace")


def test_failing_keeper_thread_ends_the_job_with_one_line(tmp_path):
    """A keeper thread cannot be caught by the program's entry wrapper; it aborts the job itself."""
    import subprocess
    import sys
    import time

    from tests.mpijobs import MPIRUN, job_env

    t0 = time.monotonic()
    res = subprocess.run([MPIRUN, "--oversubscribe", "--bind-to", "none", "-np", "2", sys.executable,
                          "tests/probes/keeper_abort_probe.py"], capture_output=True, text=True, timeout=120,
                         env={**job_env(), "TMPDIR": str(tmp_path)})
    assert res.returncode != 0 and time.monotonic() - t0 < 60
    own = [ln for ln in res.stderr.splitlines() if ln.startswith("[dpuoffload] ")]
    assert len(own) == 1, res.stderr
    assert own[0].startswith("[dpuoffload] DPU rank 0 (world rank 1) failed: OSError: [Errno 28] No space left")
    assert own[0].endswith("(in its checkpoint keeper thread)")
    assert "Traceback" not in own[0]
