"""A dead DPU rank is not fatal (`--dpu-failure fallback`, issue 13 item 3), under Open MPI's ULFM.

Pure: which deaths the run survives (`faults.verdict`), the flags refused, the mpirun line.
Real jobs (2 host + 2 DPU ranks, `da`, 2 epochs of 256 samples; DPU rank 1 feeds host rank 1):
- DPU rank 1 SIGKILLed: the job ends 0, host rank 1 builds its own batches from the step that did
  not arrive, and every epoch's losses, validation sums and weights equal a `--mode none` run's, to the bit;
- a validation DPU rank SIGKILLed (mv, hybrid): the host ranks validate, the epoch it had not
  reported included, and the run still equals `none`'s to the bit;
- a checkpoint keeper SIGKILLed on getting a checkpoint's state (keeper 0, which commits, or 1): that
  checkpoint is never committed, the next ones are (the other keeper takes the state), training is
  unchanged, and a resume from a checkpoint written after the death is bit-exact;
- a host rank SIGKILLed, and a keeper under --ckpt-mem-keep: the job ends non-zero within
  seconds, dpurun naming the dead rank, and no committed checkpoint is damaged;
- started without fault tolerance, the flag is refused in one line.

(Here the tests that start processes; those that run in one process: tests/unit/test_dpu_failure.py.)
"""

import time

import pytest

from dpuoffload.common.state import ckptfiles
from tests.mpijobs import PY, dpurun, mpmd, read_jsonl

TWO = ["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe"]
RUN = ["--preset", "debug", "--no-progress", "--train-subset", "256", "--epochs", "2"]


