"""dpurun under a real Slurm: `sbatch` jobs on emulated machines (scripts/slurm.sh: Debian's
slurmctld and one slurmd per machine, each machine a network namespace with its own hostname).

The cluster has 2 host machines (h0, h1) and their 2 DPU machines (h0-bf, h1-bf), for both kinds of
site: DPUs as Slurm nodes (partition `all`, `dpurun --dpu-nodes bf`: Open MPI starts its daemons
through `srun`) and DPUs outside Slurm (partition `hosts`, `dpurun --dpu-name '{host}-bf'`: the DPU
machines are never allocated, Open MPI reaches them through its ssh agent). Every job runs the
job script of `examples/slurm/` in miniature (the same dpurun flags, the same requeue line): `da`
trains to the bit as `none` does with each host rank fed by its own node's DPU, `scancel` ends every
rank at once and the output names the last committed checkpoint, and a requeued job resumes exactly.

Needs root (namespaces) and Slurm's packages (`bash scripts/slurm.sh install`, run by
scripts/test.sh; `up` installs them when missing); skipped with the reason otherwise, and with
DPUOFFLOAD_TEST_SLURM=0. One cluster for the module (its own prefix and subnet, taken down after).

(Here the tests that start processes; those that run in one process: tests/unit/test_slurm_cluster.py.)
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mpijobs import (
    REPO,
    Unavailable,
    job_env,
    machines_broken,
    machines_unavailable,
    read_jsonl,
    skip_or_fail,
)
from tests.unit.test_slurm_cluster import AS_NODES, OUTSIDE, OUTSIDE_MPI

pytestmark = pytest.mark.mpi
SCRIPT = str(REPO / "scripts" / "slurm.sh")
EPOCHS = 4  # 16 steps: room for a requeue after the first checkpoint (every 2 steps) and before the end


def _why_not() -> Unavailable | None:
    return machines_unavailable("DPUOFFLOAD_TEST_SLURM", "ip netns, mounts, apt-get: a Slurm on them")


def _remove_stale() -> None:
    """Clusters a killed earlier run left (prefix dsl<its pid>, the pid gone): taken down first."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for pid in {n[3:].split("-")[0] for n in listed if n.startswith("dsl") and "-" in n}:
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and int(pid) != os.getpid():
            subprocess.run(["bash", SCRIPT, "down"], capture_output=True, timeout=120,
                           env={**os.environ, "DPUOFFLOAD_SLURM_PREFIX": f"dsl{pid}",
                                "DPUOFFLOAD_SLURM_SUBNET": f"10.74.{int(pid) % 250}"})


class Cluster:
    """The module's Slurm: Slurm's commands run on its controller machine (`scripts/slurm.sh CMD`)."""

    def __init__(self, env: dict[str, str], data: Path, root: Path):
        self.env, self.data, self.root = env, data, root

    def slurm(self, *argv: str, check: bool = True) -> str:
        res = subprocess.run(["bash", SCRIPT, *argv], capture_output=True, text=True, env=self.env, cwd=REPO,
                             timeout=60)
        assert res.returncode == 0 or not check, res.stdout + res.stderr
        return res.stdout

    def submit(self, name: str, naming: str, mode: str, *sbatch: str, mpi: str = "", train: str = "") -> "Job":
        """A job script like examples/slurm/'s, with the tiny preset: submitted, not waited for."""
        log = self.root / name
        log.mkdir()
        placed = log / "placed"
        placed.mkdir()
        recorder = log / "python"  # the ranks' python, writing where each world rank runs, then itself
        recorder.write_text(f'#!/bin/sh\n[ -z "$OMPI_COMM_WORLD_RANK" ] || hostname > {placed}/$OMPI_COMM_WORLD_RANK\n'
                            f'exec {shlex.quote(sys.executable)} "$@"\n')
        recorder.chmod(0o755)
        training = (f"--preset debug --data {self.data / 'cifar10'} --epochs {EPOCHS} --mode {mode} "
                    f"--train-subset 128 --val-subset 64 --digest-batches --no-progress {train}")
        script = log / "job.sbatch"
        script.write_text(f"""#!/bin/bash
set -euo pipefail
RESUME=()
[ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ] && RESUME=(--resume latest)   # requeued: continue, exactly
echo "job $SLURM_JOB_ID on $(hostname): SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST, restart ${{SLURM_RESTART_COUNT:-0}}"
dpurun {naming} --python {recorder} --mpirun-arg="$(bash {SCRIPT} mpi-flags) {mpi}" \\
  -- {training} --log-dir {log}/run${{SLURM_RESTART_COUNT:-0}} "${{RESUME[@]}}"
""")
        out = log / "slurm.out"
        job_id = self.slurm("sbatch", "--parsable", "--job-name", name, "--ntasks-per-node=1", "--output", str(out),
                            "--chdir", str(REPO), *sbatch, str(script)).strip().split(";")[0]
        return Job(self, job_id, log, out)


