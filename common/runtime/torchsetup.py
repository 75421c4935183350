"""A process's torch set-up and its start-up clock: the low-level pieces `common.startup` runs,
and that training code (`common.train`) uses without the start-up sequence itself.

`init_torch` applies a rank's torch settings once; `import_torch_ahead` imports torch before MPI
init; `use_deterministic_algorithms` without importing torch._inductor; `CLOCK` records where a
process's start-up went (`startup_parts_s` in the run's end record).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from dataclasses import dataclass, field

from dpuoffload.common.runtime import env


@dataclass
class StartupClock:
    """Where this process's start-up went: the wall-clock time at the end of each stage, in order.

    Why: a short job pays its start-up in full (a GPU lease's 24-batch jobs took 27-59 s where
    their training took seconds), and one number (`startup_s`) cannot say whether imports, the
    data sets, the model's move to the device or a profile took it. The stages are marked where
    they end (`mark`); `parts` gives each one's seconds, the first counted from the process's
    creation (the interpreter and the imports). Process-wide (`CLOCK`): a process starts once.
    """

    marks: list[tuple[str, float]] = field(default_factory=list)

    def mark(self, stage: str) -> None:
        self.marks.append((stage, time.time()))

    def parts(self) -> dict[str, float]:
        """Seconds per stage (a stage marked twice adds up), from the process's creation."""
        import psutil

        out: dict[str, float] = {}
        last = psutil.Process().create_time()
        for stage, at in self.marks:
            out[stage] = round(out.get(stage, 0.0) + max(at - last, 0.0), 3)  # (create_time is rounded to ticks)
            last = at
        return out


CLOCK = StartupClock()


def use_deterministic_algorithms() -> None:
    """`torch.use_deterministic_algorithms(True)`, without importing torch._inductor for it.

    Since torch 2.9 the public call also sets `torch._inductor.config.deterministic`; that import
    pulls in torch._dynamo and sympy, 1.4 s of CPU per rank here before anything runs. The inductor
    flag only affects compiled graphs, which nothing here compiles. Once inductor is loaded anyway
    (torchvision imports it), or without the private setter, the public call is used.

    Where torch sees a GPU, two things would otherwise stop a GPU host rank's training: cuBLAS is
    deterministic only with a fixed workspace (`CUBLAS_WORKSPACE_CONFIG`, read when its first handle
    is made; without it torch raises at the first matmul), and some CUDA backward kernels have no
    deterministic version (AdaptiveAvgPool2d's, in resnet50, raises). So the workspace is fixed
    (unless the user set it) and there the mode only warns for such kernels: batches stay
    bit-identical (they are built on CPUs), a GPU's gradients are what its kernels make. On CPUs
    nothing changes (a GPU-less box sees no GPU: errors, as before).
    """
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    warn_only = torch.cuda.is_available()
    if "torch._inductor.config" in sys.modules or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=warn_only)


@functools.cache
def init_torch() -> None:
    """Import torch and apply this rank's settings: intra-op threads, deterministic algorithms.

    Every rank that computes calls it before building anything: host ranks at start-up, DPU ranks
    once the offload plan has given them work. An idle DPU rank (every DPU rank of --mode none)
    never does: importing torch costs 1.5 s of CPU per rank on this box's x86 cores, several
    seconds on a DPU's Arm cores, and such a rank only waits for the end.
    """
    import torch

    threads = env.threads_from_env()
    if threads is not None:
        torch.set_num_threads(threads)
    use_deterministic_algorithms()


def import_torch_ahead(torchvision: bool = True) -> None:
    """Import torch (and torchvision) now, before MPI init, in a program that will use them.

    Why: MPI init returns once every rank of the job has reached it. A DPU rank imported torch and
    torchvision after it (once its plan gave it work), a host rank torchvision (with its data
    sets), so one side's imports ran while the other side waited, instead of side by side on
    their own cores (`benchmarks/startup.py`: the start-up's seconds with and without; it saves
    at most the faster side's imports). Importing in a thread during MPI init
    would not overlap: mpi4py holds the interpreter's lock while MPI_Init waits.

    A failed import is left to the program's own later import, inside the start-up steps whose
    errors every rank reports (`collective_call`): here it would end this rank alone, before MPI.
    `DPUOFFLOAD_IMPORT_AHEAD=0` turns this off: each import waits for its first use (a DPU rank's
    for the plan to give it work, so a rank left idle never imports torch).
    """
    if os.environ.get(env.IMPORT_AHEAD) == "0":
        return
    try:
        init_torch()
        if torchvision:
            importlib.import_module("torchvision")
    except Exception:  # noqa: BLE001 (see above: imported again, and reported, where it is needed)
        pass
