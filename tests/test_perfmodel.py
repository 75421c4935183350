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


# ----------------------------------------------------------------------- da with a host share
def test_a_host_share_splits_the_feeding_between_host_workers_and_the_dpu():
    """--da-host-share s: the DPU builds (1-s) of the steps, the host's H workers the rest beside
    training; the slowest of the three sides bounds the step."""
    p = profile(dpu_aug=0.01, host_aug=0.01, host_share=0.5, host_workers=1)
    pred = predict("da", p)
    assert pred.train_s == pytest.approx(32 * 0.5 * (16 * 0.01 + 0.0001)) and pred.bottleneck == "DPU augmentation"
    assert pred.detail["host_share"] == 0.5
    slow_host = predict("da", profile(dpu_aug=0.01, host_aug=0.03, host_share=0.5, host_workers=1))
    assert slow_host.bottleneck == "host augmentation" and slow_host.train_s == pytest.approx(32 * 0.5 * 16 * 0.03)
    in_process = predict("da", profile(dpu_aug=0.01, host_aug=0.01, host_share=0.5, host_workers=0))
    assert in_process.train_s == pytest.approx(32 * (16 * 0.004 + 0.003 + 0.5 * 16 * 0.01))  # added to the step
    workers = predict("da", profile(dpu_aug=0.01, dpu_workers=4))  # 4 DPU processes per stream
    assert workers.train_s == pytest.approx(32 * (16 * 0.004 + 0.003)) and workers.bottleneck == "host compute"


def test_auto_share_balances_host_and_dpu_so_neither_waits():
    """The balanced share makes both producers equally fast per step; it is what predict uses for
    host_share None (auto), per mode (hybrid has fewer augmentation ranks than da)."""
    from dpuoffload.common.plan.perfmodel import balanced_host_share, feeding_terms

    p = profile(dpu_aug=0.01, host_aug=0.02, host_workers=2, transfer=0.0)  # host 2 workers = DPU 1 process
    assert balanced_host_share(p) == 0.5
    terms = feeding_terms(p, 1, 0.5)
    assert terms["host augmentation"] == pytest.approx(terms["DPU augmentation"])
    auto = predict("da", profile(dpu_aug=0.01, host_aug=0.02, host_workers=2, transfer=0.0, host_share=None))
    assert auto.detail["host_share"] == 0.5 and auto.train_s == pytest.approx(32 * 0.5 * 16 * 0.01)
    # in process (H = 0) the host's own share lengthens its step: (d - step) / (h + d), clipped to [0, 1]
    p0 = profile(dpu_aug=0.01, host_aug=0.01, host_workers=0, transfer=0.0)
    d, step, h = 16 * 0.01, 16 * 0.004 + 0.003, 16 * 0.01
    assert balanced_host_share(p0) == round((d - step) / (h + d), 3)
    assert balanced_host_share(profile(dpu_aug=0.0001, host_workers=0)) == 0.0  # the DPU keeps up alone
    # hybrid: half the DPU ranks augment, so each feeds twice the host ranks and the host takes more
    p4 = profile(host_ranks=4, dpu_ranks=4, dpu_aug=0.01, host_aug=0.02, host_workers=2, transfer=0.0,
                 host_share=None)
    assert predict("hybrid", p4).detail["host_share"] > predict("da", p4).detail["host_share"]
