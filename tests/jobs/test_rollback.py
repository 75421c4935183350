"""`--recovery rollback`: a spare rank (`dpurun --spare-ranks S`) takes a dead host rank's seat.

Pure parts: the call-in message, the state message, the launch command and flag checks, which
deaths are survived. Real jobs (host ranks SIGKILLed by `--inject`): a death inside a step is
replayed by the spare and the run's weights equal an uninterrupted run's to the bit; a death in
an epoch's end work is filled at the next step, to the bit too; so is host rank 0's death (its
BatchNorm buffers and every rank's epoch progress ride in each step's allreduce, and the epoch's
totals are added up from every seat's progress), also in an epoch resumed mid-way from a
checkpoint (every rank's record of it comes from the checkpoint); in `--mode da` the
spare's batches come from the dead rank's DPU rank, or from itself when that one died too (a lost
node); a second death with no spare left ends the job in one line naming the fix. A collective that
failed with no rank dead (a revoke, as ULFM's false alarm) is redone to the bit and not reported, under
both recoveries.

(Here the tests that start processes; those that run in one process: tests/unit/test_rollback.py.)
"""

from __future__ import annotations

import sys

import pytest
import torch

from dpuoffload.common.state import ckptfiles
from tests.jobs.test_dpu_failure import epochs
from tests.mpijobs import dpurun, read_jsonl

RUN = ["--preset", "debug", "--no-progress", "--epochs", "2", "--train-subset", "256"]
LAUNCH = ["--host-ranks", "2", "--dpu-ranks", "1", "--oversubscribe"]
SPARE = [*LAUNCH, "--spare-ranks", "1"]


