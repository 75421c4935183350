"""Checkpoints, resume and clones as real MPMD jobs (host, DPU and clone ranks on 2 cores).

- resume is bit-exact: a run stopped mid-epoch (da mode, 2 host ranks, zero-copy slices) and
  resumed gives the same step losses, validation and final weights as the straight run;
- the resumed run trains only the remaining steps (host rank 0's phase log: steps and first global step);
- another host rank count and another mode resume from the same files (re-slicing), and the first
  resumed step's loss equals the loss of the exported checkpoint on the same batch (a fresh model's
  does not); another model's checkpoint is refused; a missing shard file is named;
- a failed checkpoint write is reported, training goes on, the earlier checkpoint stays usable;
- export-checkpoint gives the run's weights, to the bit, as a plain state_dict;
- a clone starts from the original's state to the bit and, without overrides, trains identically.
"""

import shutil
from functools import lru_cache

import pytest
import torch

from dpuoffload.common.config import RunConfig
from dpuoffload.common.models.zoo import build_model
from dpuoffload.common.runtime.messages import STAGED_CHUNK_BYTES
from dpuoffload.common.state import ckptfiles
from dpuoffload.common.state.sharding import state_digest
from dpuoffload.common.train.training_state import build_optimizer
from dpuoffload.host.clone import state_sha256
from tests.mpijobs import DPURUN, dpurun, read_jsonl, run

