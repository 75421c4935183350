"""The public API under dpurun (real MPMD jobs): loader streams, failures, the launcher's script mode."""

from __future__ import annotations

import json

import pytest
import torch

from dpuoffload.common.state import ckptfiles
from tests.mpijobs import dpurun, read_jsonl

SCRIPT = "tests/api_scripts/streams.py"
# hybrid: one DPU rank feeds both host ranks, the other waits for a job.validate that never comes
FAN_OUT = ["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe"]


@pytest.fixture(scope="module")
def walks(tmp_path_factory) -> dict[str, list]:
    """The same awkward walk over two loaders, fed by a DPU rank (hybrid) and built on the hosts
    (none). In hybrid each of the DPU rank's 4 streams is built by 2 worker processes
    (`--dpu-workers 2`, which run ahead across epoch edges), and each host rank builds 30 % of
    its steps itself in a worker of its own (`--da-host-share 0.3`); the in-process paths of both
    are the defaults everywhere else (and tests/jobs/test_offload_modes.py's da run shares in-process)."""
    out = {}
    feeding = ["--dpu-workers", "2", "--da-host-share", "0.3", "--da-host-workers", "1"]
    for mode, workers in (("hybrid", feeding), ("none", [])):
        prefix = tmp_path_factory.mktemp(mode) / "seen"
        log = prefix.parent / "log"
        r = dpurun(FAN_OUT, ["--mode", mode, *workers, "--log-dir", str(log), SCRIPT, "--out", str(prefix)])
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"[dpuoffload] mode {mode}: 2 host rank(s), 2 DPU rank(s), script {SCRIPT}" in r.stdout
        out[mode] = [json.loads((prefix.parent / f"seen-{rank}.json").read_text()) for rank in (0, 1)]
        out[f"{mode}-dpu"] = [read_jsonl(log / f"phases-rank{rank}.jsonl") for rank in (2, 3)]
    return out


@pytest.mark.mpi
def test_da_batches_equal_the_hosts_own_through_jumps_breaks_and_partial_epochs(walks):
    for rank in (0, 1):
        da, none = walks["hybrid"][rank], walks["none"][rank]
        assert da == none
        assert [len(da[k]) for k in ("a0", "a1", "a2-rest", "a5-part", "b0", "a6")] == [7, 7, 4, 3, 2, 7]
    assert walks["hybrid"][0]["a0"] != walks["hybrid"][1]["a0"]    # each host rank its own shard
    assert walks["hybrid"][0]["a0"] != walks["hybrid"][0]["a1"]    # each epoch its own order and augmentation
    assert walks["hybrid"][0]["a0"] == walks["hybrid"][0]["a0-again"]  # a jump back re-plans, same batches


@pytest.mark.mpi
def test_in_hybrid_the_dpu_rank_built_the_batches_and_in_none_it_idled(walks):
    """The equality above means something only if the DPU rank built (most of) the hybrid batches: its
    per-epoch records count the batches it sent to both host ranks; in none both DPU ranks idled."""
    feeder, validator = walks["hybrid-dpu"]
    assert feeder[-1]["event"] == "end" and feeder[-1]["work"] == "da" and feeder[-1]["feeds"].keys() == {"0", "1"}
    sent = sum(r["batches"] for r in feeder if "batches" in r)
    used = sum(len(v) for rank in (0, 1) for k, v in walks["hybrid"][rank].items() if k != "sizes")
    print(f"DPU-built batches {sent}, batches the hosts used {used}")
    assert sent >= 0.5 * used, feeder  # (--da-host-share 0.3: the hosts build 30 % of the steps)
    assert validator[-1]["work"] == "mv"
    assert [recs[-1]["work"] for recs in walks["none-dpu"]] == ["idle", "idle"]
    assert not any("batches" in r for recs in walks["none-dpu"] for r in recs)


@pytest.mark.mpi
def test_plain_iteration_walks_epochs_in_order(walks):
    seen = walks["hybrid"][0]
    assert seen["b-iter0"] == seen["b0"] and seen["b-iter1"] != seen["b0"]
    assert seen["sizes"] == ["7", "2", "2", "0"]  # ceil(ceil(50/2)/4); drop_last: floor(11/5); 2 host ranks