@pytest.fixture(scope="module")
def baseline(bundled_data, tmp_path_factory):
    """The same training in --mode none: the batches every host rank must train on."""
    log = tmp_path_factory.mktemp("none")
    res = dpurun(TWO, [*RUN, "--mode", "none", "--data", str(bundled_data / "cifar10"), "--log-dir", str(log)],
                 timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return read_jsonl(log / "metrics.jsonl")


def epochs(metrics):
    return {m["epoch"]: m for m in metrics if m["event"] == "epoch"}


@pytest.mark.mpi
def test_dead_augmentation_rank_falls_back_to_the_host_bit_exact(bundled_data, tmp_path, baseline):
    log = tmp_path / "log"
    res = dpurun(TWO, [*RUN, "--mode", "da", "--data", str(bundled_data / "cifar10"), "--log-dir", str(log),
                       "--dpu-failure", "fallback", "--inject", "dpu:1@5"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "--with-ft ulfm" in res.stderr  # dpurun's 'running:' line
    assert ("[dpuoffload] DPU rank 1 (world rank 3, node vm) died; it augmented for host rank 1 (world rank 1, "
            "node vm), which builds its own batches from here on (--dpu-failure fallback)").replace(
                "node vm", f"node {_node(res.stdout)}") in res.stdout
    [fallback] = read_jsonl(log / "failures-rank1.jsonl")
    assert fallback["event"] == "fallback" and fallback["feeder"] == 3
    assert f"building this rank's batches here from step {fallback['step']} of epoch {fallback['epoch']} on" \
        in res.stdout
    [death] = read_jsonl(log / "failures.jsonl")
    assert (death["world_rank"], death["survived"]) == (3, True)
    got, ref = epochs(read_jsonl(log / "metrics.jsonl")), epochs(baseline)
    assert sorted(got) == sorted(ref) == [0, 1]
    for e in ref:
        for key in ("step_losses", "train_loss", "val_loss_sum", "val_correct", "weights_sha256"):
            assert got[e][key] == ref[e][key], (e, key)


@pytest.mark.mpi
@pytest.mark.parametrize("mode,spec,again", [("mv", "dpu:1@8", 1), ("hybrid", "dpu:1@16", 2)])
def test_dead_validation_rank_moves_validation_to_the_host_bit_exact(bundled_data, tmp_path, baseline, mode, spec,
                                                                    again):
    """mv: validation rank 1 (not the one that reports) dies on getting epoch 1's state, while the
    host ranks train epoch 2. hybrid: the one validation rank dies on getting the last epoch's
    state, while the host ranks wait for its results. Either way the host ranks validate that epoch
    again from the state slices they kept, and the run equals `none`'s to the bit, validation sums
    included."""
    log = tmp_path / "log"
    res = dpurun(TWO, [*RUN, "--mode", mode, "--data", str(bundled_data / "cifar10"), "--log-dir", str(log),
                       "--dpu-failure", "fallback", "--inject", spec], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    node = _node(res.stdout)
    assert (f"[dpuoffload] DPU rank 1 (world rank 3, node {node}) died; it validated; the host ranks validate from "
            "here on (--dpu-failure fallback)") in res.stdout
    assert (f"[dpuoffload] a DPU validation rank died: the host ranks validate from here on; epoch(s) {again} "
            "validated again here from the state kept for them (--dpu-failure fallback)") in res.stdout
    [moved] = [r for r in read_jsonl(log / "failures-rank0.jsonl") if r["event"] == "validation_fallback"]
    assert moved["revalidated"] == [again - 1]
    got, ref = epochs(read_jsonl(log / "metrics.jsonl")), epochs(baseline)
    assert sorted(got) == sorted(ref) == [0, 1]
    for e in ref:
        for key in ("step_losses", "weights_sha256", "val_loss_sum", "val_correct", "val_count"):
            assert got[e][key] == ref[e][key], (e, key)
    # the epochs handed to the DPU side say so; in mv, epoch 2 was validated on the host ranks alone
    assert [got[e]["val_dpu_share"] for e in (0, 1)] == ([1.0, 0.0] if mode == "mv" else [1.0, 1.0])


def _node(stdout: str) -> str:
    """This box's node name as the ranks print it ('node vm' on the dev box)."""
    line = next(x for x in stdout.splitlines() if "died;" in x)
    return line.split("node ", 1)[1].split(")", 1)[0]


@pytest.mark.mpi
def test_dead_host_rank_ends_the_job_naming_it(bundled_data, tmp_path):
    t0 = time.monotonic()
    res = dpurun(TWO, [*RUN, "--mode", "da", "--data", str(bundled_data / "cifar10"), "--dpu-failure", "fallback",
                       "--inject", "host:1@3"], timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("dpurun: world rank 1 = host rank 1 (host program) died: it trained "
                           "(--recovery lossy-forward or rollback survive host ranks"), last
    assert time.monotonic() - t0 < 120  # (start-up included; the death itself ends the job in about a second)


@pytest.mark.mpi
def test_dead_keeper_with_dpu_memory_is_survived_and_the_relaunch_reads_the_disk(bundled_data, tmp_path, baseline,
                                                                                 monkeypatch):
    """`--ckpt-mem-keep 2` with `dpurun --restarts 1`: keeper 1 dies on getting step 6's state (survived:
    step 6 is torn, host rank 1's state goes to keeper 0), then host rank 0 dies after step 13, which
    ends the job. The dead keeper's DPU memory stopped at step 4, so no step newer than the disk's is
    held by every keeper: the relaunch reads the disk (step 12, or 10 while 12 still commits) and ends on
    the failure-free weights. (A keeper that does not commit dying: its messages are asserted here; the
    committer's death is `test_dead_keeper_tears_one_checkpoint_and_the_next_ones_commit`.)"""
    monkeypatch.setenv("DPUOFFLOAD_MEM_DIR", str(tmp_path / "shm"))
    ck, log = tmp_path / "ck", tmp_path / "log"
    res = dpurun([*TWO, "--restarts", "1"], [*RUN, "--mode", "none", "--data", str(bundled_data / "cifar10"),
                                            "--dpu-failure", "fallback", "--log-dir", str(log), "--ckpt-dir", str(ck),
                                            "--ckpt-every", "2", "--ckpt-keep", "20", "--ckpt-mem-keep", "2",
                                            "--inject", "dpu:1@6,host:0@13"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    node = _node(res.stdout)
    assert (f"[dpuoffload] host rank 1 (world rank 1, node {node}): its checkpoint keeper DPU rank 1 (world rank 3, "
            f"node {node}) died; its state goes to DPU rank 0 (world rank 2, node {node}) from here on "
            "(--dpu-failure fallback)") in res.stdout
    assert (f"checkpoint at step 6 NOT saved (DPU rank 1 (world rank 3, node {node}) died before writing its part); "
            "the next ones go to the living keepers") in res.stderr  # (keeper 0, the committer, reports it)
    assert "dpurun: world rank 0 = host rank 0 (host program) died" in res.stderr
    [rep] = read_jsonl(log / "restarts.jsonl")
    # Step 12's shards go to disk in the keepers' background while step 13 trains: on a loaded box its commit can
    # still be under way when host rank 0 dies (once in a clean-clone suite run: resumed from 10). Either is the
    # newest committed checkpoint at the death; what matters is that it came from the disk, not DPU memory.
    assert (rep["source"], rep["failed_step"]) == ("disk", 13) and rep["resumed_step"] in (10, 12)
    assert "restarting from DPU memory" not in res.stdout
    steps = [ckptfiles.load(d).meta["position"]["global_step"] for d in ckptfiles.committed(ck)]
    assert steps == [2, 4, 8, 10, 12, 14, 16]
    got, ref = epochs(read_jsonl(log / "metrics.jsonl")), epochs(baseline)
    assert got[1]["weights_sha256"] == ref[1]["weights_sha256"]


@pytest.mark.mpi
def test_dead_keeper_tears_one_checkpoint_and_the_next_ones_commit(bundled_data, tmp_path, baseline):
    """`--mode none` (the DPU ranks only keep checkpoints); keeper 0, the one that commits, dies on
    getting step 6's state. Step 6 is never committed; host rank 0's state goes to keeper 1 from then
    on, which commits from then on too; every later checkpoint commits, and the run trains as without
    the death. Resumed from step 8 (both shards written by the surviving keeper), training ends on the
    same weights, to the bit. (Keeper 1, which does not commit, dies the same way in
    `test_dead_keeper_with_dpu_memory_is_survived_and_the_relaunch_reads_the_disk`'s job, whose first part
    is this run with DPU memory on: its messages and checkpoints are asserted there.)"""
    ck, log = tmp_path / "ck", tmp_path / "log"
    data = ["--data", str(bundled_data / "cifar10")]
    res = dpurun(TWO, [*RUN, "--mode", "none", *data, "--dpu-failure", "fallback", "--log-dir", str(log),
                       "--ckpt-dir", str(ck), "--ckpt-every", "2", "--ckpt-keep", "20", "--inject", "dpu:0@6"],
                 timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    node = _node(res.stdout)
    assert (f"[dpuoffload] host rank 0 (world rank 0, node {node}): its checkpoint keeper DPU rank 0 (world rank 2, "
            f"node {node}) died; its state goes to DPU rank 1 (world rank 3, node {node}) from here on "
            "(--dpu-failure fallback)") in res.stdout
    # (the committer itself died: keeper 1, committing from then on, names it)
    assert (f"checkpoint at step 6 NOT saved (DPU rank 0 (world rank 2, node {node}) died before committing it); "
            "this keeper commits from here on (--dpu-failure fallback), the last complete checkpoint is") in res.stderr
    steps = [ckptfiles.load(d).meta["position"]["global_step"] for d in ckptfiles.committed(ck)]
    assert steps == [2, 4, 8, 10, 12, 14, 16]
    got, ref = epochs(read_jsonl(log / "metrics.jsonl")), epochs(baseline)
    assert all(got[e]["weights_sha256"] == ref[e]["weights_sha256"] for e in ref)
    again = tmp_path / "again"
    res = dpurun(TWO, [*RUN, "--mode", "none", *data, "--resume", str(ckptfiles.step_dir(ck, 8)),
                       "--log-dir", str(again)], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert epochs(read_jsonl(again / "metrics.jsonl"))[1]["weights_sha256"] == ref[1]["weights_sha256"]


@pytest.mark.mpi
def test_without_fault_tolerance_the_flag_is_refused(bundled_data):
    argv = ["--preset", "debug", "--mode", "da", "--data", str(bundled_data / "cifar10"), "--dpu-failure", "fallback"]
    res = mpmd(1, [PY, "-m", "dpuoffload.host", *argv], 1, [PY, "-m", "dpuoffload.dpu", *argv])
    assert res.returncode != 0
    assert "--dpu-failure fallback needs MPI fault tolerance: Open MPI 5 started with `mpirun --with-ft ulfm`" \
        in res.stderr


# The DPU program taking 6 s to act on its shutdown message once it came: a DPU rank that reads it late
# (a busy main loop, a starved core), as a real one may. It leaves as `python -m dpuoffload.dpu` does, without
# MPI_Finalize (which Open MPI 5.0.11 may hang in under --with-ft ulfm once other ranks left without it).
LATE_READER = """
import sys, time
import dpuoffload.dpu.control as control
from dpuoffload.common.runtime.fastexit import run_and_exit_fast
from dpuoffload.dpu.main import run
arrived = control.control_arrived
control.control_arrived = lambda topo, req, buf: arrived(topo, req, buf) and (time.sleep(6.0) or True)
run_and_exit_fast(lambda: run(sys.argv[1:]))
"""


@pytest.mark.mpi
def test_host_ranks_leave_only_once_every_dpu_rank_knows_the_job_is_over(bundled_data, tmp_path):
    """The end of a fault-tolerant run is a handshake (`host.control.end_with_dpus`), not a timer: a DPU
    rank that reads its shutdown seconds late must not take the host ranks' normal exit for deaths.
    Before it, the DPU rank waited 1 s for the message, then judged host rank 0's exit a death it does
    not survive and ended a finished job."""
    log = tmp_path / "log"
    argv = [*RUN, "--mode", "none", "--data", str(bundled_data / "cifar10"), "--epochs", "1",
            "--dpu-failure", "fallback", "--log-dir", str(log)]
    res = mpmd(2, [PY, "-m", "dpuoffload.host", *argv], 1, [PY, "-c", LATE_READER, *argv], timeout=240, ft=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "died" not in res.stdout + res.stderr, res.stdout + res.stderr
    assert "epoch 1/1 |" in res.stdout
    assert not (log / "failures.jsonl").exists()  # (written at the first death)
    ends = [r for r in read_jsonl(log / "phases-rank2.jsonl") if r.get("event") == "end"]
    assert len(ends) == 1 and ends[0]["idle_wall"] > 0
