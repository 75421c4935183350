"""`--inject-simulate` (the recovery study's simulated failures): specs, the gradient arithmetic of
lossy forward and immediate rollback (pure), and one real job of each against the failure-free run.

(The tests of this feature that start processes: tests/jobs/test_simulate.py.)
"""

from __future__ import annotations

import pytest
import torch

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.inject import parse_simulated
from dpuoffload.common.faults.policy import SimulatedRecovery
from dpuoffload.common.faults.simulate import FailureSimulator, StepFailure, lose_gradients

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
