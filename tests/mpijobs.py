"""Helpers for tests that start real MPI jobs (host and DPU ranks, oversubscribed on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DPURUN = str(BIN / "dpurun")
MPIRUN = str(BIN / "mpirun")
PY = sys.executable


def job_env() -> dict[str, str]:
    """Environment for MPI jobs: venv first on PATH, tests importable (user factories), root allowed."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")  # (Hugging Face data sets from local files: never the hub)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def run(cmd: Sequence[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd)` that ends the whole job when the test gives up on it.

    subprocess.run's timeout (and pytest-timeout's exception, raised inside it) SIGKILLs the one
    process it started, which cannot pass that on: an MPICH job once kept its proxy and DPU ranks
    spinning for two hours that way. Here the command leads its own process group, which is told
    SIGTERM first (dpurun and mpirun forward it and end their ranks), then SIGKILL."""
    started = time.perf_counter()
    with subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_env(),
                          cwd=REPO, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            print_tail(*end_group(proc))
            raise
    note_job(cmd, time.perf_counter() - started)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def note_job(cmd: Sequence[str], wall: float) -> None:
    """With DPUOFFLOAD_TEST_JOBS=FILE, append the job's command line, wall seconds and test to FILE (a
    JSON line per job): which tests start which jobs, and the same job started by several tests
    (docs/testing.md, "Where the suite's time goes")."""
    path = os.environ.get("DPUOFFLOAD_TEST_JOBS")
    if path:
        line = {"test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0], "argv": list(cmd),
                "wall_s": round(wall, 2)}
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


def end_group(proc: subprocess.Popen, grace: float = 10.0) -> tuple[str, str]:
    """SIGTERM to `proc`'s process group (it leads one), SIGKILL if it is still there after `grace` s.
    Returns what the job printed (all of it: `communicate` goes on from where the timeout left it)."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break   # (gone already: what it printed is still in the pipes)
        try:
            return proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    try:
        return proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        return "", ""


def print_tail(out: Optional[str], err: Optional[str], lines: int = 40) -> None:
    """The end of a job the test gave up on, into the test's captured output: where it stood (a CI
    run showed only the test's own stack, waiting in `communicate`, for a job that hung)."""
    for name, text in (("stdout", out), ("stderr", err)):
        tail = (text or "").splitlines()[-lines:]
        print(f"----- the job's {name}, last {len(tail)} lines -----", *tail, sep="\n")


# Flags that place ranks on chosen cores or machines: a job with one keeps dpurun's pinned emulation.
PLACING = ("--dpu-cores", "--dpu-speed", "--clone-cores", "--hosts", "--hostfile", "--share-cores")


def shared(launcher: Sequence[str]) -> list[str]:
    """`--share-cores` unless the job places ranks itself. On the 2-core box dpurun's emulation pins
    host ranks to core 0 and DPU ranks to core 1, so 2 host ranks import torch and train one after
    the other on one core while an idle DPU rank leaves the other unused: sharing both cores ran a
    2-host `none` job in 13-14 s instead of 18-20 s. What the tests check (results, errors, messages)
    does not depend on the placement; the placement itself is tested by the jobs that set it."""
    return list(launcher) if any(a.split("=")[0] in PLACING for a in launcher) else [*launcher, "--share-cores"]


def dpurun(launcher: Sequence[str], training: Sequence[str], timeout: float = 240) -> subprocess.CompletedProcess:
    return run([DPURUN, *shared(launcher), "--", *training], timeout=timeout)


def mpmd(n_host: int, host_argv: Sequence[str], n_dpu: int, dpu_argv: Sequence[str],
         timeout: float = 120, ft: bool = False) -> subprocess.CompletedProcess:
    """A hand-written MPMD mpirun line (what dpurun would build, but with free per-side argv): its
    one-box transports, and waits that yield the core on every rank (dpurun yields on the host
    program's only, `launch.command._yield_env`; these jobs test roles and faults, not speed).
    `ft`: with Open MPI's fault tolerance (`--with-ft ulfm`, as dpurun starts a fault-tolerant run)."""
    return run([MPIRUN, "--oversubscribe", "--bind-to", "none", *(["--with-ft", "ulfm"] if ft else []), "--mca", "btl",
                "^ofi", "--mca", "mpi_yield_when_idle", "1", "-np", str(n_host), *host_argv, ":", "-np", str(n_dpu),
                *dpu_argv], timeout=timeout)


