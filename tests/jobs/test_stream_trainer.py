"""The built-in trainer on WebDataset tar shards (`--dataset webdataset:PATTERN`), real dpurun jobs: `da`
equals `none` to the bit over uneven shards with 2 host and 2 DPU ranks, and a stream goes on to the bit
after a mid-epoch resume, a restart from DPU memory and a rollback to a spare; a resume on another host
rank count and a truncated shard are refused in one line."""

from __future__ import annotations

import pytest

from dpuoffload.launch.make_data import _tar
from tests.jobs.test_stream_jobs import SIZES, TWO_BY_TWO
from tests.mpijobs import dpurun, read_jsonl
from tests.unit.test_shards import jpeg

TRAINER = ["--preset", "debug", "--no-progress", "--train-subset", "160", "--val-subset", "60", "--epochs", "3",
           "--allreduce", "mpi"]  # (the allreduce rollback uses, so every run here is its reference)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """`--dataset webdataset:PATTERN` on 2 host ranks: none, da, and da stopped at global step 7 (epoch 1,
    step 2 of 5) with a checkpoint there, then resumed."""
    data = tmp_path_factory.mktemp("trainer-shards")
    for split, sizes in (("train", SIZES), ("val", (40, 30))):
        for s, n in enumerate(sizes):
            members = [(f"{s}{k:04d}", jpeg((7 * k + 31 * s) % 256, side=16), (k + s) % 5) for k in range(n)]
            (data / f"{split}-{s:06d}.tar").write_bytes(_tar(members))
    dataset = ["--dataset", f"webdataset:{data}/train-{{000000..{len(SIZES) - 1:06d}}}.tar"]
    root = tmp_path_factory.mktemp("trainer")

    def job(name: str, *flags: str, launch: tuple = ()) -> dict:
        r = dpurun([*TWO_BY_TWO, *launch], [*TRAINER, *dataset, "--log-dir", str(root / name), *flags], timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        metrics = read_jsonl(root / name / "metrics.jsonl")
        return {"out": r.stdout, "err": r.stderr, "epochs": {m["epoch"]: m for m in metrics if m["event"] == "epoch"},
                "end": next(m for m in metrics if m["event"] == "end"), "metrics": metrics}

    ck = str(root / "ck")
    return {"none": job("none", "--mode", "none"), "da": job("da", "--mode", "da"),
            "stopped": job("stopped", "--mode", "da", "--ckpt-dir", ck, "--ckpt-every", "7", "--stop-at-step", "7"),
            "resumed": job("resumed", "--mode", "da", "--ckpt-dir", ck, "--resume", "latest"), "ck": ck,
            "restarted": job("restarted", "--mode", "da", "--ckpt-dir", str(root / "ck2"), "--ckpt-every", "2",
                             "--inject", "host:0@7", launch=("--restarts", "1")),
            "rollback": job("rollback", "--mode", "da", "--recovery", "rollback", "--inject", "host:1@7",
                            launch=("--spare-ranks", "1")),
            "dataset": dataset}


@pytest.mark.mpi
def test_the_trainer_on_tar_shards_in_da_equals_none_to_the_bit(trainer):
    none, da = trainer["none"], trainer["da"]
    assert "dataset webdataset:" in da["out"] and "sent as uint8" in da["out"]
    for e in (0, 1, 2):
        for key in ("step_losses", "train_loss", "weights_sha256", "stream"):
            assert da["epochs"][e][key] == none["epochs"][e][key], (e, key)
        assert len(da["epochs"][e]["step_losses"]) == 5  # ceil(160 / 2 / 16)
    assert da["end"]["weights_sha256"] == none["end"]["weights_sha256"]
    stream = da["epochs"][0]["stream"]   # 160 of the shards' 184: 6 shards, the last cut to 10
    assert stream["shards"] == 6 and stream["samples"] == 160
    assert stream["padded"] == stream["dropped"] and any(da["epochs"][e]["stream"]["padded"] for e in (0, 1, 2))
    assert "repeated" in da["out"] and "left for later (uneven shards)" in da["out"]


@pytest.mark.mpi
def test_a_stream_resumed_mid_epoch_goes_on_to_the_bit(trainer):
    straight, resumed = trainer["da"], trainer["resumed"]
    assert "(exactly): epoch 2, step 2 done (global step 7)" in resumed["out"], resumed["out"]
    for e in (1, 2):
        for key in ("step_losses", "train_loss", "weights_sha256"):
            assert resumed["epochs"][e][key] == straight["epochs"][e][key], (e, key)
    assert resumed["end"]["weights_sha256"] == straight["end"]["weights_sha256"]


@pytest.mark.mpi
def test_a_stream_resumed_on_another_host_count_is_refused_in_one_line(trainer):
    r = dpurun(["--host-ranks", "1", "--dpu-ranks", "1", "--oversubscribe"],
               [*TRAINER, *trainer["dataset"], "--mode", "da",
                "--resume", str(trainer["ck"] + "/step-000000007")], timeout=120)
    assert r.returncode != 0
    assert ("training from a stream of shards, whose sample order depends on the host rank count (each host rank "
            "reads whole shards); resume with --host-ranks 2 --batch-size 16") in r.stdout + r.stderr


def assert_same_training(got: dict, want: dict) -> None:
    for e in (0, 1, 2):
        for key in ("step_losses", "train_loss", "weights_sha256"):
            assert got["epochs"][e][key] == want["epochs"][e][key], (e, key)
    assert got["end"]["weights_sha256"] == want["end"]["weights_sha256"]


@pytest.mark.mpi
def test_a_stream_restarted_from_dpu_memory_goes_on_to_the_bit(trainer):
    restarted = trainer["restarted"]
    assert "dpurun: restart 1 of 1: relaunching with --resume auto" in restarted["err"]
    assert "restarting from DPU memory: the state of step" in restarted["out"]
    assert_same_training(restarted, trainer["da"])


@pytest.mark.mpi
def test_a_stream_rolled_back_to_a_spare_goes_on_to_the_bit(trainer):
    rollback = trainer["rollback"]
    assert "takes host rank 1's seat" in rollback["out"] and "no sample lost" in rollback["out"]
    [rec] = [r for r in rollback["metrics"] if r["event"] == "recovery"]
    assert rec["strategy"] == "rollback" and rec["samples_lost"] == 0
    assert_same_training(rollback, trainer["da"])


@pytest.mark.mpi
def test_a_truncated_training_shard_is_named_at_start_up(tmp_path):
    data = tmp_path / "shards"
    data.mkdir()
    for split, sizes in (("train", (20, 20, 20)), ("val", (10,))):
        for s, n in enumerate(sizes):
            members = [(f"{s}{k:04d}", jpeg(k, side=16), k % 3) for k in range(n)]
            (data / f"{split}-{s:06d}.tar").write_bytes(_tar(members))
    broken = data / "train-000001.tar"
    broken.write_bytes(broken.read_bytes()[:5000])
    r = dpurun(["--host-ranks", "1", "--dpu-ranks", "1", "--oversubscribe"],
               [*TRAINER[:3], "--epochs", "1", "--mode", "da",
                "--dataset", f"webdataset:{data}/train-{{000000..000002}}.tar"],
               timeout=120)
    assert r.returncode != 0
    assert f"shard {broken} cannot be read: ReadError: unexpected end of data in " in r.stdout + r.stderr
