"""Restart from DPU memory (`--ckpt-mem-keep`, `dpurun --restarts N`), issue 13 item 2.

Pure: the memory store (complete steps only, pruning, layout filter), the restart choice (the newest
step every keeper holds, unless the disk is newer), the relaunch flags, what is (not) restarted, the
report from the supervisor's event times.

Real jobs (2 host + 2 DPU ranks, da, checkpoints every 2 steps, host rank 0 killed after step 7):
- `dpurun --restarts 1` relaunches, resumes from DPU memory at step 6, replays 1 step, and ends with
  the uninterrupted run's weights and epoch records, to the bit;
- with the disk checkpoints deleted after the failure, `--resume latest` still resumes from DPU
  memory (the disk is not read) to the same weights.

(Here the tests that start processes; those that run in one process: tests/unit/test_restart.py.)
"""

import re
import shutil

import pytest

from tests.mpijobs import dpurun, read_jsonl

DEBUG = ["--preset", "debug", "--no-progress", "--train-subset", "256", "--mode", "da", "--epochs", "2"]
TWO = ["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe"]


# ----------------------------------------------------------------------------------- real jobs
@pytest.fixture(scope="module")
def straight(bundled_data, tmp_path_factory):
    log = tmp_path_factory.mktemp("straight")
    res = dpurun(TWO, [*DEBUG, "--data", str(bundled_data / "cifar10"), "--log-dir", str(log)], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return read_jsonl(log / "metrics.jsonl")


def epochs_and_end(metrics: list[dict]) -> tuple[dict, dict]:
    epochs = {m["epoch"]: m for m in metrics if m["event"] == "epoch"}
    return epochs, next(m for m in metrics if m["event"] == "end")


def assert_same_training(metrics: list[dict], straight: list[dict]) -> None:
    (epochs, end), (ref, ref_end) = epochs_and_end(metrics), epochs_and_end(straight)
    assert end["weights_sha256"] == ref_end["weights_sha256"] and end["global_step"] == 16
    for e in ref:
        for key in ("step_losses", "train_loss", "val_loss_sum", "val_correct", "weights_sha256"):
            assert epochs[e][key] == ref[e][key], (e, key)


def memory_step(stdout: str, failed_stderr: str) -> int:
    """The step a restart from DPU memory took after a host rank was killed at step 7 (checkpoints
    every 2 steps). The keepers keep a hand-off in memory as it lands and commit it to disk later,
    so under load step 6 may not have landed yet when step 7 dies: the newest step held, 6 or 4, and
    never older than the disk's newest committed checkpoint at the failure."""
    found = re.search(r"restarting from DPU memory: the state of step (\d+) ", stdout)
    assert found, stdout
    step = int(found.group(1))
    disk = re.search(r"the last committed checkpoint is \S*/step-(\d+)", failed_stderr)
    assert step in (4, 6) and step >= (int(disk.group(1)) if disk else 0), (step, failed_stderr)
    return step


def restarted_once(bundled_data, tmp_path, monkeypatch, *flags: str):
    """A 2 + 2-rank job under `dpurun --restarts 1` (DPU memory under `tmp_path`, log and checkpoints in
    `tmp_path/log` and `tmp_path/ck`) that failed once and was relaunched with `--resume auto`."""
    monkeypatch.setenv("DPUOFFLOAD_MEM_DIR", str(tmp_path / "shm"))
    res = dpurun([*TWO, "--restarts", "1"], [*DEBUG, "--data", str(bundled_data / "cifar10"), "--log-dir",
                                            str(tmp_path / "log"), "--ckpt-dir", str(tmp_path / "ck"), *flags],
                 timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "dpurun: restart 1 of 1: relaunching with --resume auto" in res.stderr
    return res


@pytest.mark.mpi
def test_restarts_resume_from_dpu_memory_to_the_bit(bundled_data, tmp_path, straight, monkeypatch):
    log = tmp_path / "log"
    res = restarted_once(bundled_data, tmp_path, monkeypatch, "--ckpt-every", "2", "--inject", "host:0@7")
    step = memory_step(res.stdout, res.stderr)
    [rep] = read_jsonl(log / "restarts.jsonl")
    assert (rep["source"], rep["failed_step"], rep["resumed_step"], rep["replayed_steps"]) == \
        ("dpu-memory", 7, step, 7 - step)
    assert rep["detected_s"] > 0 and rep["resumed_s"] > rep["transfer_s"] > 0
    metrics = read_jsonl(log / "metrics.jsonl")
    assert [m["global_step"] for m in metrics if m["event"] == "restart"] == [step]
    assert_same_training(metrics, straight)
    assert not any((tmp_path / "shm").rglob("step-*")), "a run that ended normally leaves no DPU memory behind"


@pytest.mark.mpi
def test_resume_latest_reads_dpu_memory_not_the_disk(bundled_data, tmp_path, straight, monkeypatch):
    monkeypatch.setenv("DPUOFFLOAD_MEM_DIR", str(tmp_path / "shm"))
    ck = tmp_path / "ck"
    flags = [*DEBUG, "--data", str(bundled_data / "cifar10"), "--ckpt-dir", str(ck), "--ckpt-every", "2",
             "--ckpt-mem-keep", "2"]
    failed = dpurun(TWO, [*flags, "--log-dir", str(tmp_path / "l1"), "--inject", "host:1@7"], timeout=300)
    assert failed.returncode != 0 and "host rank 1 (host program) on node" in failed.stderr
    shutil.rmtree(ck)  # the disk copy is gone: only DPU memory can give the state back
    res = dpurun(TWO, [*flags, "--log-dir", str(tmp_path / "l2"), "--resume", "latest"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    step = memory_step(res.stdout, failed.stderr)
    assert f"resuming from DPU memory (step {step}) (exactly): epoch 1, step {step} done (global step {step})" \
        in res.stdout
    assert_same_training(read_jsonl(tmp_path / "l2" / "metrics.jsonl"), straight)


@pytest.mark.mpi
def test_a_failure_before_the_first_checkpoint_restarts_from_the_beginning_to_the_bit(bundled_data, tmp_path,
                                                                                      straight, monkeypatch):
    """The relaunch's `--resume auto` finds nothing kept (no step in DPU memory, none on disk): the
    ranks say so and train from step 0, ending as the run never interrupted."""
    log, ck = tmp_path / "log", tmp_path / "ck"
    res = restarted_once(bundled_data, tmp_path, monkeypatch, "--ckpt-every", "6", "--inject", "host:1@3")
    assert (f"[dpuoffload] --resume auto: nothing was kept to resume from (no step in DPU memory, no complete "
            f"checkpoint in {ck}): starting from the beginning") in res.stdout
    [rep] = read_jsonl(log / "restarts.jsonl")
    assert (rep["failed_step"], rep["resumed_step"], rep["replayed_steps"]) == (3, 0, 3)
    assert_same_training(read_jsonl(log / "metrics.jsonl"), straight)
