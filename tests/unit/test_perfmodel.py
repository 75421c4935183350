"""The performance model (pure): each mode's epoch from a profile, the choice, the projection."""

import math
from dataclasses import replace

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


def test_the_uint8_wire_puts_the_float_steps_on_the_host_and_only_the_integer_part_on_the_dpu():
    """Under the uint8 wire the host runs the float steps of each batch it receives (fin_h, in its
    step: da's data phase, 0.6 ms a step for resnet20 that the model missed), the DPU only its part
    of the transform (`dpu_send_aug`); naive's DPU replica still builds whole float samples."""
    from dpuoffload.common.plan.perfmodel import balanced_host_share

    wire = dict(host_finish=0.0002, dpu_send_aug=0.0008)
    pred = predict("da", profile(**wire))
    assert pred.train_s == pytest.approx(32 * (16 * (0.004 + 0.0002) + 0.003)) and pred.bottleneck == "host compute"
    slow = predict("da", profile(dpu_aug=0.02, host_finish=0.0002, dpu_send_aug=0.01))
    assert slow.train_s == pytest.approx(32 * (16 * 0.01 + 0.0001)) and slow.bottleneck == "DPU augmentation"
    assert predict("naive", profile(**wire)) == predict("naive", profile())
    assert predict("none", profile(**wire)) == predict("none", profile())
    # a host share: the host finishes only the (1-s) of the steps the DPU sent
    shared = predict("da", profile(**wire, host_share=0.25, host_workers=0))
    assert shared.train_s == pytest.approx(32 * (16 * 0.004 + 0.003 + 0.75 * 16 * 0.0002 + 0.25 * 16 * 0.0005))
    # balanced in process: the share s also sheds s*f of float steps, s = (d - step - f) / (h + d - f)
    p0 = profile(dpu_aug=0.02, dpu_send_aug=0.01, host_aug=0.01, host_finish=0.001, host_workers=0, transfer=0.0)
    d, step, h, f = 16 * 0.01, 16 * 0.004 + 0.003, 16 * 0.01, 16 * 0.001
    s = balanced_host_share(p0)
    assert s == round((d - step - f) / (h + d - f), 3)
    assert step + s * h + (1 - s) * f == pytest.approx((1 - s) * d, rel=1e-2)  # neither side waits


# ----------------------------------------------------------------------- GPU host ranks (issue 12)
# The measurements on one H100 + 16 x86 cores, resnet50 at 224 px, batch 256: the GPU trains
# 3,983 img/s on batches already there; one core decodes + augments 202 img/s.
GPU_RATE, CORE_RATE, B = 3983.0, 202.0, 256
N = 100 * B  # whole steps: img/s = N / train_s exactly


def gpu_profile(**over):
    base = dict(n_train=N, n_val=0, host_ranks=1, dpu_ranks=1, batch=B, host_aug=1 / CORE_RATE,
                host_train=0.3, host_eval=0.0, dpu_aug=1 / CORE_RATE, dpu_train=1.0, dpu_eval=0.0,
                allreduce=0.0, optimizer=0.01, transfer=0.0, gpu_step=B / GPU_RATE, h2d=0.006, host_cpu=0.006)
    base.update(over)
    return Profile(**base)


def rate(mode, p):
    return N / predict(mode, p).train_s


def test_a_gpu_host_is_bound_by_the_slowest_of_gpu_step_copy_and_host_cpu_never_their_sum():
    """Launches are asynchronous and the copy runs on a side stream: the three overlap. The CPU
    training cost (host_train, optimizer) no longer enters: the GPU's step replaces it."""
    fed = gpu_profile(none_workers=20)  # 20 x 202 = 4,040 img/s of augmentation: the GPU bounds
    assert rate("none", fed) == pytest.approx(GPU_RATE)
    copy_bound = gpu_profile(none_workers=20, h2d=0.1)  # a pageable copy slower than the step
    assert rate("none", copy_bound) == pytest.approx(B / 0.1)
    cpu_bound = gpu_profile(none_workers=20, host_cpu=0.08)
    assert rate("none", cpu_bound) == pytest.approx(B / 0.08)
    assert predict("none", gpu_profile(none_workers=20, allreduce=0.01)).train_s == pytest.approx(
        100 * (B / GPU_RATE + 0.01))  # the gradient allreduce waits for the backward pass: it adds


def test_the_peer_on_a_gpu_host_is_its_workers_or_the_gpu():
    """none with W DataLoader workers: min(GPU-bound, W x per-core rate); 14 workers: 2,828 img/s."""
    assert rate("none", gpu_profile(none_workers=14)) == pytest.approx(min(GPU_RATE, 14 * CORE_RATE))
    assert rate("none", gpu_profile(none_workers=14)) == pytest.approx(2828)
    assert rate("none", gpu_profile(none_workers=4)) == pytest.approx(808)
    # the built-in trainer's none builds in its training process: one core, plus its own CPU work
    assert rate("none", gpu_profile()) == pytest.approx(B / (B / CORE_RATE + 0.006))


