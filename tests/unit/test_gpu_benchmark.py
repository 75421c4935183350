"""benchmarks/gpu.py (issue 12's table): the arithmetic behind its rates and targets (pure), and the
whole benchmark on a CPU with --quick, as CI runs it (its numbers say nothing about a GPU).

(The tests of this feature that start processes: tests/jobs/test_gpu_benchmark.py.)
"""

from __future__ import annotations

import pytest

from benchmarks import gpu, harness


def _log(step_times, epochs=(), digests=("a",), losses=((1.0,),), stdout=""):
    host = [{"epoch": i, "step_times": list(step_times), "batch_digest": d} for i, d in enumerate(digests)]
    records = [{"epoch": i, "samples_per_s": r, "train_time": t, "step_losses": list(ls)}
               for i, ((r, t), ls) in enumerate(zip(epochs or [(1.0, 1.0)] * len(losses), losses))]
    return harness.RunLog(records, host, {}, None, 1.0, stdout)


LAYOUT = gpu.Layout(host=tuple(range(8)), dpu=tuple(range(8, 16)), speed=0.5, device="cuda", long_steps=40,
                    short_steps=8, short_epochs=4, digests=False)


def test_steady_rate_is_the_second_half_of_the_epoch_and_short_rate_keeps_the_edges():
    log = _log([9.0, 5.0, 1.0, 1.0])  # start-up and the pipeline filling in the first half
    assert gpu.steady_rate(log, 256) == 256 * 2 / 2.0
    short = _log([], epochs=[(10.0, 5.0), (100.0, 2.0), (50.0, 2.0)], losses=((1.0,),) * 3)
    assert gpu.short_rate(short) == pytest.approx((200 + 100) / 4)  # epochs 2.. only: samples / seconds


def test_same_training_needs_every_epochs_batches_and_on_a_cpu_the_losses():
    a = _log([1.0], digests=("x", "y"), losses=((1.0, 2.0),))
    assert gpu.same_training(a, _log([1.0], digests=("x", "y"), losses=((1.0, 2.0),)), losses=True)
    assert not gpu.same_training(a, _log([1.0], digests=("x", "z"), losses=((1.0, 2.0),)), losses=False)
    other_losses = _log([1.0], digests=("x", "y"), losses=((1.0, 2.5),))
    assert gpu.same_training(a, other_losses, losses=False) and not gpu.same_training(a, other_losses, losses=True)
    assert not gpu.same_training(_log([1.0], digests=(None,)), _log([1.0], digests=(None,)), losses=False)


def test_share_cores_and_targets_from_the_issues_numbers():
    """h = 8 host + d = 8 DPU cores at s = 0.5, resnet50 on the H100: GPU 3,983 img/s, 202 per core."""
    assert LAYOUT.fixed_share == round(8 / 12, 3)
    need = gpu.needed_cores(3983.0, 202.0, LAYOUT)
    assert need == {"dpu_only": 36, "beside_host_cores": 20}  # 0.9 x 3,983 = 3,585 img/s of 101-img/s cores
    r = {"ceiling_img_s": 3983.0, "per_core_img_s": 202.0,
         "img_s": {v: {"median": x} for v, x in {"peer": 1519.0, "da": 800.0, "share auto": 2200.0,
                                                   "share 1.0": 1500.0}.items()},
         "short_img_s": {"ours short": {"median": 2150.0}},
         "predicted": {"img_s": {"da": 808.0, "share auto": 2424.0}}}
    rows = {t["target"]: t for t in gpu.targets(r, LAYOUT)}
    bound = min(3983.0, 1519.0 + 0.5 * 8 * 202.0)
    assert rows["share auto / min(GPU-bound, peer + s·d·core)"]["value"] == pytest.approx(2200 / bound)
    assert rows["share auto / min(GPU-bound, peer + s·d·core)"]["met"]
    assert rows["share 1.0 / peer (same cores)"]["met"] == (1500 / 1519 >= 0.97)
    assert rows["ours short / ours long (share auto)"]["value"] == pytest.approx(2150 / 2200)
    err = rows["model prediction error, share auto"]
    assert err["value"] == pytest.approx(2424 / 2200 - 1) and not err["met"]  # +10.2 %
    assert rows["model prediction error, da"]["met"]


def test_the_models_predictions_of_the_variants():
    probed = {"aug_s": 1 / 202, "step_s": 256 / 3983, "h2d_s": 0.006, "memcpy_s": 0.006}
    pred = gpu.predictions(gpu.profile_of(gpu.WORKLOADS["resnet50"], LAYOUT, probed), LAYOUT)
    transfer = 0.006  # the DPU rank's send of a batch, a memcpy
    assert pred["img_s"]["peer"] == pytest.approx(8 * 202)
    assert pred["img_s"]["da"] == pytest.approx(256 / (256 / (8 * 101) + transfer))
    assert pred["img_s"]["share 1.0"] == pytest.approx(8 * 202)
    assert pred["img_s"]["share auto"] > pred["img_s"]["share fixed"] * 0.99 > 8 * 202
    assert pred["balanced_share"] == pytest.approx(0.667, abs=0.01)


def test_the_share_auto_prints_is_read_from_the_jobs_output():
    line = "[dpuoffload] --da-host-share auto: 0.398 of every epoch's steps built on the host ranks (host ...)"
    assert gpu.printed_share(_log([1.0], stdout=f"x\n{line}\n")) == 0.398
    assert gpu.printed_share(_log([1.0])) is None


def test_variants_picks_a_part_of_the_table_and_names_the_choices():
    todo = {"peer": 1, "da": 2, "share auto": 3}
    assert gpu.chosen(todo, None) == todo and gpu.chosen(todo, ["share auto", "peer"]) == {"peer": 1, "share auto": 3}
    with pytest.raises(SystemExit, match=r"--variants dd: not a variant of this run; choose from 'peer', 'da', "):
        gpu.chosen(todo, ["dd"])
    log = _log([2.0, 1.0, 1.0, 1.0], epochs=[(256.0, 4.0)])
    parts = {"interpreter and imports": 2.5, "data sets": 3.0, "feed": 0.1, "model on its device": 0.4}
    log.epochs[0]["epoch_time"], log.wall, log.end = 4.5, 12.0, {"startup_s": 6.0, "startup_parts_s": parts}
    assert gpu.job_summary(log, "da", 256) == {"img_s": 256.0, "train_s": 4.0, "wall_s": 12.0, "startup_s": 6.0,
                                               "val_s": 0.5, "other_s": 1.5, "startup_parts_s": parts,
                                               "first_step_s": 2.0}  # (the first step waits for the first batch)
    assert gpu.largest_parts(parts) == "data sets 3.0 s, interpreter and imports 2.5 s, model on its device 0.4 s"
    assert gpu.largest_parts({}) == ""  # (results of a run before 2026-11-27's ninth session)
