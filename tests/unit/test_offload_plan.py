"""Which DPU rank augments, validates or idles, and for which host ranks (pure offload plan)."""

from collections import Counter

import pytest

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.plan.offload import DA, IDLE, MV, OffloadPlan, plan_offload, require_feeder, split_counts
from dpuoffload.common.runtime.roles import RankInfo, Role, feeders, pair_ranks

H, D = Role.HOST, Role.DPU


def ranks(layout):
    """layout: list of (role, node) in world-rank order. A DPU's hostname is its own ('a-bf'), its
    node is the host node it is plugged into, as the launcher's node map resolves it."""
    return [RankInfo(i, role, node if role is H else f"{node}-bf", node) for i, (role, node) in enumerate(layout)]


def single_node(n_host, n_dpu):
    return ranks([(H, "n0")] * n_host + [(D, "n0")] * n_dpu)


def plan(layout, **cfg) -> OffloadPlan:
    return plan_offload(layout, RunConfig(**cfg))


def node_of(layout, world_rank):
    return layout[world_rank].node


# ------------------------------------------------------------------------------------ split_counts
@pytest.mark.parametrize("cfg,expected", [
    ({"mode": "none"}, (0, 0)),
    ({"mode": "naive"}, (0, 0)),
    ({"mode": "da"}, (3, 0)),
    ({"mode": "mv"}, (0, 3)),
    ({"mode": "hybrid"}, (1, 2)),                           # half the DPU ranks, at least 1
    ({"mode": "hybrid", "da_fanout": 3}, (2, 1)),           # ceil(4 hosts / 3)
    ({"mode": "hybrid", "dpu_mv_ranks": 1}, (1, 1)),        # one DPU rank left idle
])
def test_split_counts_with_four_hosts_and_three_dpus(cfg, expected):
    assert split_counts(RunConfig(**cfg), 4, 3) == expected


# ------------------------------------------------------------------------------------------- none
def test_mode_none_leaves_every_dpu_rank_idle():
    p = plan(single_node(2, 2), mode="none")
    assert p.work == {2: IDLE, 3: IDLE}
    assert p.feeder == {} and p.mv_target == {} and p.mv_ranks == ()


# --------------------------------------------------------------------------------------------- da
def test_da_one_to_one():
    p = plan(single_node(2, 2), mode="da")
    assert p.work == {2: DA, 3: DA}
    assert p.feeder == {0: 2, 1: 3} and p.mv_target == {}
    assert p.fed_by(2) == (0,) and p.fed_by(3) == (1,)


def test_da_fan_out_two_consecutive_hosts_per_dpu():
    p = plan(single_node(4, 2), mode="da")
    assert p.feeder == {0: 4, 1: 4, 2: 5, 3: 5}
    assert p.fed_by(4) == (0, 1) and p.fed_by(5) == (2, 3)


def test_da_extra_dpu_ranks_feed_nobody():
    p = plan(single_node(1, 3), mode="da")
    assert p.feeder == {0: 1}
    assert p.fed_by(1) == (0,) and p.fed_by(2) == () and p.fed_by(3) == ()


def test_require_feeder_names_the_host_without_one():
    p = plan(ranks([(H, "a"), (H, "b"), (D, "a")]), mode="da")
    assert require_feeder(p, 0, "host rank 0") == 2
    with pytest.raises(ConfigError, match="host rank 1 has no augmentation DPU rank on its node"):
        require_feeder(p, 1, "host rank 1")


def test_feeders_is_the_first_paired_dpu():
    pairing = pair_ranks(single_node(1, 3))
    assert feeders(pairing) == {0: 1}
    assert feeders(pair_ranks(ranks([(H, "a"), (H, "b"), (D, "a")]))) == {0: 2}  # unpaired host absent


