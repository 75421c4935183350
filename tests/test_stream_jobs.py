"""Streams of shards in real dpurun jobs: the batches a DPU rank builds from tar shards, a user's own
stream and Hugging Face data sets equal the host's own (`--mode none`) to the bit, over uneven shards,
2 host ranks and 2 DPU ranks; the built-in trainer's `--dataset webdataset:PATTERN` too."""

from __future__ import annotations

import json

import pytest

from dpuoffload.launch.make_data import _tar
from tests.mpijobs import dpurun, read_jsonl
from tests.test_shards import jpeg

SCRIPT = "tests/api_scripts/shard_streams.py"
SIZES = (30, 30, 30, 30, 30, 11, 23)   # uneven shards: host ranks get 94 and 90 samples before evening
TWO_BY_TWO = ["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe"]


def write_shards(folder) -> None:
    """Tar shards of small JPEGs, and the user's own JSON-lines shards, both uneven."""
    (folder / "json").mkdir(parents=True)
    for s, n in enumerate(SIZES):
        members = [(f"{s}{k:04d}", jpeg((7 * k + 31 * s) % 256), (k + s) % 5) for k in range(n)]
        (folder / f"train-{s:06d}.tar").write_bytes(_tar(members))
        with open(folder / "json" / f"part-{s}.jsonl", "w") as f:
            f.writelines(json.dumps({"value": 100 * s + k, "label": k % 3}) + "\n" for k in range(n))


@pytest.fixture(scope="module")
def walks(tmp_path_factory) -> dict[str, list]:
    data = tmp_path_factory.mktemp("shards")
    write_shards(data)
    out = {}
    runs = {"none": ["--mode", "none"], "da": ["--mode", "da"],
            "hybrid": ["--mode", "hybrid", "--dpu-workers", "2", "--da-host-share", "0.3"]}
    for name, flags in runs.items():
        prefix = tmp_path_factory.mktemp(name) / "seen"
        log = prefix.parent / "log"
        r = dpurun(TWO_BY_TWO, [*flags, "--log-dir", str(log), SCRIPT, "--data", str(data), "--out", str(prefix)],
                   timeout=400)
        assert r.returncode == 0, r.stdout + r.stderr
        out[name] = [json.loads((prefix.parent / f"seen-{rank}.json").read_text()) for rank in (0, 1)]
        out[f"{name}-out"] = r.stdout
        out[f"{name}-dpu"] = [read_jsonl(log / f"phases-rank{rank}.jsonl") for rank in (2, 3)]
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["wds", "wdspipe", "own", "hf", "hfstream"])
def test_stream_batches_built_on_dpu_ranks_equal_the_hosts_own(walks, kind):
    for rank in (0, 1):
        none = walks["none"][rank][kind]
        assert walks["da"][rank][kind] == none
        assert walks["hybrid"][rank][kind] == none
    a, b = walks["none"][0][kind], walks["none"][1][kind]
    assert a["e0"] != b["e0"] and a["e0"] != a["e1"]   # each host rank its own shards, each epoch its own order
    assert a["e0"] and len(a["e0"]) == len(b["e0"]) == int(a["steps"][0])  # uneven shards, equal epochs
    for walk in (a, b, walks["da"][0][kind], walks["da"][1][kind]):  # a resumed epoch goes on as the whole one
        assert walk["e2-from-2"] == walk["e2"][2:] and len(walk["e2"]) == len(walk["e0"])


@pytest.mark.mpi
def test_the_dpu_ranks_built_the_stream_batches_and_sent_uint8(walks):
    feeders = walks["da-dpu"]
    for recs in feeders:
        end = recs[-1]
        assert end["work"] == "da"
        assert sum(r["batches"] for r in recs if "batches" in r) > 0
    assert "uint8" in walks["da-out"]  # the numerics line: the tar shards' augmentation went as uint8


# ------------------------------------------------------------------ the built-in trainer on tar shards
TRAINER = ["--preset", "debug", "--no-progress", "--train-subset", "160", "--val-subset", "60", "--epochs", "3"]


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
            "mpi": job("mpi", "--mode", "da", "--allreduce", "mpi"),
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
    assert "dpurun: restart 1 of 1: relaunching with --resume latest" in restarted["err"]
    assert "restarting from DPU memory: the state of step" in restarted["out"]
    assert_same_training(restarted, trainer["da"])


