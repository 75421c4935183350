"""Collective failure handling: a failing rank says who it is and why, and the job ends, not hangs.

Two paths, following DCP's gathered per-rank errors and mpi4py.futures' rank-labelled tracebacks:
- `collective_call` wraps set-up steps that fail the same way everywhere (bad flags, missing data):
  ranks allgather their outcome, world rank 0 prints ONE message, every rank raises `JobFailed`
  and exits 1 in an orderly way.
- `run_program` catches anything else (a rank that raises mid-training), prints ONE line (rank
  label, exception, the user's file:line), writes the full traceback to
  `<log-dir>/errors-rank<N>.txt`, and calls `COMM_WORLD.Abort` so peers blocked in MPI are killed
  instead of hanging. `dpurun` recognizes that line (`launch.supervise`) to name the first failure.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

from dpuoffload.common.errors import DeathNotSurvived, DpuOffloadError, SampleError, WorkerError
from dpuoffload.common.files import write_atomic

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.faults.watch import Faults

T = TypeVar("T")
ARRIVE_MAX_SLEEP = 0.005  # start-up steps take seconds; 5 ms of latency at most per step
PREFIX = "[dpuoffload]"
EXIT_CHECKPOINT_FAILED = 3   # training ran, but checkpoints were lost (--ckpt-errors)


class JobFailed(DpuOffloadError):
    """Raised on every rank after a collective step failed; world rank 0 has printed the reason."""


def _err(msg: str) -> None:
    print(f"{PREFIX} {msg}", file=sys.stderr, flush=True)


def collective_call(comm: "MPI.Comm", fn: Callable[[], T], label: str) -> T:
    """Run `fn` on every rank of `comm`; if any rank raised, raise `JobFailed` on all.

    Only `DpuOffloadError`s (user-fixable problems with a clear message) and other exceptions are
    collected; identical messages from several ranks are reported once with the rank list.
    """
    result: Optional[T] = None
    error: Optional[str] = None
    try:
        result = fn()
    except DpuOffloadError as e:
        error = f"{type(e).__name__}: {e}"
    except Exception as e:  # an unexpected failure during set-up: keep the traceback
        error = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    arrive(comm, "every rank to finish this start-up step")
    outcomes = comm.allgather((label, error))
    failed = [(i, lab, err) for i, (lab, err) in enumerate(outcomes) if err is not None]
    if failed:
        if comm.Get_rank() == 0:
            by_message: dict[str, list[str]] = {}
            for _, lab, err in failed:
                by_message.setdefault(err, []).append(lab)
            for err, labels in by_message.items():
                more = ", ..." if len(labels) > 4 else ""
                who = labels[0] if len(labels) == 1 else f"{len(labels)} ranks ({', '.join(labels[:4])}{more})"
                _err(f"error on {who}: {err}")
        raise JobFailed("set-up failed")
    return result  # type: ignore[return-value]


def arrive(comm: "MPI.Comm", what: str, max_sleep: float = ARRIVE_MAX_SLEEP) -> None:
    """A barrier that sleeps while it waits. A blocking collective spins (with `sched_yield` when
    oversubscribed): an idle DPU rank waiting out the host ranks' model and data set building spent
    2 s of CPU per job that way on 2 cores, taken from the very ranks it waited for."""
    from dpuoffload.common.runtime.waits import wait

    wait(comm.Ibarrier(), None, what, max_sleep=max_sleep)


_ROOT = Path(__file__).resolve().parents[2]   # common/faults/abort.py -> the folders mapped to dpuoffload.*
_PACKAGE_DIRS = tuple(f"{_ROOT / d}{os.sep}" for d in ("common", "host", "dpu", "launch"))
_LIBRARY_DIRS = tuple(f"{p}{os.sep}" for p in
                      {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} if p)


@dataclass
class ErrorReport:
    """How this process reports the error that ends it: the one process-wide setting here.

    Why a process-wide setting and not a parameter: the paths that use it run when an exception
    escaped everything that holds the run's objects (`run_program`'s handler, the excepthooks a
    script's job installs, a keeper thread's last words), so nothing could pass it to them there;
    like `logging`'s configuration, start-up sets it once (`set_rank_label`, `set_error_dir`,
    `set_faults`) and the last-gasp path reads it. Everything else gets the run's `Faults`
    explicitly.
    """

    rank_label: str = "rank ?"
    error_dir: Optional[str] = None        # --log-dir, once the flags are parsed
    faults: Optional["Faults"] = None      # the run's failure record (the death behind an error)


_report = ErrorReport()


def set_rank_label(label: str) -> None:
    """Name this rank in failure messages ('DPU rank 1 (world rank 3, node n0)')."""
    _report.rank_label = label


def set_error_dir(log_dir: Optional[str]) -> None:
    """Where a failing rank writes its full traceback (`errors-rank<N>.txt`): the run's --log-dir."""
    _report.error_dir = log_dir


def set_faults(faults: "Faults") -> None:
    """The run's failure record, for the error path alone: a rank that ends the job on an error
    names the death behind it (`ending_line`), and a rank that returns stops its watch."""
    _report.faults = faults


