"""`dpurun` inside a Slurm allocation (`launch.slurm`): host nodes, slots and each host node's DPU from
Slurm's environment, for both kinds of site (DPUs as allocated nodes; DPUs outside Slurm under a name
derived from the host's), and the errors when the allocation cannot give them. Pure: the environment
is a dict, name lookups a function; `dpurun --dry-run` shows the derived command without a Slurm.

(The tests of this feature that start processes: tests/jobs/test_slurm.py.)
"""

from __future__ import annotations

import pytest

from dpuoffload.common.errors import ConfigError
from dpuoffload.launch import cli
from dpuoffload.launch.slurm import Allocation, DpuNaming, derive, expand_counts, expand_nodelist

THOR = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "thor[001-002],thor-bf[01-02]",
        "SLURM_TASKS_PER_NODE": "8(x2),4(x2)"}
DINE = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "b[101,103]", "SLURM_TASKS_PER_NODE": "16(x2)"}


def test_slurms_host_lists_and_task_counts():
    assert expand_nodelist("h[0-1],bf[01-02],r[1-2]-n[1,3]") == ["h0", "h1", "bf01", "bf02", "r1-n1", "r1-n3",
                                                                 "r2-n1", "r2-n3"]
    assert expand_counts("2(x3),1") == [2, 2, 2, 1] and expand_counts("16") == [16]
    with pytest.raises(ConfigError, match=r"SLURM_TASKS_PER_NODE=2\(3\): cannot read '2\(3\)'"):
        expand_counts("2(3)")
    with pytest.raises(ConfigError, match="not a Slurm host list"):
        expand_nodelist("h[0-")
    assert Allocation.from_env({}) is None
    alloc = Allocation.from_env(THOR)
    assert alloc.nodes == ("thor001", "thor002", "thor-bf01", "thor-bf02") and alloc.tasks == (8, 8, 4, 4)
    with pytest.raises(ConfigError, match="gives 1 node.*2; give --hosts/--dpus instead"):
        Allocation.from_env({**DINE, "SLURM_TASKS_PER_NODE": "16"})


def test_dpus_as_allocated_nodes_are_paired_by_their_names():
    got = derive(Allocation.from_env(THOR), DpuNaming())
    assert (got.host_list, got.dpu_list) == ("thor001:8,thor002:8", "thor-bf01:4,thor-bf02:4")
    assert (got.host_slots, got.dpu_slots) == (16, 8)
    assert "pairs by number (the last number in each name): thor001 -> thor-bf01, thor002 -> thor-bf02" in got.why
    # Slurm sorts the allocation by name, so order alone would pair h0 with h1-bf here
    named = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "h1-bf,h0-bf,h10,h1,h10-bf,h0", "SLURM_TASKS_PER_NODE": "1(x6)"}
    got = derive(Allocation.from_env(named), DpuNaming())
    assert (got.host_list, got.dpu_list) == ("h10:1,h1:1,h0:1", "h10-bf:1,h1-bf:1,h0-bf:1")  # (h10-bf: not h1's)
    assert got.why[2].startswith("pairs by name (the host's name inside its DPU's)")
    unrelated = {**named, "SLURM_JOB_NODELIST": "alpha,beta,dpu-bf-x,dpu-bf-y", "SLURM_TASKS_PER_NODE": "1(x4)"}
    got = derive(Allocation.from_env(unrelated), DpuNaming())
    assert got.dpu_list == "dpu-bf-x:1,dpu-bf-y:1" and "in allocation order (the names do not say" in got.why[2]


def test_an_allocation_that_pairs_a_host_with_another_hosts_dpu_is_refused():
    crossed = {"SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "h[0-1],h[1-2]-bf", "SLURM_TASKS_PER_NODE": "1(x4)"}
    with pytest.raises(ConfigError, match=r"host node\(s\) h0 have no DPU node of their own in the allocation \(DPU "
                                          r"node\(s\) h2-bf name no allocated host\); allocate each host node with"):
        derive(Allocation.from_env(crossed), DpuNaming())


def test_dpus_outside_slurm_by_pattern_or_map(tmp_path):
    seen = []
    got = derive(Allocation.from_env(DINE), DpuNaming(pattern="{host}-bf"), dpu_ranks=4,
                 resolves=lambda n: seen.append(n) or True)
    assert (got.host_list, got.dpu_list, seen) == ("b101:16,b103:16", "b101-bf:2,b103-bf:2", ["b101-bf", "b103-bf"])
    mapped = tmp_path / "dpus"
    mapped.write_text("# host dpu\nb101 dpu-a\nb103 dpu-b  # the second\n")
    got = derive(Allocation.from_env(DINE), DpuNaming(map_file=str(mapped)), resolves=lambda n: True)
    assert got.dpu_list == "dpu-a:1,dpu-b:1"


def test_what_cannot_be_derived_is_named_with_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"has no DPU node \(no name matches --dpu-nodes 'bf'\); if the DPUs are "
                                          r"outside Slurm, name each host node's DPU: --dpu-name '\{host\}-bf'"):
        derive(Allocation.from_env(DINE), DpuNaming())
    odd = {**THOR, "SLURM_JOB_NODELIST": "thor[001-003],thor-bf01", "SLURM_TASKS_PER_NODE": "8(x3),4"}
    with pytest.raises(ConfigError, match=r"3 host node\(s\) .* and 1 DPU node\(s\) .*every host node needs its own"):
        derive(Allocation.from_env(odd), DpuNaming())
    with pytest.raises(ConfigError, match=r"the DPU of b101, b101-dpu \(from --dpu-name '\{host\}-dpu'\), does not "
                                          "resolve here"):
        derive(Allocation.from_env(DINE), DpuNaming(pattern="{host}-dpu"), resolves=lambda n: False)
    (tmp_path / "m").write_text("b101 dpu-a\n")
    with pytest.raises(ConfigError, match="names no DPU for b103"):
        derive(Allocation.from_env(DINE), DpuNaming(map_file=str(tmp_path / "m")), resolves=lambda n: True)
    with pytest.raises(ConfigError, match="has no {host}"):
        DpuNaming(pattern="bf")
    with pytest.raises(ConfigError, match="give one"):
        DpuNaming(pattern="{host}-bf", map_file="m")


def test_outside_an_allocation_the_defaults_and_the_naming_flags():
    args = cli.parse_launcher_args([])
    assert (args.host_ranks, args.dpu_ranks, args.hosts) == (1, 1, None)
    with pytest.raises(ConfigError, match="find DPUs in a Slurm allocation"):
        cli.parse_launcher_args(["--dpu-name", "{host}-bf"])
