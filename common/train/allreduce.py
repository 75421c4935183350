"""Gradient averaging among training replicas: Horovod (on the replicas' communicator only),
torch.distributed, or a plain MPI allreduce (`--allreduce mpi`, and what `--recovery` uses: the
only one of the three whose group can shrink to the survivors of a dead rank, or take a spare in). The
replicas are the host ranks, or host and DPU ranks in `--mode naive`.

Both backends sum every gradient across the replicas and scale by 1/N, over one flat view of all
gradients, so with the same inputs they give the same averaged gradient up to float summation
order (bit-identical in our 2-rank tests). Outside naive mode DPU ranks never join these groups:
they talk to hosts over mpi4py point-to-point on COMM_WORLD.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from dpuoffload.common.errors import ConfigError, InternalError
from dpuoffload.common.modes import AllReduce
from dpuoffload.common.runtime.env import horovod_available
from dpuoffload.common.runtime.hostgroup import HostGroup
from dpuoffload.common.train.mpibuild import horovod_mismatch

if TYPE_CHECKING:
    from mpi4py import MPI


class GradientSync(Protocol):
    """Call order on every host rank: `broadcast_parameters_` once, `allreduce_gradients_` after
    each backward, `broadcast_buffers_` at each epoch end, `shutdown` at the end. All calls are
    collective over the host ranks."""

    name: str

    def broadcast_parameters_(self, model: nn.Module) -> None: ...

    def broadcast_buffers_(self, model: nn.Module) -> None:
        """Make buffers (BatchNorm running statistics) equal to host rank 0's.

        The allreduce keeps parameters identical, but each rank updates its running statistics from
        its own batches; the model state that is validated, handed to DPU ranks or checkpointed
        must be one well-defined state, so it is host rank 0's (DDP's broadcast_buffers, once per epoch).
        """

    def allreduce_gradients_(self, grads: Sequence[torch.Tensor], average: bool = True, weight: float = 1.0) -> None:
        """Sum `grads` over the group in place; divide by the group size when `average`. `weight`:
        this replica's share of the step's samples when not averaging; only `MpiSync` uses it, to
        renormalise over the survivors of a step that lost a replica."""

    def shutdown(self) -> None: ...


class Passenger(Protocol):
    """What rides in `MpiSync`'s gradient allreduce besides the gradients, and how the epoch's end
    uses it (`host.recovery.carried.Carried`, under `--recovery rollback`: host rank 0's BatchNorm
    buffers and every rank's step loss and counts). Its part is summed with the gradients' and not
    divided."""

    def outgoing(self, dtype: torch.dtype) -> torch.Tensor:
        """This rank's part of the next message, flat, in the gradients' `dtype` (empty: nothing)."""

    def arrived(self, summed: torch.Tensor) -> None:
        """The summed part, once every rank agreed the allreduce succeeded."""

    def set_buffers(self, model: nn.Module) -> bool:
        """At the epoch's end: set the model's buffers from what arrived, or False to broadcast."""


def resolve_backend(requested: AllReduce) -> AllReduce:
    """'auto' means Horovod when it imports and was built against this job's MPI, torch.distributed otherwise."""
    if requested == AllReduce.AUTO:
        return AllReduce.HOROVOD if horovod_available() and horovod_mismatch() is None else AllReduce.TORCH
    if requested == AllReduce.MPI:
        return requested
    if requested == AllReduce.HOROVOD and not horovod_available():
        raise ConfigError("--allreduce horovod: Horovod is not installed; run scripts/setup.sh (it builds "
                          "Horovod for this platform) or use --allreduce torch")
    if requested == AllReduce.HOROVOD and (why := horovod_mismatch()) is not None:
        raise ConfigError(f"--allreduce horovod: {why}")
    return requested


class HorovodSync:
    name = "horovod"

    def __init__(self, group: "MPI.Comm", device: torch.device = torch.device("cpu")) -> None:
        import horovod.torch as hvd

        hvd.init(comm=group)
        if device.type == "cuda" and not hvd.nccl_built():
            raise ConfigError("--device cuda: this Horovod was built without GPU support (hvd.nccl_built() is 0), "
                              "so it cannot reduce GPU gradients; use --allreduce torch (NCCL), or rebuild Horovod "
                              "with HOROVOD_GPU_OPERATIONS=NCCL")
        self._hvd = hvd

    def broadcast_parameters_(self, model: nn.Module) -> None:
        self._broadcast(model.state_dict())

    def broadcast_buffers_(self, model: nn.Module) -> None:
        buffers = dict(model.named_buffers())
        if buffers:
            self._broadcast(buffers)

    def _broadcast(self, tensors: dict[str, torch.Tensor]) -> None:
        """Horovod takes only contiguous tensors: channels-last ones go through a row-major copy."""
        staged = {k: t if t.is_contiguous() else t.contiguous() for k, t in tensors.items()}
        self._hvd.broadcast_parameters(staged, root_rank=0)
        for k, t in tensors.items():
            if staged[k] is not t:
                t.copy_(staged[k])

    def allreduce_gradients_(self, grads: Sequence[torch.Tensor], average: bool = True, weight: float = 1.0) -> None:
        if grads:
            op = self._hvd.Average if average else self._hvd.Sum
            staged = [g if g.is_contiguous() else g.contiguous() for g in grads]  # channels-last: row-major copies
            self._hvd.grouped_allreduce_(staged, op=op, name="grads")
            for g, s in zip(grads, staged):
                if s is not g:
                    g.copy_(s)

    def shutdown(self) -> None:
        self._hvd.shutdown()


class TorchSync:
    """torch.distributed group of the host ranks (NCCL for GPU host ranks, gloo on CPUs); the
    rendezvous port is shared over MPI."""

    name = "torch"

    def __init__(self, group: "MPI.Comm", timeout: float, device: torch.device = torch.device("cpu")) -> None:
        import torch.distributed as dist

        init_torch_group(group, "nccl" if device.type == "cuda" else "gloo", timeout, device)
        self._dist, self._size = dist, group.Get_size()

    def broadcast_parameters_(self, model: nn.Module) -> None:
        for tensor in model.state_dict().values():
            self._dist.broadcast(tensor, src=0)

    def broadcast_buffers_(self, model: nn.Module) -> None:
        for tensor in model.buffers():
            self._dist.broadcast(tensor, src=0)

    def allreduce_gradients_(self, grads: Sequence[torch.Tensor], average: bool = True, weight: float = 1.0) -> None:
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._dist.all_reduce(flat)
        if average:
            flat.div_(self._size)
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()

    def shutdown(self) -> None:
        self._dist.destroy_process_group()


def init_torch_group(group: "MPI.Comm", backend: str, timeout: float,
                     device: torch.device = torch.device("cpu")) -> None:
    """`torch.distributed.init_process_group` over the ranks of `group` (collective over it).

    Rank 0 of the group opens a TCPStore on a free port and broadcasts the port over MPI, so no
    MASTER_ADDR/MASTER_PORT environment is needed and two jobs on one box never collide on a port.
    """
    import torch.distributed as dist

    rank, size = group.Get_rank(), group.Get_size()
    addr = _rendezvous_address(group)
    delta = datetime.timedelta(seconds=timeout)
    if rank == 0:
        store = dist.TCPStore(addr, 0, size, is_master=True, timeout=delta, wait_for_workers=False)
        port = group.bcast(store.port, root=0)
    else:
        port = group.bcast(None, root=0)
        store = dist.TCPStore(addr, port, size, is_master=False, timeout=delta)
    bound: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}  # NCCL: this rank's GPU, up front
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=delta, **bound)