def error_dir() -> Path:
    """--log-dir, else `<tmp>/dpuoffload-errors` (never the user's working directory uninvited)."""
    return Path(_report.error_dir) if _report.error_dir else Path(tempfile.gettempdir()) / "dpuoffload-errors"


def user_frame(tb: Optional[TracebackType], fallback: bool = True) -> Optional[traceback.FrameSummary]:
    """The innermost frame in the user's own code: outside this package, torch and other installed
    libraries and the standard library; else (with `fallback`) the innermost frame (the error is
    ours or a library's), or None."""
    frames = traceback.extract_tb(tb)
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_PACKAGE_DIRS + _LIBRARY_DIRS) and not frame.filename.startswith("<"):
            return frame
    return frames[-1] if frames and fallback else None


def describe_error(e: BaseException) -> str:
    """'TypeError: message (at models.py:12 in build)': the exception and where the user's code raised it."""
    if isinstance(e, WorkerError):  # described where it was raised
        return e.description
    raised = e.__cause__ if isinstance(e, SampleError) and e.__cause__ is not None else e  # (the data set's line)
    frame = user_frame(raised.__traceback__)
    message = str(e).strip().splitlines()[0] if str(e).strip() else ""
    where = f" (at {short_path(frame.filename)}:{frame.lineno} in {frame.name})" if frame else ""
    return f"{type(e).__name__}{': ' + message if message else ''}{where}"


def short_path(filename: str) -> str:
    """Relative to the working directory when inside it (what the user types), else absolute."""
    path = os.path.abspath(filename)
    cwd = os.getcwd() + os.sep
    return path[len(cwd):] if path.startswith(cwd) else path


def world_rank() -> Optional[int]:
    """This process's world rank, when MPI is up (None before MPI_Init or without mpi4py)."""
    try:
        from mpi4py import MPI

        return MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() and not MPI.Is_finalized() else None
    except Exception:  # noqa: BLE001 - a broken MPI must not hide the original error
        return None


def write_traceback(e: BaseException) -> Optional[Path]:
    """Write the full traceback to `<error dir>/errors-rank<N>.txt` (temp file + rename: a reader
    never sees half of it); None when it cannot be written (the one line says so)."""
    rank = world_rank()
    name = f"errors-rank{rank if rank is not None else os.getpid()}.txt"
    text = f"{_report.rank_label}\n" + "".join(traceback.format_exception(type(e), e, e.__traceback__))
    if isinstance(e, WorkerError):
        text += f"\nraised in a data worker process:\n{e.traceback_text}"
    try:
        return write_atomic(error_dir() / name, text.encode(), sync_dir=False, parents=True)
    except OSError:
        return None


def failure_line(e: BaseException) -> str:
    """The one line a failing rank prints: who, what, where in the user's code, where the traceback is."""
    # A user-fixable problem has its own clear message; a sample's error also says where the data set
    # raised it, and keeps its traceback.
    if isinstance(e, DpuOffloadError) and not isinstance(e, SampleError):
        return f"{_report.rank_label} failed: {type(e).__name__}: {e}"
    path = write_traceback(e)
    saved = f"full traceback in {path}" if path else f"the traceback could not be written to {error_dir()}"
    return f"{_report.rank_label} failed: {describe_error(e)}; {saved}"


def ending_line(e: BaseException, where: str = "") -> str:
    """The line that ends the job for error `e` (raised `where`, e.g. ' (in its checkpoint keeper
    thread)'): the death behind it if a rank death the run does not survive is (or within a
    second becomes) known here, which says more than a wait that failed because of it; else
    `failure_line(e)`. Under fault tolerance the failure watch knows the deaths (`set_faults`)."""
    faults = _report.faults
    death = str(e) if isinstance(e, DeathNotSurvived) else faults.death_behind() if faults is not None else None
    if death is None:
        return failure_line(e) + where
    write_traceback(e)
    return death


def run_program(main: Callable[[], int], default_label: str) -> None:
    """Entry-point wrapper for both programs: exit with main's code, or end the whole job on error."""
    set_rank_label(default_label)
    try:
        code = main()
    except JobFailed:
        sys.exit(1)
    except KeyboardInterrupt:
        abort_job(f"{_report.rank_label}: interrupted", 130)
    except BaseException as e:  # noqa: BLE001 - anything else must not leave peers hanging
        if isinstance(e, SystemExit) and (e.code in (0, None)):
            raise
        abort_job(ending_line(e), 1)
    else:
        if _report.faults is not None:
            _report.faults.stop()
        sys.exit(code)


# After its last line and before MPI_Abort, a rank gives Open MPI's output forwarding this long to
# carry the line to mpirun: aborting at once, a long line was once cut in two by mpirun's abort
# banner (the rest dropped with the banner), so dpurun quoted it truncated.
ABORT_SETTLE_S = 0.3


def abort_job(message: str, code: int = 1) -> None:
    """Print `message` (one line) and end the whole job: peers blocked in MPI are killed, not left hanging.

    For a failure outside the program's main thread (a DPU keeper thread), where `run_program`
    cannot catch it, and for `--ckpt-errors fail`."""
    _err(message)
    time.sleep(ABORT_SETTLE_S)
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)
    finally:  # Abort does not return; if MPI is unusable, still exit non-zero
        sys.exit(code)
