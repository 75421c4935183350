"""The benchmark commands keep working (quick variants; the numbers themselves go to RESULTS.md),
and the arithmetic behind the reported ratios is right (pure, no processes).

(The tests of this feature that start processes: tests/jobs/test_benchmarks.py.)
"""

import sys

import pytest

from benchmarks import harness, peer_host, workloads
from tests.mpijobs import REPO


# ------------------------------------------------------------------------------- pure arithmetic
def _log(epoch_times, host_phases, dpu_phases=None):
    """A RunLog of steady epochs 1.. after a warm-up epoch 0 (which every statistic must skip)."""
    epochs = [{"epoch": i, "epoch_time": t} for i, t in enumerate([99.0, *epoch_times])]
    host = [{"epoch": i, "epoch_time": t, "steps": 4, "phases": p}
            for i, (t, p) in enumerate(zip([99.0, *epoch_times], [{"data": 50.0}, *host_phases]))]
    dpus = {}
    if dpu_phases is not None:
        dpus[1] = [{"epoch": i, "role": "dpu", "phases": p} for i, p in enumerate([{"augment": 50.0}, *dpu_phases])]
    return harness.RunLog(epochs, host, dpus, None, 1.0)


def test_da_bound_is_the_max_of_host_without_data_and_dpu_augmentation():
    none = [_log([10.0, 12.0], [{"data": 2.0}, {"data": 2.0}])]
    da_dpu_light = [_log([9.0], [{"data": 0.1}], [{"augment": 3.0, "send": 0.5, "buffer_wait": 5.0}])]
    host, dpu, bound = workloads.da_bound(none, da_dpu_light)
    assert host == [9.0] and dpu == [3.5] and bound == [9.0]  # medians of 8 and 10; buffer_wait is not work
    da_dpu_heavy = [_log([9.0], [{"data": 0.1}], [{"augment": 20.0, "send": 1.0}])]
    assert workloads.da_bound(none, da_dpu_heavy)[2] == [21.0]


def test_auto_is_compared_with_the_best_mode_overall_and_its_own_choice_on_steady_epochs():
    """The best mode is the one with the shortest median over all repetitions (mv: 2.35 s), not the
    fastest of each repetition (that would be the minimum of noisy values); each repetition's auto
    epoch is divided by that mode's in the same repetition, and by the mode auto chose."""
    def run(times, chosen=None):
        log = _log(times, [{"data": 1.0}] * len(times))
        log.auto = {"chosen": chosen} if chosen else None
        return log

    by = {"none": [run([4.0, 4.0]), run([4.0])], "da": [run([3.0, 3.0]), run([2.0])], "mv": [run([2.5]), run([2.2])],
          "auto": [run([2.6, 2.6], "mv"), run([2.2], "da")]}  # (epoch 0, 99 s, is warm-up: never counted)
    r = workloads.auto_vs_best(by)
    assert r["best_mode"] == "mv" and r["chosen"] == ["mv", "da"]
    assert r["ratio"]["min"] == pytest.approx(1.0) and r["ratio"]["max"] == pytest.approx(1.04)
    assert r["vs_chosen"]["min"] == pytest.approx(1.04) and r["vs_chosen"]["max"] == pytest.approx(1.1)
    assert r["epoch_s"]["median"] == 2.6
    assert r["vs_chosen_each"] == pytest.approx([1.04, 1.1])
    assert r["ratio_each"] == pytest.approx([1.04, 1.0])  # (auto over mv, the best mode, in each repetition)
    left = workloads.leftover_cost({"w": {"auto": r}, "v": {"auto": {"vs_chosen_each": [1 / 1.04, 1 / 1.1]}}})
    assert left["n"] == 4 and left["geomean"] == pytest.approx(1.0) and left["low"] < 1.0 < left["high"]
    steady = workloads.geomean_interval([1.01, 1.01, 1.01])  # (no spread: the interval is the mean itself)
    assert steady["geomean"] == pytest.approx(1.01) and steady["low"] == pytest.approx(1.01) == steady["high"]
    assert workloads.geomean_interval([]) is None


