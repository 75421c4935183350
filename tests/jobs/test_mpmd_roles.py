"""A real MPMD job (2 host + 2 DPU ranks, oversubscribed): roles, communicators, pairing, handshake."""

import pytest

from tests.mpijobs import PY, REPO, json_lines, mpmd

pytestmark = pytest.mark.mpi
PROBE = str(REPO / "tests" / "probes" / "topology_probe.py")


def test_roles_communicators_pairing_and_handshake():
    res = mpmd(2, [PY, PROBE, "host"], 2, [PY, PROBE, "dpu"])
    assert res.returncode == 0, res.stderr
    ranks = {r["world_rank"]: r for r in json_lines(res.stdout)}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert [ranks[i]["role"] for i in range(4)] == ["HOST", "HOST", "DPU", "DPU"]
    # host_comm holds world ranks 0+1, dpu_comm 2+3; side ranks follow world order
    assert [ranks[i]["side_rank"] for i in range(4)] == [0, 1, 0, 1]
    assert [ranks[i]["side_sum"] for i in range(4)] == [1, 1, 5, 5]
    assert [ranks[i]["host_comm"] for i in range(4)] == [True, True, False, False]
    assert [ranks[i]["dpu_comm"] for i in range(4)] == [False, False, True, True]
    assert [ranks[i]["peers"] for i in range(4)] == [[2], [3], [0], [1]]
    assert ranks[3]["label"].startswith("DPU rank 1 (world rank 3, node ")
    assert all(r["handshake"] == "ok" for r in ranks.values())


def test_handshake_fails_on_config_mismatch_in_probe():
    res = mpmd(1, [PY, PROBE, "host", "--seed", "1"], 1, [PY, PROBE, "dpu", "--seed", "2"])
    assert res.returncode == 0, res.stderr
    assert [r["handshake"] for r in json_lines(res.stdout)] == ["JobFailed", "JobFailed"]
    assert res.stderr.count("run config mismatch") == 1
    assert "seed=1 vs 2" in res.stderr


def test_real_programs_stop_on_config_mismatch_with_one_message():
    common = ["--dataset", "fake", "--epochs", "1", "--no-progress"]
    res = mpmd(1, [PY, "-m", "dpuoffload.host", *common, "--batch-size", "16"],
               1, [PY, "-m", "dpuoffload.dpu", *common, "--batch-size", "32"])
    assert res.returncode != 0
    assert res.stderr.count("run config mismatch") == 1, res.stderr
    assert "batch_size=16 vs 32" in res.stderr
    assert "host program (world rank 0)" in res.stderr and "DPU program (world rank 1)" in res.stderr


def test_programs_in_the_wrong_app_context_are_told_so():
    res = mpmd(1, [PY, "-m", "dpuoffload.dpu", "--dataset", "fake"],
               1, [PY, "-m", "dpuoffload.host", "--dataset", "fake"])
    assert res.returncode != 0
    assert "put the host program first" in res.stderr


@pytest.mark.parametrize("pretend, message", [
    (["--as-version", "0.0.9"], "project version mismatch: "),
    (["--as-protocol", "1"], "protocol version mismatch: "),
])
def test_handshake_refuses_another_release_between_processes(pretend, message):
    res = mpmd(1, [PY, PROBE, "host"], 1, [PY, PROBE, "dpu", *pretend])
    assert res.returncode == 0, res.stderr
    assert [r["handshake"] for r in json_lines(res.stdout)] == ["JobFailed", "JobFailed"]
    assert res.stderr.count(message) == 1, res.stderr
    assert "install the same version on hosts and DPUs" in res.stderr
    assert (" 0.0.9" if "--as-version" in pretend else "speaks 1") in res.stderr
