"""--trace: one Chrome trace-event file of all ranks that shows DPU work overlapping host steps."""

import json

import pytest

from tests.mpijobs import dpurun

pytestmark = pytest.mark.mpi


def test_trace_of_a_hybrid_run_shows_all_ranks_and_the_overlap(tmp_path, bundled_data):
    path = tmp_path / "trace" / "run.json"
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "2", "--oversubscribe"],
                 ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--mode", "hybrid", "--epochs", "2",
                  "--train-subset", "128", "--no-progress", "--trace", str(path)])
    assert res.returncode == 0, res.stderr
    events = json.loads(path.read_text())["traceEvents"]
    names = sorted(e["args"]["name"].split(",")[0] for e in events if e["name"] == "process_name")
    assert names == ["DPU rank 0 (world rank 1", "DPU rank 1 (world rank 2", "host rank 0 (world rank 0"]
    spans = [e for e in events if e["ph"] == "X"]
    by = {(e["pid"], e["name"]) for e in spans}
    assert {(0, "forward_backward"), (0, "data"), (1, "augment"), (1, "send"), (2, "evaluate")} <= by
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["pid"] == 0 and e["name"] == "forward_backward"]
    augment = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["pid"] == 1 and e["name"] == "augment"]
    overlapping = sum(any(a0 < s1 and s0 < a1 for s0, s1 in steps) for a0, a1 in augment)
    assert overlapping > len(augment) // 2  # the DPU rank augments while the host computes
    assert not list(path.parent.glob(".*tmp*"))  # written atomically
