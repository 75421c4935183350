"""The clone group's stand-by: a deadline on silence, not on the stand-by (real MPMD job).

With `--peer-timeout 2` the keeper beats every 0.5 s; the clone step comes ~48 steps (about 3 s
here; at step 32 it once came after 1.98 s, too soon to prove anything) after the last PREPARE,
so the clone ranks survive only if the heartbeats arrive and each one restarts their deadline.
"""

import pytest

from tests.mpijobs import dpurun, read_jsonl

pytestmark = pytest.mark.mpi


def test_heartbeats_keep_a_stand_by_longer_than_the_peer_timeout_alive(bundled_data, tmp_path):
    timeout = 2.0
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "1", "--clone-ranks", "1", "--oversubscribe"],
                 ["--preset", "debug", "--no-progress", "--train-subset", "256",
                  "--data", str(bundled_data / "cifar10"), "--log-dir", str(tmp_path), "--epochs", "4",
                  "--clone-at", "48", "--peer-timeout", str(timeout)],
                 timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    start = next(r for r in read_jsonl(tmp_path / "clone" / "metrics.jsonl") if r["event"] == "clone_start")
    assert start["global_step"] == 48
    assert start["standby_s"] > timeout  # waited past the deadline: only the heartbeats kept it going
