"""A process's torch set-up and its start-up clock: the low-level pieces `common.startup` runs,
and that training code (`common.train`) uses without the start-up sequence itself.

`init_torch` applies a rank's torch settings once; `import_torch_ahead` imports torch before MPI
init; `import_torchvision_without_compiler` spares a DPU rank torch's compiler; `use_deterministic_algorithms`
without importing torch._inductor; `CLOCK` records where a process's start-up went (`startup_parts_s`
in the run's end record).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any

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


def import_torchvision_without_compiler() -> None:
    """Import torchvision without the torch compiler (torch._dynamo, sympy) it pulls in; for DPU ranks.

    Why: `import torchvision` runs `torchvision/ops/roi_align.py`'s `from torch._dynamo.utils import
    is_compile_supported` (torchvision 0.2x), which imports all of torch._dynamo and sympy: 1.2 s of CPU
    and 150 MB of memory per process on this box, for an operator a DPU rank never calls, in a program
    that never compiles (measured with `torchvision.transforms` and `datasets` loaded: 1.8 s user and
    531 MB against 3.0 s and 683 MB). A DPU's cores are slower and its memory is shared by every rank
    on it. torchvision's own maintainers keep dynamo out of eager users' imports where they can
    (pytorch/vision#8436, "importing dynamo has undesirable side effects for eager mode only users").

    How: for the length of `import torchvision` only, `torch._dynamo.utils` is a module holding that
    one function, which imports the real one when called; afterwards it leaves `sys.modules`, so
    anything that later imports torch._dynamo (torch.compile, torchvision.transforms.v2, an optimizer's
    first step) gets the real module, and `roi_align` still works. If the import fails this way (a
    torchvision whose import needs more of dynamo), it is undone and torchvision imported as usual.
    Host ranks do not use it: their optimizer's first step imports torch._dynamo anyway, and the cost
    belongs in start-up, not in the first step's time. `DPUOFFLOAD_LEAN_TORCHVISION=0` turns it off.
    """
    if "torchvision" in sys.modules or os.environ.get(env.LEAN_TORCHVISION) == "0":
        return
    if "torch._dynamo" in sys.modules:  # (the compiler is loaded already: nothing to spare)
        importlib.import_module("torchvision")
        return
    name = "torch._dynamo.utils"
    stand_in = types.ModuleType(name, "Stands in for torch._dynamo.utils while torchvision is imported "
                                      "(dpuoffload.common.runtime.torchsetup.import_torchvision_without_compiler).")
    stand_in.is_compile_supported = _is_compile_supported  # type: ignore[attr-defined]
    sys.modules[name] = stand_in
    try:
        importlib.import_module("torchvision")
    except ImportError:
        _forget("torchvision", "torch._dynamo")
        importlib.import_module("torchvision")
    finally:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]


def _is_compile_supported(device_type: Any) -> Any:
    """torch._dynamo.utils.is_compile_supported, imported at its first call (roi_align's)."""
    from torch._dynamo.utils import is_compile_supported

    return is_compile_supported(device_type)


def _forget(*packages: str) -> None:
    """Drop these packages and their submodules from `sys.modules` (a failed import's leftovers)."""
    for module in [m for m in sys.modules if any(m == p or m.startswith(p + ".") for p in packages)]:
        del sys.modules[module]


def import_torch_ahead(torchvision: bool = True, compiler: bool = True) -> None:
    """Import torch (and torchvision; without torch's compiler if not `compiler`: DPU ranks,
    `import_torchvision_without_compiler`) now, before MPI init, in a program that will use them.

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
        if torchvision and compiler:
            importlib.import_module("torchvision")
        elif torchvision:
            import_torchvision_without_compiler()
    except Exception:  # noqa: BLE001 (see above: imported again, and reported, where it is needed)
        pass
