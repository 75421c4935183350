"""The clone group (`dpurun --clone-ranks M`, `--clone-at STEP`): a second training that forks the first.

Clone ranks run the host program in MPI app context 2. They build their model and data with the
overridden flags (`--clone-override key=value`), then stand by cheaply (a sleeping poll, no core
burnt) until the state of step STEP arrives: each original host rank k hands its slice to its DPU
keeper, which forwards it to clone rank k mod M without touching disk (`dpu.keeper`; the routes
are `common.plan.assign`'s). The clone ranks all-gather the slices (DeepClone, Alg. 2), rebuild
the full state, and continue as their own data-parallel group with their own allreduce
communicator, logging under `<log-dir>/clone`.

The stand-by has no deadline as a whole (the clone step may be hours into training), but it is
never blind: until a keeper has served its clone ranks, it sends them a header-only HEARTBEAT
every `--peer-timeout`/4 s, and a clone rank that hears nothing at all (heartbeat, PREPARE or the
state) from one of its keepers for `--peer-timeout` seconds raises `PeerError` naming that keeper,
so a dead or hung keeper ends the job instead of leaving the clone group waiting forever.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, cast

import numpy as np
import torch

from dpuoffload.common.clones import OVERRIDABLE, clone_config  # noqa: F401 (clone_config: host.main)
from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError, PeerError
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.runtime.heartbeat import interval_for
from dpuoffload.common.runtime.messages import CKPT_HEADER, StateKind, Tag
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait, wait_all
from dpuoffload.common.state.ckptfiles import Received, part_bounds, part_sizes, plan_for
from dpuoffload.common.state.load import Live, Reader, StateSource, load_state
from dpuoffload.common.state.meta import CheckpointMeta, Slicing
from dpuoffload.common.state.sharding import Piece, byte_buffer
from dpuoffload.common.state.trainstate import dtype_of, numel, parse_local
from dpuoffload.common.train.device import to_host
from dpuoffload.common.train.loop import Trainer

if TYPE_CHECKING:
    from mpi4py import MPI
    from typing_extensions import Buffer  # (numpy's stubs give ndarray the buffer protocol on Python 3.12+ only)

CLONE_POLL_MAX_SLEEP = 0.01  # standing by: ~100 cheap polls/s bound the readiness latency to 10 ms
RECEIVE_POLL_MAX_SLEEP = 0.002  # the state in flight: each poll lets Open MPI move the next part


def receive_forwarded(topo: Topology, timeout: float) -> list[Received]:
    """This clone rank's forwarded hand-offs, as they arrived (no copies)."""
    warm: dict[int, np.ndarray] = {}
    return [receive_handoff(topo, keeper, Tag.CLONE, k, timeout, f"host rank {k}'s state from {topo.describe(keeper)}",
                            warm) for k, keeper in StateAssignment.of(topo).sources_of(topo.world_rank)]


def receive_handoff(topo: Topology, source: int, tag: int, sender: int, timeout: float, what: str,
                    warm: Optional[dict[int, np.ndarray]] = None, heartbeats: bool = True) -> Received:
    """Stand by for host rank `sender`'s CLONE hand-off from `source`. PREPAREs before it give the
    sizes (per sender, into `warm`): those buffers are faulted in while standing by, so the state
    lands in warm memory.

    The stand-by may last hours, so it has no deadline as a whole; instead `source` (a keeper) sends a
    HEARTBEAT every timeout/4 s until it serves this rank, and each next message (heartbeat, PREPARE
    or the state) must come within `timeout` (`common.runtime.heartbeat`). `heartbeats=False`: the
    sender does not beat (the p2p clone benchmark's host ranks), so the stand-by waits as long as it takes.

    Raises:
        PeerError: nothing came from `source` for `timeout` s, or it sent something other than the state.
    """
    warm = {} if warm is None else warm
    head = stand_by(topo, source, tag, timeout if heartbeats else None, what, warm)
    if head["kind"] != StateKind.CLONE or head["sender"] != sender:
        raise PeerError(f"expected host rank {sender}'s clone state from {topo.describe(source)}, got {head}")
    small = byte_buffer(head["small_nbytes"])
    shared = warm.pop(sender, None)
    if shared is None or shared.nbytes != head["shared_nbytes"]:
        shared = byte_buffer(head["shared_nbytes"])
    wait(topo.world.Irecv(small, source=source, tag=tag), timeout, what, max_sleep=RECEIVE_POLL_MAX_SLEEP)
    got = Received(head, small, shared)
    reqs = [topo.world.Irecv(shared[a:b], source=source, tag=tag) for a, b in part_bounds(part_sizes(got))]
    wait_all(reqs, timeout, what, max_sleep=RECEIVE_POLL_MAX_SLEEP)
    return got


