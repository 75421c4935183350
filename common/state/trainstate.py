"""The training state a checkpoint or a clone carries, split the way it travels.

After the allreduce every host rank holds the same parameters and optimizer state, so those are
*shared*: sent in slices, 1/N per host rank (`common.sharding`). What differs per rank is *local*
and small: BatchNorm running statistics (each rank's forward pass updates its own until the
epoch-end sync), the RNG states (torch, every GPU's, numpy, python) and the progress of the epoch in flight
(loss/accuracy sums and step losses so far, so the resumed epoch's record equals the straight
run's). Run-level facts that are the same everywhere (position, optimizer hyper-parameters,
scheduler, tensor catalog, config) travel as JSON *meta* (`common.state.meta.CheckpointMeta`).

Everything here is pure (no MPI) so the host sender, the DPU keeper, resume and export share it.
"""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from dpuoffload.common.state.meta import (  # noqa: F401  (re-exported: where state is, its meta is)
    Catalog,
    CheckpointMeta,
    Position,
    describe_position,
    reslice_position,
)


@dataclass(frozen=True)
class EpochSpan:
    """Steps [start, stop) of `epoch` to run; `completes` when the epoch-end work follows."""

    epoch: int
    start: int
    stop: int
    completes: bool


def epoch_spans(steps_per_epoch: int, epochs: int, start: Position, stop_at: Optional[int]) -> list[EpochSpan]:
    """The epochs (or parts) a run trains, from `start` up to --epochs or global step `stop_at`.

    Host ranks, augmentation DPU ranks and validation DPU ranks all derive their loops from this
    one function, so a resumed or stopped run agrees on every batch and every validation."""
    spans: list[EpochSpan] = []
    epoch, step, done = start.epoch, start.step, start.global_step
    while epoch < epochs:
        stop = steps_per_epoch
        if stop_at is not None:
            if done >= stop_at:
                break
            stop = min(stop, step + stop_at - done)
        spans.append(EpochSpan(epoch, step, stop, stop == steps_per_epoch))
        done += stop - step
        if stop < steps_per_epoch:
            break
        epoch, step = epoch + 1, 0
    return spans


# ------------------------------------------------------------------------------------ shared state
def shared_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Parameters and per-parameter optimizer state, by name (the sharded, identical-everywhere part).

    The tensors are the live ones (no copy): the staged sender copies slices out of them, the
    zero-copy sender sends from their memory."""
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        out[f"model.{name}"] = p.detach()
    for name, p in model.named_parameters():
        for key, value in optimizer.state.get(p, {}).items():
            if torch.is_tensor(value):
                out[f"optim.{name}.{key}"] = value.detach()
    return out


def catalog_of(tensors: Mapping[str, torch.Tensor]) -> Catalog:
    return [(name, dtype_name(t.dtype), tuple(t.shape)) for name, t in tensors.items()]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in checkpoint catalog")
    return dtype


def numel(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


# ------------------------------------------------------------------------------------- local state
@dataclass
class EpochProgress:
    """The epoch in flight on this rank: [loss sum, correct, count] and the step losses so far."""

    sums: np.ndarray = field(default_factory=lambda: np.zeros(3, dtype=np.float64))
    losses: list[float] = field(default_factory=list)


@dataclass
class LocalState:
    buffers: dict[str, torch.Tensor]
    rng: dict[str, Any]
    progress: EpochProgress


def capture_local(model: nn.Module, progress: EpochProgress,
                  buffers: Optional[Mapping[str, torch.Tensor]] = None) -> bytes:
    """This rank's local state as one safetensors blob (sent as-is, written as-is by the DPU);
    `buffers`: the model's buffers to write instead of its own (a rollback spare's pre-step ones)."""
    own = dict(model.named_buffers()) if buffers is None else buffers
    tensors = {f"model.{name}": b.detach().contiguous() for name, b in own.items()}
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # (a CPU run never starts CUDA for this)
        tensors["rng.cuda"] = torch.stack(torch.cuda.get_rng_state_all())  # every GPU's: dropout masks there
    tensors["rng.numpy"] = torch.from_numpy(np.asarray(np_keys, dtype=np.int64))
    tensors["rng.python"] = torch.tensor(py_state, dtype=torch.int64)
    tensors["progress.sums"] = torch.from_numpy(progress.sums.copy())
    tensors["progress.losses"] = torch.tensor(progress.losses, dtype=torch.float64)
    meta = {"numpy": json.dumps([int(np_pos), int(np_has_gauss), float(np_gauss)]),
            "python": json.dumps([py_version, py_gauss])}
    return st_save(tensors, metadata=meta)


def parse_local(blob: bytes) -> LocalState:
    tensors = st_load(blob)
    meta = safetensors_metadata(blob)
    buffers = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    np_pos, np_has_gauss, np_gauss = json.loads(meta["numpy"])
    py_version, py_gauss = json.loads(meta["python"])
    rng = {"torch": tensors["rng.torch"], "cuda": tensors.get("rng.cuda"),
           "numpy": ("MT19937", tensors["rng.numpy"].numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss),
           "python": (py_version, tuple(int(x) for x in tensors["rng.python"].tolist()), py_gauss)}
    progress = EpochProgress(tensors["progress.sums"].numpy().copy(), tensors["progress.losses"].tolist())
    return LocalState(buffers, rng, progress)


def safetensors_metadata(blob: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors blob (8-byte little-endian header size, then JSON)."""
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8: 8 + n]).get("__metadata__", {})


