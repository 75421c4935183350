"""DPU memory that outlives its node (issue 57 items 1-2), pure parts: where partner copies go (a ring
by node), the restart step when parts come from copies, damaged parts, the memory budget, and the
reclaiming of what dead runs left. The real jobs (a whole machine pair lost, its DPU memory gone and
the disk deleted) are in tests/cluster/test_multinode.py; the budget in a real job in tests/jobs/test_restart.py.

(The tests of this feature that start processes: tests/jobs/test_partner_copies.py.)
"""

import argparse
import os
import time

import pytest

from dpuoffload.common.config import parse_size
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.state.memstore import (
    Held,
    MemoryBudget,
    MemoryStore,
    RunLock,
    place_copies,
    reclaim,
    restart_plan,
    why_the_disk,
)
from tests.unit.test_restart import handoff


def test_copies_go_round_a_ring_of_nodes():
    # one keeper per node: each copies to the next node's keeper
    assert place_copies(["n0", "n1", "n2"], 1).holders == ((1,), (2,), (0,))
    assert place_copies(["n0", "n1", "n2"], 2).holders == ((1, 2), (2, 0), (0, 1))
    # two keepers per node: the j-th keeper of a node copies to the j-th keeper of the next node
    p = place_copies(["n0", "n0", "n1", "n1"], 1)
    assert p.holders == ((2,), (3,), (0,), (1,)) and p.sources(0) == (2,) and p.replicas == 1
    # uneven: wrapping on the smaller node; never on the keeper's own node
    p = place_copies(["n0", "n0", "n1"], 1)
    assert p.holders == ((2,), (2,), (0,)) and p.sources(2) == (0, 1)
    # default: 1 with >= 2 nodes, none on one node
    assert place_copies(["n0", "n1"], None).holders == ((1,), (0,))
    assert place_copies(["n0", "n0"], None).holders == ((), ()) and place_copies(["n0"], 0).replicas == 0


def test_more_replicas_than_other_nodes_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        place_copies(["h0", "h0"], 1)
    assert str(e.value) == (
        "--ckpt-mem-replicas 1 puts each keeper's copies on 1 other node(s), but this job's keepers are on 1 node(s) "
        "(h0): a copy on the same node is lost with it; use --ckpt-mem-replicas 0 or start DPU ranks on more nodes")


@pytest.mark.parametrize("held, disk, expected", [
    # keeper 1's memory gone with its node; keeper 0 holds its copy: every part of 8 is somewhere
    ([Held((6, 8), {1: (6, 8)}), Held()], None, (8, (0, 0))),
    ([Held((6, 8), {1: (6,)}), Held()], None, (6, (0, 0))),    # the copy of 8 never arrived: 6
    ([Held((6, 8), {1: (6, 8)}), Held((6, 8), {0: (6, 8)})], None, (8, (0, 1))),  # own parts first
    ([Held((6, 8), {1: (6, 8)}), Held()], 10, None),           # the disk is newer
    ([Held((6, 8)), Held()], None, None),                      # no copy: keeper 1's part is gone
    ([Held((), {1: (8,)}), Held((), {0: (8,)})], 8, (8, (1, 0))),  # both memories replaced by each other's copy
])
def test_the_restart_step_takes_parts_from_copies(held, disk, expected):
    assert restart_plan(held, disk) == expected


def test_why_the_disk_is_read_instead():
    names = ["DPU rank 0", "DPU rank 1"]
    assert why_the_disk([Held((6, 8)), Held()], None, names) == (
        "no part of DPU rank 1 survives in DPU memory (its own memory and every copy of it are gone)")
    assert why_the_disk([Held((8,), {1: (8,)}), Held((8,))], 10, names) == (
        "the newest step whose every part DPU memory holds is 8, older than the disk's 10")
    assert why_the_disk([Held(), Held()], 4, names).startswith("DPU memory holds nothing of this run")
    assert why_the_disk([Held((6,)), Held((8,))], None, names).endswith("(no step is whole)")


def test_a_copy_is_kept_apart_and_a_damaged_part_is_not_held(tmp_path):
    own, copy = MemoryStore(tmp_path, 1, 2), MemoryStore(tmp_path, 1, 2, copy=True)
    own.put(4, [handoff(1, 4, 100)])
    copy.put(4, [handoff(1, 4, 100)])
    copy.put(6, [handoff(1, 6, 100)])
    assert copy.dir == tmp_path / "copies" / "keeper-001" and own.steps([1]) == [4] and copy.steps([1]) == [4, 6]
    with open(copy.dir / "step-000000006" / "shared-00001.bin", "r+b") as f:
        f.truncate(10)  # (a copy cut short)
    damaged: list[str] = []
    assert copy.steps([1], damaged) == [4]
    assert damaged == [f"{copy.dir}/step-000000006: shared-00001.bin has 10 bytes, its header says 100"]
    damaged.clear()
    assert copy.steps([0, 1], damaged) == [] and len(damaged) == 1  # (step 4 of another layout: missing, not damaged)


def test_the_budget_counts_what_the_run_keeps_on_this_machine(tmp_path):
    MemoryStore(tmp_path, 0, 2).put(2, [handoff(0, 2, 1000)])
    held = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    budget = MemoryBudget(held + 500, chosen=True)
    assert budget.refusal(tmp_path, 500) is None
    assert budget.refusal(tmp_path, 501) == (
        "0.0 MB more beside the 0.0 MB this run keeps here is over the DPU memory budget of 0.0 MB "
        "(--ckpt-mem-budget)")
    default = MemoryBudget.of(None)
    assert not default.chosen and default.limit > 0
    assert "25% of this DPU's RAM" in MemoryBudget(1, False).refusal(tmp_path, 1)


def test_sizes_are_read_with_binary_units():
    assert parse_size("512M") == 512 << 20 and parse_size("4G") == 4 << 30 and parse_size("1.5g") == 3 << 29
    assert parse_size("2048") == 2048 and parse_size("64KiB") == 64 << 10 and parse_size("1GB") == 1 << 30
    with pytest.raises(argparse.ArgumentTypeError, match="'lots' is not a size: write e.g. 512M, 4G"):
        parse_size("lots")


def test_what_dead_runs_left_is_reclaimed_never_a_live_or_recent_one(tmp_path):
    user = tmp_path / "dpuoffload-mem-0"
    mine, dead, live, recent = (user / name for name in ("mine", "dead", "live", "recent"))
    for run in (dead, live, recent):
        MemoryStore(run, 0, 1).put(2, [handoff(0, 2, 1000)])
    hold = RunLock(live)  # a live job holds its run (a shared flock, gone with the process)
    old = time.time() - 3600
    for run in (dead, live):
        for p in [run, *run.rglob("*")]:
            os.utime(p, (old, old))
    mine.mkdir()
    runs, freed = reclaim(mine)
    assert (runs, freed > 1000) == (1, True)
    assert not dead.exists() and live.exists() and recent.exists()  # (recent: a relaunch may be coming)
    hold.release(live)
    assert live.exists()  # (it still holds a step: only an emptied run's directory goes with its last holder)
    assert reclaim(mine, older_than_s=0)[0] == 2 and not live.exists() and not recent.exists()
