"""`--inject-simulate` (the recovery study's simulated failures): specs, the gradient arithmetic of
lossy forward and immediate rollback (pure), and one real job of each against the failure-free run.

(Here the tests that start processes; those that run in one process: tests/unit/test_simulate.py.)
"""

from __future__ import annotations

import json

import pytest

from tests.mpijobs import dpurun, read_jsonl


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