def _rendezvous_address(group: "MPI.Comm") -> str:
    """Loopback when all replicas share a machine, else the hostname of the group's rank 0."""
    from mpi4py import MPI

    names = group.allgather(MPI.Get_processor_name())
    return "127.0.0.1" if len(set(names)) == 1 else names[0]


class MpiSync:
    """The replicas' sums as one MPI allreduce of every gradient (mpi4py, through host memory).

    Over a `host.recovery.survivors.SurvivorGroup` it survives a dead replica: the group agrees the
    allreduce failed, shrinks to the survivors and redoes it, and the step's gradient becomes the
    survivors' mean (lossy forward). A weight per replica travels in the same message (1, or its
    share of the step's samples) so that the mean is right for unequal batches too.
    """

    name = "mpi"

    def __init__(self, group: HostGroup, passenger: Optional[Passenger] = None) -> None:
        """`group`: the replicas (a `FixedGroup`, or a `SurvivorGroup` under --recovery); `passenger`:
        what rides in each allreduce besides the gradients (`--recovery rollback`'s `Carried`)."""
        self.group, self.passenger = group, passenger

    def broadcast_parameters_(self, model: nn.Module) -> None:
        self._broadcast(list(model.state_dict().values()))

    def broadcast_buffers_(self, model: nn.Module) -> None:
        if self.passenger is not None and self.passenger.set_buffers(model):
            return  # (every rank holds host rank 0's buffers from the last step's allreduce)
        self._broadcast(list(model.buffers()))

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            staged = t.detach().contiguous().cpu()  # (the tensor itself on a CPU, when contiguous)
            self.group.Bcast(staged.numpy(), root=0)
            if staged.data_ptr() != t.data_ptr():
                t.copy_(staged)

    def allreduce_gradients_(self, grads: Sequence[torch.Tensor], average: bool = True, weight: float = 1.0) -> None:
        if not grads:
            return
        dtype = grads[0].dtype
        riding = self.passenger.outgoing(dtype) if self.passenger is not None else torch.empty(0, dtype=dtype)
        flat = torch.cat([g.detach().reshape(-1).cpu() for g in grads]
                         + [torch.tensor([1.0 if average else weight], dtype=dtype), riding])
        out = np.empty_like(flat.numpy())
        before = self.group.generation
        self.group.Allreduce(flat.numpy(), out)
        summed = torch.from_numpy(out)
        n = len(flat) - len(riding)   # the gradients and the weight; then the passenger's part
        if self.passenger is not None:
            self.passenger.arrived(summed[n:])
        if self.group.generation != before:  # the group changed in the call (replicas lost:
            # the survivors' weighted mean; a spare replayed a dead one's step: the weights sum to the size again)
            summed[:n - 1].div_(summed[n - 1])
        elif average:
            summed[:n - 1].div_(self.group.Get_size())
        offset = 0
        for g in grads:
            g.copy_(summed[offset: offset + g.numel()].view_as(g))
            offset += g.numel()

    def shutdown(self) -> None:
        """Nothing to end: the group is the caller's (freed at MPI_Finalize)."""


def build_sync(requested: AllReduce, group: HostGroup, timeout: float,
               device: torch.device = torch.device("cpu"), passenger: Optional[Passenger] = None) -> GradientSync:
    """The gradient allreduce of `group`; GPU host ranks (`device` cuda) reduce on their GPUs
    (`--allreduce mpi`: through host memory). A `passenger` rides in MPI's allreduce only."""
    backend = resolve_backend(requested)
    if backend == AllReduce.MPI:
        return MpiSync(group, passenger)
    if passenger is not None:
        raise InternalError(f"a passenger in the {backend} allreduce (--recovery takes --allreduce mpi)")
    comm = group.comm  # (a fixed group's: --recovery, whose group changes, takes mpi)
    return HorovodSync(comm, device) if backend == AllReduce.HOROVOD else TorchSync(comm, timeout, device)
