"""Streams of shards in real dpurun jobs: the batches a DPU rank builds from tar shards, a user's own
webdataset pipeline, a user's own stream and Hugging Face data sets equal the host's own (`--mode none`)
to the bit, over uneven shards, 2 host ranks and 2 DPU ranks; the streams example; samples that fail to
load, named or left out (`--skip-corrupt`). The built-in trainer on shards: tests/jobs/test_stream_trainer.py."""

from __future__ import annotations

import json

import pytest

from dpuoffload.launch.make_data import _tar
from tests.mpijobs import dpurun, read_jsonl
from tests.unit.test_shards import jpeg

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
        r = dpurun(["--host-ranks", "1", "--dpu-ranks", "1", "--oversubscribe"],
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
def test_the_streams_example_from_shards_and_from_an_arrow_folder(bundled_data, tmp_path):
    """examples/streams_loop.py: its losses in da equal none's, from tar shards and from an Arrow folder."""
    shards = f"{bundled_data}/tinyimagenet/shards/train-{{000000..000001}}.tar"
    arrow = ["--arrow", str(tmp_path / "arrow"),
             "--arrow-from", f"{bundled_data}/tinyimagenet/shards/train-00000[01].tar"]
    for source, modes in ((["--shards", shards], ("da", "none")), (arrow, ("da",))):  # (Arrow = none: the walks)
        lines = {}
        for mode in modes:
            r = dpurun(["--oversubscribe"], ["--mode", mode, "examples/streams_loop.py", *source, "--epochs", "1"],
                       timeout=200)
            assert r.returncode == 0, r.stdout + r.stderr
            lines[mode] = [line for line in r.stdout.splitlines() if line.startswith("epoch 0: mean loss")]
        assert lines["da"] == lines.get("none", lines["da"]) and lines["da"][0].endswith("(16 steps)"), lines