def stand_by(topo: Topology, source: int, tag: int, silence: Optional[float], what: str,
             warm: dict[int, np.ndarray]) -> dict[str, int]:
    """Receive headers from `source` until one is neither a heartbeat nor a PREPARE; return it.
    Each header must come within `silence` seconds of the one before (None: no limit)."""
    awaited = what if silence is None else \
        f"{what}, or its heartbeat (sent every {interval_for(silence):.0f} s while the clone stands by)"
    while True:
        header = CKPT_HEADER.empty()
        wait(topo.world.Irecv(header, source=source, tag=tag), silence, awaited, max_sleep=CLONE_POLL_MAX_SLEEP)
        head = dict(CKPT_HEADER.unpack(header))
        if head["kind"] == StateKind.PREPARE:
            warm[head["sender"]] = byte_buffer(head["shared_nbytes"], touch=True)
        elif head["kind"] != StateKind.HEARTBEAT:
            return head


def gather_handoffs(comm: "MPI.Comm", mine: list[Received]) -> list[Received]:
    """Every clone rank gets every host rank's hand-off (DeepClone, Alg. 2): headers and the small
    parts as objects, the slices with one `Allgatherv` into one buffer (no pickling of the state)."""
    if comm.Get_size() == 1:
        return mine
    parts = comm.allgather([(r.head, r.small) for r in mine])
    counts = [sum(head["shared_nbytes"] for head, _ in part) for part in parts]
    send = np.concatenate([r.shared for r in mine]) if mine else np.empty(0, dtype=np.uint8)
    everything = byte_buffer(sum(counts))
    comm.Allgatherv(send, [everything, counts])
    out, offset = [], 0
    for head, small in (item for part in parts for item in part):
        out.append(Received(head, small, everything[offset: offset + head["shared_nbytes"]]))
        offset += head["shared_nbytes"]
    return out


def rebuild_shared(meta: CheckpointMeta, slices: dict[int, np.ndarray]) -> dict[str, torch.Tensor]:
    """Every shared tensor, reassembled from all host ranks' packed slices. A tensor that came whole
    from one host rank is a view of the received bytes; only sliced tensors are copied together."""
    catalog, plan = meta.catalog, plan_for(meta)
    located: dict[int, list[tuple[Piece, np.ndarray, int]]] = {}
    for k, buf in slices.items():
        offset = 0
        for p in plan.rank_pieces(k):
            located.setdefault(p.tensor, []).append((p, buf, offset))
            offset += (p.stop - p.start) * dtype_of(catalog[p.tensor][1]).itemsize
    out = {}
    for i, (name, dtype, shape) in enumerate(catalog):
        dt, n = dtype_of(dtype), numel(shape)
        pieces = located.get(i, [])
        if len(pieces) == 1 and (pieces[0][0].start, pieces[0][0].stop) == (0, n):
            _, buf, offset = pieces[0]
            out[name] = torch.frombuffer(buf, dtype=dt, count=n, offset=offset).reshape(shape) if n else \
                torch.empty(shape, dtype=dt)
            continue
        flat = torch.empty(n, dtype=dt)
        for p, buf, offset in pieces:
            flat[p.start: p.stop] = torch.frombuffer(buf, dtype=dt, count=p.stop - p.start, offset=offset)
        out[name] = flat.reshape(shape)
    return out