def test_same_job_errors_are_auto_s_own_and_results_without_them_print_a_dash():
    """The error each auto job printed at its end (its prediction for its choice against its own
    epochs); a job that logged none (one that trained no epoch) is left out, not read as 0."""
    def auto(record):
        log = _log([1.0], [{"data": 0.0}])
        log.auto = record
        return log

    logs = [auto({"chosen": "mv", "prediction_error": -0.08}), auto({"chosen": "mv"}),
            auto({"chosen": "da", "prediction_error": 0.02})]
    assert workloads.same_job_errors(logs) == [-0.08, 0.02]
    assert workloads.fmt_errors([-0.08, 0.02, 0.05]) == "+2.0% (-8.0% to +5.0%)"
    assert workloads.fmt_errors(None) == "-" and workloads.fmt_errors([]) == "-"


def test_rotation_puts_every_variant_once_in_every_place():
    orders = [workloads.rotation(workloads.VARIANTS, rep) for rep in range(len(workloads.VARIANTS))]
    assert all(sorted(o) == sorted(workloads.VARIANTS) for o in orders)
    for place in range(len(workloads.VARIANTS)):
        assert sorted(o[place] for o in orders) == sorted(workloads.VARIANTS)
    assert workloads.rotation(workloads.VARIANTS, 0) == workloads.VARIANTS


def test_the_prediction_is_rescaled_by_the_machine_speed_each_repetition_started_at():
    """Repetition 1: auto's profile ran at 20 ms, mv's job at 30 ms (1.5x slower): its prediction
    2.0 s reads 3.0 s at that speed; repetition 2: both at 25 ms. The raw error stays as it was."""
    def auto(pred, ms):
        log = _log([1.0], [{"data": 0.0}])
        log.auto, log.machine_ms = {"predicted": {"mv": pred}, "chosen": "mv", "profile": {}}, ms
        return log

    def mv(ms):
        log = _log([2.9], [{"data": 0.0}])
        log.machine_ms = ms
        return log

    assert workloads.speed_adjusted([auto(2.0, 20.0), auto(2.2, 25.0)], [mv(30.0), mv(25.0)], "mv") == \
        pytest.approx((3.0 + 2.2) / 2)
    assert workloads.speed_adjusted([auto(2.0, None)], [mv(30.0)], "mv") is None  # (results without probes)


def test_ratio_spread_pairs_repetitions():
    r = harness.ratio_spread([2.0, 4.0, 3.0], [1.0, 2.0, 3.0])
    assert r["median"] == 1.5 and r["min"] == 1.0 and r["max"] == 2.0 and r["n"] == 3


def test_peer_batches_carry_their_epoch_and_match_the_distributed_sampler():
    from torch.utils.data import DistributedSampler

    class Seeded:  # PerSampleSeeded's interface: set_epoch + __getitems__
        epoch = -1

        def __len__(self):
            return 10

        def set_epoch(self, e):
            self.epoch = e

        def __getitems__(self, idx):
            return [(self.epoch, i) for i in idx]

    ds = Seeded()
    batches = peer_host.TaggedBatches(DistributedSampler(ds, num_replicas=1, rank=0, seed=0), 4, drop_last=False)
    batches.set_epoch(3)
    keys = list(batches)
    plain = DistributedSampler(ds, num_replicas=1, rank=0, seed=0)
    plain.set_epoch(3)
    assert [i for b in keys for _, i in b] == list(plain) and len(batches) == 3
    assert peer_host.EpochTagged(ds).__getitems__(keys[0]) == [(3, i) for _, i in keys[0]]