# -------------------------------------------------------------------------------------- meta (JSON)
def meta_of(position: Position, catalog: Catalog, optimizer: torch.optim.Optimizer, scheduler: Any,
            model: nn.Module, **facts: Any) -> CheckpointMeta:
    """The run-level facts of the live objects at `position`, identical on every host rank.
    `facts`: the hand-off's run facts (`CheckpointMeta`'s host_ranks, config, ...); `scheduler`
    may be None (a script without one)."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[id(p)] for p in g["params"]]}
              for g in optimizer.param_groups]
    return CheckpointMeta(position, catalog, groups, scheduler_state(scheduler), **facts)


def capture_meta(position: Position, catalog: Catalog, optimizer: torch.optim.Optimizer,
                 scheduler: Any, model: nn.Module, extra: Mapping[str, Any]) -> dict[str, Any]:
    """`meta_of` as its JSON object (what the files and hand-offs hold)."""
    return meta_of(position, catalog, optimizer, scheduler, model, **extra).to_json()


def scheduler_state(scheduler: Any) -> Optional[dict[str, Any]]:
    """A learning-rate scheduler's `state_dict()` as JSON, or None without one.

    LambdaLR/MultiplicativeLR keep their functions out (`lr_lambdas`: code, not state; the live
    scheduler has them). Any other scheduler's state is plain numbers and lists; one that is not
    (a user's own) gets a clear error instead of a failed hand-off."""
    if scheduler is None:
        return None
    state = {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}
    try:
        json.dumps(state)
    except TypeError as e:
        raise TypeError(f"the scheduler {type(scheduler).__name__}'s state_dict() is not plain data ({e}): "
                        "checkpoint without it (scheduler=None) and keep what it needs in extra=") from None
    return state


def load_scheduler(scheduler: Any, state: Optional[Mapping[str, Any]], n_groups: int) -> None:
    if scheduler is None or state is None:
        return
    full = dict(state)
    if "lr_lambdas" in scheduler.state_dict():  # LambdaLR and kin expect the key (None: keep their own)
        full["lr_lambdas"] = [None] * n_groups
    scheduler.load_state_dict(full)


# ------------------------------------------------------------------------------------------ restore
def optimizer_state_dict(meta: CheckpointMeta | Mapping[str, Any], shared: Mapping[str, torch.Tensor],
                         param_names: Sequence[str]) -> dict[str, Any]:
    """A plain `Optimizer.state_dict()` (indices in `param_names` order) from meta + shared tensors."""
    index = {n: i for i, n in enumerate(param_names)}
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in shared.items():
        if key.startswith("optim."):
            pname, _, skey = key.removeprefix("optim.").rpartition(".")
            state.setdefault(index[pname], {})[skey] = t
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in CheckpointMeta.of(meta).param_groups]
    return {"state": state, "param_groups": groups}


def restore(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
            meta: CheckpointMeta | Mapping[str, Any], shared: Mapping[str, torch.Tensor], local: LocalState) -> None:
    """Load everything into live objects; the caller restores RNG states last (`set_rng`).
    Callers go through `common.state.load.load_state`, which does both in that order."""
    meta = CheckpointMeta.of(meta)
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n in names if f"model.{n}" not in shared]
    if missing:
        raise ValueError(f"checkpoint has no parameter(s) {missing[:3]}: it was written for another model")
    with torch.no_grad():
        for name, p in model.named_parameters():
            src = shared[f"model.{name}"]
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"checkpoint parameter {name} has shape {tuple(src.shape)}, the model's is "
                                 f"{tuple(p.shape)}: it was written for another model")
            p.copy_(src)
        for name, b in model.named_buffers():
            b.copy_(local.buffers[name])
    optimizer.load_state_dict(optimizer_state_dict(meta, shared, names))
    load_scheduler(scheduler, meta.scheduler, len(optimizer.param_groups))


def set_rng(rng: Mapping[str, Any]) -> None:
    """Restore the carried RNG states. The GPUs' only where they were captured and this process has as
    many GPUs (a state written on GPUs and resumed on a CPU keeps the CPU's; the weights are the same,
    and a GPU's dropout masks were never the CPU's anyway)."""
    torch.set_rng_state(rng["torch"])
    cuda = rng.get("cuda")
    if cuda is not None and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(list(cuda))
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
