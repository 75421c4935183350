"""`--inject-simulate` (the recovery study's simulated failures): specs, the gradient arithmetic of
lossy forward and immediate rollback (pure), and one real job of each against the failure-free run."""

from __future__ import annotations

import json

import pytest
import torch

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.inject import parse_simulated
from dpuoffload.common.faults.policy import SimulatedRecovery
from dpuoffload.common.faults.simulate import FailureSimulator, StepFailure, lose_gradients
from tests.mpijobs import dpurun, read_jsonl

LF = SimulatedRecovery.LOSSY_FORWARD


def test_specs_name_host_ranks_a_step_and_the_share_computed_before_the_failure():
    assert parse_simulated("host:1@12:25%").progress == 0.25
    assert parse_simulated("node:0@0.5:0.75").progress == 0.75 and parse_simulated("host:0@3").progress == 0.5
    assert str(parse_simulated("host:1@12:25%")) == "host:1@12:25%"
    for spec, why in (("dpu:0@3", "only host ranks compute gradients"), ("host:0@3:lots", "P 'lots' is not a share"),
                      ("host:0@3:150%", "P '150%' is outside 0..100 %"), ("host:0@0", "WHEN '0' is neither")):
        with pytest.raises(ConfigError, match=f"--inject-simulate '{spec}': {why}"):
            parse_simulated(spec)
    with pytest.raises(ConfigError, match="--inject-simulate fails host ranks' gradients"):
        parse_run_config(["--mode", "naive", "--inject-simulate", "host:0@3"])


def test_simulator_groups_casualties_per_step_and_refuses_what_cannot_run():
    sim = FailureSimulator(["host:1@4:25%,host:2@4:25%", "node:0@0.5"], "lossy-forward", total_steps=10, replicas=4)
    assert sim.at(4) == StepFailure(4, (1, 2), 0.25, LF) and sim.at(5) == StepFailure(5, (0,), 0.5, LF)
    assert sim.at(3) is None
    with pytest.raises(ConfigError, match="another spec fails step 4 after 25%"):
        FailureSimulator(["host:1@4:25%", "host:2@4:50%"], LF, 10, 4)
    with pytest.raises(ConfigError, match="every host rank is a casualty at step 2, so lossy forward"):
        FailureSimulator(["host:0@2", "host:1@2"], LF, 10, 2)
    FailureSimulator(["host:0@2", "host:1@2"], "rollback", 10, 2)  # rollback needs no survivor
    with pytest.raises(ConfigError, match="there is no host rank 2"):
        FailureSimulator(["host:2@2"], LF, 10, 2)


def _allreduce_average(per_rank: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [sum(ts) / len(per_rank) for ts in zip(*per_rank)]


def test_simulate_recovery_speaks_the_recoveries_names_and_reads_the_old_ones_with_a_warning(capsys):
    """One vocabulary: --simulate-recovery says lossy-forward / rollback as --recovery does; lf / ir still
    parse (the same strategies) with one deprecation line naming the new spelling."""
    assert parse_run_config(["--simulate-recovery", "rollback"]).simulate_recovery is SimulatedRecovery.ROLLBACK
    assert capsys.readouterr().err == ""
    assert parse_run_config(["--simulate-recovery", "ir"]).simulate_recovery is SimulatedRecovery.ROLLBACK
    assert "--simulate-recovery ir is deprecated: say --simulate-recovery rollback" in capsys.readouterr().err
    assert parse_run_config([]).simulate_recovery is LF
    with pytest.raises(SystemExit):
        parse_run_config(["--simulate-recovery", "undo"])
    assert "argument --simulate-recovery: invalid choice: 'undo'" in capsys.readouterr().err


@pytest.mark.parametrize("recovery", list(SimulatedRecovery))
def test_lost_gradients_average_over_the_survivors_or_vanish(recovery):
    torch.manual_seed(0)
    size, n = 4, 8                                       # 4 replicas, 8 gradient tensors each
    grads = [[torch.randn(3) for _ in range(n)] for _ in range(size)]
    failure = StepFailure(7, (1, 3), 0.25, recovery)     # 2 of 8 computed (the last two, backward order)
    work = [[g.clone() for g in rank] for rank in grads]
    assert {lose_gradients(work[r], failure, r, size) for r in range(size)} == {6}
    reduced = _allreduce_average(work)
    for i in range(n - 2, n):                            # computed before the failure: everyone's average
        assert torch.allclose(reduced[i], sum(g[i] for g in grads) / size)
    for i in range(n - 2):                               # lost: the survivors' (0 and 2) average, or nothing
        want = (grads[0][i] + grads[2][i]) / 2 if recovery is LF else torch.zeros(3)
        assert torch.allclose(reduced[i], want, atol=1e-6)


def _losses(log) -> list[float]:
    return [x for r in read_jsonl(log / "metrics.jsonl") if r.get("event") == "epoch" for x in r["step_losses"]]


@pytest.mark.mpi
def test_a_simulated_failure_changes_only_the_steps_after_it_and_is_reported(bundled_data, tmp_path):
    """2 host ranks, 8 steps; host rank 1 fails in step 3 after half its gradients. Both recoveries
    keep the steps before as in the failure-free run and change what follows, each its own way."""
    flags = ["--mode", "none", "--preset", "debug", "--epochs", "1", "--train-subset", "256", "--val-subset", "32",
             "--batch-size", "16", "--data", str(bundled_data / "cifar10"), "--no-progress"]
    runs = {}
    for name, extra in (("free", []), ("lf", ["--inject-simulate", "host:1@3:50%"]),
                        ("ir", ["--inject-simulate", "host:1@3:50%", "--simulate-recovery", "rollback"])):
        r = dpurun(["--host-ranks", "2", "--dpu-ranks", "1"], [*flags, *extra, "--log-dir", str(tmp_path / name)])
        assert r.returncode == 0, r.stdout + r.stderr
        runs[name] = (r.stdout, _losses(tmp_path / name))
    free = runs["free"][1]
    assert len(free) == 8
    for name, same in (("lf", 3), ("ir", 2)):  # ir logs step 3's replay, on the state the failed attempt left
        out, losses = runs[name]
        assert len(losses) == 8 and losses[:same] == free[:same] and losses[same] != free[same], name
        event = next(json.loads(ln) for ln in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
                     if "simulated_failure" in ln)
        assert (event["global_step"], event["casualties"], event["recovery"]) == \
            (3, [1], {"lf": "lossy-forward", "ir": "rollback"}[name])
        assert event["gradients_lost"] == event["gradients"] // 2 + event["gradients"] % 2
    assert "simulated failure at global step 3: host rank(s) 1 lost" in runs["lf"][0]
    assert "lossy forward: the 1 survivor(s) average them" in runs["lf"][0]
    assert "immediate rollback: those weights stay, then the mini-batch is replayed" in runs["ir"][0]
    assert runs["lf"][1][3:] != runs["ir"][1][3:]
