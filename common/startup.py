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

from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

from dpuoffload.common.config import RunConfig, parse_run_config
from dpuoffload.common.faults.abort import collective_call, set_error_dir, set_faults, set_rank_label
from dpuoffload.common.faults.watch import Faults, require_ft
from dpuoffload.common.modes import Mode
from dpuoffload.common.runtime import metrics, trace
from dpuoffload.common.runtime.env import horovod_available
from dpuoffload.common.runtime.handshake import check_peers
from dpuoffload.common.runtime.malloc import freeze_startup_objects, tune_malloc
from dpuoffload.common.runtime.roles import Role, Topology, build_topology
from dpuoffload.common.runtime.torchsetup import CLOCK, init_torch
from dpuoffload.common.state.memstore import MemoryPoint, agree_restart

T = TypeVar("T")


def configure(argv: Optional[Sequence[str]], prog: str) -> RunConfig:
    """Parse the training flags (torch-free, see `init_torch`)."""
    cfg = parse_run_config(argv, prog=prog)
    tune_malloc()  # steps re-fault their activations otherwise (common/runtime/malloc.py)
    return cfg


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