@pytest.mark.mpi
@pytest.mark.parametrize("where, workers, message", [
    ("host", "0", "host rank 0 (host program) failed first: RuntimeError: the user's loop failed (at "
                  "tests/api_scripts/streams.py:"),
    ("dpu", "0", "DPU rank 0 (DPU program) failed first: SampleError: training sample 3 could not be loaded: "
                 "ValueError: sample 3 is corrupt (at tests/api_scripts/streams.py:"),
    ("dpu", "1", "DPU rank 0 (DPU program) failed first: SampleError: training sample 3 could not be loaded: "
                 "ValueError: sample 3 is corrupt (at tests/api_scripts/streams.py:"),  # in a worker
])
def test_a_failure_in_the_script_or_the_data_set_ends_the_job_in_one_line(tmp_path, where, workers, message):
    r = dpurun(["--host-ranks", "1", "--dpu-ranks", "1"], ["--mode", "da", "--dpu-workers", workers, SCRIPT,
                                                           "--out", str(tmp_path / "x"), "--fail", where], timeout=120)
    assert r.returncode == 1
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_built_in_trainer_flags_are_refused_with_a_script_before_launch():
    r = dpurun([], ["--mode", "da", "--lr", "0.1", SCRIPT, "--out", "x"], timeout=60)
    assert r.returncode == 2
    assert "--lr configures dpurun's built-in trainer; tests/api_scripts/streams.py runs its own loop" in r.stderr
    assert "running:" not in r.stderr  # no rank started


@pytest.mark.mpi
def test_a_plain_hvd_init_means_the_host_ranks():
    """Over COMM_WORLD Horovod would wait forever for the DPU ranks; the job makes the host ranks the default."""
    pytest.importorskip("horovod.torch")
    r = dpurun(["--host-ranks", "2", "--dpu-ranks", "1", "--oversubscribe"],
               ["--mode", "none", "tests/api_scripts/plain_hvd.py"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "host rank 0: hvd rank 0 of 2" in r.stdout and "host rank 1: hvd rank 1 of 2" in r.stdout


@pytest.mark.mpi
def test_a_lost_checkpoint_fails_a_script_that_ends_without_finish(tmp_path):
    """The keeper cannot write step 2 (a file in the way): the other checkpoints commit, and the job
    finished from the exit hook still exits 3 naming the newest intact one, which resumes."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step-000000002").write_text("in the way")
    r = dpurun([], ["--mode", "none", "--ckpt-dir", str(ckpt), "--ckpt-keep", "5", "tests/api_scripts/ckpt_at_exit.py"])
    assert r.returncode == 3, r.stdout + r.stderr
    assert "restored null" in r.stdout and "checkpoint step 4 committed" in r.stdout
    assert r.stderr.splitlines()[-1] == (f"dpurun: checkpoints: 1 of 4 NOT saved (step 2); the newest intact one "
                                         f"is {ckpt / 'step-000000004'}")
    again = tmp_path / "again"
    r = dpurun([], ["--mode", "none", "--ckpt-dir", str(again), "--resume", str(ckpt / "step-000000003"),
                    "tests/api_scripts/ckpt_at_exit.py"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'restored [0, 3, 3, {"step": 3}]' in r.stdout
    first, resumed = (ckptfiles.load(d / "step-000000004").shared for d in (ckpt, again))
    assert first.keys() == resumed.keys() and all(torch.equal(first[k], resumed[k]) for k in first)  # Adam too


@pytest.mark.mpi
def test_a_clone_step_never_reached_ends_the_job_in_one_line():
    r = dpurun(["--clone-ranks", "1", "--oversubscribe"],
               ["--mode", "none", "--clone-at", "2", "tests/api_scripts/no_clone_state.py"], timeout=120)
    assert r.returncode != 0
    # Both ranks name their own mistake in one line; which one dpurun names first is a race between them.
    host = next(ln for ln in r.stderr.splitlines() if ln.startswith("[dpuoffload] host rank 0 (world rank 0, "))
    assert "failed: ConfigError: --clone-at 2: the script never called job.checkpoint at global step 2" in host
    assert "clone rank 0 (world rank 2" in r.stderr and "call job.restore(model, optimizer, scheduler)" in r.stderr
    first = next(ln for ln in r.stderr.splitlines() if "failed first:" in ln)
    assert "host rank 0 (host program) failed first: ConfigError: --clone-at 2" in first or \
        "clone rank 0 (host program (clone group)) failed first: ConfigError: a clone rank starts" in first, first