# --------------------------------------------------------------------------------------------- mv
def test_mv_each_host_sends_to_one_validation_rank():
    p = plan(single_node(2, 2), mode="mv")
    assert p.work == {2: MV, 3: MV} and p.feeder == {}
    assert p.mv_target == {0: 2, 1: 3}
    assert p.states_to(2) == (0,) and p.states_to(3) == (1,)


def test_mv_ranks_are_sorted_and_every_host_sends_exactly_once():
    p = plan(single_node(4, 3), mode="mv")
    assert p.mv_ranks == (4, 5, 6)
    senders = [h for d in p.mv_ranks for h in p.states_to(d)]
    assert sorted(senders) == [0, 1, 2, 3]


def test_mv_rank_order_in_work_does_not_matter():
    p = OffloadPlan(work={7: MV, 5: IDLE, 6: MV}, feeder={}, mv_target={0: 7, 1: 6})
    assert p.mv_ranks == (6, 7) and p.states_to(7) == (0,)


# ----------------------------------------------------------------------------------------- hybrid
def test_hybrid_published_single_node_layout():
    p = plan(single_node(8, 8), mode="hybrid", da_fanout=2)
    assert [p.work[d] for d in range(8, 16)] == [DA] * 4 + [MV] * 4
    assert {d: p.fed_by(d) for d in range(8, 12)} == {8: (0, 1), 9: (2, 3), 10: (4, 5), 11: (6, 7)}
    assert p.mv_ranks == (12, 13, 14, 15)
    assert {d: p.states_to(d) for d in p.mv_ranks} == {12: (0, 1), 13: (2, 3), 14: (4, 5), 15: (6, 7)}


def test_hybrid_explicit_counts_leave_the_rest_idle():
    p = plan(single_node(4, 6), mode="hybrid", dpu_da_ranks=2, dpu_mv_ranks=1)
    assert [p.work[d] for d in range(4, 10)] == [DA, DA, MV, IDLE, IDLE, IDLE]
    assert p.feeder == {0: 4, 1: 4, 2: 5, 3: 5}
    assert p.mv_target == {0: 6, 1: 6, 2: 6, 3: 6}


def test_hybrid_needs_two_dpu_ranks():
    with pytest.raises(ConfigError, match=r"at least one augmentation and one validation DPU rank within the 1 "
                                          r"DPU rank\(s\); got 1 \+ 0"):
        plan(single_node(2, 1), mode="hybrid")


def test_hybrid_counts_beyond_the_dpu_ranks_are_rejected():
    with pytest.raises(ConfigError, match=r"within the 4 DPU rank\(s\); got 3 \+ 2 .*--dpu-da-ranks"):
        plan(single_node(4, 4), mode="hybrid", dpu_da_ranks=3, dpu_mv_ranks=2)


def test_hybrid_fanout_too_small_is_rejected():
    with pytest.raises(ConfigError, match=r"--da-fanout 1 with 2 augmentation rank\(s\) feeds only 2 of 4 host ranks"):
        plan(single_node(4, 4), mode="hybrid", dpu_da_ranks=2, da_fanout=1)


def test_hybrid_fanout_needing_more_dpu_ranks_than_exist_is_rejected():
    with pytest.raises(ConfigError, match=r"within the 3 DPU rank\(s\); got 4 \+"):
        plan(single_node(8, 3), mode="hybrid", da_fanout=2)


@pytest.mark.parametrize("field", ["dpu_da_ranks", "dpu_mv_ranks", "da_fanout"])
@pytest.mark.parametrize("mode", ["none", "da", "mv"])
def test_hybrid_only_fields_are_rejected_in_other_modes(field, mode):
    flag = field.replace("_", "-")
    with pytest.raises(ConfigError, match=f"--{flag} only applies to --mode hybrid \\(got --mode {mode}\\)"):
        RunConfig(mode=mode, **{field: 2})


# -------------------------------------------------------------------------------------- two nodes
def test_da_pairing_stays_within_each_node():
    layout = ranks([(H, "a"), (H, "a"), (H, "b"), (H, "b"), (D, "b"), (D, "a")])
    p = plan(layout, mode="da")
    assert p.feeder == {0: 5, 1: 5, 2: 4, 3: 4}
    assert all(node_of(layout, h) == node_of(layout, d) for h, d in p.feeder.items())


