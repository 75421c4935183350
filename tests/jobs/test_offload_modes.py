"""The offload modes as real MPMD jobs: results provably the same as a plain (--mode none) run.

- da: every batch a host rank trains on is bit-identical to the one it builds itself in --mode none
  (sha256 of each epoch's batches), so losses and final weights are identical to the bit.
- mv: the validation metrics the DPU ranks compute equal the host's for the same weights.
- hybrid: both at once. Plus uneven data, tiny epochs, odd rank counts, faults and bad input.
Each distinct run starts once per module (oversubscribed on 2 cores) and is shared by the tests.
"""

import re
from functools import lru_cache

import pytest

from dpuoffload.common.data.streams import StepSplit
from tests.mpijobs import dpurun, kill_first_dpu_rank_once, read_jsonl

pytestmark = pytest.mark.mpi
EPOCHS = "2"
# 256 of the debug preset's 512 training samples: every property below holds per batch and per epoch,
# so half the steps prove the same (tests that need other shapes pass their own --train-subset).
TRAIN = 256
STEPS = TRAIN // 2 // 16  # per host rank and epoch with 2 host ranks, batch 16
# 50 samples over 3 host ranks (17 each, padded), batch 16: 2 batches per host rank and epoch, the last of
# 1 sample, fewer than --da-buffers; one DPU rank feeds all three (the uneven and the fan-out test share it).
# Their tests check training only, so 32 validation samples keep the validation pass short.
# They also run the compute options of GPU host ranks, on the CPU (bf16 autocast and channels-last work there too).
TINY = ("--train-subset", "50", "--da-buffers", "4", "--val-subset", "32", "--device", "cpu", "--amp", "bf16",
        "--channels-last")


@pytest.fixture(scope="module")
def run(bundled_data, tmp_path_factory):
    @lru_cache(maxsize=None)
    def _run(mode: str, hosts: int, dpus: int, *extra: str) -> dict:
        log = tmp_path_factory.mktemp(f"{mode}-{hosts}h{dpus}d")
        res = dpurun(["--host-ranks", str(hosts), "--dpu-ranks", str(dpus), "--oversubscribe"],
                     ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs", EPOCHS,
                      "--mode", mode, "--digest-batches", "--log-dir", str(log), "--no-progress",
                      "--train-subset", str(TRAIN), *extra])
        assert res.returncode == 0, res.stdout + res.stderr
        metrics = read_jsonl(log / "metrics.jsonl")
        phases = {int(p.stem.split("rank")[1]): read_jsonl(p) for p in log.glob("phases-rank*.jsonl")}
        return {"epochs": [m for m in metrics if m["event"] == "epoch"],
                "end": next(m for m in metrics if m["event"] == "end"), "phases": phases, "stdout": res.stdout,
                "log": log}
    return _run


def batch_digests(r: dict, hosts: int) -> list[list[str]]:
    return [[e["batch_digest"] for e in r["phases"][h]] for h in range(hosts)]


def assert_same_training(a: dict, b: dict, hosts: int) -> None:
    assert batch_digests(a, hosts) == batch_digests(b, hosts)
    assert [e["step_losses"] for e in a["epochs"]] == [e["step_losses"] for e in b["epochs"]]
    assert a["end"]["weights_sha256"] == b["end"]["weights_sha256"]


def test_a_model_with_dropout_trains_to_the_bit_alike_in_none_da_and_mv(run):
    """Dropout draws from the global RNG: each training rank seeds it from --seed, and the DataLoaders
    a host rank starts in one mode and not in another (its own batches in none, its validation in none
    and da) draw from generators of their own, not from it."""
    dropout = ("--model", "tests.user_factories:dropout_model", "--train-subset", "128", "--val-subset", "64")
    none, da, mv = (run(mode, 2, 2, *dropout) for mode in ("none", "da", "mv"))
    for other in (da, mv):
        assert [e["step_losses"] for e in other["epochs"]] == [e["step_losses"] for e in none["epochs"]]
        assert other["end"]["weights_sha256"] == none["end"]["weights_sha256"]


