"""DPU memory that outlives its node (issue 57 items 1-2), pure parts: where partner copies go (a ring
by node), the restart step when parts come from copies, damaged parts, the memory budget, and the
reclaiming of what dead runs left. The real jobs (a whole machine pair lost, its DPU memory gone and
the disk deleted) are in tests/cluster/test_multinode.py; the budget in a real job in tests/jobs/test_restart.py.

(Here the tests that start processes; those that run in one process: tests/unit/test_partner_copies.py.)
"""

import os
import time

import pytest

from dpuoffload.common.state.memstore import (
    MemoryStore,
)
from tests.mpijobs import dpurun
from tests.unit.test_restart import handoff


# ----------------------------------------------------------------------------------- real jobs
def test_copies_on_the_keepers_own_node_are_refused_before_launch(bundled_data):
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "2"],
                 ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--mode", "da", "--ckpt-dir", "/tmp/x",
                  "--ckpt-every", "2", "--ckpt-mem-keep", "2", "--ckpt-mem-replicas", "1"])
    assert res.returncode == 2 and [ln for ln in res.stderr.splitlines() if "error" in ln] == [
        "dpurun: error: --ckpt-mem-replicas 1 puts each keeper's copies on 1 other node(s), but this job's keepers are "
        "on 1 node(s) (this machine): a copy on the same node is lost with it; use --ckpt-mem-replicas 0 or start DPU "
        "ranks on more nodes"]


@pytest.mark.mpi
def test_a_step_over_the_budget_is_kept_on_disk_only_and_dead_runs_memory_is_reclaimed(bundled_data, tmp_path,
                                                                                         monkeypatch):
    """`--ckpt-mem-budget 1K`: no hand-off fits, said once, every checkpoint still committed to disk. And
    what a dead run left in this DPU's memory (no job holds it, unused for an hour) is freed at the
    start, with a line; a recent one is left for a relaunch that may come."""
    monkeypatch.setenv("DPUOFFLOAD_MEM_DIR", str(tmp_path / "shm"))
    dead, recent = (tmp_path / "shm" / f"dpuoffload-mem-{os.getuid()}" / name for name in ("dead", "recent"))
    for run in (dead, recent):
        MemoryStore(run, 0, 1).put(2, [handoff(0, 2, 200_000)])
    old = time.time() - 3600
    for p in [dead, *dead.rglob("*")]:
        os.utime(p, (old, old))
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "1", "--oversubscribe"],
                 ["--preset", "debug", "--no-progress", "--data", str(bundled_data / "cifar10"), "--mode", "da",
                  "--epochs", "1", "--train-subset", "64", "--ckpt-dir", str(tmp_path / "ck"), "--ckpt-every", "1",
                  "--ckpt-mem-keep", "2", "--ckpt-mem-budget", "1K"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    over = [ln for ln in res.stderr.splitlines() if "not kept in DPU memory" in ln]
    assert len(over) == 1 and over[0].startswith(
        "[dpuoffload] warning: DPU rank 0 (world rank 1, node ") and over[0].endswith(
        "over the DPU memory budget of 0.0 MB (--ckpt-mem-budget); this and later steps over the budget are kept on "
        "disk only (said once)"), res.stderr
    assert res.stdout.count("committed") == 4  # (64 samples, batch 16: 4 steps, each checkpointed)
    freed = "): freed 0.2 MB of DPU memory that 1 earlier run(s) left (no job held them, unused for over 10 min)"
    assert "DPU rank 0 (world rank 1, node " in res.stdout and freed in res.stdout
    assert not dead.exists() and recent.exists()
