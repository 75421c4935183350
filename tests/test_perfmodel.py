"""The performance model (pure): each mode's epoch from a profile, the choice, the projection."""

import math

import pytest

from dpuoffload.common.plan.perfmodel import (
    Profile,
    choose,
    format_table,
    predict,
    predict_all,
    project,
    ring_allreduce_s,
)


def profile(**over):
    base = dict(n_train=512, n_val=256, host_ranks=1, dpu_ranks=1, batch=16, host_aug=0.0005,
                host_train=0.004, host_eval=0.001, dpu_aug=0.001, dpu_train=0.008, dpu_eval=0.002,
                allreduce=0.002, optimizer=0.001, transfer=0.0001)
    base.update(over)
    return Profile(**base)


def test_none_is_steps_times_step_plus_validation():
    p = profile()
    steps = 512 / 16
    assert predict("none", p).epoch_s == pytest.approx(steps * (16 * 0.0045 + 0.003) + 256 * 0.001)


def test_da_removes_augmentation_while_the_dpu_keeps_up_and_is_bound_by_it_when_not():
    fast = predict("da", profile())
    assert fast.train_s == pytest.approx(32 * (16 * 0.004 + 0.003)) and fast.bottleneck == "host compute"
    slow = predict("da", profile(dpu_aug=0.01))  # 16 * 10 ms per batch > the host step
    assert slow.train_s == pytest.approx(32 * (16 * 0.01 + 0.0001)) and slow.bottleneck == "DPU augmentation"


def test_da_fan_out_multiplies_the_dpu_work_per_step():
    p = profile(host_ranks=4, dpu_ranks=2, dpu_aug=0.004)
    assert predict("da", p).train_s == pytest.approx(math.ceil(512 / 64) * 2 * (16 * 0.004 + 0.0001))


def test_mv_moves_validation_off_the_host_up_to_what_the_dpu_finishes():
    p = profile()
    none, mv = predict("none", p), predict("mv", p)
    assert mv.detail["mv_fraction"] == 1.0 and mv.epoch_s == pytest.approx(none.train_s)
    slow = predict("mv", profile(dpu_eval=0.1))  # DPU validation would outlast a whole epoch
    assert 0 < slow.detail["mv_fraction"] < 1
    assert slow.epoch_s == pytest.approx(slow.detail["dpu_validation_s"])  # balanced: both end together
    assert predict("mv", profile(mv_fraction=0.5)).validation_s == pytest.approx(128 * 0.001)


def test_naive_balances_the_dpu_batch_and_weights_in_the_larger_allreduce():
    p = profile(allreduce_all=0.004)
    pred = predict("naive", p)
    assert pred.detail["dpu_batch"] == 8  # 16 * 4.5 ms / 9 ms
    steps = math.ceil(512 / (16 + 8))
    assert pred.train_s == pytest.approx(steps * (max(16 * 0.0045, 8 * 0.009) + 0.004 + 0.001))


def test_choice_and_modes_that_cannot_run():
    assert set(predict_all(profile(dpu_ranks=0))) == {"none"}
    assert "hybrid" not in predict_all(profile(dpu_ranks=1)) and "hybrid" in predict_all(profile(dpu_ranks=2))
    heavy_aug = predict_all(profile(host_aug=0.02, dpu_aug=0.02, dpu_ranks=2))
    assert heavy_aug["da"].epoch_s < heavy_aug["mv"].epoch_s < heavy_aug["none"].epoch_s
    # two DPU replicas almost as fast as the host: naive triples the throughput and wins
    assert choose(profile(host_aug=0.02, dpu_aug=0.02, dpu_ranks=2), allow=("naive",)) == "naive"
    slow = predict_all(profile(dpu_aug=1.0, dpu_train=1.0, dpu_eval=1.0, n_val=16))
    assert slow["da"].epoch_s > slow["none"].epoch_s and slow["naive"].epoch_s > slow["none"].epoch_s
    assert slow["mv"].epoch_s > 0.99 * slow["none"].epoch_s  # a hopeless DPU takes almost no validation
    assert choose(profile(dpu_ranks=0)) == "none"
    with pytest.raises(ValueError, match="needs DPU ranks"):
        predict("da", profile(dpu_ranks=0))
    assert "<- chosen" in format_table(predict_all(profile()), "mv")


def test_ring_allreduce_and_projection():
    assert ring_allreduce_s(1_000_000, 1, 1e9, 1e-6) == 0.0
    assert ring_allreduce_s(1_000_000, 4, 1e9, 1e-6) == pytest.approx(6 * (1e-6 + 250_000 / 1e9))
    big = project(profile(), nodes=16, host_per_node=8, dpu_per_node=8, grad_bytes=1_000_000,
                  bandwidth_Bps=12.5e9, latency_s=2e-6)
    assert (big.host_ranks, big.dpu_ranks) == (128, 128)
    assert big.allreduce_all > big.allreduce > 0
    assert predict("none", big).epoch_s < predict("none", profile()).epoch_s  # more ranks, shorter epoch