@pytest.mark.mpi
def test_both_original_host_ranks_dead_a_seated_spare_goes_on(bundled_data, tmp_path, reference):
    """Host rank 1 dies, spare 0 takes its seat; then host rank 0 dies and spare 1 takes seat 0
    with spare 0's state: the run ends normally although no original host rank is left. The seated
    spares tell the DPU rank to stop (`host.control.shutdown_sender`): it once waited for a message
    no rank sent, took their normal exit for the last host rank's death and called MPI_Abort."""
    res = rollback_run(bundled_data, tmp_path, "host:1@3,host:0@9", [*LAUNCH, "--spare-ranks", "2"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ending the job" not in res.stdout + res.stderr
    assert "took host rank 0's seat with spare rank 0 (world rank 3, node" in res.stdout
    assert [res.stdout.count(f"epoch {e}/2 |") for e in (1, 2)] == [1, 1]
    recs = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["event"] == "recovery"]
    assert [(r["lost_world_ranks"], r["replaced_by"], r["state_from"]) for r in recs] == \
        [([1], [[3, 1]], 0), ([0], [[4, 0]], 3)]
    # (host rank 0's death is recorded by spare rank 0 in its seat: the DPU rank, which once did, took a death
    # in the run's last second for a rank leaving once its shutdown came)
    deaths = [(r["world_rank"], r["survived"]) for r in read_jsonl(tmp_path / "failures.jsonl")]
    assert sorted(deaths) == [(0, True), (1, True)], deaths
    assert_records_exact(tmp_path, reference)  # (spare 1 in seat 0 has host rank 0's buffers and progress)


@pytest.mark.mpi
def test_a_spare_filled_in_at_an_epoch_s_start_sends_seat_zero_that_epoch_s_progress(bundled_data, tmp_path,
                                                                                    reference):
    """Host rank 1 dies in epoch 1's end work (spare 0 takes its seat before epoch 2), then host rank 0
    in epoch 2's first step: spare 0 sends spare 1 seat 0's progress of epoch 2 alone (on 74aff0d it
    sent epoch 1's too: epoch 2's record held 16 step losses). Epoch 1's totals still count host rank
    1's steps, from every seat's progress (on a3e8cdb the survivor summed its own alone): every record
    is the uninterrupted run's, to the bit. (Host rank 1's death alone is this test's first half: the
    survivor does the end work, the spare joins before epoch 2 with the state there, nothing replayed.)"""
    res = rollback_run(bundled_data, tmp_path, "host:1@8,host:0@9", [*LAUNCH, "--spare-ranks", "2"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "died outside a step (near global step 8)" in res.stdout and "host rank 1 (world rank 1, node" in res.stdout
    assert "took host rank 1's seat before global step 9" in res.stdout and "nothing to replay" in res.stdout
    assert "took host rank 0's seat with spare rank 0 (world rank 3, node" in res.stdout
    assert_records_exact(tmp_path, reference)


@pytest.fixture(scope="module")
def reference_log(bundled_data, tmp_path_factory):
    """The uninterrupted run: 2 host ranks, the MPI allreduce rollback uses; a checkpoint after
    every step in `ck` (one DPU rank keeps both host ranks' slices)."""
    log = tmp_path_factory.mktemp("reference")
    res = dpurun(LAUNCH, [*RUN, "--data", str(bundled_data / "cifar10"), "--mode", "none", "--allreduce", "mpi",
                          "--log-dir", str(log), "--ckpt-dir", str(log / "ck"), "--ckpt-every", "1",
                          "--ckpt-keep", "16"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return log


@pytest.fixture(scope="module")
def reference(reference_log):
    return read_jsonl(reference_log / "metrics.jsonl")


def rollback_run(bundled_data, log, inject, launch=SPARE, mode="none", extra=()):
    return dpurun(launch, [*RUN, "--data", str(bundled_data / "cifar10"), "--mode", mode, "--log-dir", str(log),
                           "--recovery", "rollback", "--inject", inject, *extra], timeout=300)


EXACT = ("weights_sha256", "val_loss_sum", "val_correct", "step_losses", "train_loss", "train_acc")


def assert_records_exact(log, reference):
    """Every epoch's record and the end's weights equal the uninterrupted run's, to the bit."""
    got = read_jsonl(log / "metrics.jsonl")
    mine, want = epochs(got), epochs(reference)
    for epoch in (0, 1):
        for key in EXACT:
            assert mine[epoch][key] == want[epoch][key], (epoch, key)
    assert [r["weights_sha256"] for r in got if r["event"] == "end"] == \
        [r["weights_sha256"] for r in reference if r["event"] == "end"]


@pytest.mark.mpi
def test_host_rank_zero_in_da_is_replayed_to_the_bit(bundled_data, tmp_path, reference):
    """Host rank 0 (world rank 0) dies in --mode da: the spare takes seat 0 and the metrics log,
    with host rank 0's BatchNorm buffers and epoch progress, which rode in every step's allreduce
    (`host.recovery.carried`): every record is the uninterrupted run's (on ab0a360 the spare took
    host rank 1's buffers and an empty progress: epoch 1's weights, validation and training loss
    differed)."""
    res = rollback_run(bundled_data, tmp_path, "host:0@3", ["--host-ranks", "2", "--dpu-ranks", "2",
                                                              "--oversubscribe", "--spare-ranks", "1"], "da")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "took host rank 0's seat with host rank 1 (world rank 1" in res.stdout
    assert "its batches from DPU rank 0 (world rank 2" in res.stdout  # (the dead rank's own DPU rank)
    assert res.stdout.count("epoch 2/2 |") == 1
    assert_records_exact(tmp_path, reference)


@pytest.mark.mpi
def test_a_node_lost_whole_the_spare_loads_itself_bit_exactly(bundled_data, tmp_path, reference):
    """`node:1` in --mode da: host rank 1 and the DPU rank that fed it die; the spare finds that DPU
    rank gone and builds the seat's batches itself: the same batches, the reference's weights."""
    res = rollback_run(bundled_data, tmp_path, "node:1@5", ["--host-ranks", "2", "--dpu-ranks", "2",
                                                              "--oversubscribe", "--spare-ranks", "1"], "da",
                       ["--dpu-failure", "fallback"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "takes host rank 1's seat: it replays the failed step from epoch 1, step 5 done (global step 5), its " \
        "batches from this process" in res.stdout
    mine, want = epochs(read_jsonl(tmp_path / "metrics.jsonl")), epochs(reference)
    assert [mine[e]["weights_sha256"] for e in (0, 1)] == [want[e]["weights_sha256"] for e in (0, 1)]


@pytest.mark.mpi
def test_no_spare_left_ends_the_job_naming_the_fix(bundled_data, tmp_path):
    res = rollback_run(bundled_data, tmp_path, "host:1@3,host:2@5",
                       ["--host-ranks", "3", "--dpu-ranks", "1", "--oversubscribe", "--spare-ranks", "1"])
    assert res.returncode != 0
    # (named as the death it is: dpurun --restarts would relaunch it)
    assert "dpurun: world rank 2 = host rank 2 (host program) died: it trained, and no spare rank is left to take " \
        "host rank 2's seat (all spares of dpurun --spare-ranks are in use): start more spares" in res.stderr


@pytest.mark.mpi
def test_spare_in_seat_zero_gets_the_validation_still_due(bundled_data, tmp_path, reference):
    """--mode hybrid (one DPU rank augments, one validates); host rank 0 dies in epoch 2 while
    epoch 1 is validated on the DPU side: the spare takes seat 0 (and the metrics log), epoch 1's
    record came with its state and gets the DPU results, equal to the failure-free run's to the
    bit; epoch 2's state goes from the spare and host rank 1 and is validated whole."""
    res = rollback_run(bundled_data, tmp_path, "host:0@10", ["--host-ranks", "2", "--dpu-ranks", "2",
                                                               "--oversubscribe", "--spare-ranks", "1"], "hybrid")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "takes host rank 0's seat: it replays the failed step from epoch 2, step 2 done" in res.stdout
    assert [res.stdout.count(f"epoch {e}/2 |") for e in (1, 2)] == [1, 1]
    got = epochs(read_jsonl(tmp_path / "metrics.jsonl"))
    assert got[1]["val_count"] == 256 and got[1]["val_dpu_share"] == 1.0
    # (epoch 1's record, built by host rank 1 who packed the spare's state, holds host rank 0's step losses)
    assert_records_exact(tmp_path, reference)


def assert_same_checkpoints(ck, ref, steps, slicing):
    """`ck` committed exactly `steps`, each the uninterrupted run's state to the bit (parameters and
    momentum), sliced among `slicing[step]` host ranks (default 2)."""
    assert [int(p.name.split("-")[1]) for p in ckptfiles.committed(ck)] == steps
    for step in steps:
        got, want = ckptfiles.load(ckptfiles.step_dir(ck, step)), ckptfiles.load(ckptfiles.step_dir(ref, step))
        assert got.meta["position"] == want.meta["position"] and got.meta["host_ranks"] == slicing.get(step, 2)
        assert got.shared.keys() == want.shared.keys(), step
        assert all(torch.equal(got.shared[k], want.shared[k]) for k in want.shared), step


@pytest.mark.mpi
def test_checkpoints_survive_a_death_next_to_one_to_the_bit(bundled_data, tmp_path, reference_log, reference):
    """Host rank 1 dies right after step 6's optimizer step, before handing step 6's checkpoint
    over; the survivor detects it in step 7 and the spare replays that step from host rank 0's state of
    step 6: said in the log and the recovery record (one step replayed, no sample lost, the state sent),
    and every epoch's record equals the uninterrupted run's to the bit. The spare sends the dead rank's
    part of step 6 (the keeper waited for it), so every checkpoint is committed and equals the
    uninterrupted run's; a run resumed from step 6 (half of it written by the spare) ends on the
    uninterrupted run's weights."""
    ck = tmp_path / "ck"
    res = rollback_run(bundled_data, tmp_path, "host:1@6", extra=["--ckpt-dir", str(ck), "--ckpt-every", "3",
                                                                   "--ckpt-keep", "10"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "spare rank 0 (world rank 3, node" in res.stdout and "takes host rank 1's seat: it replays the failed " \
        "step from epoch 1, step 6 done (global step 6)" in res.stdout
    assert "died at global step 7 (epoch 1, step 7): rollback, spare rank 0 (world rank 3" in res.stdout
    assert "and replayed the step" in res.stdout and "no sample lost" in res.stdout
    [rec] = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["event"] == "recovery"]
    assert (rec["strategy"], rec["lost_world_ranks"], rec["replaced_by"], rec["state_from"]) == \
        ("rollback", [1], [[3, 1]], 0)
    assert rec["replayed_steps"] == 1 and rec["samples_lost"] == 0 and rec["bytes_moved"] > 1e6
    assert_records_exact(tmp_path, reference)  # (every epoch's weights, validation and step losses)
    assert "NOT saved" not in res.stdout + res.stderr
    assert "checkpoint step 6 committed" in res.stdout
    assert_same_checkpoints(ck, reference_log / "ck", [3, 6, 9, 12, 15], {})
    resumed = dpurun(LAUNCH, [*RUN, "--data", str(bundled_data / "cifar10"), "--mode", "none", "--allreduce", "mpi",
                              "--log-dir", str(tmp_path / "resumed"), "--resume", str(ckptfiles.step_dir(ck, 6))],
                     timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "(exactly): epoch 1, step 6 done (global step 6)" in resumed.stdout
    assert [r["weights_sha256"] for r in read_jsonl(tmp_path / "resumed" / "metrics.jsonl") if r["event"] == "end"] \
        == [r["weights_sha256"] for r in reference if r["event"] == "end"]


@pytest.mark.mpi
def test_host_rank_zero_lost_at_an_epoch_end_checkpoints_go_on(bundled_data, tmp_path, reference_log):
    """Host rank 0 dies after epoch 1's last step: host rank 1 alone does the epoch's end work,
    logs epoch 1 and hands the epoch-end checkpoint over sliced for itself alone; the spare then
    takes seat 0 for epoch 2, and gets the checkpoint summary as the new host rank 0. Every
    checkpoint holds the uninterrupted run's state."""
    ck = tmp_path / "ck"
    res = rollback_run(bundled_data, tmp_path, "host:0@8", extra=["--ckpt-dir", str(ck), "--ckpt-every", "4",
                                                                   "--ckpt-keep", "10"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert [res.stdout.count(f"epoch {e}/2 |") for e in (1, 2)] == [1, 1]
    assert_same_checkpoints(ck, reference_log / "ck", [4, 8, 12, 16], {8: 1})
    got = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["event"] for r in got].count("end") == 1
    # the epoch's end took host rank 0's buffers from its last step's allreduce, its totals and step losses
    # from every seat's progress: not the survivor's own
    assert_records_exact(tmp_path, read_jsonl(reference_log / "metrics.jsonl"))


@pytest.mark.mpi
def test_no_spare_left_is_a_death_that_dpurun_restarts_from_dpu_memory(bundled_data, tmp_path, reference,
                                                                        monkeypatch):
    """Three host-rank deaths in one run, each replayed to the bit. Host rank 1 dies at step 3 (the
    spare takes its seat), host rank 0 at step 9 with no spare left: that death ends the job, named as
    a death (not the survivors' error), so `dpurun --restarts 1` relaunches it from the state the keeper
    holds in DPU memory, with the pool full again; there host rank 1 dies at step 13 (the injected
    failures after the one that ended the job stay), a spare replays it, and the run ends on the
    uninterrupted run's weights."""
    monkeypatch.setenv("DPUOFFLOAD_MEM_DIR", str(tmp_path / "shm"))
    res = rollback_run(bundled_data, tmp_path, "host:1@3,host:0@9,host:1@13", [*SPARE, "--restarts", "1"],
                       extra=["--ckpt-dir", str(tmp_path / "ck"), "--ckpt-every", "2"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "dpurun: world rank 0 = host rank 0 (host program) died: it trained, and no spare rank is left to take " \
        "host rank 0's seat" in res.stderr
    assert "dpurun: restart 1 of 1: relaunching with --resume auto" in res.stderr
    [rep] = read_jsonl(tmp_path / "restarts.jsonl")
    assert rep["source"] == "dpu-memory" and rep["failed_step"] == 9
    assert rep["resumed_step"] in (6, 8) and rep["replayed_steps"] == 9 - rep["resumed_step"]  # (8 unless
    # its hand-off had not landed when host rank 0 died: the newest state held)
    assert f"restarting from DPU memory: the state of step {rep['resumed_step']} " in res.stdout
    assert "--inject host:1@13 --resume auto" in res.stderr  # (the relaunch's command line)
    replays = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["event"] == "recovery"]
    assert [(r["global_step"], r["lost_host_ranks"], r["replayed_steps"]) for r in replays] == \
        [(4, [1], 1), (14, [1], 1)]  # (the steps after the injected ones, one per launch: one log)
    assert [r["weights_sha256"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["event"] == "end"] == \
        [r["weights_sha256"] for r in reference if r["event"] == "end"]


@pytest.mark.mpi
def test_a_resumed_epoch_s_records_survive_deaths_to_the_bit(bundled_data, tmp_path, reference_log, reference):
    """Resumed from the uninterrupted run's checkpoint of step 3 (mid-epoch 1), host rank 1 dies in
    step 6 (spare 0 replays it with seat 1's record of the epoch) and host rank 0 after step 8, in
    the epoch's end work (spare 1 takes seat 0 before epoch 2): every record is the uninterrupted
    run's. Every rank's record of the interrupted epoch comes from the checkpoint (`Loaded.seats`);
    before, a resume shared none, and epoch 1's training loss and accuracy lacked the dead ranks'
    steps."""
    res = rollback_run(bundled_data, tmp_path, "host:1@5,host:0@8", [*LAUNCH, "--spare-ranks", "2"],
                       extra=["--resume", str(reference_log / "ck" / "step-000000003")])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "died at global step 6 (epoch 1, step 6): rollback, spare rank 0 (world rank 3" in res.stdout
    assert "took host rank 0's seat before global step 9" in res.stdout
    assert_records_exact(tmp_path, reference)


# Host rank 1 revokes the host group's communicator before its 6th allreduce, as ULFM's agreement saying
# "failed" with no rank dead (CI saw it once, benchmarks/faults.py in 2 of 180 rollback tries): every rank
# then meets a failed call and shrinks, finding everyone alive. The wrapper prints what its group recorded,
# so a test knows the false alarm happened.
FALSE_ALARM = """
import sys
from dpuoffload.common.runtime.fastexit import run_and_exit_fast
from dpuoffload.host.main import run
from dpuoffload.host.recovery.survivors import SurvivorGroup
calls, shrinks, run_group, shrink = [0], [0], SurvivorGroup.run, SurvivorGroup._shrink
def counted(group, *args):
    shrinks[0] += 1
    return shrink(group, *args)
def revoking(group, call, what):
    calls[0] += what == "an allreduce"
    if calls[0] != 6 or what != "an allreduce":
        return run_group(group, call, what)
    group.comm.Revoke()
    run_group(group, call, what)
    print(f"false alarm: {shrinks[0]} shrink(s), {len(group.shrinks)} recorded, {len(group.regroups)} regroup(s), "
          f"generation {group.generation}, size {group.Get_size()}, {group.redone} redone", flush=True)
SurvivorGroup.run, SurvivorGroup._shrink = revoking, counted
run_and_exit_fast(lambda: run(sys.argv[1:]))
"""


# A spare standing by that acts on the host ranks' END 6 s after it came (a starved core, a slow node), started
# through dpurun's --python by a wrapper that leaves every other rank as it is.
LATE_SPARE = """
import sys, time
import dpuoffload.host.recovery.spares as spares
from dpuoffload.common.runtime.fastexit import run_and_exit_fast
from dpuoffload.host.main import run
stand_by = spares.SparePool.stand_by
spares.SparePool.stand_by = lambda pool: (lambda call: call if call is not None else time.sleep(6.0))(stand_by(pool))
run_and_exit_fast(lambda: run(sys.argv[1:]))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("recovery", ["lossy-forward", "rollback"])
def test_a_failed_collective_with_no_rank_dead_is_redone_to_the_bit(bundled_data, tmp_path, monkeypatch, recovery,
                                                                   reference):
    """A real job whose group shrinks although no rank died (host rank 1 revokes it, `FALSE_ALARM`):
    the call is redone on the same ranks, said in one line and not as a recovery, and the weights are the
    uninterrupted run's. A standing-by spare (rollback) follows the pool's regroup and stays a spare.

    Under rollback the spare also acts on the host ranks' END 6 s late (`LATE_SPARE`): the spares standing
    by pass a last barrier with the host ranks (`SparePool.release`); a spare once waited 1 s for END, then
    took the host ranks' normal exit for deaths, the last one fatal. (One job for both: a spare that stays a
    spare through the regroup is the one that then hears the end late.)"""
    wrapper = tmp_path / "python"
    late = (f'if [ "$DPUOFFLOAD_STANDBY" = spare ]; then shift 2; exec {sys.executable} -c "$LATE_SPARE" "$@"; fi\n'
            if recovery == "rollback" else "")
    wrapper.write_text(f'#!/bin/sh\n{late}if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then shift 2; '
                       f'exec {sys.executable} -c "$FALSE_ALARM" "$@"; fi\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("FALSE_ALARM", FALSE_ALARM)
    monkeypatch.setenv("LATE_SPARE", LATE_SPARE)  # (the job's environment: tests.mpijobs.job_env copies this one)
    launch = SPARE if recovery == "rollback" else LAUNCH
    training = [*RUN, "--data", str(bundled_data / "cifar10"), "--mode", "none", "--log-dir", str(tmp_path),
                "--recovery", recovery]
    res = dpurun([*launch, "--python", str(wrapper)], training, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "false alarm: 1 shrink(s), 0 recorded, 0 regroup(s), generation 0, size 2, 1 redone" in res.stdout, \
        res.stdout
    assert res.stdout.count("[dpuoffload] an allreduce of the host ranks failed (MPI's agreement), yet the shrink "
                            "found all 2 host ranks alive: redone on the same ranks (host rank 0's call: "
                            "MPI_ERR_REVOKED: Communication Object Revoked)") == 1, res.stdout
    assert "host rank 1's call, in" not in res.stdout  # (its own revoke: nothing more to say)
    assert "died" not in res.stdout + res.stderr and "global step" not in res.stdout, res.stdout + res.stderr
    assert [res.stdout.count(f"epoch {e}/2 |") for e in (1, 2)] == [1, 1]
    assert not (tmp_path / "failures.jsonl").exists()  # (written at the first death)
    got = read_jsonl(tmp_path / "metrics.jsonl")
    assert not [r for r in got if r["event"] == "recovery"]
    assert [r["weights_sha256"] for r in got if r["event"] == "end"] == \
        [r["weights_sha256"] for r in reference if r["event"] == "end"]
