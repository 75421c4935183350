"""Cluster mode for real: `dpurun --hosts/--dpus` across emulated machines (scripts/nodes.sh: one
network namespace per host node and per DPU, each with its own hostname, joined over TCP).

Two host nodes with one host rank each, and their two DPUs with one DPU rank each: every host rank
is fed by the DPU of its own node, over the network (`btl tcp`: no shared memory between machines),
and `da` trains to the bit as `none` does. Needs root for `ip netns`; skipped with the reason elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.mpijobs import REPO, job_env, read_jsonl

pytestmark = pytest.mark.mpi
NODES = ("h0", "h1", "d0", "d1")
SCRIPT = str(REPO / "scripts" / "nodes.sh")


def _env() -> dict[str, str]:
    env = job_env()  # a prefix and subnet of this run's own: a user's nodes (scripts/nodes.sh up) are left alone
    env["DPUOFFLOAD_NETNS_PREFIX"] = f"dpt{os.getpid()}"
    env["DPUOFFLOAD_NETNS_SUBNET"] = f"10.78.{os.getpid() % 250}"
    return env


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "emulated nodes need root (ip netns add)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "emulated nodes need iproute2's ip and util-linux's unshare"
    return None


def _remove_stale() -> None:
    """Namespaces a killed earlier run left (prefix dpt<its pid>, the pid gone): taken down first."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for pid in {n[3:].split("-")[0] for n in listed if n.startswith("dpt") and "-" in n}:
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and int(pid) != os.getpid():
            subprocess.run(["bash", SCRIPT, "down", *NODES], capture_output=True, timeout=60,
                           env={**os.environ, "DPUOFFLOAD_NETNS_PREFIX": f"dpt{pid}"})


@pytest.fixture(scope="module")
def nodes():
    why = _why_not()
    if why:
        pytest.skip(why)
    _remove_stale()
    env = _env()
    up = subprocess.run(["bash", SCRIPT, "up", *NODES], capture_output=True, text=True, env=env, timeout=60)
    if up.returncode != 0:
        pytest.skip(f"could not create network namespaces here: {up.stderr.strip()}")
    try:
        yield env
    finally:
        subprocess.run(["bash", SCRIPT, "down", *NODES], capture_output=True, env=env, timeout=60)


def cluster_run(env: dict[str, str], bundled_data, log, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", SCRIPT, "dpurun", "--hosts", "h0:1,h1:1", "--dpus", "d0:1,d1:1", "--host-ranks", "2",
         "--dpu-ranks", "2", "--", "--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs", "2",
         "--mode", mode, "--train-subset", "128", "--val-subset", "64", "--digest-batches", "--no-progress",
         "--log-dir", str(log)],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_da_across_nodes_pairs_each_host_with_its_own_dpu_and_equals_none(nodes, bundled_data, tmp_path):
    runs = {}
    for mode in ("none", "da"):
        res = cluster_run(nodes, bundled_data, tmp_path / mode, mode)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "--host h0:1,h1:1" in res.stderr and "--host d0:1,d1:1" in res.stderr and "btl tcp,self" in res.stderr
        runs[mode] = {"metrics": read_jsonl(tmp_path / mode / "metrics.jsonl"),
                      "phases": {r: read_jsonl(tmp_path / mode / f"phases-rank{r}.jsonl") for r in range(4)}}
    none, da = runs["none"], runs["da"]
    for h in (0, 1):
        assert [e["batch_digest"] for e in da["phases"][h]] == [e["batch_digest"] for e in none["phases"][h]]
    losses = [[e["step_losses"] for e in r["metrics"] if e["event"] == "epoch"] for r in (none, da)]
    assert losses[0] == losses[1] and len(losses[0]) == 2
    ends = [next(e for e in r["metrics"] if e["event"] == "end") for r in (none, da)]
    assert ends[0]["weights_sha256"] == ends[1]["weights_sha256"]
    # World ranks 0-1 are the host ranks (h0, h1), 2-3 the DPU ranks (d0, d1: nodes h0 and h1 by --dpus)
    dpu_ends = {r: next(e for e in da["phases"][r] if e.get("event") == "end") for r in (2, 3)}
    assert {r: (e["node"], e["feeds"]) for r, e in dpu_ends.items()} == {2: ("h0", {"0": "h0"}), 3: ("h1", {"1": "h1"})}