def test_peer_command_is_dpuruns_host_command_with_the_peer_program():
    cmd = workloads.peer_cmd(["--mode", "none"], 1, "1", "/sys/fs/cgroup/cpu/x")
    i = cmd.index(str(REPO / "benchmarks" / "peer_host.py"))
    assert cmd[i - 1] == sys.executable and "dpuoffload.host" not in cmd
    assert cmd[i + 1:cmd.index("--", i) + 1] == ["--workers", "1", "--cores", "1", "--prefetch", "4", "--cgroup",
                                                 "/sys/fs/cgroup/cpu/x", "--"]
    assert cmd[cmd.index("taskset") + 2] == "0" and ":" not in cmd  # host core only, no DPU program


def test_checkpoint_overhead_is_ckpt_step_and_next_minus_ordinary():
    from benchmarks import checkpoint

    phases = [{"first_global_step": 1, "step_times": [9.0, 9.0, 1.0, 3.0, 2.0, 1.0, 1.0]},
              {"first_global_step": 8, "step_times": [1.0, 1.0]}]
    handoffs = [{"global_step": 4, "blocked_s": 0.5}, {"global_step": 9, "blocked_s": 0.25}]
    s = checkpoint.summarize(phases, handoffs)
    assert s["ordinary_step_s"] == 1.0                 # steps 3, 6, 7, 8 (1-2 are warm-up; 4-5 and 9 have ckpts)
    assert s["overhead_s"] == [1.5]                    # (3 + 2) / 2 - 1; step 9 has no next step: skipped
    assert s["blocked_s"] == [0.5, 0.25] and s["checkpoints"] == 2


def test_clone_metrics_from_step_times_and_wall_clock_stamps():
    from benchmarks import clone

    phases = [{"first_global_step": 1, "step_times": [9.0, 9.0, 1.0, 1.0, 4.0, 2.0, 1.0, 1.0]}]
    handoffs = [{"kind": "clone", "global_step": 5, "blocked_s": 0.5, "wall_time": 100.5}]
    start = {"standby_s": 7.0, "ready_time": 100.75, "rebuild_s": 0.125, "state_sha256": "ab"}
    s = clone.summarize(phases, handoffs, start, {"received_time": 100.5625})
    assert s["ordinary_step_s"] == 1.0            # steps 3, 4, 7, 8 (1-2 warm-up, 5-6 clone step and next)
    assert s["overhead_s"] == 2.0                 # (4 + 2) / 2 - 1
    assert s["readiness_s"] == 0.75               # ready at 100.75, hand-off began at 100.5 - 0.5
    assert (s["blocked_s"], s["standby_s"], s["clone_step"]) == (0.5, 7.0, 5)
    # where it went: packing 0.5, then the clone had every byte at 100.625 (the keeper at 100.5625), rebuild
    assert (s["after_pack_s"], s["at_keeper_s"], s["rebuild_s"]) == (0.125, 0.0625, 0.125)
    assert clone.summarize(phases, handoffs, start)["at_keeper_s"] is None   # (no keeper on the path)


def test_study_cells_fail_the_last_step_of_an_epoch_with_the_survivors_asked_for():
    from types import SimpleNamespace

    from benchmarks import study

    args = SimpleNamespace(points=[0.25, 0.75], progress=[0.5], survivors=[1, 3])
    cells = study.cells(args)
    assert [(c["recovery"], c["survivors"]) for c in cells[:3]] == [("rollback", None), ("lossy-forward", 1),
                                                                  ("lossy-forward", 3)] and len(cells) == 6
    assert [study.failed_epoch(p, 4) for p in (0.25, 0.5, 0.75)] == [1, 2, 3]
    with pytest.raises(SystemExit, match="must fall on the end of an epoch before the last"):
        study.failed_epoch(1.0, 4)
    # lossy forward with 1 survivor of 4 loses host ranks 1-3; rollback's one casualty is the last rank
    assert study.specs(cells[1], 4, 16) == ["host:1@16:50%", "host:2@16:50%", "host:3@16:50%"]
    assert study.specs(cells[0], 4, 16) == ["host:3@16:50%"]
    assert study.delta(0.30, 0.40) == "-10.0 (-25.0 %)"


