"""Torch-free planning: the modes enum and `--mode naive`'s arithmetic (also run under Python 3.10).

`scripts/test-min-python.sh` runs this file with the other torch-free tests under the minimum
Python, in a venv that has no torch, so an accidental torch import in `plan/` fails there.

(The tests of this feature that start processes: tests/jobs/test_plan_pure.py.)
"""


import pytest

from dpuoffload.common.modes import CONCRETE, Mode
from dpuoffload.common.plan.naive import balanced_dpu_batch, naive_steps


@pytest.mark.parametrize("n, sizes, drop_last, steps", [
    (512, [16, 16, 2, 2], False, 15), (512, [16, 16, 2, 2], True, 14), (7, [4, 1], False, 2), (100, [10], True, 10),
])
def test_naive_steps_deal_out_the_epoch(n, sizes, drop_last, steps):
    assert naive_steps(n, sizes, drop_last) == steps


def test_balanced_dpu_batch_matches_step_costs():
    assert balanced_dpu_batch(16, host_cost=0.004, dpu_cost=0.032) == 2  # the published 2 vs 16
    assert balanced_dpu_batch(16, 0.004, 0.5) == 1                       # never below one sample
    assert balanced_dpu_batch(16, 0.004, 0.0) == 16                      # no cost measured: same batch


def test_modes_say_what_the_dpu_ranks_do():
    assert [m for m in Mode if m.augments_on_dpu] == [Mode.DA, Mode.HYBRID]
    assert [m for m in Mode if m.validates_on_dpu] == [Mode.MV, Mode.HYBRID]
    assert [m for m in Mode if not m.keeps_math] == [Mode.NAIVE]
    assert [m for m in Mode if not m.offloads] == [Mode.NONE, Mode.AUTO]
    assert Mode("da") is Mode.DA and f"{Mode.MV}" == "mv" and Mode.AUTO not in CONCRETE
