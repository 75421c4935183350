"""--mode auto (profile, predict, choose, run, report) and `dpurun project`, as real MPMD jobs.

(Here the tests that start processes; those that run in one process: tests/unit/test_auto.py.)
"""

import json

import pytest

from dpuoffload.common.train.autoselect import UNSTEADY_SPREAD
from tests.mpijobs import DPURUN, dpurun, read_jsonl, run

pytestmark = pytest.mark.mpi


def test_auto_predicts_every_runnable_mode_runs_the_choice_and_reports(tmp_path, bundled_data):
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "1"],
                 ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--mode", "auto", "--epochs", "2",
                  "--train-subset", "128", "--log-dir", str(tmp_path), "--no-progress"])
    assert res.returncode == 0, res.stderr
    record = read_jsonl(tmp_path / "auto.jsonl")[-1]
    assert set(record["predicted"]) == {"none", "da", "mv", "naive"}  # hybrid needs 2 DPU ranks
    keeping = {m: t for m, t in record["predicted"].items() if m != "naive"}  # naive only with --auto-allow
    fastest = min(keeping.values())  # the fastest, or the first in TIE_ORDER of the modes tied with it (3 %)
    assert record["chosen"] == next(m for m in ("none", "mv", "da") if keeping[m] <= fastest * 1.03)
    tie = sum(t <= fastest * 1.03 for t in keeping.values()) > 1
    assert f"[dpuoffload] --mode auto chose {record['chosen']}: " + (
        "" if tie else "the shortest predicted epoch (") in res.stdout
    assert "--auto-allow naive" in res.stdout
    beside = record["profile"]["host_beside"]  # (the host's step timed again beside DPU ranks building batches)
    assert beside >= 1.0 and f"the host's forward/backward took {beside:.2f}x as long while the DPU" in res.stdout
    spread = record["profile"]["host_step_spread"]  # (the profile's host steps: upper over lower quartile)
    assert spread >= 1.0 and ("[dpuoffload] note: the host's profile steps were unsteady" in res.stdout) == (
        spread >= UNSTEADY_SPREAD)
    assert f"[dpuoffload] mode {record['chosen']}:" in res.stdout
    assert f"--mode auto chose {record['chosen']}: predicted" in res.stdout
    assert record["measured_epoch_s"] > 0 and "prediction_error" in record

    projected = run([DPURUN, "project", str(tmp_path / "auto.jsonl"), "--nodes", "16"])
    assert projected.returncode == 0, projected.stderr
    assert projected.stdout.startswith("PROJECTION (model, not a measurement): 16 nodes x 8 host + 8 DPU ranks")
    assert "<- chosen" in projected.stdout and "hybrid" in projected.stdout
    # over a measured link: 10 us + n / 1.25 GB/s (10 Gbit/s) at 4 sizes, as benchmarks/transport.py --tcp writes it
    sizes = (196_816, 787_024, 3_146_320, 19_267_920)
    (tmp_path / "transport.json").write_text(json.dumps({"results_tcp": [
        {"message_bytes": n, "raw_GBps": n / (10e-6 + n / 1.25e9) / 1e9} for n in sizes]}))
    linked = run([DPURUN, "project", str(tmp_path / "auto.jsonl"), "--link", str(tmp_path / "transport.json")])
    assert linked.returncode == 0, linked.stderr
    assert linked.stdout.startswith(f"PROJECTION (model, not a measurement): 16 nodes x 8 host + 8 DPU ranks, 10 "
                                    f"Gbit/s, 10 us latency (measured in {tmp_path / 'transport.json'} (raw MPI over "
                                    "TCP, 4 sizes 0.2-19 MB)), per-sample costs as measured in")


def test_auto_times_the_runs_backend_and_then_trains_as_the_chosen_mode_run_by_hand(tmp_path, bundled_data):
    """The profile starts the run's allreduce backend (torch.distributed here, over 2 host ranks),
    times it on the model's gradient shapes and shuts it down; the run starts it again. Nothing of
    the profile's steps (a copy of the model, its own loader) is left in the run: the chosen mode
    run by hand gives the same losses and weights, to the bit."""
    common = ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs", "2", "--train-subset", "128",
              "--allreduce", "torch", "--no-progress"]
    launcher = ["--host-ranks", "2", "--dpu-ranks", "1"]
    auto = dpurun(launcher, [*common, "--mode", "auto", "--log-dir", str(tmp_path / "auto")])
    assert auto.returncode == 0, auto.stderr
    record = read_jsonl(tmp_path / "auto" / "auto.jsonl")[-1]
    assert record["profile"]["allreduce"] > 0 and record["profile"]["optimizer"] > 0
    assert "allreduce torch" in auto.stdout  # (the run's own backend, started again after the profile's)
    by_hand = dpurun(launcher, [*common, "--mode", record["chosen"], "--log-dir", str(tmp_path / "hand")])
    assert by_hand.returncode == 0, by_hand.stderr
    runs = {name: read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("auto", "hand")}
    assert [r["step_losses"] for r in runs["auto"][:-1]] == [r["step_losses"] for r in runs["hand"][:-1]]
    assert runs["auto"][-1]["weights_sha256"] == runs["hand"][-1]["weights_sha256"]


def test_project_rejects_a_file_that_is_not_a_profile(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text(json.dumps({"event": "epoch"}) + "\n")
    res = run([DPURUN, "project", str(bad)])
    assert res.returncode == 2
    assert "not a dpuoffload profile" in res.stderr
