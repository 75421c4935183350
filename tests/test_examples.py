"""The examples/ scripts as real MPMD jobs: their losses equal the same script with torch's DataLoader.

Each pair runs the script once with `job.loader` in `--mode da` (batches from DPU ranks) and once with
`--loader torch` (torch's DataLoader over `dpu.seeded`, built on the host) under `--mode none`; the
step losses must be equal to the bit, on every host rank: same batches, same math.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mpijobs import dpurun

pytestmark = pytest.mark.mpi
QUICK = ["--epochs", "2", "--subset", "256"]


def losses(tmp_path, launcher, mode, script, loader, extra=(), ranks=1) -> list[list[float]]:
    out = tmp_path / f"{mode}-{loader}-{{rank}}.json"
    r = dpurun(launcher, ["--mode", mode, f"examples/{script}", *QUICK, "--loader", loader, "--losses", str(out),
                          *extra], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "epoch 1: mean loss" in r.stdout
    return [json.loads(Path(str(out).format(rank=rank)).read_text()) for rank in range(ranks)]


def test_plain_loop_with_accumulation_and_bf16_autocast(tmp_path):
    extra = ["--accum", "2", "--amp", "bf16"]
    da = losses(tmp_path, [], "da", "plain_loop.py", "dpu", extra)
    ref = losses(tmp_path, [], "none", "plain_loop.py", "torch", extra)
    assert len(da[0]) == 2 * 8 and da == ref


@pytest.mark.parametrize("script", ["ddp_loop.py", "horovod_loop.py"])
def test_data_parallel_loops_fed_by_one_dpu_rank(tmp_path, script):
    """Two host ranks, one DPU rank feeding both (fan-out), the script's own allreduce."""
    launcher = ["--host-ranks", "2", "--dpu-ranks", "1", "--oversubscribe"]
    da = losses(tmp_path, launcher, "da", script, "dpu", ranks=2)
    ref = losses(tmp_path, launcher, "none", script, "torch", ranks=2)
    assert len(da[0]) == 2 * 4 and da == ref
    assert da[0] != da[1]  # each rank its own shard of the data