class Unavailable(str):
    """Why a set-up the tests need cannot be had here (the text), and whether that is a broken set-up
    (`broken`: tools, namespaces or an environment missing where they should be) rather than a choice
    (`broken` False: turned off by its switch, or not root). `skip_or_fail` decides by it."""

    broken: bool

    def __new__(cls, reason: str, broken: bool) -> "Unavailable":
        self = super().__new__(cls, reason)
        self.broken = broken
        return self


def under_ci() -> bool:
    """Whether this runs under CI: CI=true in the environment (as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def switched_off(switch: str) -> bool:
    """`switch`=0 in the environment: those tests turned off on purpose (DPUOFFLOAD_TEST_MPICH=0 ...)."""
    return os.environ.get(switch, "1") == "0"


def skip_or_fail(reason: str, broken: bool) -> NoReturn:
    """Skip the test with `reason`; but where `broken` (a set-up that should be there and is not, rather
    than one turned off or not permitted here) and under CI (CI=true), fail it with the same message: a
    CI run must not count a broken emulation (nodes, aarch64, Slurm, MPICH) as tests it need not run.
    Deliberate skips (a DPUOFFLOAD_TEST_*=0 switch, not root, no CUDA GPU) stay skips under CI too."""
    import pytest

    if broken and under_ci():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def machines_unavailable(switch: Optional[str] = None, needs: str = "ip netns add") -> Optional[Unavailable]:
    """Why emulated machines (scripts/nodes.sh: network namespaces) cannot be had here, or None.
    `switch`: an environment variable that turns the tests off with 0; `needs`: what root is for.
    Turned off and not root are choices; the rest (no ip or unshare, no namespaces) a broken set-up."""
    import shutil

    if switch and switched_off(switch):
        return Unavailable(f"{switch}=0: turned off", broken=False)
    if os.geteuid() != 0:
        return Unavailable(f"emulated machines need root ({needs})", broken=False)
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return Unavailable("emulated machines need iproute2's ip and util-linux's unshare", broken=True)
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:  # (root in a container without the capabilities: a limit of the machine)
        return Unavailable(f"this machine cannot make network and mount namespaces (unshare: {probe.stderr.strip()})",
                           broken=True)
    return None


def machines_broken(what: str, stderr: str, switch: str) -> None:
    """Fail the test: `what` did not come up on a machine that has what it needs (root, the tools).
    That is the emulation broken (scripts/nodes.sh, slurm.sh, aarch64.sh), which must show as a
    failure: a skip would let CI count a broken emulation as nothing run."""
    import pytest

    pytest.fail(f"{what} did not come up, though this machine has what it needs: {stderr.strip()}\n"
                f"(a broken emulation script? {switch}=0 turns these tests off where that is intended)")


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kill_first_dpu_rank_once(training: Sequence[str], ready: Path, limit: float = 30,
                             sig: int = 9) -> tuple[int, str, float]:
    """Start `dpurun -- training` (1 host + 1 DPU rank), wait until file `ready` exists (training
    is under way), send `sig` (default SIGKILL; SIGSTOP hangs the rank instead) to the DPU rank, and
    return (exit code, stderr, seconds until the job ended). Fails the test if `ready` never appears
    (the signal would hit a job that is not training) or if the job outlives `limit` seconds after
    the signal."""
    import time

    import psutil
    import pytest

    proc = subprocess.Popen([DPURUN, "--host-ranks", "1", "--dpu-ranks", "1", "--share-cores", "--", *training],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_env(), cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        if not ready.exists():
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"{ready} never appeared (job exit code {proc.returncode}): training never got under "
                        f"way, so there was nothing to interrupt\n{out}{err}")
        victim = next(p for p in psutil.Process(proc.pid).children(recursive=True)
                      if "dpuoffload.dpu" in p.cmdline() and "python" in os.path.basename(p.cmdline()[0]))
        victim.send_signal(sig)
        signalled_at = time.monotonic()
        _, err = proc.communicate(timeout=limit)
        return proc.returncode, err, time.monotonic() - signalled_at
    finally:
        if proc.poll() is None:
            proc.kill()
