"""Nothing lost: checkpoints that cannot be written make the job exit non-zero naming the newest
intact one (`--ckpt-errors fail` stops at the first), a --stop-at-step run says how to continue, and
a resumed run appends to the logs of the run it continues. Real dpurun jobs on the tiny preset
(64 samples, batch 16: 4 steps per epoch)."""

import pytest

from dpuoffload.common.state import ckptfiles
from tests.mpijobs import dpurun, read_jsonl

pytestmark = pytest.mark.mpi
TINY = ["--preset", "debug", "--train-subset", "64", "--val-subset", "64", "--no-progress"]
ONE = ["--host-ranks", "1", "--dpu-ranks", "1"]


def blocked_ckpt_dir(tmp_path):
    """A checkpoint dir where the 2nd checkpoint's directory (step 8) cannot be made: a file is there."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step-000000008").write_text("in the way")
    return ckpt


def test_checkpoint_that_cannot_be_written_gives_nonzero_exit_naming_the_newest_intact(tmp_path, bundled_data):
    ckpt = blocked_ckpt_dir(tmp_path)
    res = dpurun(ONE, [*TINY, "--data", str(bundled_data / "cifar10"), "--epochs", "3", "--ckpt-dir", str(ckpt),
                       "--ckpt-every", "4", "--ckpt-keep", "3", "--log-dir", str(tmp_path / "log")], timeout=120)
    assert res.returncode == 3, res.stderr
    assert "epoch 3/3" in res.stdout  # training went on after the failed checkpoint
    newest = ckpt / "step-000000012"  # the next checkpoint tried again and was saved
    assert res.stderr.splitlines()[-1] == ("dpurun: checkpoints: 1 of 3 NOT saved (step 8); the newest intact one "
                                           f"is {newest}")
    assert [p.name for p in ckptfiles.committed(ckpt)] == ["step-000000004", "step-000000012"]
    assert ckptfiles.load(newest).meta["position"]["global_step"] == 12
    assert (ckpt / "step-000000008").read_text() == "in the way"


def test_ckpt_errors_fail_stops_at_the_first_failure(tmp_path, bundled_data):
    ckpt = blocked_ckpt_dir(tmp_path)
    res = dpurun(ONE, [*TINY, "--data", str(bundled_data / "cifar10"), "--epochs", "3", "--ckpt-dir", str(ckpt),
                       "--ckpt-every", "4", "--ckpt-errors", "fail"], timeout=120)
    assert res.returncode == 3, res.stderr
    # Keeper 0 ends the job from inside the commit of step 8, so no later checkpoint is taken. The
    # host ranks train on meanwhile (checkpoints are asynchronous): whether epoch 3's 0.2 s finish
    # within the 0.3 s the line is given to reach mpirun is timing, not asserted.
    assert "checkpoint step 12" not in res.stdout
    assert [p.name for p in ckptfiles.committed(ckpt)] == ["step-000000004"]
    last = res.stderr.splitlines()[-1]
    assert last.startswith("dpurun: checkpoints: step 8 NOT saved (") and "FileExistsError" in last
    assert last.endswith(f"stopping the job (--ckpt-errors fail); the newest intact one is {ckpt / 'step-000000004'}")
    assert "MPI_ABORT" not in res.stderr


def test_stop_then_resume_appends_to_the_logs(tmp_path, bundled_data):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log"
    args = [*TINY, "--data", str(bundled_data / "cifar10"), "--epochs", "2", "--ckpt-dir", str(ckpt),
            "--log-dir", str(log)]
    first = dpurun(ONE, [*args, "--stop-at-step", "4"], timeout=120)
    assert first.returncode == 0, first.stderr
    # Host rank 0's last line. (The keeper's "checkpoint step 4 committed" is said before it, but from
    # another process: mpirun forwards each rank's output on its own pipe, so it may come out after.)
    host_lines = [line for line in first.stdout.splitlines() if " committed: " not in line]
    assert host_lines[-1] == (f"[dpuoffload] stopped at step 4; checkpoint {ckpt / 'step-000000004'}; "
                              "continue with `--resume latest`")
    second = dpurun(ONE, [*args, "--resume", "latest"], timeout=120)
    assert second.returncode == 0, second.stderr
    epochs = [r for r in read_jsonl(log / "metrics.jsonl") if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1]  # both epochs, 0-based: the first run's, then the resumed one's
    assert epochs[0]["run_id"] != epochs[1]["run_id"]
    assert (epochs[0]["resumed_from"], epochs[1]["resumed_from"]) == (None, 4)


def test_killed_job_names_the_last_committed_checkpoint(tmp_path, bundled_data):
    from tests.mpijobs import kill_first_dpu_rank_once

    ckpt = tmp_path / "ckpt"
    code, err, _ = kill_first_dpu_rank_once(
        [*TINY, "--data", str(bundled_data / "cifar10"), "--epochs", "100", "--ckpt-dir", str(ckpt),
         "--ckpt-every", "4"], ready=ckpt / "step-000000004" / "COMMITTED")
    assert code != 0
    newest = ckptfiles.committed(ckpt)[-1]
    assert err.splitlines()[-1] == f"dpurun: the last committed checkpoint is {newest}; continue with `--resume latest`"