def test_startup_compares_imports_ahead_with_imports_at_first_use_pair_by_pair():
    from benchmarks import startup

    walls = {"dpurun": [5.0, 6.0], "plain": [5.0, 5.0], "dpurun da": [5.0, 5.5], "dpurun da, imports late": [7.0, 8.5]}
    stats, summary = startup.summarize(walls)
    assert summary["dpurun"]["difference_s"]["median"] == 0.5 and summary["dpurun"]["ratio"] == 1.1
    ahead = summary["imports ahead"]
    assert (ahead["difference_s"]["min"], ahead["difference_s"]["max"]) == (-3.0, -2.0)
    assert ahead["ratio"] == pytest.approx(5.25 / 7.75)
    parts = {"dpurun": {"parts_s": {"MPI init + topology": 0.1}, "wall_s": 5.0}}
    text = startup.markdown(stats, summary, parts)
    assert "imported before MPI init − at first use: -2.50 (-3.00–-2.00) s per pair (ratio 0.68)" in text
    assert "| dpurun --mode da, imports at first use (DPUOFFLOAD_IMPORT_AHEAD=0) | 7.75 (7.00–8.50) |" in text
    assert "imports ahead" not in startup.summarize({k: walls[k] for k in ("dpurun", "plain")})[1]


def test_startup_compares_the_collector_paused_with_it_left_on_pair_by_pair():
    from benchmarks import startup

    walls = {"dpurun": [5.0, 6.0], "plain": [5.0, 5.0], "dpurun da": [5.0, 5.5],
             "dpurun da, collector on": [5.5, 6.5]}
    stats, summary = startup.summarize(walls)
    paused = summary["collector paused"]
    assert (paused["difference_s"]["min"], paused["difference_s"]["max"]) == (-1.0, -0.5)
    assert paused["ratio"] == pytest.approx(5.25 / 6.0)
    text = startup.markdown(stats, summary, {"dpurun": {"parts_s": {"MPI init + topology": 0.1}, "wall_s": 5.0}})
    assert "collector paused through start-up − left on: -0.75 (-1.00–-0.50) s per pair (ratio 0.88)" in text
    assert "| dpurun --mode da, the collector on through start-up (DPUOFFLOAD_GC_FREEZE=0) | 6.00 (5.50–6.50) |" in text


def test_multinode_table_compares_each_mode_to_none_and_checks_the_training():
    from benchmarks import multinode

    def log(times, losses, digest="w"):
        epochs = [{"epoch": i, "epoch_time": t, "step_losses": losses, "weights_sha256": digest}
                  for i, t in enumerate([9.0, *times])]
        return harness.RunLog(epochs, [], {}, None, 20.0)

    runs = {"none": [log([2.0, 2.0], [1.0, 0.5])], "da": [log([1.0, 3.0], [1.0, 0.5])],
            "mv": [log([4.0], [1.0, 0.25])]}
    r = multinode.summarize(runs)
    assert r["none"]["ratio_to_none"] == 1.0 and r["da"]["epoch_s"] == 2.0  # median of the steady epochs 2..
    assert (r["da"]["min_s"], r["da"]["max_s"]) == (1.0, 3.0) and r["mv"]["ratio_to_none"] == 2.0
    assert r["da"]["same_training_as_none"] and not r["mv"]["same_training_as_none"]


# --------------------------------------------------------------------------------- netmodel (pure)
def test_netmodel_reads_steady_allreduce_per_step_from_host_phase_records():
    from benchmarks import netmodel

    def rec(rank, epoch, allreduce, steps=4, role="host"):
        return {"world_rank": rank, "role": role, "epoch": epoch, "steps": steps, "phases": {"allreduce": allreduce}}

    records = [rec(0, 0, 9.0), rec(1, 0, 9.0), rec(0, 1, 0.4), rec(1, 1, 0.8), rec(0, 2, 0.2),
               rec(2, 1, 5.0, role="dpu"), rec(1, 2, 0.0, steps=0)]  # (a DPU rank's and an empty record: skipped)
    assert netmodel.logged_allreduce_s(records) == [0.1, 0.2, 0.05]  # epoch 0 is warm-up
    assert netmodel.logged_allreduce_s([rec(0, 0, 2.0)]) == [0.5]  # one epoch only: it counts


