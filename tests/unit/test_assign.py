"""Who keeps which host rank's state and which clone rank gets which slice (pure, no processes)."""

import pytest

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.runtime.roles import RankInfo, Role, Topology, pair_ranks

H, D, C = Role.HOST, Role.DPU, Role.CLONE


def assignment(layout) -> StateAssignment:
    """layout: (role, node) in world-rank order, as `dpurun` starts them (hosts, DPUs, clones)."""
    ranks = tuple(RankInfo(i, role, node, node) for i, (role, node) in enumerate(layout))
    # no communicators: the assignment only reads the rank list and the pairing
    return StateAssignment.of(Topology(world=None, side_comm=None, role=H, ranks=ranks, pairing=pair_ranks(ranks)))


def test_fan_out_keepers_and_what_each_keeps():
    # 4 host ranks share 2 DPU ranks on one node: hosts 0,1 -> DPU 4; hosts 2,3 -> DPU 5
    a = assignment([(H, "n0")] * 4 + [(D, "n0")] * 2)
    assert [a.keeper_of(h) for h in range(4)] == [4, 4, 5, 5]
    assert a.hosts_kept_by(4) == (0, 1) and a.hosts_kept_by(5) == (2, 3)
    assert a.hosts_kept_by(0) == ()  # a host rank keeps nothing


def test_a_dead_keepers_host_ranks_go_to_the_least_loaded_living_keeper():
    # 6 host ranks, 3 keepers of 2 each (6: hosts 0,1; 7: hosts 2,3; 8: hosts 4,5); keeper 7 dies
    a = assignment([(H, "n0")] * 6 + [(D, "n0")] * 3)
    assert a.keeper_ranks == (6, 7, 8)
    lost = frozenset({7})
    assert [a.keeper_of(h, lost) for h in range(6)] == [6, 6, 6, 8, 8, 8]  # host 2 -> 6 (tie: lowest), 3 -> 8
    assert a.hosts_kept_by(6, lost) == (0, 1, 2) and a.hosts_kept_by(7, lost) == () and a.hosts_kept_by(8, lost) == (
        3, 4, 5)
    assert a.lost_mask(lost) == 0b010 and a.lost_of(0b010) == lost and a.lost_of(0) == frozenset()
    assert a.survivors(frozenset({6, 7, 8})) == {}  # nobody left to keep anything
    assert [a.keeper_of(h) for h in range(6)] == [6, 6, 7, 7, 8, 8]  # (nothing lost: the pairing's keepers)


def test_more_dpus_than_hosts_the_first_paired_dpu_keeps():
    a = assignment([(H, "n0"), (D, "n0"), (D, "n0")])
    assert a.keeper_of(0) == 1
    assert a.hosts_kept_by(1) == (0,) and a.hosts_kept_by(2) == ()  # the extra DPU rank keeps nobody


def test_keepers_stay_on_the_host_node():
    a = assignment([(H, "a"), (H, "b"), (D, "b"), (D, "a")])
    assert a.keeper_of(0) == 3 and a.keeper_of(1) == 2


def test_host_without_a_dpu_on_its_node_is_a_config_error_naming_it():
    a = assignment([(H, "a"), (H, "b"), (D, "a")])
    assert a.keeper_of(0) == 2
    with pytest.raises(ConfigError) as e:
        a.keeper_of(1)
    assert str(e.value) == ("checkpoints and clones need a DPU rank on every host rank's node, but host rank 1 "
                            "(world rank 1, node b) has none: start DPU ranks on that node (dpurun --dpus)")


def test_clone_targets_are_k_mod_m_and_sources_their_inverse():
    # 3 host ranks (0..2), 2 DPU ranks (3, 4), 2 clone ranks (5, 6)
    a = assignment([(H, "n0")] * 3 + [(D, "n0")] * 2 + [(C, "n0")] * 2)
    assert [a.clone_target(h) for h in (0, 1, 2)] == [5, 6, 5]
    assert a.sources_of(5) == ((0, 3), (2, 4))   # (host rank number, its keeper), host rank order
    assert a.sources_of(6) == ((1, 3),)
    assert a.clone_targets_of(3) == (5, 6)       # DPU 3 keeps hosts 0 and 1
    assert a.clone_targets_of(4) == (5,)
    every = sorted(k for c in (5, 6) for k, _ in a.sources_of(c))
    assert every == [0, 1, 2]                     # each slice reaches exactly one clone rank


def test_more_clone_ranks_than_hosts_leave_some_without_sources():
    a = assignment([(H, "n0"), (D, "n0"), (C, "n0"), (C, "n0"), (C, "n0")])
    assert a.sources_of(2) == ((0, 1),) and a.sources_of(3) == () and a.sources_of(4) == ()
    assert a.clone_targets_of(1) == (2,)


def test_clone_rank_adopts_the_local_state_of_host_c_mod_senders():
    a = assignment([(H, "n0")] * 2 + [(D, "n0")] + [(C, "n0")] * 3)
    assert [a.local_state_of(c, senders=2) for c in (3, 4, 5)] == [0, 1, 0]
    assert [a.local_state_of(c, senders=1) for c in (3, 4, 5)] == [0, 0, 0]  # one sender (p2p baseline)


def test_without_clone_ranks_nothing_is_forwarded():
    a = assignment([(H, "n0"), (D, "n0")])
    assert a.clone_targets_of(1) == ()
    with pytest.raises(ValueError, match="no clone ranks"):
        a.clone_target(0)
