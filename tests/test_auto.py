"""--mode auto (profile, predict, choose, run, report) and `dpurun project`, as real MPMD jobs."""

import json

import pytest

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
    assert record["chosen"] == min(keeping, key=keeping.get)
    assert f"[dpuoffload] --mode auto chose {record['chosen']}: the shortest predicted epoch (" in res.stdout
    assert "--auto-allow naive" in res.stdout
    assert f"[dpuoffload] mode {record['chosen']}:" in res.stdout
    assert f"--mode auto chose {record['chosen']}: predicted" in res.stdout
    assert record["measured_epoch_s"] > 0 and "prediction_error" in record

    projected = run([DPURUN, "project", str(tmp_path / "auto.jsonl"), "--nodes", "16"])
    assert projected.returncode == 0, projected.stderr
    assert projected.stdout.startswith("PROJECTION (model, not a measurement): 16 nodes x 8 host + 8 DPU ranks")
    assert "<- chosen" in projected.stdout and "hybrid" in projected.stdout


def test_project_rejects_a_file_that_is_not_a_profile(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text(json.dumps({"event": "epoch"}) + "\n")
    res = run([DPURUN, "project", str(bad)])
    assert res.returncode == 2
    assert "not a dpuoffload profile" in res.stderr
