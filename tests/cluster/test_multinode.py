"""Cluster mode for real: `dpurun --hosts/--dpus` across emulated machines (scripts/nodes.sh: one
network namespace per host node and per DPU, each with its own hostname, joined over TCP).

Two host nodes with one host rank each, and their two DPUs with one DPU rank each: every host rank
is fed by the DPU of its own node, over the network (`btl tcp`: no shared memory between machines),
and `da` trains to the bit as `none` does. Needs root for `ip netns`; skipped with the reason elsewhere.

`DPUOFFLOAD_TEST_DPU_ARCH=aarch64` makes the two DPU machines aarch64 (qemu-user, `scripts/aarch64.sh`)
for the four-machine tests: every DPU role (augmentation, validation, checkpoint keepers writing shards,
clone state forwarded, a killed DPU rank) then runs as aarch64 processes beside x86-64 hosts. About
4x slower (each aarch64 rank imports torch under qemu), so it is a documented command, not the suite's:
`DPUOFFLOAD_TEST_DPU_ARCH=aarch64 bash scripts/test.sh tests/cluster/test_multinode.py` (docs/cluster.md, "An Arm DPU").
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.mpijobs import (
    REPO,
    Unavailable,
    job_env,
    machines_broken,
    machines_unavailable,
    read_jsonl,
    skip_or_fail,
    switched_off,
)

NODES = ("h0", "h1", "d0", "d1")
DPU_ARCH = os.environ.get("DPUOFFLOAD_TEST_DPU_ARCH", "x86_64")  # aarch64: the four-machine tests' DPUs are Arm
pytestmark = [pytest.mark.mpi, *([pytest.mark.timeout(1800)] if DPU_ARCH == "aarch64" else [])]
UP = ("h0", "h1", "d0:aarch64", "d1:aarch64") if DPU_ARCH == "aarch64" else NODES
JOB_TIMEOUT = 900 if DPU_ARCH == "aarch64" else 300
SCRIPT = str(REPO / "scripts" / "nodes.sh")
SWITCH = "DPUOFFLOAD_TEST_NODES"  # 0: these tests off (they skip and say so)


def _env() -> dict[str, str]:
    env = job_env()  # a prefix and subnet of this run's own: a user's nodes (scripts/nodes.sh up) are left alone
    env["DPUOFFLOAD_NETNS_PREFIX"] = f"dpt{os.getpid()}"
    env["DPUOFFLOAD_NETNS_SUBNET"] = f"10.78.{os.getpid() % 250}"
    return env


def _why_not() -> Unavailable | None:
    return machines_unavailable(SWITCH)


def _remove_stale() -> None:
    """Namespaces a killed earlier run left (prefix dpt<its pid>, or for two machines: dps<its pid>
    shaped, dpl<its pid> delayed; the pid gone): taken down first, with a delay line still running."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for prefix in ("dpt", "dps", "dpl"):
        for pid in {n[3:].split("-")[0] for n in listed if n.startswith(prefix) and "-" in n}:
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and int(pid) != os.getpid():
                subprocess.run(["bash", SCRIPT, "down", *NODES], capture_output=True, timeout=60,
                               env={**os.environ, "DPUOFFLOAD_NETNS_PREFIX": f"{prefix}{pid}"})


@pytest.fixture(scope="module")
def nodes():
    why = _why_not()
    if why:
        skip_or_fail(why, why.broken)
    _remove_stale()
    env = _env()
    up = subprocess.run(["bash", SCRIPT, "up", *UP], capture_output=True, text=True, env=env, timeout=60)
    if up.returncode != 0:
        machines_broken("the emulated machines (scripts/nodes.sh up)", up.stderr, SWITCH)
    try:
        yield env
    finally:
        subprocess.run(["bash", SCRIPT, "down", *NODES], capture_output=True, env=env, timeout=60)


def machine_pids(env: dict[str, str], machine: str) -> list[int]:
    """The processes running on one emulated machine (its network namespace)."""
    out = subprocess.run(["ip", "netns", "pids", f"{env['DPUOFFLOAD_NETNS_PREFIX']}-{machine}"], capture_output=True,
                         text=True, check=True).stdout
    return [int(pid) for pid in out.split()]


