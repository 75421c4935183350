"""The examples/ scripts as real MPMD jobs: their losses equal the same script with torch's DataLoader.

Each pair runs the script once with `job.loader` offloaded (`da`: batches from a DPU rank; `hybrid`:
validation on a DPU rank too) and once with `--loader torch` (torch's DataLoader over `dpu.seeded`,
built on the host) under `--mode none`, where `job.validate` evaluates on the host ranks; the step
losses and every epoch's validation results must be equal to the bit, on every host rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mpijobs import dpurun

pytestmark = pytest.mark.mpi
QUICK = ["--epochs", "2", "--subset", "256"]


def records(tmp_path, launcher, mode, script, loader, extra=(), ranks=1) -> list[dict]:
    out = tmp_path / f"{mode}-{loader}-{{rank}}.json"
    r = dpurun(launcher, ["--mode", mode, f"examples/{script}", *QUICK, "--loader", loader, "--record", str(out),
                          *extra], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    where = "DPU" if mode in ("mv", "hybrid") else "host"
    assert "[dpuoffload] validation of epoch 1: loss" in r.stdout and f"256 samples, on the {where} ranks" in r.stdout
    return [json.loads(Path(str(out).format(rank=rank)).read_text()) for rank in range(ranks)]


def test_plain_loop_with_accumulation_bf16_autocast_and_validation_on_a_dpu_rank(tmp_path):
    extra = ["--accum", "2", "--amp", "bf16"]
    hybrid = records(tmp_path, ["--dpu-ranks", "2", "--oversubscribe"], "hybrid", "plain_loop.py", "dpu", extra)
    ref = records(tmp_path, [], "none", "plain_loop.py", "torch", extra)
    assert len(hybrid[0]["losses"]) == 2 * 8 and hybrid == ref
    assert sorted(hybrid[0]["validation"]) == ["0", "1"] and hybrid[0]["validation"]["1"]["count"] == 256


@pytest.mark.parametrize("script, mode, dpus", [("ddp_loop.py", "hybrid", 2), ("horovod_loop.py", "da", 1)])
def test_data_parallel_loops_fed_by_one_dpu_rank(tmp_path, script, mode, dpus):
    """Two host ranks, one DPU rank feeding both (fan-out), the script's own allreduce; with DDP a
    second DPU rank validates the state assembled from both host ranks' slices."""
    launcher = ["--host-ranks", "2", "--dpu-ranks", str(dpus), "--oversubscribe"]
    offloaded = records(tmp_path, launcher, mode, script, "dpu", ranks=2)
    ref = records(tmp_path, launcher, "none", script, "torch", ranks=2)
    assert len(offloaded[0]["losses"]) == 2 * 4 and offloaded == ref
    assert offloaded[0]["losses"] != offloaded[1]["losses"]  # each rank its own shard of the data
    assert offloaded[1]["validation"] == {} and sorted(offloaded[0]["validation"]) == ["0", "1"]  # host rank 0
