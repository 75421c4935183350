"""Pairing of host and DPU ranks (pure) and role checks from MPI.APPNUM."""

import pytest

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime.env import parse_node_map
from dpuoffload.common.runtime.roles import RankInfo, Role, node_of, pair_ranks, role_from_appnum


def ranks(layout):
    """layout: list of (role, node) in world-rank order."""
    return [RankInfo(i, role, node, node) for i, (role, node) in enumerate(layout)]


H, D = Role.HOST, Role.DPU


def test_one_to_one_single_node():
    p = pair_ranks(ranks([(H, "n0"), (H, "n0"), (D, "n0"), (D, "n0")]))
    assert p.host_to_dpus == {0: (2,), 1: (3,)}
    assert p.dpu_to_hosts == {2: (0,), 3: (1,)}


def test_fan_out_two_hosts_per_dpu():
    p = pair_ranks(ranks([(H, "n0")] * 4 + [(D, "n0")] * 2))
    assert p.host_to_dpus == {0: (4,), 1: (4,), 2: (5,), 3: (5,)}
    assert p.dpu_to_hosts == {4: (0, 1), 5: (2, 3)}


def test_more_dpus_than_hosts():
    p = pair_ranks(ranks([(H, "n0"), (D, "n0"), (D, "n0"), (D, "n0")]))
    assert p.host_to_dpus == {0: (1, 2, 3)}


def test_pairing_stays_within_node():
    layout = [(H, "a"), (H, "a"), (H, "b"), (H, "b"), (D, "a"), (D, "b"), (D, "b")]
    p = pair_ranks(ranks(layout))
    assert p.host_to_dpus == {0: (4,), 1: (4,), 2: (5,), 3: (6,)}
    assert p.dpu_to_hosts == {4: (0, 1), 5: (2,), 6: (3,)}


def test_node_without_dpus_leaves_hosts_unpaired():
    p = pair_ranks(ranks([(H, "a"), (H, "b"), (D, "a")]))
    assert p.host_to_dpus == {0: (2,), 1: ()}


def test_node_map_puts_dpu_hostnames_on_their_host_node():
    node_map = parse_node_map("node1-bf=node1,node2-bf.cluster=node2")
    assert node_of("node1-bf", node_map) == "node1"
    assert node_of("node2-bf", node_map) == "node2"
    assert node_of("node1.cluster.local", node_map) == "node1"
    with pytest.raises(ConfigError, match="expected dpu-hostname=host-node"):
        parse_node_map("node1-bf")


def test_role_from_appnum():
    assert role_from_appnum(0, Role.HOST) is Role.HOST
    assert role_from_appnum(None, Role.DPU) is Role.DPU
    with pytest.raises(ConfigError, match="put the host program first"):
        role_from_appnum(0, Role.DPU)
    assert role_from_appnum(2, Role.HOST) is Role.CLONE  # the clone group runs the host program
    with pytest.raises(ConfigError, match="context 1 is reserved"):
        role_from_appnum(2, Role.DPU)
    with pytest.raises(ConfigError, match="two or three"):
        role_from_appnum(3, Role.HOST)


def test_a_dpu_is_another_machine_than_the_host_node_it_serves():
    """What makes the DPU and host ranks poll every 50 us for each other's batches (TCP, not
    shared memory): the hostname, not the node the DPU→node map gives it."""
    MPI = pytest.importorskip("mpi4py.MPI", reason="needs mpi4py (the minimum-Python venv has none)")
    from dpuoffload.common.runtime.roles import Topology

    infos = [RankInfo(0, D, "n0-bf", "n0"), RankInfo(1, H, "n0", "n0"), RankInfo(2, H, "n0-bf", "n0")]
    topo = Topology(MPI.COMM_SELF, MPI.COMM_SELF, D, tuple(infos), pair_ranks(infos))  # this rank: world rank 0
    assert topo.on_other_machine(1) and not topo.on_other_machine(2) and not topo.on_other_machine(0)


def test_mpi_inits_bound_is_the_peer_timeout_but_never_less_than_two_minutes():
    """`init_mpi`'s bound (a rank lost while the job starts must not hang it): the command line's
    `--peer-timeout`, at least `INIT_MIN_S` (init waits for the slowest rank's start), 600 s without
    one, or `DPUOFFLOAD_INIT_TIMEOUT` when set."""
    from dpuoffload.common.runtime.roles import INIT_BOUND_S, INIT_MIN_S, init_bound

    assert init_bound(["x", "--peer-timeout", "900"], {}) == 900.0
    assert init_bound(["x", "--peer-timeout=2"], {}) == INIT_MIN_S == 120.0
    assert init_bound(["x"], {}) == INIT_BOUND_S == 600.0
    assert init_bound(["x", "--peer-timeout", "soon"], {}) == INIT_BOUND_S  # (the config names a bad value)
    assert init_bound(["x", "--peer-timeout", "900"], {"DPUOFFLOAD_INIT_TIMEOUT": "15"}) == 15.0
