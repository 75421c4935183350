"""End a rank's process without the interpreter's teardown of its modules.

With torch and torchvision loaded (torchvision pulls in torch._dynamo and sympy), Python's
shutdown spends 1.3-1.9 s per process freeing module objects on this box, after all work is
done and every file is written; the job ends when its slowest rank does, so every run paid it.
The ranks leave with `os._exit` instead, at the very end: after the program returned, after
Python joined the non-daemon threads and ran every other `atexit` hook (logging, user hooks),
after MPI_Finalize (which mpi4py would otherwise run later, from a C-level exit hook) and after
stdout/stderr are flushed. Files must be closed by their owners (every writer here uses `with`
or closes explicitly); buffered data of a file left open would be lost. `DPUOFFLOAD_FAST_EXIT=0`
restores the ordinary exit (e.g. for a user factory that leaves a file open).

Under MPI fault tolerance (`--dpu-failure fallback`, `--recovery`) every rank leaves this way, and
without MPI_Finalize: once a rank of the job has died, Open MPI 5.0.11's finalize waits on it now
and then for ever (1 run in 6 of a 3-rank test here hung in `ompi_mpi_finalize`, a suite job too),
and under `--with-ft ulfm` mpirun counts a rank that exits 0 without finalizing as a success.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Callable

OPT_OUT = "DPUOFFLOAD_FAST_EXIT"  # "0": exit the ordinary way (teardown included)
_exit_code: list[int] = [0]


def run_and_exit_fast(program: Callable[[], None]) -> None:
    """Run a rank's `program` (which ends with `sys.exit(code)`), then leave without teardown."""
    if os.environ.get(OPT_OUT) == "0":
        program()
        return
    atexit.register(_exit_now)  # registered first, so it runs after every other atexit hook
    try:
        program()
    except SystemExit as e:
        _exit_code[0] = _code_of(e.code)
        raise  # Python prints a message code and joins threads as usual, then runs the hooks
    except BaseException:
        _exit_code[0] = 1
        raise


def _code_of(code: object) -> int:
    """The process exit status `sys.exit(code)` gives: None is 0, an int itself, a message 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _exit_now() -> None:
    if "torch" not in sys.modules and not _fault_tolerant():
        # Nothing heavy to tear down (an idle DPU rank): the ordinary exit costs little here, and
        # under MPICH an idle rank leaving by os._exit right after MPI_Finalize got a host rank of
        # the same job killed (SIGKILL, reported by Hydra) in 4 of 16 runs; 0 of 28 the ordinary way.
        return
    exit_now(_exit_code[0])


def exit_now(code: int) -> None:
    """Finalize MPI, flush, and leave with `code` now (also from an exit hook, where raising
    SystemExit would not change the process's exit status)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() and not _fault_tolerant():
        mpi.Finalize()  # mpirun reports a rank that exits without it as failed (unless fault tolerant)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or replaced streams
            pass
    os._exit(code)


def _fault_tolerant() -> bool:
    """Whether this rank runs under Open MPI's fault tolerance (see the module docstring)."""
    if "mpi4py.MPI" not in sys.modules:
        return False
    from dpuoffload.common.faults.watch import ft_active

    return ft_active()