def val_sums(r: dict) -> list[tuple]:
    return [(e["val_loss_sum"], e["val_correct"], e["val_count"]) for e in r["epochs"]]


# ------------------------------------------------------------------------------------------- da
def none_ref(run, hosts: int, *extra: str) -> dict:
    """The --mode none reference for `hosts` host ranks. Its DPU rank only idles (none trains on the
    host ranks alone), so one DPU rank serves every comparison, whatever the compared run's count."""
    return run("none", hosts, 1, *extra)


# Each host rank builds every 4th step itself (steps 3 and 7 of 8), in its own process; its DPU rank
# the others (the in-process paths of --da-host-share: tests/jobs/test_api_jobs.py's walk has the workers).
SHARED = ("--da-host-share", "0.25", "--da-host-workers", "0")


def test_da_batches_losses_and_weights_equal_none(run):
    none, da = none_ref(run, 2), run("da", 2, 2, *SHARED)
    assert_same_training(da, none, hosts=2)
    assert all(d is not None for d in batch_digests(da, 2)[0])
    assert len(da["epochs"]) == int(EPOCHS)
    for rank in (2, 3):  # each DPU rank sent its host's 6 of the 8 steps of every epoch
        dpu = [r for r in da["phases"][rank] if r.get("work") == "da" and "epoch" in r]
        assert [r["batches"] for r in dpu] == [STEPS - STEPS // 4] * int(EPOCHS)
        end = next(r for r in da["phases"][rank] if r.get("event") == "end")
        assert list(end["wires"].values()) == ["uint8"]  # --wire auto: the host ran ToTensor + Normalize
    for host in (0, 1):  # the numerics check (--numerics warn, the default) before each loader's first batch
        (check,) = read_jsonl(da["log"] / f"numerics-rank{host}.jsonl")
        assert check["identical"] and check["compared"] == 16
        assert check["wire"] == "uint8 (then ToTensor, Normalize here)"
    assert "identical on all 16 compared" in da["stdout"]  # (host rank 0's line)


def test_da_fan_out_several_hosts_per_dpu(run):
    """One DPU rank feeds 3 host ranks (the uneven runs below, shared): training as in none, and the
    DPU rank sends every host's batches (3 hosts x 2 batches per epoch)."""
    none, da = none_ref(run, 3, *TINY), run("da", 3, 1, *TINY)
    assert_same_training(da, none, hosts=3)
    dpu = [r for r in da["phases"][3] if r.get("work") == "da" and "epoch" in r]
    assert [r["batches"] for r in dpu] == [3 * 2] * int(EPOCHS)  # all three hosts' batches


def test_da_equals_none_under_bf16_autocast_and_channels_last(run):
    none, da = none_ref(run, 3, *TINY), run("da", 3, 1, *TINY)  # (the fan-out runs: no job of its own)
    assert_same_training(da, none, hosts=3)
    assert "allreduce horovod, on cpu, bf16 autocast, channels-last" in da["stdout"]


def test_da_host_stall_is_logged_per_epoch(run):
    da = run("da", 2, 2, *SHARED)
    for h in (0, 1):
        assert all("data" in e["phases"] and e["steps"] == STEPS for e in da["phases"][h])


# ------------------------------------------------------------------------------------------- mv
def test_mv_dpu_ranks_rebuild_the_hosts_weights_and_auto_picks_a_share(run):
    """--mode mv, --mv-dpu-fraction auto: training as in none; both DPU validation ranks rebuild exactly
    the host's weights every epoch; the share is picked from measured costs and reported every epoch;
    the metrics equal the host's (to float32 rounding: the share changes the batch boundaries)."""
    none, mv = none_ref(run, 2), run("mv", 2, 2, "--mv-dpu-fraction", "auto")
    assert_same_training(mv, none, hosts=2)
    for rank in (2, 3):  # the DPU validation ranks rebuilt exactly the host's weights, every epoch
        dpu = [r for r in mv["phases"][rank] if r.get("work") == "mv" and "epoch" in r]
        assert [r["weights_sha256"] for r in dpu] == [e["weights_sha256"] for e in none["epochs"]]
    shares = [e["val_dpu_share"] for e in mv["epochs"]]
    assert len(shares) == int(EPOCHS) and all(0.0 <= s <= 1.0 for s in shares)
    assert "[dpuoffload] mv auto: evaluation costs" in mv["stdout"]
    assert all(e["val_count"] == 256 for e in mv["epochs"])
    assert_same_metrics(val_sums(mv), val_sums(none))


def assert_same_metrics(a: list[tuple], b: list[tuple]) -> None:
    """Same correct and count; the loss sum equal up to float32 rounding of per-batch sums (other
    batch boundaries than the reference run's change the summation order)."""
    for (l1, c1, n1), (l2, c2, n2) in zip(a, b, strict=True):
        assert (c1, n1) == (c2, n2)
        assert l1 == pytest.approx(l2, rel=1e-6)


def fan_out_runs(run) -> tuple[dict, dict]:
    """The published layout scaled down: 4 host ranks, 2 augmentation ranks feeding 2 host ranks
    each (--da-fanout 2), 1 validation rank taking half of the validation set (--mv-dpu-fraction 0.5),
    the host ranks building the share of the steps `--da-host-share auto` picks (in one worker
    process each), and its --mode none reference. One pair of jobs proves the hybrid fan-out, the
    split fraction and the automatic host share."""
    none = none_ref(run, 4, "--train-subset", "128")
    hy = run("hybrid", 4, 3, "--train-subset", "128", "--da-fanout", "2", "--mv-dpu-fraction", "0.5",
             "--da-host-share", "auto")
    return none, hy


def auto_host_share(r: dict) -> float:
    """The share `--da-host-share auto` printed (host rank 0, at start-up)."""
    found = re.search(r"\[dpuoffload\] --da-host-share auto: ([0-9.]+) of every epoch's steps", r["stdout"])
    assert found, r["stdout"]
    return float(found.group(1))


def test_mv_split_fraction_gives_same_metrics(run):
    none, mv = fan_out_runs(run)  # hosts validate half, the DPU validation rank (rank 6) the other half
    assert_same_metrics(val_sums(mv), val_sums(none))
    dpu_samples = sum(r["val_samples"] for r in mv["phases"][6] if r.get("work") == "mv" and "epoch" in r)
    assert dpu_samples == 128 * int(EPOCHS)  # half of 256 validation samples per epoch


# --------------------------------------------------------------------------------------- hybrid
def test_hybrid_both_properties_at_once(run):
    """One augmentation and one validation DPU rank: training as in none, and the validation rank
    (share 1.0, the host shards' batches) rebuilds the host's weights and gives bit-identical sums."""
    none, hy = none_ref(run, 2), run("hybrid", 2, 2)
    assert_same_training(hy, none, hosts=2)
    assert val_sums(hy) == val_sums(none)  # same shards, same batches: bit-identical sums
    assert [e["val_dpu_share"] for e in hy["epochs"]] == [1.0] * int(EPOCHS)
    work = {rank: next(r["work"] for r in hy["phases"][rank] if "work" in r) for rank in (2, 3)}
    assert work == {2: "da", 3: "mv"}
    dpu = [r for r in hy["phases"][3] if r.get("work") == "mv" and "epoch" in r]
    assert [r["weights_sha256"] for r in dpu] == [e["weights_sha256"] for e in none["epochs"]]


def test_hybrid_fan_out_layout(run):
    """4 host ranks, 2 augmentation ranks feeding 2 host ranks each, 1 validation rank (fan_out_runs)."""
    none, hy = fan_out_runs(run)
    assert_same_training(hy, none, hosts=4)
    assert_same_metrics(val_sums(hy), val_sums(none))  # 1 validation rank vs 4 host shards: other batches
    work = {rank: next(r["work"] for r in hy["phases"][rank] if "work" in r) for rank in (4, 5, 6)}
    assert work == {4: "da", 5: "da", 6: "mv"}
    fed = [sum(r["batches"] for r in hy["phases"][rank] if r.get("work") == "da" and "epoch" in r) for rank in (4, 5)]
    dpu_steps = StepSplit(auto_host_share(hy), 2).owned(host=False)  # of 2 steps (128 / 4 / 16) per epoch
    assert fed == [2 * dpu_steps * int(EPOCHS)] * 2  # 2 hosts each, every epoch


def test_auto_host_share_is_measured_and_balanced(run):
    """`--da-host-share auto` (the fan-out runs): a share in [0, 1] from the measured speeds of both
    sides, printed once; the training stays the same as none's (test_hybrid_fan_out_layout)."""
    _, hy = fan_out_runs(run)
    assert 0.0 <= auto_host_share(hy) <= 1.0
    assert hy["stdout"].count("--da-host-share auto:") == 1
    assert "ms/sample in 1 worker process(es); DPU" in hy["stdout"] and "feeding 2 host rank(s)" in hy["stdout"]


# ------------------------------------------------------------------------------ no deadlock
def test_uneven_tiny_epochs_more_hosts_than_dpus(run):
    """50 samples over 3 host ranks (17 each, padded), batch 16: 2 batches, the last of 1 sample,
    fewer batches per epoch than --da-buffers; one DPU rank feeds all three host ranks."""
    none, da = none_ref(run, 3, *TINY), run("da", 3, 1, *TINY)
    assert_same_training(da, none, hosts=3)
    assert all(e["steps"] == 2 for e in da["phases"][0])


def test_drop_last_and_more_dpu_ranks_than_needed(run):
    opts = ("--train-subset", "50", "--drop-last", "--val-subset", "32")  # checks training only
    none, da = none_ref(run, 1, *opts), run("da", 1, 3, *opts, "--wire", "float")  # (the float wire, to the bit too)
    assert_same_training(da, none, hosts=1)
    assert all(e["steps"] == 3 for e in da["phases"][0])  # 50 // 16
    idle = [r for rank in (2, 3) for r in da["phases"][rank] if r.get("event") == "end"]
    assert [r["work"] for r in idle] == ["idle", "idle"]
    assert next(r for r in da["phases"][1] if r.get("event") == "end")["wires"] == {"0": "float32"}


# ------------------------------------------------------------------------------ faults, input
def test_transform_with_varying_shapes_is_named(run):
    training = ["--mode", "da", "--dataset", "tests.user_factories:varying_shapes", "--epochs", "1",
                "--batch-size", "8", "--no-progress"]
    # before launch: the dry import collates one batch and names the problem
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "1"], training, timeout=120)
    assert res.returncode == 2
    assert "every image of a batch must have the same shape" in res.stderr
    # on the ranks (checks skipped): the DPU rank names the transform
    res = dpurun(["--skip-checks", "--host-ranks", "1", "--dpu-ranks", "1"], training, timeout=120)
    assert res.returncode != 0
    assert "--mode da needs every training sample to have the same shape" in res.stderr
    assert "RandomSizeCrop(8..16)" in res.stderr


def test_killed_dpu_rank_mid_epoch_in_da_mode_ends_job_within_30s(tmp_path, bundled_data):
    # TRAIN of the 1,497 training samples, not all of them: epoch 1 only has to end before the kill, and its
    # 8 steps of 32 an epoch (more than --da-buffers' 4) still leave the DPU rank feeding epoch 2 when it comes.
    code, err, ended_after = kill_first_dpu_rank_once(
        ["--mode", "da", "--data", str(bundled_data / "cifar10"), "--epochs", "50", "--no-progress",
         "--train-subset", str(TRAIN), "--log-dir", str(tmp_path)],
        ready=tmp_path / "phases-rank0.jsonl")  # epoch 1 done: the DPU rank is feeding epoch 2
    assert code != 0
    assert "DPU rank 0 (DPU program)" in err and "killed by signal 9" in err, err
    assert ended_after < 30
