"""The keepers' commit decision (`dpu.keeper.commit.decide_commit`), pure: no MPI, no disk.

Four host ranks, two keepers on one node (keeper 4 keeps host ranks 0 and 1, keeper 5 host ranks 2
and 3; keeper 4 commits). Each case is a set of typed reports as the committer holds them, and the
exact decision. The last tests drive the `--recovery` route's collection (`SurvivingRoute.settle`)
with scripted reports, so late and early reports end in exact decisions too.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.runtime.roles import RankInfo, Role, Topology, pair_ranks
from dpuoffload.common.state.ckptfiles import local_name, shard_name
from dpuoffload.dpu.keeper.commit import (
    CommitRules,
    Death,
    KeeperReport,
    Outcome,
    ReportSet,
    decide_commit,
)
from dpuoffload.dpu.keeper.recovery import SurvivingRoute

RULES = CommitRules(keep=2, stop_on_failure=False)
HOST = [f"host rank {k} (world rank {k}, node n0)" for k in range(4)]
KEEPER = {4: "DPU rank 0 (world rank 4, node n0)", 5: "DPU rank 1 (world rank 5, node n0)"}


def meta(step: int, senders: int = 4) -> dict[str, Any]:
    return {"position": {"global_step": step, "epoch": 1, "step": step}, "host_ranks": senders}


def files(*senders: int, nbytes: int = 100) -> dict[str, dict[str, Any]]:
    """The files a keeper writes for host ranks `senders`: a shard and a local file each."""
    return {name: {"bytes": nbytes, "sha256": name} for k in senders for name in (shard_name(k), local_name(k))}


def written(step: int, keeper: int, *senders: int, write_s: float = 1.0) -> KeeperReport:
    return KeeperReport(step, files(*senders), write_s=write_s, keeper=keeper)


def test_every_keeper_reports_its_files_the_checkpoint_is_committed_and_pruned():
    reports = [written(6, 0, 0, 1, write_s=1.5), written(6, 1, 2, 3, write_s=2.5)]
    d = decide_commit(meta(6), reports, RULES)
    assert (d.step, d.outcome, d.errors, d.torn_by) == (6, Outcome.COMMITTED, (), None)
    assert d.files == {**files(0, 1), **files(2, 3)}
    assert (d.complete, d.missing) == ((0, 1, 2, 3), ())
    assert (d.prune_keep, d.stop_job, d.remove) == (2, False, False)
    assert (d.write_s, d.nbytes) == (2.5, 800)


def test_a_keeper_lost_under_fallback_tears_the_checkpoint_without_failing_it():
    died = KeeperReport.lost(6, Death.KEEPER, f"{KEEPER[5]} died before writing its part")
    d = decide_commit(meta(6), [written(6, 0, 0, 1), died], CommitRules(keep=2, stop_on_failure=True))
    assert d.outcome is Outcome.TORN and d.torn_by is Death.KEEPER
    assert d.errors == (f"{KEEPER[5]} died before writing its part",)
    assert (d.complete, d.missing) == ((0, 1), (2, 3))
    assert (d.prune_keep, d.stop_job, d.remove) == (None, False, True)  # (a death survived never stops the job)


def test_a_host_rank_lost_under_recovery_tears_the_checkpoint_by_its_death():
    # keeper 5's host rank 3 died before handing step 6 over: keeper 5 wrote host rank 2's part only
    mine = KeeperReport(6, files(2), f"{HOST[3]} died before handing its state over", keeper=1,
                        death=Death.HOST)
    d = decide_commit(meta(6), [written(6, 0, 0, 1), mine], RULES)
    assert d.outcome is Outcome.TORN and d.torn_by is Death.HOST
    assert d.errors == (f"{HOST[3]} died before handing its state over",)
    assert (d.complete, d.missing) == ((0, 1, 2), (3,))


def test_a_write_error_fails_the_checkpoint_and_stops_the_job_only_under_ckpt_errors_fail():
    error = f"{KEEPER[5]}: FileExistsError: [Errno 17] File exists"
    reports = [written(8, 0, 0, 1), KeeperReport(8, {}, error, write_s=0.1, keeper=1)]
    d = decide_commit(meta(8), reports, RULES)
    assert (d.outcome, d.errors, d.torn_by) == (Outcome.FAILED, (error,), None)
    assert (d.missing, d.prune_keep, d.stop_job, d.remove) == ((2, 3), None, False, True)
    assert decide_commit(meta(8), reports, CommitRules(keep=2, stop_on_failure=True)).stop_job


def test_a_write_error_next_to_a_death_is_a_failure_not_a_tear():
    reports = [KeeperReport(6, {}, f"{KEEPER[4]}: OSError: [Errno 28] No space left on device", keeper=0),
               KeeperReport.lost(6, Death.KEEPER, f"{KEEPER[5]} died before writing its part")]
    d = decide_commit(meta(6), reports, RULES)
    assert d.outcome is Outcome.FAILED and len(d.errors) == 2 and d.complete == ()


def test_a_failed_manifest_is_decided_again_and_not_committed():
    reports = [written(6, 0, 0, 1), written(6, 1, 2, 3)]
    d = decide_commit(meta(6), reports, RULES, manifest_error="writing the manifest: OSError: disk full")
    assert not d.committed and d.remove and d.errors == ("writing the manifest: OSError: disk full",)


def test_reports_in_any_order_give_the_same_decision_errors_in_report_order():
    reports = [written(6, 0, 0, 1), KeeperReport(6, files(2), "keeper 1: OSError: a", keeper=1),
               KeeperReport(6, files(3), "keeper 2: OSError: b", keeper=2)]
    first = decide_commit(meta(6), reports, RULES)
    for seed in range(5):
        shuffled = random.Random(seed).sample(reports, len(reports))
        d = decide_commit(meta(6), shuffled, RULES)
        assert (d.outcome, d.files, d.complete, d.missing, d.nbytes) == (
            first.outcome, first.files, first.complete, first.missing, first.nbytes)
        assert d.errors == tuple(r.error for r in shuffled if r.error)


def test_a_duplicate_report_counts_its_files_once():
    again = written(6, 1, 2, 3)
    d = decide_commit(meta(6), [written(6, 0, 0, 1), again, again], RULES)
    assert d.committed and d.complete == (0, 1, 2, 3) and d.nbytes == 800


def test_a_report_of_another_step_is_refused():
    with pytest.raises(ValueError, match="a report of checkpoint step 8 .* among those of step 6"):
        decide_commit(meta(6), [written(6, 0, 0, 1), written(8, 1, 2, 3)], RULES)
    with pytest.raises(ValueError):
        decide_commit(meta(6), [written(6, 0, 0, 1), KeeperReport.end_of_run()], RULES)


def test_reports_keep_their_wire_layout():
    own = KeeperReport(6, files(0), "x died before handing its state over", 0.5, 1, {"m": 1}, Death.HOST)
    assert own.to_wire() == {"keeper": 1, "step": 6, "files": files(0), "error": "x died before handing its state "
                             "over", "meta": {"m": 1}, "host_died": True, "write_s": 0.5}
    assert list(written(6, 0, 0).to_wire()) == ["keeper", "step", "files", "error", "meta", "write_s"]
    assert KeeperReport.from_wire(own.to_wire()) == own
    assert KeeperReport.end_of_run().to_wire() == {"end": True, "step": -1}
    assert KeeperReport.from_wire({"end": True, "step": -1}).end
    assert KeeperReport.from_wire({"step": 6, "files": {}, "write_s": 0.0, "died": True, "error": "e"}).death \
        is Death.KEEPER


def test_rules_come_from_the_flags():
    cfg = parse_run_config(["--mode", "da", "--ckpt-dir", "/tmp/x", "--ckpt-every", "2", "--ckpt-keep", "3",
                            "--ckpt-errors", "fail"])
    assert CommitRules.of(cfg) == CommitRules(keep=3, stop_on_failure=True)


# ------------------------------------------------------------------- late and early reports (--recovery)
def surviving_route(scripted: dict[int, list[KeeperReport]], gone: set[int]) -> SurvivingRoute:
    """Keeper 4's route under --recovery lossy-forward, whose MPI receives are `scripted` (keeper ->
    the reports it sends, in order); `gone`: host ranks it knows dead."""
    ranks = tuple(RankInfo(i, role, "n0", "n0") for i, role in enumerate([Role.HOST] * 4 + [Role.DPU] * 2))
    topo = Topology(world=SimpleNamespace(Get_rank=lambda: 4), side_comm=None, role=Role.DPU, ranks=ranks,
                    pairing=pair_ranks(ranks))
    cfg = parse_run_config(["--mode", "da", "--recovery", "lossy-forward", "--ckpt-dir", "/tmp/x",
                            "--ckpt-every", "2"])
    route = SurvivingRoute(cfg, topo, inbox=None, faults=Faults.inert())
    route.headers.gone |= gone
    route.receive_report = lambda source, what: scripted[source].pop(0)
    return route


def test_a_keeper_whose_host_ranks_died_reports_a_later_step_first_the_earlier_one_is_torn():
    # host ranks 2 and 3 died after step 6 but before handing it over: keeper 5 never heard of
    # step 6, and reports step 8 (a notice: the survivors slice it among themselves) first
    notice8 = KeeperReport(8, keeper=1)
    route = surviving_route({5: [notice8]}, gone=set())
    at6 = route.collect(6, [5])
    assert at6.earlier == []
    lost = KeeperReport.lost(6, Death.HOST, f"{HOST[2]}, {HOST[3]} died before handing the state of step 6 over")
    assert at6.reports == [lost]
    d6 = decide_commit(meta(6), [written(6, 0, 0, 1), *at6.reports], RULES)
    assert (d6.outcome, d6.torn_by, d6.missing, d6.errors) == (Outcome.TORN, Death.HOST, (2, 3), (lost.error,))
    at8 = route.collect(8, [5])   # the step-8 report was kept for its turn
    assert (at8.reports, at8.earlier) == ([notice8], [])
    d8 = decide_commit(meta(8, senders=2), [written(8, 0, 0, 1), *at8.reports], RULES)
    assert d8.committed and d8.complete == (0, 1)


def test_the_committers_host_ranks_died_the_checkpoint_it_never_heard_of_is_settled_first():
    # host ranks 0 and 1 died after step 6 but before handing it over: keeper 4 (the committer)
    # hears of step 8 only, and keeper 5's report of step 6 comes first
    theirs6 = KeeperReport(6, files(2, 3), keeper=1, meta=meta(6))
    theirs8 = KeeperReport(8, files(0, 1), keeper=1, meta=meta(8, senders=2))
    route = surviving_route({5: [theirs6, theirs8]}, gone={0, 1})
    at8 = route.collect(8, [5])
    mine = KeeperReport.lost(6, Death.HOST, f"{HOST[0]}, {HOST[1]} died before handing the state of step 6 over")
    assert at8.earlier == [ReportSet(meta(6), [theirs6, mine])] and at8.reports == [theirs8]
    d6 = decide_commit(at8.earlier[0].meta, at8.earlier[0].reports, RULES)
    assert (d6.step, d6.outcome, d6.torn_by, d6.complete, d6.missing) == (6, Outcome.TORN, Death.HOST, (2, 3), (0, 1))
    d8 = decide_commit(meta(8, senders=2), [KeeperReport(8, keeper=0), *at8.reports], RULES)
    assert d8.committed


def test_at_the_end_the_committer_settles_what_a_keeper_reported_after_its_last_hand_off():
    theirs10 = KeeperReport(10, files(2, 3), keeper=1, meta=meta(10))
    route = surviving_route({5: [theirs10, KeeperReport.end_of_run()]}, gone={0, 1})
    settled = route.settle(None, [5]).earlier
    assert [s.meta["position"]["global_step"] for s in settled] == [10]
    assert decide_commit(settled[0].meta, settled[0].reports, RULES).outcome is Outcome.TORN