def test_netmodel_takes_the_last_arriving_rank_per_step_from_the_trace():
    from benchmarks import netmodel

    def span(rank, epoch, step, ms, name="allreduce"):
        return {"name": name, "ph": "X", "pid": rank, "ts": 0.0, "dur": ms * 1e3,
                "args": {"epoch": epoch, "step": step}}

    events = [span(0, 0, 1, 50.0), span(1, 0, 1, 40.0),                 # warm-up epoch: skipped
              span(0, 1, 2, 30.0), span(1, 1, 2, 3.0),                  # rank 1 came last: it waited 3 ms
              span(0, 1, 3, 2.0), span(1, 1, 3, 25.0),
              span(0, 1, 4, 1.0),                                       # one rank's span only: skipped
              span(0, 1, 5, 99.0, name="forward_backward"),
              {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "host rank 0"}}]
    assert netmodel.last_arriving_s(events) == pytest.approx([0.003, 0.002])


def test_netmodel_fits_the_link_and_predicts_the_ring_allreduce():
    from benchmarks import netmodel

    bw, lat = 25e6, 2e-4  # 200 Mbit/s, 200 us
    raw = {n: [lat + n / bw, lat + n / bw + 1e-3] for n in (1 << 16, 1 << 18, 1 << 20, 1 << 22)}
    link = netmodel.link_record(raw, "synthetic")
    assert link["median_s"][1 << 20] == pytest.approx(lat + (1 << 20) / bw + 5e-4)
    assert link["bandwidth_Bps"] == pytest.approx(bw) and link["latency_s"] == pytest.approx(lat + 5e-4)
    burst = netmodel.link_record(raw, "synthetic", max_bytes=1 << 20)
    assert burst["fitted_sizes"] == [1 << 16, 1 << 18, 1 << 20]
    assert netmodel.link_record({1 << 16: [1e-3]}, "one size")["bandwidth_Bps"] is None
    # 2 ranks: 2 steps of half the bytes each way = 2 latencies + bytes / bandwidth
    assert netmodel.predict_allreduce_s(1_000_000, link) == pytest.approx(2 * (lat + 5e-4) + 1_000_000 / bw)
    assert netmodel.predict_allreduce_s(1_000_000, {"bandwidth_Bps": None, "latency_s": None}) is None
    assert netmodel.grad_bytes_of("resnet20") == 4 * 269_722


def test_netmodel_settings_and_their_ratios():
    from benchmarks import netmodel

    todo = netmodel.link_settings(["unshaped", "200mbit"], "1ms")
    assert [s.label for s in todo] == ["unshaped", "200mbit", "200mbit + 1ms delay"]
    assert (todo[0].rate, todo[2].rate, todo[2].delay) == (None, "200mbit", "1ms")
    with pytest.raises(ValueError, match="--rates"):
        netmodel.link_settings([], None)
    link = {"bandwidth_Bps": 25e6, "latency_s": 0.0, "median_s": {}}
    run = {"logged_s": [0.02, 0.04, 0.03], "last_arriving_s": [0.01, 0.02], "backend": "horovod", "step_s": 0.1,
           "epoch_s": [1.0, 1.0], "job_s": 9.0}
    row = netmodel.summarize(todo[1], {"stream": link, "idle": {**link, "bandwidth_Bps": None}}, run, 1_000_000)
    assert row["stream"]["predicted_s"] == pytest.approx(0.04)
    assert row["stream"]["ratio"] == pytest.approx(0.75)  # medians: 30 ms logged, 15 ms last-arriving, 40 predicted
    assert row["stream"]["ratio_last_arriving"] == pytest.approx(0.375)
    assert row["idle"]["predicted_s"] is None and row["idle"]["ratio"] is None
    assert netmodel._rate_bps("1gbit") == 1e9 and netmodel._rate_bps("fast") is None


