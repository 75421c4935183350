"""Feedback a user expects: samples/s in the epoch line and metrics.jsonl, step and epoch on trace
spans, TensorBoard events (`--tensorboard`) and a loss/accuracy PNG (`--plots`).

(Here the tests that start processes; those that run in one process: tests/unit/test_reports.py.)
"""

import json

import pytest

from tests.unit.test_reports import PNG


@pytest.mark.mpi
def test_a_run_reports_samples_per_second_tensorboard_plots_and_trace_positions(tmp_path, bundled_data):
    pytest.importorskip("tensorboard")
    from tests.mpijobs import dpurun, read_jsonl

    log, tb, path = tmp_path / "log", tmp_path / "tb", tmp_path / "trace.json"
    res = dpurun([], ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs", "2",
                      "--train-subset", "64", "--val-subset", "64", "--no-progress", "--log-dir", str(log),
                      "--plots", "--tensorboard", str(tb), "--trace", str(path)])
    assert res.returncode == 0, res.stderr
    epochs = [r for r in read_jsonl(log / "metrics.jsonl") if r["event"] == "epoch"]
    for r in epochs:
        assert r["samples_per_s"] == pytest.approx(64 / r["train_time"])
    assert res.stdout.count(" samples/s | ") == 2
    assert (log / "training.png").read_bytes().startswith(PNG)
    assert list(tb.glob("events.out.tfevents.*"))
    spans = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X" and e["pid"] == 0]
    steps = {e["args"]["step"] for e in spans if e["name"] == "forward_backward"}
    assert steps == set(range(1, 9)) and {e["args"]["epoch"] for e in spans} == {0, 1}