def state_sha256(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """sha256 over model parameters, buffers and optimizer state tensors: 'the same state, to the bit'."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(memoryview(cast("Buffer", to_host(t).contiguous().numpy())).cast("B"))
    for i, st in sorted(optimizer.state_dict()["state"].items()):
        for key, t in sorted(st.items()):
            h.update(f"{i}.{key}".encode())
            h.update(memoryview(cast("Buffer", to_host(t).contiguous().numpy())).cast("B") if torch.is_tensor(t)
                     else repr(t).encode())
    return h.hexdigest()


Receive = Callable[[Topology, float], list[Received]]


def handoff_source(comm: "MPI.Comm", mine: list[Received], adopt: Optional[Callable[[int], int]] = None) -> StateSource:
    """Hand-offs received by the ranks of `comm` -> the whole state, gathered over `comm`: the run's
    meta, every shared tensor, and every host rank's local state, or with `adopt` (host rank
    count -> whose) only the one this rank adopts. DPU-memory restarts and clones both load this."""
    parts = {r.head["sender"]: r for r in gather_handoffs(comm, mine)}
    meta = CheckpointMeta.from_json(parts[0].meta)
    shared = rebuild_shared(meta, {k: r.shared for k, r in parts.items()})
    kept = range(meta.writers) if adopt is None else [adopt(meta.writers)]
    return StateSource(meta, shared, tuple(parse_local(bytes(parts[k].local)) for k in kept), meta.slicing)


def assemble(topo: Topology, mine: list[Received]) -> StateSource:
    """This clone rank's hand-offs -> the state it loads, with the local state it adopts (gathered
    over the clone group): what the built-in clone and a script's clone both load."""
    return handoff_source(topo.side_comm, mine,
                          functools.partial(StateAssignment.of(topo).local_state_of, topo.world_rank))


def adopt(trainer: Trainer, topo: Topology, original: RunConfig, clone: RunConfig,
          receive: Receive = receive_forwarded) -> dict[str, Any]:
    """Stand by, receive, rebuild, apply overrides; return the clone-start record.

    `receive` yields this clone rank's hand-offs; the default takes them from the DPU keepers.
    The clone benchmark passes its point-to-point one."""
    t0 = time.perf_counter()
    mine = receive(topo, original.peer_timeout)
    received = time.perf_counter()
    reader = Reader(topo.side_rank, Slicing(topo.side_comm.Get_size(), clone.batch_size), trainer.feed.steps())
    loaded = load_state(assemble(topo, mine), Live.of(trainer), reader)
    apply_hyperparameters(trainer, original, clone)
    trainer.resume_at(loaded.start, loaded.progress)
    ready = time.time()  # wall clock, comparable with the originals' hand-off `wall_time`
    start = loaded.start
    return {"event": "clone_start", "global_step": start.global_step, "epoch": start.epoch, "step": start.step,
            "standby_s": received - t0, "rebuild_s": time.perf_counter() - received, "ready_time": ready,
            "state_sha256": state_sha256(trainer.model, trainer.optimizer), "overrides": list(original.clone_override)}


def apply_hyperparameters(trainer: Trainer, original: RunConfig, clone: RunConfig) -> None:
    """Overridden optimizer settings replace the restored ones; the schedule continues from its step."""
    if all(getattr(original, k) == getattr(clone, k) for k in ("lr", "momentum", "weight_decay")):
        return
    sched = trainer.scheduler
    sched.base_lrs = [clone.lr] * len(trainer.optimizer.param_groups)
    for group, factor in zip(trainer.optimizer.param_groups, (f(sched.last_epoch) for f in sched.lr_lambdas)):
        group.update(momentum=clone.momentum, weight_decay=clone.weight_decay, initial_lr=clone.lr,
                     lr=clone.lr * factor)


def check_clone_flags(cfg: RunConfig, topo: Topology, last_step: int) -> None:
    """--clone-at and the clone ranks go together, and the clone step must happen in this run."""
    if cfg.clone_at is not None and not topo.clone_ranks:
        raise ConfigError("--clone-at needs clone ranks to hand the state to: start them with dpurun --clone-ranks M")
    if topo.clone_ranks and cfg.clone_at is None:
        raise ConfigError("clone ranks were started (dpurun --clone-ranks) but --clone-at STEP is not set")
    if cfg.clone_at is not None and cfg.clone_at > last_step:
        raise ConfigError(f"--clone-at {cfg.clone_at} is after this run's last step ({last_step}); "
                          f"pick a step in 1..{last_step}")


def describe_overrides(original: RunConfig, clone: RunConfig) -> str:
    diffs = [f"{f.name}={getattr(clone, f.name)}" for f in dataclasses.fields(RunConfig)
             if f.name in OVERRIDABLE and getattr(original, f.name) != getattr(clone, f.name)]
    return ", ".join(diffs) or "no overrides"