def cluster_argv(bundled_data, log, mode: str, *extra: str, launcher: tuple[str, ...] = (),
                 dpus: str = "d0:1,d1:1") -> list[str]:
    """`dpus`: the DPU machines and their DPU ranks (hybrid needs 2 per node: one augments, one validates)."""
    dpu_ranks = sum(int(d.split(":")[1]) for d in dpus.split(","))
    return ["bash", SCRIPT, "dpurun", "--hosts", "h0:1,h1:1", "--dpus", dpus, "--host-ranks", "2",
            "--dpu-ranks", str(dpu_ranks), *launcher, "--", "--preset", "debug", "--data",
            str(bundled_data / "cifar10"),
            "--epochs", "2", "--mode", mode, "--train-subset", "128", "--val-subset", "64", "--digest-batches",
            "--no-progress", "--log-dir", str(log), *extra]


@pytest.fixture(scope="module")
def run(nodes, bundled_data, tmp_path_factory):
    """`run(name, mode, *extra)`: one job across the emulated nodes, once per module, and its logs."""
    done: dict[str, dict] = {}

    def _run(name: str, mode: str, *extra: str, launcher: tuple[str, ...] = (), dpus: str = "d0:1,d1:1") -> dict:
        if name not in done:
            log = tmp_path_factory.mktemp(name)
            res = subprocess.run(cluster_argv(bundled_data, log, mode, *extra, launcher=launcher, dpus=dpus),
                                 capture_output=True, text=True, env=nodes, cwd=REPO, timeout=JOB_TIMEOUT)
            assert res.returncode == 0, res.stdout + res.stderr
            launched = res.stderr.split("dpurun: running:")[1].splitlines()[0]  # the mpirun command
            assert all(f in launched for f in ("--host h0:1,h1:1", f"--host {dpus}", "btl tcp,self"))
            metrics = read_jsonl(log / "metrics.jsonl")
            done[name] = {"epochs": [e for e in metrics if e["event"] == "epoch"],
                          "end": next(e for e in metrics if e["event"] == "end"), "out": res.stdout,
                          "phases": {r: read_jsonl(p) for p in log.glob("phases-rank*.jsonl")
                                     for r in [int(p.stem.removeprefix("phases-rank"))]}}
        return done[name]
    return _run


def da_with_clones(run, tmp_path_factory) -> dict:
    """The da run, with 2 clone ranks (one per host node) forking at step 3 from the DPU keepers'
    state: one job for the da and the clone tests (the clones do not change the group's training)."""
    ck = str(tmp_path_factory.mktemp("clone-ck"))
    return run("da", "da", "--ckpt-dir", ck, "--clone-at", "3", launcher=("--clone-ranks", "2", "--oversubscribe"))


def test_da_across_nodes_pairs_each_host_with_its_own_dpu_and_equals_none(run, tmp_path_factory):
    none, da = run("none", "none"), da_with_clones(run, tmp_path_factory)
    for h in (0, 1):
        assert [e["batch_digest"] for e in da["phases"][h]] == [e["batch_digest"] for e in none["phases"][h]]
    assert [e["step_losses"] for e in da["epochs"]] == [e["step_losses"] for e in none["epochs"]]
    assert len(none["epochs"]) == 2 and da["end"]["weights_sha256"] == none["end"]["weights_sha256"]
    # World ranks 0-1 are the host ranks (h0, h1), 2-3 the DPU ranks (d0, d1: nodes h0 and h1 by --dpus)
    dpu_ends = {r: next(e for e in da["phases"][r] if e.get("event") == "end") for r in (2, 3)}
    assert {r: (e["node"], e["feeds"]) for r, e in dpu_ends.items()} == {2: ("h0", {"0": "h0"}), 3: ("h1", {"1": "h1"})}


