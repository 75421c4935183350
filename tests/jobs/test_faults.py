"""Faults in real MPMD jobs end the whole job with a message naming the rank, and never hang."""

import signal

import pytest

from tests.mpijobs import dpurun, kill_first_dpu_rank_once

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


def test_killed_dpu_rank_ends_job_within_30s_and_is_named(tmp_path):
    code, err, ended_after = kill_first_dpu_rank_once(
        ["--dataset", "fake", "--epochs", "100", "--no-progress", "--log-dir", str(tmp_path)],
        ready=tmp_path / "metrics.jsonl")  # the host has finished an epoch: training is under way
    assert code != 0
    assert "dpurun: world rank 1 = DPU rank 0 (DPU program)" in err and "killed by signal 9" in err, err
    assert ended_after < 30


def test_hung_dpu_rank_trips_the_peer_timeout(tmp_path, bundled_data):
    """A DPU rank that stops answering (SIGSTOP: alive, so MPI reports nothing) is caught by the host
    rank's --peer-timeout, which names the wait and ends the job."""
    code, err, ended_after = kill_first_dpu_rank_once(
        ["--preset", "debug", "--mode", "da", "--data", str(bundled_data / "cifar10"), "--epochs", "50",
         "--train-subset", "128", "--peer-timeout", "3", "--no-progress", "--log-dir", str(tmp_path)],
        ready=tmp_path / "phases-rank0.jsonl", limit=90, sig=signal.SIGSTOP)
    assert code != 0
    assert "timed out after 3 s waiting for" in err and "raise --peer-timeout if it is slow" in err, err
    assert "host rank 0 (world rank 0" in err


def test_injected_failures_end_the_job_naming_the_rank_and_the_step(bundled_data):
    """`--inject`: an exception in a host rank at step 3, and a SIGKILL of the augmentation DPU rank
    when it builds the batch of step 8 (half of 2 epochs x 8 steps): one line each, naming both."""
    run = ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--train-subset", "128", "--epochs", "2",
           "--mode", "da", "--no-progress"]
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "1"], [*run, "--inject", "host:0@3:raise"], timeout=120)
    assert res.returncode != 0
    assert "InjectedFailure: injected failure host:0@3:raise at global step 3" in res.stderr, res.stderr
    assert "host rank 0 (world rank 0" in res.stderr
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "1"], [*run, "--inject", "dpu:0@0.5"], timeout=120)
    assert res.returncode != 0
    assert "DPU rank 0 (world rank 1, node" in res.stderr and "injected failure dpu:0@0.5:kill at global step 8" \
        in res.stderr, res.stderr
    assert "dpurun: world rank 1 = DPU rank 0 (DPU program)" in res.stderr and "killed by signal 9" in res.stderr