class Job:
    def __init__(self, cluster: Cluster, job_id: str, log: Path, out: Path):
        self.cluster, self.id, self.log, self.out = cluster, job_id, log, out

    def state(self) -> str:
        shown = self.cluster.slurm("scontrol", "show", "job", "-o", self.id)
        return shown.split("JobState=")[1].split()[0]

    def wait(self, timeout: float = 240) -> str:
        """Until the job ends (its state then: COMPLETED, FAILED, CANCELLED...)."""
        deadline = time.monotonic() + timeout
        while (state := self.state()) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED"):
            assert time.monotonic() < deadline, f"job {self.id} still {state} after {timeout} s:\n{self.text()}"
            time.sleep(0.5)
        return state

    def text(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def story(self) -> str:
        """The job's output, then what the controller and the nodes' slurmd logged about it (for failures)."""
        logs = Path(f"/run/{self.cluster.env['DPUOFFLOAD_SLURM_PREFIX']}-slurm/log")
        said = [ln for p in sorted(logs.glob("slurm*.log")) for ln in p.read_text(errors="replace").splitlines()
                if f"JobId={self.id} " in ln or f"job {self.id} " in ln or f"[{self.id}." in ln or f" {self.id}." in ln]
        return self.text() + "\n--- Slurm's logs:\n" + "\n".join(said)

    def run(self, n: int = 0) -> dict:
        """Run `n` of the job (0, then 1 after a requeue): its metrics, ranks' phases and placement."""
        d = self.log / f"run{n}"
        metrics = read_jsonl(d / "metrics.jsonl")
        return {"epochs": [e for e in metrics if e["event"] == "epoch"],
                "end": next((e for e in metrics if e["event"] == "end"), None),
                "phases": {int(p.stem.removeprefix("phases-rank")): read_jsonl(p)
                           for p in d.glob("phases-rank*.jsonl")},
                "placed": {int(p.name): p.read_text().strip() for p in (self.log / "placed").iterdir()}}


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    why = _why_not()
    if why:
        skip_or_fail(why, why.broken)
    bundled_data = request.getfixturevalue("bundled_data")  # (only where the tests run: it takes seconds)
    _remove_stale()
    env = {**job_env(), "DPUOFFLOAD_SLURM_PREFIX": f"dsl{os.getpid()}",
           "DPUOFFLOAD_SLURM_SUBNET": f"10.74.{os.getpid() % 250}"}
    up = subprocess.run(["bash", SCRIPT, "up"], capture_output=True, text=True, env=env, timeout=300)
    if up.returncode != 0:
        subprocess.run(["bash", SCRIPT, "down"], capture_output=True, env=env, timeout=120)
        machines_broken("the Slurm cluster (scripts/slurm.sh up)", up.stderr, "DPUOFFLOAD_TEST_SLURM")
    try:
        yield Cluster(env, bundled_data, tmp_path_factory.mktemp("slurm"))
    finally:
        subprocess.run(["bash", SCRIPT, "down"], capture_output=True, env=env, timeout=120)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert env["DPUOFFLOAD_SLURM_PREFIX"] + "-" not in left, left  # `down` leaves nothing running


@pytest.fixture(scope="module")
def jobs(cluster):
    """Each job once per module, run to its end: `jobs(name)`."""
    kinds = {"none": (OUTSIDE + " --dpu-ranks 0", "none", ("--partition", "hosts", "--nodes", "2"), OUTSIDE_MPI),
             "as-nodes": (AS_NODES, "da", ("--partition", "all", "--nodes", "4"), ""),
             "outside": (OUTSIDE, "da", ("--partition", "hosts", "--nodes", "2"), OUTSIDE_MPI)}
    done: dict[str, tuple[Job, dict]] = {}

    def _job(name: str) -> tuple[Job, dict]:
        if name not in done:
            naming, mode, sbatch, mpi = kinds[name]
            job = cluster.submit(name, naming, mode, *sbatch, mpi=mpi)
            assert job.wait() == "COMPLETED", job.story()
            done[name] = (job, job.run())
        return done[name]
    return _job


def assert_da_equals_none(jobs, kind: str, nodelist: str) -> str:
    job, da = jobs(kind)
    _, none = jobs("none")
    said = job.text()
    assert f"SLURM_JOB_NODELIST={nodelist} (" in said, said
    assert "dpurun: note: from the allocation: --hosts h0:1,h1:1 --dpus h0-bf:1,h1-bf:1 --host-ranks 2 --dpu-ranks 2" \
        in said, said
    # World ranks 0-1 are the host ranks, 2-3 the DPU ranks: where each ran (its machine's hostname)
    assert da["placed"] == {0: "h0", 1: "h1", 2: "h0-bf", 3: "h1-bf"}, said
    assert none["placed"] == {0: "h0", 1: "h1"}
    dpu_ends = {r: next(e for e in da["phases"][r] if e.get("event") == "end") for r in (2, 3)}
    assert {r: (e["node"], e["feeds"]) for r, e in dpu_ends.items()} == {2: ("h0", {"0": "h0"}), 3: ("h1", {"1": "h1"})}
    for h in (0, 1):
        assert [e["batch_digest"] for e in da["phases"][h]] == [e["batch_digest"] for e in none["phases"][h]]
    assert [e["step_losses"] for e in da["epochs"]] == [e["step_losses"] for e in none["epochs"]]
    assert len(none["epochs"]) == EPOCHS and da["end"]["weights_sha256"] == none["end"]["weights_sha256"]
    return said


def test_dpus_as_slurm_nodes_each_host_fed_by_its_own_dpu_equals_none(jobs):
    """sbatch -N 4 on partition `all` (h0, h1, h0-bf, h1-bf): dpurun --dpu-nodes bf pairs h0 with
    h0-bf and h1 with h1-bf; Open MPI starts its daemons on the other 3 nodes with srun (a job step)."""
    said = assert_da_equals_none(jobs, "as-nodes", "h0,h0-bf,h1,h1-bf")
    assert "--prtemca plm ssh" not in said


def test_dpus_outside_slurm_found_by_name_each_host_fed_by_its_own_dpu_equals_none(jobs):
    """sbatch -N 2 on partition `hosts` (h0, h1 only): dpurun --dpu-name '{host}-bf' finds h0-bf and
    h1-bf, which Slurm never allocated, and Open MPI reaches them by its ssh agent."""
    assert_da_equals_none(jobs, "outside", "h[0-1]")


def wait_for_checkpoint(job: Job, ckpt: Path, timeout: float = 180) -> list[Path]:
    from dpuoffload.common.state.ckptdirs import committed

    deadline = time.monotonic() + timeout
    while not committed(ckpt):
        assert job.state() in ("PENDING", "CONFIGURING", "RUNNING"), f"job {job.id} ended early:\n{job.text()}"
        assert time.monotonic() < deadline, f"no checkpoint committed in {timeout} s:\n{job.text()}"
        time.sleep(0.2)
    return committed(ckpt)


def last_words(job: Job, line: str, timeout: float = 30) -> str:
    """The job's output once `line` is in it, or after `timeout` (Slurm's KillWait): the job reads
    CANCELLED and its ranks are gone while dpurun, signalled with them, may still be writing its
    report (under a loaded test run the output was read before it, once)."""
    deadline = time.monotonic() + timeout
    while line not in (said := job.text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return said


def ranks_on(cluster: Cluster) -> dict[str, int]:
    """How many ranks (python processes of dpuoffload's programs) run on each machine of the cluster."""
    import psutil

    found = {}
    for machine in ("h0", "h1", "h0-bf", "h1-bf"):
        ns = f"{cluster.env['DPUOFFLOAD_SLURM_PREFIX']}-{machine}"
        found[machine] = 0
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(int(pid))
                rank = "python" in p.name() and bool({"dpuoffload.host", "dpuoffload.dpu"} & set(p.cmdline()))
                found[machine] += rank
    return found


def test_scancel_ends_every_rank_at_once_and_names_the_last_checkpoint(cluster, tmp_path):
    """A long da job (DPUs as Slurm nodes) cancelled after its first checkpoint: Slurm signals
    every process of the job (the batch step and srun's daemon step), all ranks on all 4 machines
    are gone within 30 s (Slurm's KillWait), and dpurun's last words name the last committed
    checkpoint, where `--resume latest` would continue."""
    ckpt = tmp_path / "ckpt"
    job = cluster.submit("cancelled", AS_NODES, "da", "--partition", "all", "--nodes", "4",
                         train=f"--epochs 60 --ckpt-dir {ckpt} --ckpt-every 2")
    wait_for_checkpoint(job, ckpt)
    running = ranks_on(cluster)
    assert running == {"h0": 1, "h1": 1, "h0-bf": 1, "h1-bf": 1}, running
    cancelled_at = time.monotonic()
    cluster.slurm("scancel", job.id)
    while any(ranks_on(cluster).values()):
        assert time.monotonic() - cancelled_at < 30, ranks_on(cluster)
        time.sleep(0.2)
    took = time.monotonic() - cancelled_at
    assert job.wait(60) == "CANCELLED"
    from dpuoffload.common.state.ckptdirs import committed

    said = last_words(job, "dpurun: the last committed checkpoint is")
    last = committed(ckpt)[-1]
    assert f"*** JOB {job.id} ON h0 CANCELLED AT" in said, said
    assert f"dpurun: the last committed checkpoint is {last}; continue with `--resume latest`" in said, said
    print(f"scancel: every rank gone after {took:.1f} s; {last.name} named")


def test_a_requeued_job_resumes_from_its_last_checkpoint_exactly(cluster, jobs, tmp_path):
    """`scontrol requeue` after the first checkpoint (every 2 steps) of a da job submitted with
    --requeue: Slurm ends the first run and starts the job script again with SLURM_RESTART_COUNT=1,
    which adds `--resume latest`; the second run continues exactly from the last committed
    checkpoint and ends with the losses and weights of an uninterrupted `none` run.
    (Slurm holds a requeued job for 121 s (its BeginTime); the test releases it after 2 s.)"""
    ckpt = tmp_path / "ckpt"
    job = cluster.submit("requeued", AS_NODES, "da", "--partition", "all", "--nodes", "4", "--requeue",
                         "--open-mode=append", train=f"--ckpt-dir {ckpt} --ckpt-every 2")
    wait_for_checkpoint(job, ckpt)
    cluster.slurm("scontrol", "requeue", job.id)
    deadline = time.monotonic() + 60
    while job.state() != "PENDING" or any(ranks_on(cluster).values()):  # (held until its BeginTime, old run gone)
        assert time.monotonic() < deadline, job.story()
        time.sleep(0.2)
    # Released within the second of the requeue, the job once ended FAILED without running (likely a
    # node refusing a credential issued in the second it revoked the old one; Slurm's own hold is the
    # credential's lifetime, 121 s)
    time.sleep(2)
    cluster.slurm("scontrol", "update", f"JobId={job.id}", "StartTime=now")
    assert job.wait() == "COMPLETED", job.story()
    said = job.text()
    first, second = said.split("restart 1\n")
    assert "CANCELLED AT" in first and "DUE TO JOB REQUEUE" in first, said
    assert "dpurun: the last committed checkpoint is" in first, said
    resumed_from = second.split("[dpuoffload] resuming from ")[1].split(" (")[0]
    # (exactly, from mid-epoch or from an epoch's end: the requeue may land after either checkpoint)
    assert Path(resumed_from).parent == ckpt and re.search(r"\(exactly\): (epoch \d+, step|end of epoch)", second), said
    resumed, none = job.run(1), jobs("none")[1]
    step = int(Path(resumed_from).name.removeprefix("step-"))
    assert 0 < step < EPOCHS * 4, said  # (4 steps an epoch) a checkpoint from the middle of the run
    assert resumed["end"]["weights_sha256"] == none["end"]["weights_sha256"]
    assert resumed["epochs"][-1]["step_losses"] == none["epochs"][-1]["step_losses"]
    assert resumed["placed"] == {0: "h0", 1: "h1", 2: "h0-bf", 3: "h1-bf"}
    print(f"requeue: resumed exactly from {Path(resumed_from).name}")