def test_hybrid_checkpoints_on_the_dpus_and_resumes_to_the_bit(run, tmp_path_factory):
    """hybrid across machines (2 DPU ranks per DPU: one augments for its node's host rank, one
    validates) stopped at step 6 of 8 with checkpoints every 3 steps (the DPU keepers write the
    shards), then resumed: the same losses, validation sums and final weights as none."""
    ck = str(tmp_path_factory.mktemp("ckpt"))
    two = "d0:2,d1:2"  # world ranks 2-3 on d0 (node h0), 4-5 on d1 (node h1)
    stopped = run("hy-stopped", "hybrid", "--ckpt-dir", ck, "--ckpt-every", "3", "--stop-at-step", "6", dpus=two)
    assert "checkpoint step 6 committed" in stopped["out"] and stopped["end"]["global_step"] == 6
    ends = {r: next(e for e in stopped["phases"][r] if e.get("event") == "end") for r in (2, 3, 4, 5)}
    assert sorted(e["work"] for e in ends.values()) == ["da", "da", "mv", "mv"], ends
    fed = sorted((e["node"], e["feeds"]) for e in ends.values() if e["work"] == "da")
    assert fed == [("h0", {"0": "h0"}), ("h1", {"1": "h1"})]  # each node's augmentation rank feeds its own host
    resumed = run("hy-resumed", "hybrid", "--ckpt-dir", ck, "--resume", "latest", dpus=two)
    assert "(exactly): epoch 2, step 2 done (global step 6)" in resumed["out"], resumed["out"]
    none = run("none", "none")
    assert resumed["epochs"][-1]["step_losses"] == none["epochs"][-1]["step_losses"]
    assert resumed["end"]["weights_sha256"] == none["end"]["weights_sha256"]
    assert [(e["val_loss_sum"], e["val_correct"]) for e in resumed["epochs"]] == \
        [(e["val_loss_sum"], e["val_correct"]) for e in none["epochs"][-1:]]
    assert resumed["epochs"][-1]["val_dpu_share"] == 1.0  # validated on the DPU ranks


def test_a_clone_forks_across_machines_from_the_dpu_keepers_and_trains_identically(run, tmp_path_factory):
    """2 clone ranks (one per host node) stand by, get the state of step 3 from the DPU keepers of both
    machines over TCP, and train on identically (no overrides): every epoch line equal to the group's."""
    out = da_with_clones(run, tmp_path_factory)["out"]
    assert "[clone] state of step 3 received after" in out, out
    lines = [ln.split(" s, ")[0].rsplit(" | ", 1)[0] for ln in out.splitlines() if "| train loss" in ln]
    ours = [ln for ln in lines if not ln.startswith("[clone] ")]
    clone = [ln.removeprefix("[clone] ") for ln in lines if ln.startswith("[clone] ")]
    assert len(ours) == 2 and clone == ours, out


def test_a_killed_dpu_rank_on_another_machine_ends_the_job_naming_it(nodes, bundled_data, tmp_path):
    import psutil

    ready = tmp_path / "phases-rank0.jsonl"  # host rank 0 finished an epoch: training is under way
    proc = subprocess.Popen(cluster_argv(bundled_data, tmp_path, "da", "--epochs", "60"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=nodes, cwd=REPO)
    try:
        deadline = time.monotonic() + (600 if DPU_ARCH == "aarch64" else 180)
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), f"training never got under way (exit code {proc.poll()})"
        victim = next(p for p in map(psutil.Process, machine_pids(nodes, "d0"))  # this job's, not another test's
                      if "dpuoffload.dpu" in p.cmdline() and any("python" in a for a in p.cmdline()[:2]))
        # (an aarch64 rank's command line starts with qemu, the binfmt handler, then the python)
        victim.kill()
        killed_at = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - killed_at < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    # Over TCP the host rank usually loses its socket to the dead DPU rank and aborts before mpirun
    # reports the kill. When Open MPI prints its banner naming the peer's machine (d0, where only
    # DPU rank 0 ran; not in every run before the job ends), dpurun names DPU rank 0 first
    # (launch/supervise.py, name_lost_peer); else it says which rank lost its connection.
    said = next(x for x in err.splitlines() if x.startswith("dpurun: world rank"))
    if "Peer host:" in err or "killed by signal 9" in said:
        assert said.startswith("dpurun: world rank 2 = DPU rank 0 (DPU program) on node d0 died: "), err
    else:
        assert "lost its connection to another rank (Open MPI: 'Socket closed')" in said, err


