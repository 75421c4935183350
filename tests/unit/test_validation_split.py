"""How much of the validation set the DPU ranks evaluate in `--mode mv` (pure)."""

import random

import pytest

from dpuoffload.common.plan.validation_split import auto_share, dpu_count


# -------------------------------------------------------------------------------------- dpu_count
@pytest.mark.parametrize("n,share,expected", [
    (1000, 0.0, 0),
    (1000, 1.0, 1000),
    (1000, 0.3, 300),
    (10, 0.26, 3),     # 2.6 rounds up
    (10, 0.24, 2),     # 2.4 rounds down
    (10, 0.25, 2),     # 2.5: Python's round() goes to the even neighbour
    (6, 0.25, 2),      # 1.5 -> 2 (even)
    (0, 0.5, 0),
])
def test_dpu_count_rounds_n_times_share(n, share, expected):
    assert dpu_count(n, share) == expected


@pytest.mark.parametrize("share,expected", [(-0.5, 0), (1.5, 10), (2.0, 10)])
def test_dpu_count_stays_within_the_set(share, expected):
    assert dpu_count(10, share) == expected


def test_dpu_count_never_decreases_with_the_share():
    counts = [dpu_count(257, s / 100) for s in range(101)]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 257


# ------------------------------------------------------------------------------------- auto_share
def share(T, n=1000, dpu=0.01, dpu_ranks=1, host=0.001, host_ranks=1):
    return auto_share(T, n, dpu, dpu_ranks, host, host_ranks)


def test_auto_share_formula_on_hand_examples():
    # A = 1000 * 0.01 / 1 = 10 s on the DPU, B = 1000 * 0.001 / 1 = 1 s on the host
    assert share(0.0) == pytest.approx(1 / 11)            # (0 + 1) / (10 + 1)
    assert share(4.0) == pytest.approx(5 / 11)            # (4 + 1) / 11
    # A = 1000 * 0.02 / 4 = 5, B = 1000 * 0.004 / 2 = 2: (1.5 + 2) / 7
    assert share(1.5, dpu=0.02, dpu_ranks=4, host=0.004, host_ranks=2) == pytest.approx(0.5)


def test_auto_share_is_one_when_training_covers_all_dpu_validation():
    assert share(10.0) == 1.0              # T == A: exactly enough time
    assert share(100.0) == 1.0             # clipped
    assert share(0.0, dpu=0.0) == 1.0      # a free DPU takes everything


def test_auto_share_is_zero_without_any_time():
    assert share(0.0, host=0.0) == 0.0     # T + B = 0: nothing fits on the DPU
    assert share(-5.0) == 0.0              # clipped below


def test_auto_share_with_zero_costs_is_one():
    assert share(0.0, dpu=0.0, host=0.0) == 1.0
    assert share(0.0, n=0) == 1.0


def test_auto_share_treats_zero_ranks_as_one():
    assert share(2.0, dpu_ranks=0, host_ranks=0) == share(2.0, dpu_ranks=1, host_ranks=1)


def test_auto_share_grows_with_training_time():
    shares = [share(t / 2) for t in range(30)]
    assert shares == sorted(shares) and shares[0] < shares[-1] == 1.0


def test_auto_share_grows_with_dpu_speed_and_dpu_ranks():
    slow_to_fast = [share(2.0, dpu=c) for c in (0.1, 0.05, 0.02, 0.01, 0.005, 0.001)]
    assert slow_to_fast == sorted(slow_to_fast) and slow_to_fast[0] < slow_to_fast[-1]
    more_ranks = [share(2.0, dpu_ranks=k) for k in range(1, 9)]
    assert more_ranks == sorted(more_ranks) and more_ranks[0] < more_ranks[-1]


def test_auto_share_dpu_finishes_within_the_next_host_epoch():
    """f*A <= T + (1-f)*B for the returned f (equality when f is not clipped): the DPU part ends
    by the time the host ranks have trained an epoch and evaluated their own part."""
    rng = random.Random(7)
    for _ in range(2000):
        T, n = rng.uniform(0, 100), rng.randint(1, 50_000)
        dpu, host = rng.uniform(1e-5, 1e-1), rng.uniform(1e-6, 1e-2)
        dpu_ranks, host_ranks = rng.randint(1, 16), rng.randint(1, 16)
        f = auto_share(T, n, dpu, dpu_ranks, host, host_ranks)
        A, B = n * dpu / dpu_ranks, n * host / host_ranks
        assert 0.0 <= f <= 1.0
        assert f * A <= T + (1 - f) * B + 1e-9 * (A + B + T)
        if f < 1:  # the largest such f: moving any more to the DPU would overrun
            assert f * A == pytest.approx(T + (1 - f) * B, rel=1e-9)
