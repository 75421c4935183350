"""The start-up sequence both programs run, in the same order, so their world collectives match.

    build_topology      roles, host_comm / dpu_comm, pairing                (allgather + split)
    configure           parse flags, per-side threads                        (collective_call)
    check_peers         same version, protocol, config hash everywhere       (collective_call)
    [auto]              --mode auto: profile, predict, resolve the mode      (collectives)
    prepare             the program's own set-up (data sets, model, ...)     (collective_call)
    profile             what each rank measured or has, for choices that     (allgather)
                        must agree everywhere (naive's DPU batch, backend)

Each step is collective over COMM_WORLD, so a bad flag or a missing data directory on any rank
ends every rank with one message instead of leaving the other program waiting for a peer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, Sequence, TypeVar

import torch

from dpuoffload.common.config import RunConfig, parse_run_config
from dpuoffload.common.modes import Mode
from dpuoffload.common.runtime import env, trace
from dpuoffload.common.runtime.failure import collective_call, set_rank_label
from dpuoffload.common.runtime.handshake import check_peers
from dpuoffload.common.runtime.malloc import tune_malloc
from dpuoffload.common.runtime.roles import Role, Topology, build_topology
from dpuoffload.common.train.allreduce import horovod_available
from dpuoffload.common.train.autoselect import resolve_auto

T = TypeVar("T")


def configure(argv: Optional[Sequence[str]], prog: str) -> RunConfig:
    """Parse the training flags and apply this side's thread count."""
    cfg = parse_run_config(argv, prog=prog)
    tune_malloc()  # steps re-fault their activations otherwise (common/runtime/malloc.py)
    threads = env.threads_from_env()
    if threads is not None:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    return cfg


@dataclass
class Started(Generic[T]):
    """The outcome of start-up on this rank."""

    cfg: RunConfig                      # with --mode auto resolved to the chosen mode
    topo: Topology
    state: T                            # what the program's `prepare` built
    profiles: list[dict[str, Any]]      # every rank's profile, by world rank
    auto: Optional[dict[str, Any]]      # --mode auto: the profile, predictions and choice


def start_program(role: Role, argv: Optional[Sequence[str]], prepare: Callable[[RunConfig, Topology], T],
                  profile: Callable[[RunConfig, Topology, T], dict[str, Any]]) -> Started[T]:
    """Run the shared start-up sequence on this rank."""
    topo = build_topology(role)
    label = topo.describe()
    set_rank_label(label)
    prog = "python -m dpuoffload.host" if role is Role.HOST else "python -m dpuoffload.dpu"
    cfg = collective_call(topo.world, lambda: configure(argv, prog), label)
    collective_call(topo.world, lambda: check_peers(topo, cfg), label)
    auto = None
    if cfg.mode is Mode.AUTO:
        cfg, auto = resolve_auto(cfg, topo, label)
    state = collective_call(topo.world, lambda: prepare(cfg, topo), label)
    mine = collective_call(topo.world, lambda: {"horovod": horovod_available(), **profile(cfg, topo, state)}, label)
    profiles = topo.world.allgather(mine)
    trace.start(topo, cfg.trace is not None)
    return Started(cfg, topo, state, profiles, auto)
