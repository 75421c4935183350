"""The recovery policy (`common.faults.policy`): what each flag combination survives, asked in one place.

Pure: no MPI. The last test keeps it the only place: no source file compares a recovery setting with a
string (the issue counted 29 such comparisons in 11 files before the policy existed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.faults.policy import DpuFailure, Recovery, RecoveryPolicy

REPO = Path(__file__).resolve().parents[2]


def _policy(*flags: str) -> RecoveryPolicy:
    return parse_run_config(["--mode", "da", *flags]).recovery_policy


def test_default_survives_nothing_and_needs_no_ulfm():
    p = _policy()
    assert p == RecoveryPolicy(Recovery.STOP, DpuFailure.STOP, clones=False)
    assert not (p.survives_host_loss or p.survives_dpu_loss or p.survives_keeper_loss or p.needs_ulfm)
    assert p.flag == "no fault tolerance"


@pytest.mark.parametrize("recovery, shrinks, spares", [("lossy-forward", True, False), ("rollback", False, True)])
def test_each_host_recovery_survives_a_host_rank_its_own_way(recovery, shrinks, spares):
    p = _policy("--recovery", recovery)
    assert p.host_loss is Recovery(recovery) and p.survives_host_loss and p.needs_ulfm
    assert (p.shrinks_group, p.uses_spares) == (shrinks, spares)
    assert not p.survives_dpu_loss and p.flag == f"--recovery {recovery}"


def test_dpu_fallback_survives_keepers_only_without_clones():
    p = _policy("--dpu-failure", "fallback", "--ckpt-dir", "/tmp/x", "--ckpt-every", "2")
    assert p.survives_dpu_loss and p.survives_keeper_loss and p.needs_ulfm and not p.survives_host_loss
    assert p.flag == "--dpu-failure fallback"
    cloned = _policy("--dpu-failure", "fallback", "--clone-at", "3")
    assert cloned.survives_dpu_loss and not cloned.survives_keeper_loss


def test_config_holds_the_settings_as_enums():
    cfg = parse_run_config(["--mode", "da", "--recovery", "lossy-forward", "--dpu-failure", "stop"])
    assert cfg.recovery is Recovery.LOSSY_FORWARD and cfg.dpu_failure is DpuFailure.STOP
    assert f"{cfg.recovery}" == "lossy-forward" and cfg.fault_tolerant


_COMPARISON = re.compile(r"""\b(recovery|dpu_failure|simulate_recovery)\s*(==|!=|\bin\b|\bnot in\b)\s*[("']""")


def test_no_source_file_compares_a_recovery_setting_with_a_string():
    """Decisions ask the policy; a comparison with a string literal is how the old checks drifted apart."""
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
             for top in ("api", "common", "dpu", "host", "launch")
             for path in sorted((REPO / top).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if _COMPARISON.search(line)]
    assert found == [], "ask cfg.recovery_policy instead:\n" + "\n".join(found)
