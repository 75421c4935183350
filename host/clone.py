"""The clone group (`dpurun --clone-ranks M`, `--clone-at STEP`): a second training that forks the first.

Clone ranks run the host program in MPI app context 2. They build their model and data with the
overridden flags (`--clone-override key=value`), then stand by cheaply (a sleeping poll, no core
burnt) until the state of step STEP arrives: each original host rank k hands its slice to its DPU
keeper, which forwards it to clone rank k mod M without touching disk (`dpu.keeper`). The clone
ranks all-gather the slices (DeepClone, Alg. 2), rebuild the full state, and continue as their
own data-parallel group with their own allreduce communicator, logging under `<log-dir>/clone`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Callable

import numpy as np
import torch

from dpuoffload.common.ckptfiles import plan_for
from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError, PeerError
from dpuoffload.common.messages import CKPT_HEADER, StateKind, Tag
from dpuoffload.common.roles import Topology, feeders
from dpuoffload.common.sharding import unpack_pieces
from dpuoffload.common.training import Trainer
from dpuoffload.common.trainstate import (
    EpochProgress,
    dtype_of,
    numel,
    parse_local,
    position_of,
    reslice_position,
    restore,
    set_rng,
)
from dpuoffload.common.waits import wait

# flag -> how to read its value; the clone keeps its model, data set and mode
OVERRIDABLE: dict[str, Callable[[str], Any]] = {
    "lr": float, "momentum": float, "weight_decay": float, "lr_schedule": str, "seed": int, "epochs": int,
    "batch_size": int, "train_subset": int, "val_subset": int, "drop_last": lambda v: v.lower() in ("1", "true", "yes"),
    "allreduce": str, "save_weights": str, "stop_at_step": int}
CLONE_POLL_MAX_SLEEP = 0.2


def clone_config(cfg: RunConfig) -> RunConfig:
    """The clone group's config: the original's with `--clone-override`s, no offload, no hand-offs."""
    changes: dict[str, Any] = {}
    for item in cfg.clone_override:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or key not in OVERRIDABLE:
            raise ConfigError(f"--clone-override {item!r}: expected KEY=VALUE with KEY one of "
                              f"{', '.join(sorted(OVERRIDABLE))}")
        try:
            changes[key] = OVERRIDABLE[key](value.strip())
        except ValueError:
            raise ConfigError(f"--clone-override {item!r}: {value!r} is not a valid {key}") from None
    log_dir = os.path.join(cfg.log_dir, "clone") if cfg.log_dir else None
    return cfg.replace(**{"mode": "none", "clone_at": None, "clone_override": (), "ckpt_dir": None,
                          "ckpt_every": None, "ckpt_every_epoch": False, "resume": None, "stop_at_step": None,
                          "log_dir": log_dir, "trace": None, "save_weights": None, **changes})


def expected_sources(topo: Topology) -> list[tuple[int, int]]:
    """(original host rank, keeper DPU rank) of every slice forwarded to this clone rank, in order."""
    keepers = feeders(topo.pairing)
    me, m = topo.side_rank, len(topo.clone_ranks)
    return [(k, keepers[h]) for k, h in enumerate(topo.host_ranks) if k % m == me]


def receive_forwarded(topo: Topology, timeout: float) -> list[bytes]:
    """This clone rank's forwarded hand-offs, each packed as header + small + shared bytes."""
    out = []
    for k, keeper in expected_sources(topo):
        header = CKPT_HEADER.empty()
        wait(topo.world.Irecv(header, source=keeper, tag=Tag.CLONE), None,
             f"the state of host rank {k} from {topo.describe(keeper)}", max_sleep=CLONE_POLL_MAX_SLEEP)
        head = CKPT_HEADER.unpack(header)
        if head["kind"] != StateKind.CLONE or head["sender"] != k:
            raise PeerError(f"expected host rank {k}'s clone state from {topo.describe(keeper)}, got {dict(head)}")
        small = np.empty(head["small_nbytes"], dtype=np.uint8)
        shared = np.empty(head["shared_nbytes"], dtype=np.uint8)
        for buf in (small, shared):
            wait(topo.world.Irecv(buf, source=keeper, tag=Tag.CLONE), timeout, f"host rank {k}'s state slices")
        out.append(header.tobytes() + small.tobytes() + shared.tobytes())
    return out


def split_handoff(blob: bytes) -> tuple[dict[str, int], bytes, bytes, bytes]:
    """(header, meta JSON, local blob, shared bytes) of one packed hand-off."""
    n = 8 * len(CKPT_HEADER.fields)
    head = CKPT_HEADER.unpack(np.frombuffer(blob[:n], dtype=np.int64).copy())
    small_end = n + head["small_nbytes"]
    return head, blob[n: n + head["meta_nbytes"]], blob[n + head["meta_nbytes"]: small_end], blob[small_end:]


def rebuild_shared(meta: dict[str, Any], slices: dict[int, bytes]) -> dict[str, torch.Tensor]:
    """Every shared tensor, reassembled from all host ranks' packed slices."""
    tensors = [torch.empty(numel(shape), dtype=dtype_of(dtype)) for _, dtype, shape in meta["catalog"]]
    plan = plan_for(meta)
    for k, data in slices.items():
        unpack_pieces(np.frombuffer(bytearray(data), dtype=np.uint8), plan.rank_pieces(k), tensors)
    return {name: t.reshape(shape) for (name, _, shape), t in zip(meta["catalog"], tensors)}


def state_sha256(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """sha256 over model parameters, buffers and optimizer state tensors: 'the same state, to the bit'."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    for i, st in sorted(optimizer.state_dict()["state"].items()):
        for key, t in sorted(st.items()):
            h.update(f"{i}.{key}".encode())
            h.update(t.detach().contiguous().numpy().tobytes() if torch.is_tensor(t) else repr(t).encode())
    return h.hexdigest()


def adopt(trainer: Trainer, topo: Topology, original: RunConfig, clone: RunConfig) -> dict[str, Any]:
    """Stand by, receive, rebuild, apply overrides; return the clone-start record."""
    t0 = time.perf_counter()
    mine = receive_forwarded(topo, original.peer_timeout)
    received = time.perf_counter()
    everything = [blob for part in topo.side_comm.allgather(mine) for blob in part]
    parts = {split_handoff(b)[0]["sender"]: split_handoff(b) for b in everything}
    meta = json.loads(parts[0][1])
    shared = rebuild_shared(meta, {k: p[3] for k, p in parts.items()})
    n_orig = int(meta["host_ranks"])
    local = parse_local(parts[topo.side_rank % n_orig][2])
    restore(trainer.model, trainer.optimizer, trainer.scheduler, meta, shared, local)
    apply_hyperparameters(trainer, original, clone)
    pos = position_of(meta)
    start = reslice_position(pos, n_orig * original.batch_size, topo.side_comm.Get_size() * clone.batch_size,
                             trainer.feed.steps())
    trainer.resume_at(start, local.progress if start == pos else EpochProgress())
    set_rng(local.rng)
    return {"event": "clone_start", "global_step": pos.global_step, "epoch": start.epoch, "step": start.step,
            "standby_s": received - t0, "rebuild_s": time.perf_counter() - received,
            "state_sha256": state_sha256(trainer.model, trainer.optimizer), "overrides": list(original.clone_override),
            "ready_time": time.time()}  # wall clock, comparable with the originals' hand-off `wall_time`


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

