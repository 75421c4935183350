"""End a rank's process without the interpreter's teardown of its modules.

With torch and torchvision loaded (torchvision pulls in torch._dynamo and sympy), Python's
shutdown spends 1.3-1.9 s per process freeing module objects on this box, after all work is
done and every file is written; the job ends when its slowest rank does, so every run paid it.
The ranks leave with `os._exit` (under MPICH the C library's `exit()`, below) instead, at the
very end: after the program returned, after Python joined the non-daemon threads and ran every
other `atexit` hook (logging, user hooks), after MPI_Finalize (which mpi4py would otherwise run
later, from a C-level exit hook) and after stdout/stderr are flushed. Files must be closed by
their owners (every writer here uses `with` or closes explicitly); buffered data of a file left
open would be lost. `DPUOFFLOAD_FAST_EXIT=0` restores the ordinary exit (e.g. for a user factory
that leaves a file open).

Under MPICH (and the MPIs built on it) the rank leaves through the C library's `exit()` instead
of `os._exit`: MPICH defers its goodbye to the process manager (PMI finalize) from MPI_Finalize to a
C exit hook ("so that an abnormal exit does not show up as a normal one", src/util/mpir_pmi.c), and
Hydra's proxy takes a PMI socket closed without that goodbye for a crash: it SIGKILLs every rank of
the job still running. A rank leaving by `os._exit` thus killed the ranks still finishing (silently,
or reported as "EXIT CODE: 9", as in a CI run of tests/test_mpich.py). `exit()` runs the C hooks and
C++ static destructors but still not Python's teardown: ~0.1 s over `os._exit` here, not ~1 s.

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

from dpuoffload.common.runtime import env

OPT_OUT = env.FAST_EXIT  # "0": exit the ordinary way (teardown included)
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
    if mpi is not None and mpi.Is_initialized() and _pmi_goodbye_at_exit(mpi):
        _c_exit(code)
    os._exit(code)


def _pmi_goodbye_at_exit(mpi: object) -> bool:
    """Whether this MPI says goodbye to its process manager from a C exit hook, which `os._exit`
    skips (see the module docstring): every MPI but Open MPI's (MPICH, and Intel MPI, MVAPICH and
    Cray MPICH, built on it). Open MPI finalizes its PMIx client inside MPI_Finalize."""
    return not mpi.Get_library_version().startswith("Open MPI")  # type: ignore[attr-defined]


def _c_exit(code: int) -> None:
    """The C library's `exit(code)`: its exit hooks run, Python's teardown does not. Called holding
    the GIL (`PyDLL`, where `CDLL` would release it), so no daemon thread runs Python while the C++
    libraries' static objects are destroyed. Returns only where there is no C library to call (then
    `os._exit` follows, as before)."""
    import ctypes

    try:
        libc_exit = ctypes.PyDLL(None).exit
    except (OSError, AttributeError):
        return
    libc_exit.argtypes = [ctypes.c_int]
    libc_exit(code)


def _fault_tolerant() -> bool:
    """Whether this rank runs under Open MPI's fault tolerance (see the module docstring)."""
    if "mpi4py.MPI" not in sys.modules:
        return False
    from dpuoffload.common.faults.watch import ft_active

    return ft_active()