def test_da_with_d_dpu_cores_at_speed_s_feeds_s_d_cores_worth():
    """8 DPU worker processes at half a core each: 8 x 0.5 x 202 = 808 img/s, the GPU idles 80 %."""
    p = gpu_profile(dpu_aug=1 / (0.5 * CORE_RATE), dpu_workers=8)
    pred = predict("da", p)
    assert rate("da", p) == pytest.approx(808) and pred.bottleneck == "DPU augmentation"
    with_transfer = gpu_profile(dpu_aug=1 / (0.5 * CORE_RATE), dpu_workers=8, transfer=0.01)
    assert predict("da", with_transfer).train_s == pytest.approx(100 * (B / 808 + 0.01))
    many = gpu_profile(dpu_aug=1 / CORE_RATE, dpu_workers=32)  # 32 x 202 > 3,983: the GPU bounds
    assert rate("da", many) == pytest.approx(GPU_RATE) and predict("da", many).bottleneck == "host compute"


def test_host_and_dpu_shares_add_their_cores_up_to_the_gpu_and_auto_balances_them():
    """h = 8 host workers + d = 8 DPU workers at s = 0.5: 8 x 202 + 8 x 101 = 2,424 img/s at the
    balanced share 2/3, which is what --da-host-share auto (host_share None) picks."""
    from dpuoffload.common.plan.perfmodel import balanced_host_share, feeding_terms

    p = gpu_profile(dpu_aug=1 / (0.5 * CORE_RATE), dpu_workers=8, host_workers=8, host_share=None)
    share = balanced_host_share(p)
    assert share == round(2 / 3, 3)
    terms = feeding_terms(p, 1, 2 / 3)
    assert terms["host augmentation"] == pytest.approx(terms["DPU augmentation"]) == pytest.approx(B / 2424)
    assert predict("da", p).detail["host_share"] == share
    assert rate("da", p) == pytest.approx(2424, rel=1e-3)
    for fixed in (0.5, 0.8):  # any other share leaves one side waiting: slower
        assert rate("da", replace(p, host_share=fixed)) < rate("da", p)
    # 14 host workers + 16 DPU workers at half speed: 2,828 + 1,616 > 3,983, the GPU bounds
    enough = gpu_profile(dpu_aug=1 / (0.5 * CORE_RATE), dpu_workers=16, host_workers=14, host_share=None)
    assert rate("da", enough) == pytest.approx(GPU_RATE)
    # share 1.0: the host's workers alone, as the peer with as many workers
    assert rate("da", gpu_profile(host_workers=14, host_share=1.0)) == pytest.approx(
        rate("none", gpu_profile(none_workers=14)))


def test_in_process_share_on_a_gpu_host_balances_against_its_cpu_not_its_gpu_step():
    """H = 0: the host builds its share in the training process, beside the GPU's step: the share
    is (d - host_cpu) / (h + d), whatever the GPU takes."""
    from dpuoffload.common.plan.perfmodel import balanced_host_share

    p = gpu_profile(dpu_aug=1 / (0.5 * CORE_RATE), dpu_workers=8, host_workers=0, host_share=None)
    d, h = B / 808, B / CORE_RATE
    assert balanced_host_share(p) == round((d - 0.006) / (h + d), 3)
    assert balanced_host_share(replace(p, gpu_step=1.0)) == balanced_host_share(p)


def test_auto_on_a_gpu_host_picks_da_at_the_balanced_share_and_cpu_profiles_are_unchanged():
    p = gpu_profile(dpu_aug=1 / (0.5 * CORE_RATE), dpu_workers=8, host_workers=8, host_share=None)
    assert choose(p) == "da"
    assert predict_all(p)["da"].detail["host_share"] == round(2 / 3, 3)
    assert "naive" not in predict_all(p)  # CPU replicas: nothing in a GPU profile predicts them
    cpu = profile()  # no GPU fields: the CPU formulas, to the bit
    assert predict("none", cpu).train_s == 32 * (16 * (0.004 + 0.0005) + 0.002 + 0.001)
    with pytest.raises(ValueError, match="gpu_step must be >= 0"):
        gpu_profile(gpu_step=-1.0)


def test_the_host_step_beside_working_dpu_ranks_enters_da_and_hybrid_only():
    """`host_beside` (the host's forward/backward beside DPU ranks building batches, over it beside
    idle ones) scales train_h in the modes whose DPU ranks build while the host trains: da and
    hybrid's training term. none and mv keep the step timed beside waiting DPU ranks."""
    p = profile(dpu_ranks=2)
    slowed = replace(p, host_beside=1.25)
    for mode in ("none", "mv"):
        assert predict(mode, slowed).epoch_s == predict(mode, p).epoch_s
    for mode in ("da", "hybrid"):
        assert predict(mode, slowed).train_s == pytest.approx(32 * (16 * 0.004 * 1.25 + 0.003))
    with pytest.raises(ValueError, match="host_beside must be >= 1"):
        profile(host_beside=0.9)


def test_the_in_process_host_share_balances_against_the_slowed_step():
    """With --da-host-workers 0 the host's share adds to its step as slowed beside the DPU ranks,
    so the balanced share is (d - step_beside) / (h + d)."""
    from dpuoffload.common.plan.perfmodel import balanced_host_share

    p = profile(dpu_aug=0.01, host_workers=0, host_share=None, host_beside=1.5)
    h, d = 16 * 0.0005, 16 * 0.01 + 0.0001
    assert balanced_host_share(p) == round((d - (16 * 0.004 * 1.5 + 0.003)) / (h + d), 3)