def started(bundled_data, env: dict[str, str], log: Path, *extra: str,
            launcher: tuple[str, ...] = ()) -> subprocess.Popen:
    """A da job across the four machines, returned once host rank 0 finished an epoch (training under way)."""
    proc = subprocess.Popen(cluster_argv(bundled_data, log, "da", "--epochs", "60", *extra, launcher=launcher),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    deadline = time.monotonic() + (600 if DPU_ARCH == "aarch64" else 180)
    while not (log / "phases-rank0.jsonl").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if not (log / "phases-rank0.jsonl").exists():
        proc.kill()
        raise AssertionError(f"training never got under way (exit code {proc.poll()}): {proc.communicate()}")
    return proc


def job_processes(env: dict[str, str], *machines: str) -> list[str]:
    """This job's live processes (ranks and Open MPI daemons) on the machines named, zombies aside."""
    import psutil

    out = []
    for machine in machines:
        for pid in machine_pids(env, machine):
            with contextlib.suppress(psutil.NoSuchProcess):
                p = psutil.Process(pid)
                line = " ".join(p.cmdline())
                if p.status() != psutil.STATUS_ZOMBIE and ("dpuoffload" in line or "prted" in line):
                    out.append(f"{machine}: {pid} {' '.join(p.cmdline()[:4])}")
    return out


def test_a_lost_machine_pair_is_named_and_restarted_from_dpu_memory(nodes, bundled_data, tmp_path):
    """Every process of h1 and its DPU d1 killed (their daemons, host rank 1, DPU rank 1): Open MPI loses
    its daemon there and ends the job (mpirun then exited 0, and so did dpurun: issue 57); dpurun names
    the machine and the ranks on it, and `--restarts 1` relaunches from DPU memory."""
    proc = started(bundled_data, nodes, tmp_path, "--epochs", "12", "--ckpt-dir", str(tmp_path / "ck"),
                   "--ckpt-every", "2", launcher=("--restarts", "1"))
    try:
        for pid in machine_pids(nodes, "h1") + machine_pids(nodes, "d1"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        _, err = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    lost = [m for m in ("h1", "d1") if f"dpurun: machine {m} lost: Open MPI lost contact with its daemon there" in err]
    assert lost, err
    assert "its machine was lost" in err and "dpurun: restart 1 of 1: relaunching with --resume auto" in err, err
    assert proc.returncode == 0, err
    assert next(m for m in read_jsonl(tmp_path / "metrics.jsonl") if m["event"] == "end")["global_step"] == 12 * 4


def machine_memory(env: dict[str, str], machine: str) -> Path:
    """A machine's own /dev/shm (scripts/nodes.sh): its DPU memory, this box's user 0's part of it."""
    return Path(f"/run/{env['DPUOFFLOAD_NETNS_PREFIX']}-shm/{machine}/dpuoffload-mem-{os.getuid()}")


def test_a_whole_node_lost_restarts_from_its_partner_copy_without_the_disk(nodes, run, bundled_data, tmp_path):
    """Node h1 lost whole: every process of h1 and of its DPU d1 killed once step 8 is committed, and d1's
    DPU memory gone with it (its /dev/shm emptied, as a replacement machine comes up). With the disk
    checkpoints deleted too, `--resume latest` restarts from DPU memory alone: keeper 1's part from the
    partner copy d0 holds (`--ckpt-mem-replicas` defaults to 1 on two nodes), to the bit as the
    uninterrupted run. Then the same again with that copy damaged and the disk back: a warning, a line
    saying why, and the disk, to the same bits."""
    ck, d0 = tmp_path / "ck", machine_memory(nodes, "d0")
    flags = ("--epochs", "6", "--ckpt-dir", str(ck), "--ckpt-every", "2", "--ckpt-mem-keep", "2")
    straight = run("da6", "da", "--epochs", "6")
    proc = subprocess.Popen(cluster_argv(bundled_data, tmp_path / "l1", "da", *flags), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=nodes, cwd=REPO)
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        committed = ck / "step-000000008" / "COMMITTED"
        while not committed.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        for pid in machine_pids(nodes, "h1") + machine_pids(nodes, "d1"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        shutil.rmtree(machine_memory(nodes, "d1"))
        _, err = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and any(f"dpurun: machine {m} lost" in err for m in ("h1", "d1")), err  # (one named)
    shutil.copytree(ck, tmp_path / "ck-saved")
    shutil.copytree(d0, tmp_path / "d0-saved")
    shutil.rmtree(ck)

    def resume(log: str) -> tuple[str, list[dict]]:
        res = subprocess.run(cluster_argv(bundled_data, tmp_path / log, "da", *flags, "--resume", "latest"),
                             capture_output=True, text=True, env=nodes, cwd=REPO, timeout=JOB_TIMEOUT)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout + res.stderr, read_jsonl(tmp_path / log / "metrics.jsonl")

    out, metrics = resume("l2")
    step = int(re.search(r"restarting from DPU memory: the state of step (\d+) ", out)[1])
    assert step >= 6 and ("; DPU rank 1 (world rank 3, node h1)'s part from its partner copy on DPU rank 0 (world "
                          "rank 2, node h0); the checkpoint disk was not read") in out, out
    assert next(m for m in metrics if m["event"] == "end")["weights_sha256"] == straight["end"]["weights_sha256"]

    for d in (d0, ck):  # (as the failure left them: d0's memory, and the disk back)
        shutil.rmtree(d)
    shutil.copytree(tmp_path / "d0-saved", d0)
    shutil.copytree(tmp_path / "ck-saved", ck)
    for part in d0.glob("*/copies/keeper-001/step-*/shared-00001.bin"):
        os.truncate(part, 1000)  # (every copy of keeper 1's part cut short)
    out, metrics = resume("l3")
    assert "shared-00001.bin has 1000 bytes, its header says" in out, out
    assert ("--resume latest: no part of DPU rank 1 (world rank 3, node h1) survives in DPU memory (its own memory and "
            "every copy of it are gone); reading the checkpoint disk") in out, out
    assert f"resuming from {ck}/step-" in out
    assert next(m for m in metrics if m["event"] == "end")["weights_sha256"] == straight["end"]["weights_sha256"]


def test_a_machine_cut_off_ends_the_job_named_in_bounded_time_with_nothing_left_running(nodes, bundled_data,
                                                                                      tmp_path):
    """h1's link cut (`ip link set eth0 down` in its namespace) mid-training: nothing fails on its own and
    TCP would wait minutes, so the job hung until killed (issue 57). Open MPI's daemons now probe their
    connections (`launch.command._keepalive_args`): the job ends within the bound, non-zero, naming h1,
    and no rank or daemon is left on any machine, the cut-off one included."""
    from dpuoffload.launch.command import LOST_MACHINE_BOUND_S

    link = ["ip", "netns", "exec", f"{nodes['DPUOFFLOAD_NETNS_PREFIX']}-h1", "ip", "link", "set", "eth0"]
    proc = started(bundled_data, nodes, tmp_path)
    try:
        subprocess.run([*link, "down"], check=True)
        cut_at = time.monotonic()
        _, err = proc.communicate(timeout=LOST_MACHINE_BOUND_S + 90)
        took = time.monotonic() - cut_at
        time.sleep(2)  # (the cut-off machine's own ranks and daemon end when they notice, at the same bound)
        left = job_processes(nodes, *NODES)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run([*link, "up"], check=True)
    print(f"the job ended {took:.1f} s after the cut")
    assert proc.returncode != 0 and took < LOST_MACHINE_BOUND_S + 30, (took, err)
    assert "dpurun: machine h1 lost: Open MPI lost contact with its daemon there" in err, err
    assert "world rank 1 = host rank 1 (host program)" in err
    assert not left, left


def test_mpich_across_machines_pairs_each_host_with_its_own_dpu_and_equals_none(nodes, run, bundled_data, tmp_path):
    """The same cluster-mode job under MPICH (`.venv-mpich`, Hydra's mpiexec, started on the other
    machines through the same agent: `scripts/nodes.sh` sets Hydra's variables): Hydra's host syntax
    places the ranks, each host rank is fed by its own node's DPU over TCP, and `da` trains as `none`.
    The reference is this module's `none` job under Open MPI and Horovod (the same flags but the MPI and
    the allreduce): batches are built the same whatever the MPI, and Horovod, torch and MPI allreduce agree
    to the bit (tests/jobs/test_training.py), so one MPICH job checks both libraries at once."""
    venv = REPO / ".venv-mpich"
    if DPU_ARCH == "aarch64":
        pytest.skip("the aarch64 machines run Open MPI (scripts/aarch64.sh makes no aarch64 MPICH venv)")
    if not (venv / "bin" / "mpiexec").exists():
        skip_or_fail(f"no MPICH venv at {venv} (bash scripts/test.sh sets it up unless DPUOFFLOAD_TEST_MPICH=0)",
                     broken=not switched_off("DPUOFFLOAD_TEST_MPICH"))
    env = {**nodes, "DPUOFFLOAD_VENV": str(venv)}
    res = subprocess.run(cluster_argv(bundled_data, tmp_path, "da", "--allreduce", "torch"), capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    launched = res.stderr.split("dpurun: running:")[1].splitlines()[0]
    assert launched.split()[0] == str(venv / "bin" / "mpirun") and "-hosts h0:1,h1:1,d0:1,d1:1 -n 2 " in launched
    none = run("none", "none")
    phases = {r: read_jsonl(tmp_path / f"phases-rank{r}.jsonl") for r in range(4)}
    for h in (0, 1):
        assert [e["batch_digest"] for e in phases[h]] == [e["batch_digest"] for e in none["phases"][h]]
    end = next(e for e in read_jsonl(tmp_path / "metrics.jsonl") if e["event"] == "end")
    assert end["allreduce"] == "torch" and end["weights_sha256"] == none["end"]["weights_sha256"]
    dpu_ends = {r: next(e for e in phases[r] if e.get("event") == "end") for r in (2, 3)}
    assert {r: (e["node"], e["feeds"]) for r, e in dpu_ends.items()} == {2: ("h0", {"0": "h0"}), 3: ("h1", {"1": "h1"})}


@contextlib.contextmanager
def two_machines(prefix: str, subnet: str, **knobs: str) -> Iterator[tuple[dict[str, str], str]]:
    """h0 and its DPU d0 up (scripts/nodes.sh) under this test's own prefix and subnet with the link
    `knobs` (DPUOFFLOAD_NETNS_RATE=...), taken down after: their environment and `up`'s output.
    Skipped with the reason where they cannot be made; failed where they could but did not come up."""
    why = _why_not()
    if why:
        skip_or_fail(why, why.broken)
    _remove_stale()
    env = {**job_env(), "DPUOFFLOAD_NETNS_PREFIX": f"{prefix}{os.getpid()}",
           "DPUOFFLOAD_NETNS_SUBNET": f"{subnet}.{os.getpid() % 250}", **knobs}
    up = subprocess.run(["bash", SCRIPT, "up", "h0", "d0"], capture_output=True, text=True, env=env, timeout=60)
    if up.returncode != 0:
        machines_broken("h0 and d0 (scripts/nodes.sh up)", up.stderr, SWITCH)
    try:
        yield env, up.stdout
    finally:
        subprocess.run(["bash", SCRIPT, "down", "h0", "d0"], capture_output=True, env=env, timeout=60)


def mpi_probe(env: dict[str, str], code: str) -> str:
    """What `code` prints run as 2 MPI ranks, on h0 and d0 (raw mpi4py over TCP between them)."""
    flags = subprocess.run(["bash", SCRIPT, "mpi-flags"], capture_output=True, text=True, env=env,
                           check=True).stdout.split()
    venv = REPO / ".venv" / "bin"
    probe = subprocess.run(["bash", SCRIPT, "run", "h0", str(venv / "mpirun"), *flags, "--host", "h0:1,d0:1",
                            "-np", "2", str(venv / "python"), "-c", code], capture_output=True, text=True,
                           env=env, cwd=REPO, timeout=120)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    return probe.stdout


NONE_DIGESTS: list[str] = []  # the first two-machine test's `none` batches (one epoch, 1 host rank)


def da_digests_equal_none(env: dict[str, str], bundled_data, tmp_path: Path) -> None:
    """One epoch of `da` (h0 fed by d0 over the link) gives the batches of `none`, to the bit. `none` runs
    once per module, over the first test's link: its host rank builds its own batches, which no link
    touches (its DPU rank idles), so the next test's `da` is compared with the same batches."""
    def digests(mode: str) -> list[str]:
        log = tmp_path / mode
        argv = ["bash", SCRIPT, "dpurun", "--hosts", "h0:1", "--dpus", "d0:1", "--host-ranks", "1",
                "--dpu-ranks", "1", "--", "--preset", "debug", "--data", str(bundled_data / "cifar10"),
                "--epochs", "1", "--mode", mode, "--train-subset", "128", "--val-subset", "64",
                "--digest-batches", "--no-progress", "--log-dir", str(log)]
        res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        return [e["batch_digest"] for e in read_jsonl(log / "phases-rank0.jsonl")]

    if not NONE_DIGESTS:
        NONE_DIGESTS.extend(digests("none"))
    da = digests("da")
    assert da == NONE_DIGESTS and len(da) == 1


RATE_MBPS = 400   # the shaped links' rate, Mbit/s: 50 MB/s
PROBE = """
import sys, time
import numpy as np
from mpi4py import MPI
comm, buf = MPI.COMM_WORLD, np.zeros(8 << 20, dtype=np.uint8)
for i in range(5):  # the first one crosses the bucket's 2 MB burst and sets the connection up: not timed
    if i == 1:
        comm.Barrier()
        t0 = time.perf_counter()
    comm.Send(buf, dest=1) if comm.rank == 0 else comm.Recv(buf, source=0)
comm.Barrier()
if comm.rank == 1:
    print(f"MBps {4 * buf.nbytes / (time.perf_counter() - t0) / 1e6:.1f}", flush=True)
"""


def test_a_link_of_a_stated_speed_caps_the_transfer_and_da_still_equals_none(bundled_data, tmp_path):
    """Two machines (h0 and its DPU d0) whose links are shaped to 400 Mbit/s
    (`DPUOFFLOAD_NETNS_RATE`, a `tbf` qdisc on each machine's side): raw MPI sends between them
    move no faster than that (an upper bound: a slow box only makes it lower), and `da` over the
    slow link still trains to the bit as `none`. The link's measured speed against raw MPI is
    benchmarks/transport.py --tcp's job."""
    with two_machines("dps", "10.79", DPUOFFLOAD_NETNS_RATE=f"{RATE_MBPS}mbit") as (env, said):
        assert f"links at {RATE_MBPS}mbit" in said
        out = mpi_probe(env, PROBE)
        mbps = float(out.split("MBps")[1].split()[0])
        assert mbps <= 1.15 * RATE_MBPS / 8, out
        da_digests_equal_none(env, bundled_data, tmp_path)


DELAY_MS = 2.0  # one way, h0 <-> d0 (one node: DPUOFFLOAD_NETNS_DELAY)
PING_PONG = """
import time
import numpy as np
from mpi4py import MPI
comm, buf, rtts = MPI.COMM_WORLD, np.zeros(1, dtype=np.uint8), []
for i in range(12):  # the first 2 set the connection up: not counted
    t0 = time.perf_counter()
    if comm.rank == 0:
        comm.Send(buf, dest=1)
        comm.Recv(buf, source=1)
    else:
        comm.Recv(buf, source=0)
        comm.Send(buf, dest=0)
    rtts.append(time.perf_counter() - t0)
if comm.rank == 0:
    print(f"one-way ms: min {min(rtts[2:]) / 2 * 1e3:.3f}", flush=True)
"""
ECHO = """
import socket
server = socket.create_server(("0.0.0.0", 7007))
conn = server.accept()[0]
while conn.recv(1):
    conn.sendall(b"x")
"""
PING = """
import socket, time
for _ in range(100):  # until the echo server listens
    try:
        conn = socket.create_connection(("d0", 7007))
        break
    except ConnectionRefusedError:
        time.sleep(0.1)
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(20):
    t0 = time.perf_counter()
    conn.sendall(b"x")
    conn.recv(1)
    rtts.append(time.perf_counter() - t0)
one_way = sorted(t / 2 * 1e3 for t in rtts[1:])
print(f"one-way ms: min {one_way[0]:.3f} median {one_way[len(one_way) // 2]:.3f}", flush=True)
"""


def tcp_ping(env: dict[str, str]) -> tuple[float, float]:
    """One-way times h0 -> d0 (min, median; ms) of a 1-byte TCP ping-pong between plain sockets."""
    echo = subprocess.Popen(["bash", SCRIPT, "run", "d0", sys.executable, "-c", ECHO], env=env)
    try:
        ping = subprocess.run(["bash", SCRIPT, "run", "h0", sys.executable, "-c", PING], capture_output=True,
                              text=True, env=env, timeout=60)
        assert ping.returncode == 0, ping.stdout + ping.stderr
    finally:
        try:
            echo.wait(timeout=10)
        except subprocess.TimeoutExpired:
            echo.kill()
    least, median = (float(x) for x in ping.stdout.split("one-way ms: min")[1].split(" median "))
    return least, median


def test_a_delayed_link_holds_every_message_for_its_delay_and_da_still_equals_none(bundled_data, tmp_path):
    """Two machines joined by the delay line (`DPUOFFLOAD_NETNS_DELAY=2ms`: scripts/delayline.py, a
    userspace switch over TAPs, as this kernel has no netem): a TCP ping-pong's one-way time is at
    least the delay and not much more (the line's wake-up adds tens of microseconds; a busy box
    some ms), every MPI message takes at least the delay, and `da` over the delayed link still
    trains to the bit as `none`. (MPI's own small-message round trips are no measure of the link
    here: on this box Open MPI's TCP transport takes them in steps of 4 ms, one tick of the kernel's
    250 Hz clock, even over the undelayed veth link: 8 ms round trips.)"""
    if not os.path.exists("/dev/net/tun"):
        skip_or_fail("the delay line needs the kernel's TUN/TAP driver (/dev/net/tun)", broken=True)
    with two_machines("dpl", "10.80", DPUOFFLOAD_NETNS_DELAY=f"{DELAY_MS:g}ms") as (env, said):
        assert f"delay {DELAY_MS:g}ms within a node" in said, said
        least, median = tcp_ping(env)
        assert least >= DELAY_MS and median < DELAY_MS + 5, (least, median)
        out = mpi_probe(env, PING_PONG)
        assert float(out.split("one-way ms: min")[1]) >= DELAY_MS, out
        da_digests_equal_none(env, bundled_data, tmp_path)


def test_a_failed_delayed_up_says_why_and_leaves_nothing(tmp_path):
    """`up` whose delay line cannot start (here: a prefix too long for its TAP names) fails naming
    the cause and takes down the namespaces it made; a bad delay fails before making any."""
    why = _why_not()
    if why:
        skip_or_fail(why, why.broken)
    prefix = f"dpl{os.getpid()}x{'y' * 8}"  # + "t1": over the 15 characters of an interface name
    env = {**job_env(), "DPUOFFLOAD_NETNS_PREFIX": prefix, "DPUOFFLOAD_NETNS_DELAY": "1ms"}
    for knobs, said in (({}, "TAP name"), ({"DPUOFFLOAD_NETNS_DELAY": "2x"}, "DPUOFFLOAD_NETNS_DELAY='2x' is not")):
        up = subprocess.run(["bash", SCRIPT, "up", "h0", "d0"], capture_output=True, text=True,
                            env={**env, **knobs}, timeout=60)
        assert up.returncode != 0 and said in up.stderr, up.stderr
        assert prefix not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not [p for p in Path("/run").iterdir() if p.name.startswith(prefix)]