pytestmark = pytest.mark.mpi
DEBUG = ["--preset", "debug", "--no-progress", "--train-subset", "256"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt")


@pytest.fixture(scope="module")
def job(bundled_data, root):
    @lru_cache(maxsize=None)
    def _job(name: str, launcher: tuple, *training: str) -> dict:
        log = root / name
        res = dpurun(["--oversubscribe", *launcher],
                     [*DEBUG, "--data", str(bundled_data / "cifar10"), "--log-dir", str(log), *training],
                     timeout=300)
        metrics = read_jsonl(log / "metrics.jsonl") if (log / "metrics.jsonl").exists() else []
        clone = read_jsonl(log / "clone" / "metrics.jsonl") if (log / "clone" / "metrics.jsonl").exists() else []
        return {"rc": res.returncode, "out": res.stdout, "err": res.stderr, "log": log,
                "epochs": {m["epoch"]: m for m in metrics if m["event"] == "epoch"},
                "end": next((m for m in metrics if m["event"] == "end"), None),
                "clone": clone}
    return _job


TWO = ("--host-ranks", "2", "--dpu-ranks", "2")
ONE = ("--host-ranks", "1", "--dpu-ranks", "1")


def ok(r: dict) -> dict:
    assert r["rc"] == 0, r["out"] + r["err"]
    return r


def straight_da(job):
    return ok(job("straight-da", TWO, "--mode", "da", "--epochs", "3"))


def stopped_da(job, ck: str):
    """Stopped at global step 12 = epoch 2, step 4 of 8; checkpoints every 4 steps, zero-copy slices."""
    return ok(job("stopped-da", TWO, "--mode", "da", "--epochs", "3", "--ckpt-dir", ck, "--ckpt-every", "4",
                  "--stop-at-step", "12", "--ckpt-copy", "zero"))


def test_resume_mid_epoch_in_da_mode_is_bit_exact(job, root):
    straight = straight_da(job)
    ck = str(root / "da-ck")
    stopped = stopped_da(job, ck)
    assert "checkpoint step 12 committed" in stopped["out"]
    assert sorted(stopped["epochs"]) == [0] and stopped["end"]["global_step"] == 12  # stopped in epoch 2
    resumed = ok(job("resumed-da", TWO, "--mode", "da", "--epochs", "3", "--ckpt-dir", ck, "--resume", "latest"))
    assert "(exactly): epoch 2, step 4 done (global step 12)" in resumed["out"]
    # only the remaining steps were trained: 4 of epoch 2 (global steps 13..16), then 8 of epoch 3
    assert trained_spans(resumed) == [(1, 4, 13), (2, 8, 17)] and resumed["end"]["global_step"] == 24
    for e in (1, 2):  # the interrupted epoch's record includes the steps before the checkpoint
        for key in ("step_losses", "train_loss", "val_loss_sum", "val_correct", "weights_sha256"):
            assert resumed["epochs"][e][key] == straight["epochs"][e][key], (e, key)
    assert resumed["end"]["weights_sha256"] == straight["end"]["weights_sha256"]
    assert [p.name for p in ckptfiles.committed(ck)] == ["step-000000008", "step-000000012"]  # --ckpt-keep 2


def test_resume_with_another_host_count_and_mode_reslices(job, root, bundled_data):
    stopped_da(job, str(root / "da-ck"))
    ck = ckptfiles.step_dir(root / "da-ck", 8)  # end of epoch 1, written by 2 host ranks
    r = ok(job("resumed-1h-mv", ONE, "--mode", "mv", "--epochs", "3", "--resume", str(ck)))
    assert "re-sliced from 2 host rank(s) x batch 16): end of epoch 1 (global step 8)" in r["out"]
    assert sorted(r["epochs"]) == [1, 2] and r["end"]["global_step"] == 8 + 2 * 16
    assert all(r["epochs"][e]["val_count"] == 256 for e in (1, 2))  # the DPU validated the resumed epochs
    assert trained_spans(r) == [(1, 16, 9), (2, 16, 25)]  # epoch 1 trained in full, none retrained
    # the first resumed step ran on the checkpoint's weights: its loss equals the loss of the exported
    # checkpoint on the same batch (1 host rank, epoch 2, batch 1), which a fresh model does not give
    plain = torch.load(_export(str(ck), root / "reslice8.pt"), weights_only=True)
    data = bundled_data / "cifar10"
    reference, fresh = first_batch_loss(plain["model"], 1, data), first_batch_loss(None, 1, data)
    assert r["epochs"][1]["step_losses"][0] == pytest.approx(reference, rel=1e-4)
    assert abs(r["epochs"][1]["step_losses"][0] - fresh) > 100 * abs(reference * 1e-4)


def test_checkpoint_of_another_model_is_refused(job, root):
    stopped_da(job, str(root / "da-ck"))
    r = job("other-model", ONE, "--model", "resnet56", "--epochs", "3",
            "--resume", str(ckptfiles.step_dir(root / "da-ck", 8)))
    assert r["rc"] != 0
    assert ("was written by a run with --model resnet20; this run has --model resnet56: resume with the same "
            "model and data set") in r["err"], r["err"]


def test_resume_from_a_checkpoint_missing_a_shard_names_it(job, root):
    stopped_da(job, str(root / "da-ck"))
    broken = root / "broken-ck" / "step-000000008"
    shutil.copytree(ckptfiles.step_dir(root / "da-ck", 8), broken)
    (broken / ckptfiles.shard_name(1)).unlink()
    r = job("missing-shard", ONE, "--epochs", "3", "--resume", str(broken))
    assert r["rc"] != 0
    assert f"{broken / ckptfiles.shard_name(1)} is missing" in r["err"], r["err"]
    # `--resume latest` passes over it (the newest) with a warning and resumes from an older intact one
    # (a copy of step 8 under an older name: the stopped run kept only steps 8 and 12)
    shutil.copytree(ckptfiles.step_dir(root / "da-ck", 8), root / "broken-ck" / "step-000000004")
    intact = root / "broken-ck" / "step-000000004"
    r = ok(job("latest-skips", ONE, "--epochs", "3", "--ckpt-dir", str(root / "broken-ck"), "--resume", "latest",
               "--stop-at-step", "9"))
    note = f"skipped damaged checkpoint {broken}: {ckptfiles.shard_name(1)} is missing"
    assert f"dpurun: warning: --resume latest: {note}; resuming from {intact}" in r["err"], r["err"]
    assert f"[dpuoffload] warning: --resume latest {note}" in r["out"]
    assert f"resuming from {intact}" in r["out"] and r["end"]["global_step"] == 9


def trained_spans(r: dict) -> list[tuple[int, int, int]]:
    """(epoch, steps trained by this run, its first global step) from host rank 0's phase log."""
    return [(p["epoch"], p["steps"], p["first_global_step"]) for p in read_jsonl(r["log"] / "phases-rank0.jsonl")]


def first_batch_loss(weights, epoch: int, data_dir) -> float:
    """Training-mode loss of the first batch that 1 host rank trains in `epoch`, with `weights`
    (None: the fresh model every run starts from), computed here with the training code's pieces."""
    from dpuoffload.common.config import parse_run_config
    from dpuoffload.common.data.datasets import build_datasets
    from dpuoffload.common.data.loaders import RankLoader
    from dpuoffload.common.data.sampling import PerSampleSeeded

    cfg = parse_run_config([*DEBUG, "--data", str(data_dir)])
    data = build_datasets(cfg)
    loader = RankLoader(cfg, PerSampleSeeded(data.train, cfg.seed), replicas=1, rank=0)
    loader.set_epoch(epoch)
    x, y = next(loader.batches(0, 1))
    model = build_model(cfg, data.num_classes)
    if weights is not None:
        model.load_state_dict(weights)
    model.train()
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


def test_failed_write_is_reported_and_training_continues(job, root):
    ck = root / "fail-ck"
    ck.mkdir()
    (ck / "step-000000008").write_text("in the way")  # mkdir of that checkpoint fails
    r = job("fail", ONE, "--epochs", "1", "--ckpt-dir", str(ck), "--ckpt-every", "4", "--ckpt-keep", "5")
    assert r["rc"] == 3, r["out"] + r["err"]  # the run finished, but a checkpoint was lost: not a success
    assert r["err"].splitlines()[-1] == (f"dpurun: checkpoints: 1 of 4 NOT saved (step 8); the newest intact one "
                                         f"is {ck / 'step-000000016'}")
    assert "checkpoint at step 8 NOT saved" in r["err"] and "FileExistsError" in r["err"]
    assert "training continues, the last complete checkpoint is" in r["err"] and "step-000000004" in r["err"]
    assert [p.name for p in ckptfiles.committed(ck)] == [f"step-{s:09d}" for s in (4, 12, 16)]
    # the last checkpoint (end of the run) exports to exactly the final weights
    out = root / "fail-export.pt"
    res = run([DPURUN, "export-checkpoint", str(ck), str(out)])
    assert res.returncode == 0, res.stderr
    assert "end of epoch 1 (global step 16)" in res.stdout
    plain = torch.load(out, weights_only=True)
    model = build_model(RunConfig(), 10)
    model.load_state_dict(plain["model"])
    assert state_digest(model) == r["end"]["weights_sha256"]


def test_clone_starts_from_the_same_state_and_trains_identically(job, root):
    ck = str(root / "clone-ck")
    # 128 samples: 4 steps per host rank and epoch, the clone at global step 3 of 8, inside the first epoch
    r = ok(job("clone", ("--host-ranks", "2", "--dpu-ranks", "1", "--clone-ranks", "2"), "--epochs", "2",
               "--train-subset", "128", "--clone-at", "3", "--ckpt-dir", ck, "--ckpt-every", "3"))
    start = r["clone"][0]
    assert start["event"] == "clone_start" and start["global_step"] == 3 and start["overrides"] == []
    # the state the clones rebuilt == the state the original group checkpointed at the same step
    plain = torch.load(_export(str(ckptfiles.step_dir(ck, 3)), root / "clone3.pt"), weights_only=True)
    model = build_model(RunConfig(), 10)
    opt = build_optimizer(RunConfig(), model)
    model.load_state_dict(plain["model"])
    opt.load_state_dict(plain["optimizer"])
    assert state_sha256(model, opt) == start["state_sha256"]
    clone_epochs = {m["epoch"]: m for m in r["clone"] if m["event"] == "epoch"}
    assert sorted(clone_epochs) == [0, 1]
    for e in (0, 1):
        assert clone_epochs[e]["step_losses"] == r["epochs"][e]["step_losses"]
    assert r["clone"][-1]["weights_sha256"] == r["end"]["weights_sha256"]
    assert "[clone] epoch 2/2" in r["out"]
    handed = [h for h in read_jsonl(r["log"] / "handoff-rank0.jsonl") if h["kind"] == "clone"]
    assert [h["global_step"] for h in handed] == [3]
    assert 0 < start["ready_time"] - handed[0]["wall_time"] < 60  # readiness: hand-off end -> clones ready


def wide_clone(job, name: str, ck: str, *extra: str) -> dict:
    """A model of 3 staged chunks (`tests.user_factories:wide_model`), checkpointed every 2 of 6 steps and
    cloned at step 2 (1 host, 1 DPU, 1 clone rank)."""
    return ok(job(name, ("--host-ranks", "1", "--dpu-ranks", "1", "--clone-ranks", "1"),
                  "--model", "tests.user_factories:wide_model", "--epochs", "1", "--train-subset", "96",
                  "--clone-at", "2", "--ckpt-dir", ck, "--ckpt-every", "2", "--ckpt-keep", "5", *extra))


def test_a_clone_state_of_many_chunks_goes_on_part_by_part_and_arrives_to_the_bit(job, root):
    """The staged hand-off in chunks (a 10 MB tensor wider than one): the host sends each chunk as it is
    packed, the keeper passes each on to the clone rank as it lands (cut-through), and the clone's state
    is the original's to the bit (the checkpoint of the same step, written from the same chunks)."""
    ck = str(root / "wide-ck")
    r = wide_clone(job, "clone-wide", ck)
    start = r["clone"][0]
    assert start["global_step"] == 2
    cfg = RunConfig(model="tests.user_factories:wide_model")
    plain = torch.load(_export(str(ckptfiles.step_dir(ck, 2)), root / "wide2.pt"), weights_only=True)
    model = build_model(cfg, 10)
    opt = build_optimizer(cfg, model)
    model.load_state_dict(plain["model"])
    opt.load_state_dict(plain["optimizer"])
    assert state_sha256(model, opt) == start["state_sha256"]
    handed = next(h for h in read_jsonl(r["log"] / "handoff-rank0.jsonl") if h["kind"] == "clone")
    n_bytes = handed["shared_bytes"]
    forwarded = next(k for k in read_jsonl(r["log"] / "keeper-rank1.jsonl") if "forwarded_step" in k)
    assert forwarded["relayed_parts"] == -(-n_bytes // STAGED_CHUNK_BYTES) >= 3
    clone_losses = next(m for m in r["clone"] if m["event"] == "epoch")["step_losses"]
    assert clone_losses == r["epochs"][0]["step_losses"]   # (no overrides: the clone trains on identically)


def test_an_overlapped_copy_hands_off_the_same_state_as_a_staged_one(job, root):
    """`--ckpt-copy overlap`: the slice is copied beside the next step's forward and backward and the
    optimizer step waits for the copy, so every checkpoint and the clone hold the state of their own
    step to the bit (the staged run's shard files, byte for byte), and training is unchanged."""
    staged = wide_clone(job, "clone-wide", str(root / "wide-ck"))
    ck = root / "wide-overlap-ck"
    r = wide_clone(job, "clone-wide-overlap", str(ck), "--ckpt-copy", "overlap")
    assert r["clone"][0]["state_sha256"] == staged["clone"][0]["state_sha256"]
    steps = [p.name for p in ckptfiles.committed(ck)]
    assert steps == [p.name for p in ckptfiles.committed(root / "wide-ck")] and len(steps) >= 3
    for step in steps:
        ours, theirs = (ckptfiles.read_manifest(d / step)["files"] for d in (ck, root / "wide-ck"))
        assert ours[ckptfiles.shard_name(0)] == theirs[ckptfiles.shard_name(0)], step
    assert r["epochs"][0]["step_losses"] == staged["epochs"][0]["step_losses"]
    assert r["end"]["weights_sha256"] == staged["end"]["weights_sha256"]
    handed = read_jsonl(r["log"] / "handoff-rank0.jsonl")
    assert {h["copy"] for h in handed} == {"overlap"} and all(h["next_step_wait_s"] >= 0 for h in handed)


def test_clone_overrides_change_only_the_clone(job):
    plain = ok(job("plain-1h", ONE, "--epochs", "2", "--train-subset", "128"))
    r = ok(job("clone-lr", ("--host-ranks", "1", "--dpu-ranks", "1", "--clone-ranks", "1"), "--epochs", "2",
               "--train-subset", "128", "--clone-at", "4", "--clone-override", "lr=0.005"))
    assert "(lr=0.005)" in r["out"]
    assert r["clone"][0]["overrides"] == ["lr=0.005"]
    assert [r["epochs"][e]["step_losses"] for e in (0, 1)] == [plain["epochs"][e]["step_losses"] for e in (0, 1)]
    clone_losses = [m for m in r["clone"] if m["event"] == "epoch"][0]["step_losses"]
    original = r["epochs"][0]["step_losses"]
    assert clone_losses[:4] == original[:4]           # carried over from before the clone step
    assert clone_losses[4] == original[4]             # step 5 runs on the cloned weights...
    assert clone_losses[5:] != original[5:]           # ...then the smaller LR changes the trajectory


def _export(ck: str, out) -> str:
    """`dpurun export-checkpoint CK OUT`'s own function (`launch.export.export`), called in this process:
    these tests read a checkpoint's weights through it, and a process of its own would cost seconds (an
    import of torch) for nothing they check. The command itself runs as a process, and its file is
    checked to the bit, in test_failed_write_is_reported_and_training_continues."""
    from dpuoffload.launch.export import export

    export(ck, str(out))
    return str(out)


@pytest.mark.parametrize("launcher, training, message", [
    (ONE, ["--clone-at", "3"], "--clone-at needs clone ranks: add --clone-ranks C"),
    (("--clone-ranks", "1"), [], "without --clone-at STEP"),
    (("--dpu-ranks", "0"), ["--ckpt-dir", "/tmp/x", "--ckpt-every", "2"], "--dpu-ranks is 0"),
    (ONE, ["--resume", "/nonexistent/ck"], "no such checkpoint directory"),
    (ONE, ["--ckpt-every", "2"], "need --ckpt-dir"),
    (ONE, ["--mode", "naive", "--ckpt-dir", "/tmp/x", "--ckpt-every-epoch"], "not naive"),
])
def test_bad_checkpoint_flags_fail_before_mpi(bundled_data, launcher, training, message):
    res = dpurun(list(launcher), [*DEBUG, "--data", str(bundled_data / "cifar10"), *training], timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr and "running:" not in res.stderr


def test_clone_at_after_the_last_step_fails_on_every_rank(bundled_data):
    res = dpurun([*ONE, "--clone-ranks", "1", "--oversubscribe"],
                 [*DEBUG, "--data", str(bundled_data / "cifar10"), "--epochs", "1", "--clone-at", "99"], timeout=120)
    assert res.returncode != 0
    assert "--clone-at 99 is after this run's last step (16); pick a step in 1..16" in res.stderr