def test_hybrid_published_layout_on_two_nodes_stays_within_each_node():
    layout = ranks([(H, "a")] * 4 + [(H, "b")] * 4 + [(D, "a")] * 4 + [(D, "b")] * 4)
    p = plan(layout, mode="hybrid", da_fanout=2)
    assert [p.work[d] for d in range(8, 16)] == [DA, DA, MV, MV, DA, DA, MV, MV]
    assert p.feeder == {0: 8, 1: 8, 2: 9, 3: 9, 4: 12, 5: 12, 6: 13, 7: 13}
    assert p.mv_target == {0: 10, 1: 10, 2: 11, 3: 11, 4: 14, 5: 14, 6: 15, 7: 15}
    for table in (p.feeder, p.mv_target):
        assert all(node_of(layout, h) == node_of(layout, d) for h, d in table.items())


def test_host_node_without_validation_rank_sends_round_robin():
    layout = ranks([(H, "a"), (H, "a"), (H, "b"), (H, "b"), (D, "a"), (D, "a")])
    p = plan(layout, mode="mv")
    assert p.mv_target == {0: 4, 1: 5, 2: 4, 3: 5}
    assert p.states_to(4) == (0, 2) and p.states_to(5) == (1, 3)


def test_hybrid_node_without_validation_rank_sends_to_the_other_node():
    layout = ranks([(H, "a"), (H, "b"), (D, "a"), (D, "a"), (D, "b")])
    p = plan(layout, mode="hybrid", dpu_da_ranks=2, dpu_mv_ranks=1)
    assert p.work == {2: DA, 3: MV, 4: DA}  # node b's only DPU rank augments
    assert p.feeder == {0: 2, 1: 4}
    assert p.mv_target == {0: 3, 1: 3}


def test_unpaired_hosts_are_spread_over_the_validation_ranks():
    # --map-by node: host ranks alternate between nodes a and b; only node a has DPU ranks
    layout = ranks([(H, "a"), (H, "b"), (H, "a"), (H, "b"), (D, "a"), (D, "a")])
    p = plan(layout, mode="mv")
    assert p.mv_target[0] == 4 and p.mv_target[2] == 5  # paired on node a
    assert {p.mv_target[1], p.mv_target[3]} == {4, 5}   # unpaired hosts spread round-robin


@pytest.mark.parametrize("n_da, n_mv", [(1, 1), (3, 3)])
def test_hybrid_explicit_counts_on_two_nodes_are_honoured(n_da, n_mv):
    """Counts that fit are placed exactly (no refusal: a regression to refusing them fails here); a host rank
    is fed only by an augmentation rank of its own node (with one DA rank, node b's host ranks load
    themselves)."""
    layout = ranks([(H, "a")] * 4 + [(H, "b")] * 4 + [(D, "a")] * 4 + [(D, "b")] * 4)
    p = plan(layout, mode="hybrid", dpu_da_ranks=n_da, dpu_mv_ranks=n_mv)
    assert Counter(p.work.values()) == {DA: n_da, MV: n_mv, IDLE: 8 - n_da - n_mv}
    assert sorted(p.feeder) == (list(range(4)) if n_da == 1 else list(range(8)))
    assert all(p.work[f] == DA and layout[f].node == layout[h].node for h, f in p.feeder.items())


def test_hybrid_every_node_with_dpu_ranks_gets_an_augmentation_rank():
    layout = ranks([(H, "a"), (H, "a"), (H, "b"), (H, "b"), (D, "a"), (D, "b"), (D, "b"), (D, "b")])
    p = plan(layout, mode="hybrid")  # 2 DA + 2 MV over 4 DPU ranks: feasible with a DA rank per node
    assert sorted(p.feeder) == [0, 1, 2, 3]
