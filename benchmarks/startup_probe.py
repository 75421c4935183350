"""Where a rank's start-up and shut-down time goes: `benchmarks/startup.py` runs dpurun with
`--python` pointing at a wrapper that starts this file instead of the interpreter's `-m`.

    startup_probe.py -m dpuoffload.host|dpuoffload.dpu [training flags]

It wraps (times, never replaces) the steps of the real program: imports, MPI init, the start-up
sequence (`common/startup.py`), building the allreduce, training, telling the DPU ranks to
stop, the allreduce shut-down, and MPI finalize; every mark is wall-clock seconds since the
benchmark started dpurun (`STARTUP_T0`). One JSON file per rank goes to `STARTUP_PROBE_DIR`.
"""

from __future__ import annotations

import time

T_EXEC = time.time()

import atexit  # noqa: E402 - the first mark is taken before anything is imported
import functools  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import Any, Callable  # noqa: E402

MARKS: list[tuple[str, float]] = [("exec", T_EXEC)]
PACKAGE: list[str] = ["?"]


def mark(name: str) -> None:
    MARKS.append((name, time.time()))


def timed(owner: Any, attr: str, name: str) -> None:
    """Replace `owner.attr` by a wrapper that marks `name` when the call returns."""
    fn: Callable[..., Any] = getattr(owner, attr)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        mark(name)
        return out

    setattr(owner, attr, wrapper)


def dump() -> None:
    """At exit: after the program's other exit hooks, before MPI finalize and the process exit."""
    mark("exit")
    t0 = float(os.environ["STARTUP_T0"])
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", str(os.getpid())))
    path = os.path.join(os.environ["STARTUP_PROBE_DIR"], f"rank{rank}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"module": PACKAGE[0], "marks": [(n, t - t0) for n, t in MARKS]}, f)


def instrument(package: str) -> None:
    if package.endswith("host"):  # (the host program imports torch with its modules; the DPU program where it computes)
        import torch  # noqa: F401 - timed on its own: the largest import

    mark("import_torch")
    main = importlib.import_module(f"{package}.main")
    mark("import_program")
    from dpuoffload.common import startup
    from dpuoffload.common.runtime import trace

    for owner, attr, name in ((main, "import_torch_ahead", "import_ahead"),
                              (startup, "build_topology", "mpi_init_topology"), (startup, "configure", "configure"),
                              (startup, "check_peers", "handshake"), (main, "prepare", "prepare_data_model"),
                              (main, "start_program", "profile_started"), (trace, "finish", "trace_finish")):
        timed(owner, attr, name)
    if package.endswith("host"):
        from dpuoffload.common.train import allreduce  # (torch: not on a DPU rank, which imports it where it computes)
        from dpuoffload.host import library

        for owner, attr, name in ((main, "build_sync", "allreduce_init"), (main.Trainer, "fit", "trained"),
                                  (library, "end_with_dpus", "shutdown_sent"),
                                  (allreduce.HorovodSync, "shutdown", "allreduce_shutdown"),
                                  (allreduce.TorchSync, "shutdown", "allreduce_shutdown")):
            timed(owner, attr, name)
    else:
        timed(main, "idle_until_shutdown", "shutdown_received")



def run() -> None:
    if sys.argv[1:2] != ["-m"] or len(sys.argv) < 3:
        raise SystemExit("usage: startup_probe.py -m dpuoffload.host|dpuoffload.dpu [training flags]")
    package = PACKAGE[0] = sys.argv[2]
    instrument(package)
    argv = sys.argv[3:]
    sys.argv = [package, *argv]
    from dpuoffload.common.runtime.fastexit import run_and_exit_fast

    def program() -> None:
        atexit.register(dump)  # after run_and_exit_fast's hook, so it runs before that one exits
        importlib.import_module(f"{package}.main").run(argv)

    run_and_exit_fast(program)  # like the program's own __main__


if __name__ == "__main__":
    run()