@pytest.mark.mpi
def test_a_stream_rolled_back_to_a_spare_goes_on_to_the_bit(trainer):
    rollback = trainer["rollback"]
    assert "takes host rank 1's seat" in rollback["out"] and "no sample lost" in rollback["out"]
    [rec] = [r for r in rollback["metrics"] if r["event"] == "recovery"]
    assert rec["strategy"] == "rollback" and rec["samples_lost"] == 0
    assert_same_training(rollback, trainer["mpi"])


# ----------------------------------------------------------------------------- bad input, map-style too
BAD = ["--preset", "debug", "--no-progress", "--dataset", "tinyimagenet", "--train-subset", "96", "--val-subset",
       "32", "--epochs", "2", "--batch-size", "16"]


@pytest.fixture(scope="module")
def truncated(bundled_data, tmp_path_factory):
    """The bundled Tiny ImageNet with one training JPEG cut short (sample 9 in ImageFolder's order)."""
    import shutil

    root = tmp_path_factory.mktemp("truncated") / "tinyimagenet"
    shutil.copytree(bundled_data / "tinyimagenet", root, ignore=shutil.ignore_patterns("shards"))
    first_class = sorted((root / "train").iterdir())[0]
    victim = sorted(first_class.iterdir())[9]
    victim.write_bytes(victim.read_bytes()[:300])
    return root, victim


@pytest.mark.mpi
def test_a_truncated_jpeg_stops_the_job_naming_its_sample_and_file(truncated, tmp_path):
    root, victim = truncated
    r = dpurun(["--host-ranks", "1", "--dpu-ranks", "1", "--oversubscribe"],
               [*BAD, "--data", str(root), "--mode", "da", "--log-dir", str(tmp_path)], timeout=200)
    assert r.returncode != 0
    assert (f"failed first: SampleError: training sample 9 ({victim}) could not be loaded: OSError: ") in r.stderr, \
        r.stderr


@pytest.mark.mpi
def test_skip_corrupt_leaves_it_out_the_same_in_none_and_da(truncated, tmp_path):
    root, victim = truncated
    runs = {}
    for mode in ("none", "da"):
        r = dpurun(["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe"],
                   [*BAD, "--data", str(root), "--mode", mode, "--skip-corrupt", "1",
                    "--log-dir", str(tmp_path / mode)],
                   timeout=200)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"--skip-corrupt: left out of its batch in epoch 1: training sample 9 ({victim}) could not be " \
               "loaded: OSError: " in r.stdout
        runs[mode] = {m["epoch"]: m for m in read_jsonl(tmp_path / mode / "metrics.jsonl") if m["event"] == "epoch"}
    for e in (0, 1):
        assert runs["da"][e]["skipped_corrupt"] == runs["none"][e]["skipped_corrupt"] == 1
        for key in ("step_losses", "weights_sha256"):
            assert runs["da"][e][key] == runs["none"][e][key], (e, key)


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


@pytest.mark.mpi
def test_the_streams_example_from_shards_and_from_an_arrow_folder(bundled_data, tmp_path):
    """examples/streams_loop.py: its losses in da equal none's, from tar shards and from an Arrow folder."""
    shards = f"{bundled_data}/tinyimagenet/shards/train-{{000000..000001}}.tar"
    arrow = ["--arrow", str(tmp_path / "arrow"),
             "--arrow-from", f"{bundled_data}/tinyimagenet/shards/train-00000[01].tar"]
    for source in (["--shards", shards], arrow):
        lines = {}
        for mode in ("da", "none"):
            r = dpurun(["--oversubscribe"], ["--mode", mode, "examples/streams_loop.py", *source, "--epochs", "1"],
                       timeout=200)
            assert r.returncode == 0, r.stdout + r.stderr
            lines[mode] = [line for line in r.stdout.splitlines() if line.startswith("epoch 0: mean loss")]
        assert lines["da"] == lines["none"] and lines["da"][0].endswith("(16 steps)"), lines
