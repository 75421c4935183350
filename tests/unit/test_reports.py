"""Feedback a user expects: samples/s in the epoch line and metrics.jsonl, step and epoch on trace
spans, TensorBoard events (`--tensorboard`) and a loss/accuracy PNG (`--plots`).

(The tests of this feature that start processes: tests/jobs/test_reports.py.)
"""

import sys

import pytest

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime import trace
from dpuoffload.common.runtime.report import TensorBoardReport, TrainingPlot, build_reports
from dpuoffload.common.train.records import format_epoch_line

PNG = b"\x89PNG\r\n\x1a\n"


def record(epoch: int, loss: float) -> dict:
    return {"event": "epoch", "epoch": epoch, "train_loss": loss, "train_acc": 0.25, "val_loss": loss + 1,
            "val_acc": 0.2, "epoch_time": 2.0, "samples_per_s": 321.4, "lr": 0.05, "global_step": 4 * (epoch + 1),
            "step_losses": [loss] * 4, "phase_shares": {"data": 0.1, "forward_backward": 0.9}}


def test_epoch_line_shows_samples_per_second():
    line = format_epoch_line(record(0, 2.0), 3)
    assert line.startswith("epoch 1/3 | train loss 2.0000 acc 25.0% | val loss 3.0000 acc 20.0% | "
                           "2.0 s, 321 samples/s |")


def test_plot_is_a_png_rewritten_atomically_every_epoch(tmp_path):
    plot = TrainingPlot(str(tmp_path))
    plot.add_epoch(record(0, 2.0))
    first = (tmp_path / "training.png").read_bytes()
    plot.add_epoch(record(1, 1.5))
    second = (tmp_path / "training.png").read_bytes()
    assert first.startswith(PNG) and second.startswith(PNG) and first != second
    assert [p.name for p in tmp_path.iterdir()] == ["training.png"]  # no temp file left behind


def test_tensorboard_events_hold_epoch_metrics_and_step_losses(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    report = TensorBoardReport(str(tmp_path))
    report.add_epoch(record(0, 2.0))
    report.add_epoch(record(1, 1.5))
    report.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 2.0), (2, 1.5)]
    assert [e.step for e in events.Scalars("train/step_loss")] == list(range(1, 9))
    assert {"val/acc", "run/samples_per_s", "run/epoch_time", "run/lr"} <= set(events.Tags()["scalars"])


def test_missing_tensorboard_fails_at_config_time_with_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an environment without it looks like
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        parse_run_config(["--tensorboard", "tb"])


def test_plots_need_a_log_dir():
    with pytest.raises(ConfigError, match=r"--plots writes <log-dir>/training.png: add --log-dir DIR"):
        parse_run_config(["--plots"])


def test_only_the_group_leader_reports(tmp_path):
    cfg = parse_run_config(["--plots", "--log-dir", str(tmp_path)])
    assert build_reports(cfg, leader=False).reports == []
    assert [type(r) for r in build_reports(cfg, leader=True).reports] == [TrainingPlot]


def test_trace_spans_carry_the_position():
    tracer = trace.Tracer(0, "host rank 0")
    trace._tracer = tracer
    try:
        trace.set_position(epoch=1, step=7)
        tracer.complete("data", 0, 1000)
        tracer.complete("evaluate", 0, 1000, {"batches": 2})
    finally:
        trace._tracer = None
    assert [e["args"] for e in tracer.events[2:]] == [{"epoch": 1, "step": 7}, {"epoch": 1, "step": 7, "batches": 2}]
