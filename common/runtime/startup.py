"""The start-up sequence both programs run, in the same order, so their world collectives match.

    build_topology      roles, host_comm / dpu_comm, pairing                (allgather + split)
    configure           parse flags, per-side threads                        (collective_call)
    check_peers         same version, protocol, config hash everywhere       (collective_call)
    run id              world rank 0's id for this run, stamped on log lines  (bcast)
    [restart]           --resume latest --ckpt-mem-keep: does every keeper    (allgather + bcast)
                        hold a newer state in DPU memory than the disk?
    [auto]              --mode auto: profile, predict, resolve the mode      (collectives)
    prepare             the program's own set-up (data sets, model, ...)     (collective_call)
    profile             what each rank measured or has, for choices that     (allgather)
                        must agree everywhere (naive's DPU batch, backend)
    [failure watch]     --dpu-failure fallback: a thread per rank learns of  (dup)
                        dead ranks (`faults.FailureWatch`, held by the run's `Faults`)

Each step is collective over COMM_WORLD, so a bad flag or a missing data directory on any rank
ends every rank with one message instead of leaving the other program waiting for a peer.

What start-up builds for the whole process (the failure record, the DPU-memory restart point) is
one `Run`, handed to the program's `prepare` and returned on `Started`: the program passes it on
explicitly.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

from dpuoffload.common.config import RunConfig, parse_run_config
from dpuoffload.common.faults.abort import collective_call, set_error_dir, set_faults, set_rank_label
from dpuoffload.common.faults.watch import Faults, require_ft
from dpuoffload.common.modes import Mode
from dpuoffload.common.runtime import env, metrics, trace
from dpuoffload.common.runtime.env import horovod_available
from dpuoffload.common.runtime.handshake import check_peers
from dpuoffload.common.runtime.malloc import freeze_startup_objects, tune_malloc
from dpuoffload.common.runtime.roles import Role, Topology, build_topology
from dpuoffload.common.state.memstore import MemoryPoint, agree_restart

T = TypeVar("T")


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


def configure(argv: Optional[Sequence[str]], prog: str) -> RunConfig:
    """Parse the training flags (torch-free, see `init_torch`)."""
    cfg = parse_run_config(argv, prog=prog)
    tune_malloc()  # steps re-fault their activations otherwise (common/runtime/malloc.py)
    return cfg


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


@dataclass(frozen=True)
class Run:
    """What start-up builds for the whole process, passed explicitly to everything that uses it.

    `faults`: this rank's failure record (`common.faults.watch.Faults`): the dead ranks known, the
    failure log, the watch (started at the end of start-up, so it is inert while `prepare` runs).
    `memory`: the state every keeper holds in DPU memory that this run restarts from
    (`memstore.agree_restart`; None: from the disk, or not resuming).
    A process that never ran start-up uses `Run.inert()`.
    """

    faults: Faults
    memory: Optional[MemoryPoint] = None

    @classmethod
    def inert(cls) -> "Run":
        return cls(Faults.inert())


@dataclass
class Started(Generic[T]):
    """The outcome of start-up on this rank."""

    cfg: RunConfig                      # with --mode auto resolved to the chosen mode
    topo: Topology
    state: T                            # what the program's `prepare` built
    profiles: list[dict[str, Any]]      # every rank's profile, by world rank
    auto: Optional[dict[str, Any]]      # --mode auto: the profile, predictions and choice
    run: Run                            # the failure record and restart point, handed to `prepare` too


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


def start_program(role: Role, argv: Optional[Sequence[str]], prepare: Callable[[RunConfig, Topology, Run], T],
                  profile: Callable[[RunConfig, Topology, T], dict[str, Any]]) -> Started[T]:
    """Run the shared start-up sequence on this rank.

    Host ranks (and every rank under --mode auto, which measures) set up torch here; a DPU program's
    `prepare` calls `init_torch` itself when its work computes. `prepare` gets the `Run` and keeps
    what its objects need of it.
    """
    CLOCK.mark("interpreter and imports")
    topo = build_topology(role)
    CLOCK.mark("MPI init and topology")
    label = topo.describe()
    set_rank_label(label)
    prog = "python -m dpuoffload.host" if role is Role.HOST else "python -m dpuoffload.dpu"
    cfg = collective_call(topo.world, lambda: configure(argv, prog), label)
    collective_call(topo.world, lambda: check_peers(topo, cfg), label)
    collective_call(topo.world, lambda: require_ft(cfg), label)
    set_error_dir(cfg.log_dir)
    faults = Faults()
    set_faults(faults)  # (the error path's one process-wide hook: `common.faults.abort.ErrorReport`)
    metrics.set_run(topo.world.bcast(metrics.new_run_id() if topo.world.Get_rank() == 0 else None, root=0),
                    resuming=cfg.resume is not None)
    run = Run(faults, collective_call(topo.world, lambda: agree_restart(cfg, topo), label))
    if role is Role.HOST or cfg.mode is Mode.AUTO:
        init_torch()
    CLOCK.mark("flags, peer checks and torch settings")
    auto = None
    if cfg.mode is Mode.AUTO:
        from dpuoffload.common.train.autoselect import resolve_auto  # (torch: measures the model)

        cfg, auto = resolve_auto(cfg, topo, label)
        CLOCK.mark("--mode auto's profile")
    if cfg.da_host_share == "auto":  # (da, hybrid: the config allows it nowhere else)
        from dpuoffload.common.train.autoselect import resolve_host_share  # (torch: builds samples)

        cfg = resolve_host_share(cfg, topo, label)
        CLOCK.mark("--da-host-share auto's profile")
    state = collective_call(topo.world, lambda: prepare(cfg, topo, run), label)
    CLOCK.mark("waiting for every rank's set-up")  # (a host rank's `prepare` marks its own parts inside it)
    mine = collective_call(topo.world, lambda: {"horovod": horovod_available(), **profile(cfg, topo, state)}, label)
    profiles = topo.world.allgather(mine)
    trace.start(topo, cfg.trace is not None)
    run.faults.start(topo, cfg)
    freeze_startup_objects()  # no full collection walks start-up's objects in a step (common/runtime/malloc.py)
    CLOCK.mark("profiles exchanged")
    return Started(cfg, topo, state, profiles, auto, run)
