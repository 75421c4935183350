"""--mode naive: DPU ranks as extra replicas with a smaller batch, sample-weighted gradients.

(The tests of this feature that start processes: tests/jobs/test_naive.py.)
"""

from collections import Counter

import pytest

from dpuoffload.common.config import RunConfig
from dpuoffload.common.train.naive import balanced_dpu_batch, naive_plan, naive_steps, resolve_dpu_batch


# ------------------------------------------------------------------------------- pure: the plan
@pytest.mark.parametrize("n, sizes", [(512, [16, 16, 2, 2]), (50, [16, 16, 3, 3]), (7, [4, 1]), (100, [10])])
def test_every_sample_exactly_once_per_epoch(n, sizes):
    for epoch in range(3):
        plan = naive_plan(n, seed=0, epoch=epoch, batch_sizes=sizes, drop_last=False)
        seen = Counter(i for replica in plan for batch in replica for i in batch)
        assert seen == Counter(range(n))
        assert all(len(replica) == naive_steps(n, sizes, False) for replica in plan)


def test_shares_proportional_to_batch_sizes_and_full_steps():
    plan = naive_plan(512, seed=0, epoch=0, batch_sizes=[16, 16, 2, 2], drop_last=False)
    assert [len(b) for b in plan[0][:-1]] == [16] * 14 and [len(b) for b in plan[3][:-1]] == [2] * 14
    assert [len(r[-1]) for r in plan] == [8, 0, 0, 0]  # 512 - 14 * 36 = 8 left for the last step


def test_drop_last_drops_the_partial_step_and_epochs_reshuffle():
    plan = naive_plan(50, seed=0, epoch=0, batch_sizes=[16, 16, 3], drop_last=True)
    assert [len(r) for r in plan] == [1, 1, 1]
    assert naive_plan(50, 0, 1, [16, 16, 3], True) != plan
    assert naive_plan(50, 0, 0, [16, 16, 3], True) == plan


def test_dpu_batch_choice():
    assert balanced_dpu_batch(16, host_cost=0.004, dpu_cost=0.032) == 2  # the published 2 vs 16
    assert balanced_dpu_batch(16, 0.004, 0.5) == 1
    assert resolve_dpu_batch(RunConfig(mode="naive", dpu_batch_size=5), None, None) == 5