def test_goodput_counts_useful_samples_over_the_failure_free_rate():
    """`benchmarks/goodput.py`: useful samples (less those lost) per second over the failure-free run's;
    a job that did not finish did no useful work, and survived every kill but the last."""
    from benchmarks import goodput

    ref = {"wall": 100.0, "final_acc": 0.5}
    done = {"finished": True, "exit": 0, "wall": 125.0, "kills": [{}, {}], "survived": 2, "samples_lost": 40,
            "replayed_steps": 1, "restarts": 0, "recoveries": 2, "refilled": 0, "whole_again_s": [],
            "final_acc": 0.48, "tail": ""}
    r = goodput.row("lossy forward", 30.0, done, ref, samples=1000)
    assert r["goodput"] == (960 / 125.0) / (1000 / 100.0) and r["killed"] == 2 and r["survived"] == 2
    assert abs(r["acc_delta_pts"] - -2.0) < 1e-9
    failed = done | {"finished": False, "exit": 1, "survived": 1, "final_acc": None}
    r = goodput.row("rollback", 10.0, failed, ref, samples=1000)
    assert r["goodput"] == 0 and r["acc_delta_pts"] is None and r["survived"] == 1


def test_goodput_times_each_death_until_the_group_is_whole_again():
    """A rollback's spare: its record's report minus the death's notice; a growth back: from the latest
    notice of a death of each seat it filled (an earlier death of the same seat, already refilled, does
    not count); a relaunch: the job's end and the relaunch until training resumed."""
    from benchmarks import goodput

    rollback = {"lost_host_ranks": [1], "learnt_time": 10.0, "reported_time": 10.25, "replaced_by": [[4, 1]]}
    lossy = [{"lost_host_ranks": [1], "learnt_time": 20.0, "reported_time": 20.1, "replaced_by": None},
             {"lost_host_ranks": [2], "learnt_time": 22.0, "reported_time": 22.1},
             {"lost_host_ranks": [1], "learnt_time": 30.0, "reported_time": 30.1}]
    grown = [{"seats": [1, 2], "reported_time": 25.0}, {"seats": [1], "reported_time": 33.0}]
    restarts = [{"ended_s": 1.5, "resumed_s": 12.0}, {"ended_s": None, "resumed_s": 10.0}, {"resumed_s": None}]
    assert goodput.whole_again([rollback, *lossy], grown, restarts) == [0.25, 5.0, 3.0, 3.0, 13.5, 10.0]


def test_goodput_cells_take_medians_over_repetitions_and_add_the_counts_up():
    from benchmarks import goodput

    def rep(goodput_, acc, finished=True, kills=2):
        return {"strategy": "rollback", "every_s": 10.0, "killed": kills, "survived": kills if finished else kills - 1,
                "finished": finished, "wall_s": 100.0 / goodput_, "goodput": goodput_, "acc_delta_pts": acc,
                "samples_lost": 0, "replayed_steps": 2, "refilled": 2, "restarts": 1, "whole_again_s": [0.2, 9.0]}

    rows = [rep(0.9, 0.0), rep(0.8, None, finished=False), rep(0.95, 0.4)]
    [cell] = goodput.cells(rows)
    assert (cell["reps"], cell["finished"], cell["killed"], cell["survived"]) == (3, 2, 6, 5)
    assert cell["goodput"] == 0.9 and cell["goodput_range"] == [0.8, 0.95] and cell["acc_delta_pts"] == 0.2
    assert (cell["replayed_steps"], cell["refilled"], cell["restarts"], len(cell["whole_again_s"])) == (6, 6, 3, 6)
    assert goodput.cell_line(cell)[3:6] == ["2 of 3", f"{100 / 0.9:.1f}", "0.90 (0.80-0.95)"]

