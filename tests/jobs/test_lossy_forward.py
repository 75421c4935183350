"""`--recovery lossy-forward`: host ranks survive a dead host rank inside the job (ULFM).

Pure parts: refused flag combinations, which deaths are survived, the takeover's slices and the
lost-sample accounting. Real jobs (host ranks SIGKILLed by `--inject`): the failed step equals the
recovery study's simulated lossy forward to the bit, the lost samples are exactly the dead rank's
batches, and the survivors train every sample of the following epochs.

(Here the tests that start processes; those that run in one process: tests/unit/test_lossy_forward.py.)
"""

from __future__ import annotations

import pytest

from dpuoffload.common.state import ckptfiles
from tests.jobs.test_dpu_failure import epochs
from tests.mpijobs import dpurun, read_jsonl
from tests.unit.test_lossy_forward import order

RUN = ["--preset", "debug", "--no-progress", "--epochs", "2"]


@pytest.mark.mpi
def test_dead_host_rank_lossy_forward_equals_the_simulated_one(bundled_data, tmp_path):
    """2 host ranks; host rank 1 is killed after step 7, so step 8 (the last of epoch 1) fails.
    The survivor finishes it alone: epoch 1 ends with the weights of the study's simulated lossy
    forward (`--inject-simulate host:1@8:0%`: every gradient of host rank 1 lost) to the bit."""
    data = ["--data", str(bundled_data / "cifar10"), "--train-subset", "256", "--mode", "none"]
    launch = ["--host-ranks", "2", "--dpu-ranks", "1", "--oversubscribe"]
    real, sim = tmp_path / "real", tmp_path / "sim"
    res = dpurun(launch, [*RUN, *data, "--log-dir", str(real), "--recovery", "lossy-forward",
                          "--inject", "host:1@7"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "host rank 1 (world rank 1, node" in res.stdout and "died at global step 8 (epoch 1, step 8): lossy " \
        "forward, the 1 surviving host rank(s) finished the step with their own gradients" in res.stdout
    assert "16 samples lost (the rest of its epoch; --reassign hands them on); they take its batches over from " \
        "epoch 2" in res.stdout
    ref = dpurun(launch, [*RUN, *data, "--log-dir", str(sim), "--allreduce", "mpi",
                          "--inject-simulate", "host:1@8:0%"], timeout=300)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    got, want = epochs(read_jsonl(real / "metrics.jsonl")), epochs(read_jsonl(sim / "metrics.jsonl"))
    for key in ("step_losses", "weights_sha256", "val_loss_sum", "val_correct"):
        assert got[0][key] == want[0][key], key
    [rec] = [r for r in read_jsonl(real / "metrics.jsonl") if r["event"] == "recovery"]
    assert rec["lost_ids"] == order(256, 2, 1, 0)[7 * 16: 8 * 16] and rec["survivors"] == [0]
    samples = [r["samples"] for r in read_jsonl(real / "phases-rank0.jsonl")]
    assert samples == [128, 256]  # epoch 2: its own batches and every batch of the dead rank
    [death] = read_jsonl(real / "failures.jsonl")
    assert (death["world_rank"], death["survived"]) == (1, True)


@pytest.mark.mpi
def test_dead_host_rank_zero_in_da_with_reassign(bundled_data, tmp_path):
    """3 host ranks fed by 3 DPU ranks; host rank 0 (world rank 0) dies after step 3: the new host
    rank 0 reports, only step 4's batch of the dead rank is lost, the survivors train the rest."""
    log = tmp_path / "log"
    res = dpurun(["--host-ranks", "3", "--dpu-ranks", "3", "--oversubscribe"],
                 [*RUN, "--data", str(bundled_data / "cifar10"), "--train-subset", "288", "--mode", "da",
                  "--log-dir", str(log), "--recovery", "lossy-forward", "--reassign", "--inject", "host:0@3"],
                 timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "16 samples lost; they take its batches over from step 5 of epoch 1" in res.stdout
    assert res.stdout.count("epoch 2/2 |") == 1
    recs = [r for r in read_jsonl(log / "metrics.jsonl") if r["event"] == "recovery"]
    assert len(recs) == 1, f"one death, one recovery record: {recs}\n{res.stdout[-3000:]}"  # (seen 2 once, loaded box)
    rec = recs[0]
    assert rec["lost_ids"] == order(288, 3, 0, 0)[3 * 16: 4 * 16] and rec["survivors"] == [1, 2]
    per_epoch = [[r["samples"] for r in read_jsonl(log / f"phases-rank{w}.jsonl")] for w in (1, 2)]
    assert [sum(s) for s in zip(*per_epoch)] == [288 - 3 * 16 - 16, 288]  # (the dead rank trained 3 steps)


@pytest.mark.mpi
def test_validation_ranks_follow_the_shrunk_group(bundled_data, tmp_path):
    """--mode mv, each of 2 host ranks paired with its own DPU validation rank; host rank 0 dies in
    epoch 2, while epoch 1's results are still due (they went to both senders): the survivor
    logs them, epochs 2 and 3 come from it alone (the dead rank's validation rank gets a
    header-only notice), and every epoch's weights and validation sums equal --mode none's under
    the same failure, to the bit."""
    launch = ["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe"]
    train = ["--preset", "debug", "--no-progress", "--epochs", "3", "--data", str(bundled_data / "cifar10"),
             "--train-subset", "256", "--recovery", "lossy-forward", "--inject", "host:0@10"]
    logs = {m: tmp_path / m for m in ("mv", "none")}
    for mode, log in logs.items():
        res = dpurun(launch, [*train, "--mode", mode, "--log-dir", str(log)], timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "host rank 0 (world rank 0, node" in res.stdout and "died at global step 11 (epoch 2, step 3)" in \
            res.stdout
        assert [res.stdout.count(f"epoch {e}/3 |") for e in (1, 2, 3)] == [1, 1, 1]
    got, want = (epochs(read_jsonl(logs[m] / "metrics.jsonl")) for m in ("mv", "none"))
    for epoch in (0, 1, 2):
        for key in ("weights_sha256", "val_loss_sum", "val_correct", "val_count", "train_loss"):
            assert got[epoch][key] == want[epoch][key], (epoch, key)  # (step_losses: the logging rank's own)
        assert got[epoch]["val_count"] == 256 and got[epoch]["val_dpu_share"] == 1.0


@pytest.mark.mpi
def test_checkpoints_go_on_from_the_survivors(bundled_data, tmp_path):
    """--mode da, a checkpoint every 3 steps; host rank 0 is killed right after step 6's optimizer
    step, before handing step 6 over: that checkpoint is never committed (its keeper never heard
    of it: the committer settles it by name), steps 9 and 12 come from the survivor alone and load
    whole, the weights equal the same failure's run without checkpoints, and a relaunch with both
    host ranks resumes from the survivor's checkpoint (re-sliced)."""
    launch = ["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe"]
    train = [*RUN, "--data", str(bundled_data / "cifar10"), "--train-subset", "256", "--mode", "da",
             "--stop-at-step", "12"]
    ck, log, plain = tmp_path / "ck", tmp_path / "log", tmp_path / "plain"
    res = dpurun(launch, [*train, "--log-dir", str(log), "--recovery", "lossy-forward", "--inject", "host:0@6",
                          "--ckpt-dir", str(ck), "--ckpt-every", "3", "--ckpt-keep", "10"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "checkpoint at step 6 NOT saved (host rank 0 (world rank 0, node" in res.stderr
    assert "died before handing the state of step 6 over); the next ones come from the surviving host ranks" in \
        res.stderr
    done = ckptfiles.committed(ck)
    assert [d.name for d in done] == ["step-000000003", "step-000000009", "step-000000012"]
    assert [ckptfiles.load(d).meta["host_ranks"] for d in done] == [2, 1, 1]
    ref = dpurun(launch, [*train, "--log-dir", str(plain), "--recovery", "lossy-forward", "--inject", "host:0@6"],
                 timeout=300)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    end = [[r["weights_sha256"] for r in read_jsonl(d / "metrics.jsonl") if r["event"] == "end"] for d in (log, plain)]
    assert end[0] == end[1]
    again = dpurun(launch, [*RUN, "--data", str(bundled_data / "cifar10"), "--train-subset", "256", "--mode", "da",
                            "--log-dir", str(tmp_path / "again"), "--ckpt-dir", str(ck), "--resume", "latest"],
                   timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "step-000000012 (re-sliced from 1 host rank(s)" in again.stdout


@pytest.mark.mpi
def test_the_group_grows_back_from_a_spare_and_trains_on_as_a_full_group_would(bundled_data, tmp_path):
    """--mode da, 2 host ranks each fed by its own DPU rank, one spare (`dpurun --spare-ranks 1`); host
    rank 1 is killed after step 5 of epoch 1. The survivor finishes epoch 1 alone (lossy forward), then
    the spare takes host rank 1's seat with the survivor's state, its batches from host rank 1's DPU rank:
    epochs 2 and 3 train all 256 samples on 2 host ranks, no batch taken over. And the group grown back
    trains as a full group would: a run resumed from the checkpoint at the end of epoch 1 (the survivor's)
    on 2 host ranks gives epochs 2 and 3 the same step losses and weights, to the bit."""
    launch = ["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe"]
    train = ["--preset", "debug", "--no-progress", "--epochs", "3", "--data", str(bundled_data / "cifar10"),
             "--train-subset", "256", "--mode", "da"]
    ck, log, resumed = tmp_path / "ck", tmp_path / "log", tmp_path / "resumed"
    res = dpurun([*launch, "--spare-ranks", "1"],
                 [*train, "--log-dir", str(log), "--recovery", "lossy-forward", "--inject", "host:1@5",
                  "--ckpt-dir", str(ck), "--ckpt-every", "8", "--ckpt-keep", "5"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "died at global step 6 (epoch 1, step 6): lossy forward, the 1 surviving host rank(s)" in out, out
    assert ("the host group grows back: spare rank 0 (world rank 4, node" in out
            and "took host rank 1's seat before epoch 2 (global step 9), with host rank 0 (world rank 0, node" in out
            and "2 of 2 host ranks train; no batch is taken over from here on" in out), out
    assert ("spare rank 0 (world rank 4, node vm) takes host rank 1's seat: it starts at end of epoch 1 (global step "
            "8), its batches from DPU rank 1 (world rank 3" in out), out
    metrics = read_jsonl(log / "metrics.jsonl")
    got = epochs(metrics)
    assert [got[e]["replicas"] for e in (0, 1, 2)] == [1, 2, 2]
    assert [got[e]["samples"] for e in (0, 1, 2)] == [128, 256, 256]  # (epoch 1's totals: the survivor's own)
    [grew] = [r for r in metrics if r["event"] == "grown_back"]
    assert (grew["seats"], grew["replaced_by"], grew["epoch"], grew["host_ranks_now"]) == ([1], [[4, 1]], 1, 2)
    assert [r["samples"] for r in read_jsonl(log / "phases-rank0.jsonl")] == [128, 128, 128]  # nothing taken over
    assert [r["samples"] for r in read_jsonl(log / "phases-rank4.jsonl")] == [128, 128]  # the seat's own batches
    again = dpurun(launch, [*train, "--log-dir", str(resumed), "--ckpt-dir", str(ck), "--resume",
                            str(ck / "step-000000008")], timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    want = epochs(read_jsonl(resumed / "metrics.jsonl"))
    for e in (1, 2):
        for key in ("step_losses", "train_loss", "weights_sha256"):
            assert got[e][key] == want[e][key], (e, key)
