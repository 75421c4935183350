"""Collective failure handling: a failing rank says who it is and why, and the job ends, not hangs.

Two paths, following DCP's gathered per-rank errors and mpi4py.futures' rank-labelled tracebacks:
- `collective_call` wraps set-up steps that fail the same way everywhere (bad flags, missing data):
  ranks allgather their outcome, world rank 0 prints ONE message, every rank raises `JobFailed`
  and exits 1 in an orderly way.
- `run_program` catches anything else (a rank that raises mid-training), prints the rank label and
  traceback, and calls `COMM_WORLD.Abort` so peers blocked in MPI are killed instead of hanging.
"""

from __future__ import annotations

import sys
import traceback
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

from dpuoffload.common.errors import DpuOffloadError

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")
PREFIX = "[dpuoffload]"


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
    outcomes = comm.allgather((label, error))
    failed = [(i, lab, err) for i, (lab, err) in enumerate(outcomes) if err is not None]
    if failed:
        if comm.Get_rank() == 0:
            by_message: dict[str, list[str]] = {}
            for _, lab, err in failed:
                by_message.setdefault(err, []).append(lab)
            for err, labels in by_message.items():
                who = labels[0] if len(labels) == 1 else f"{len(labels)} ranks ({', '.join(labels[:4])}{', ...' if len(labels) > 4 else ''})"
                _err(f"error on {who}: {err}")
        raise JobFailed("set-up failed")
    return result  # type: ignore[return-value]


_rank_label = "rank ?"


def set_rank_label(label: str) -> None:
    """Name this rank in failure messages ('DPU rank 1 (world rank 3, node n0)')."""
    global _rank_label
    _rank_label = label


def run_program(main: Callable[[], int], default_label: str) -> None:
    """Entry-point wrapper for both programs: exit with main's code, or end the whole job on error."""
    set_rank_label(default_label)
    try:
        code = main()
    except JobFailed:
        sys.exit(1)
    except KeyboardInterrupt:
        _abort(f"{_rank_label}: interrupted", 130)
    except BaseException as e:  # noqa: BLE001 - anything else must not leave peers hanging
        if isinstance(e, SystemExit) and (e.code in (0, None)):
            raise
        detail = "".join(traceback.format_exception(e)) if not isinstance(e, DpuOffloadError) else f"{type(e).__name__}: {e}"
        _abort(f"{_rank_label} failed: {detail}".rstrip(), 1)
    else:
        sys.exit(code)


def _abort(message: str, code: int) -> None:
    _err(message)
    try:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(code)
    finally:  # Abort does not return; if MPI is unusable, still exit non-zero
        sys.exit(code)
