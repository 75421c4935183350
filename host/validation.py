"""Epoch-end validation on the host side: all on the host ranks, or handed to DPU ranks (`--mode mv`).

`LocalValidation` evaluates the whole validation set on the host ranks before the next epoch.
`OffloadedValidation` follows the published O-MV design: at the end of epoch i each host rank
stages its 1/N slice of the model state (parameters and buffers, `common.sharding`) and sends it
to its DPU validation rank, evaluates the host's part of the validation set (the `1 - f` tail,
split over host ranks; f = `--mv-dpu-fraction`), and starts epoch i+1. Host rank 0 collects the
DPU ranks' sums for epoch i when they arrive and merges them with the host part. The host only
blocks for the staging copy; the buffer is reused only after its previous send completed.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Optional, Sequence, cast

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from dpuoffload.common.data.streams import ValidatorSetup, encode
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.plan.offload import OffloadPlan
from dpuoffload.common.plan.validation_split import auto_share, dpu_count
from dpuoffload.common.runtime.messages import (
    METRICS_FIELDS,
    STATE_HEADER,
    STATE_HEADER_BYTES,
    Tag,
)
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.runtime.waits import wait
from dpuoffload.common.state.sharding import (
    pack_pieces,
    packed_nbytes,
    plan_shards,
    state_tensors,
)
from dpuoffload.common.train.device import to_host
from dpuoffload.common.train.evaluation import (
    LocalValidation,
    SharePolicy,
    Sums,
    Validation,
    allreduce_sums,
    eval_seconds_per_sample,
    evaluate_sums,
    metrics_from_sums,
    shard_range,
)

if TYPE_CHECKING:
    from mpi4py import MPI



def fixed_share(f: float) -> SharePolicy:
    return lambda train_seconds: f


class AutoShare:
    """`--mv-dpu-fraction auto`: each epoch, the largest DPU share that the DPU validation ranks can
    finish within the next host epoch (`validation_split.auto_share`), from evaluation costs measured
    on host rank 0 and on DPU validation rank 0 and host rank 0's training time of this epoch.
    Collective over the host ranks (host rank 0 decides and broadcasts), so they all split alike."""

    def __init__(self, topo: Topology, model: nn.Module, val_set: Dataset, batch_size: int,
                 dpu_leader: int, mv_ranks: int, timeout: float) -> None:
        self.comm, self.n, self.mv_ranks = topo.side_comm, len(val_set), mv_ranks
        self.host_cost = self.dpu_cost = 0.0
        if self.comm.Get_rank() == 0:
            self.host_cost = eval_seconds_per_sample(model, val_set, batch_size)
            buf = np.zeros(1, dtype=np.float64)
            req = topo.world.Irecv(buf, source=dpu_leader, tag=Tag.PROFILE)
            wait(req, timeout, "the evaluation profile of DPU validation rank 0")
            self.dpu_cost = float(buf[0])
            print(f"[dpuoffload] mv auto: evaluation costs {self.host_cost * 1e3:.2f} ms/sample on a host "
                  f"rank, {self.dpu_cost * 1e3:.2f} ms/sample on a DPU rank", flush=True)

    def __call__(self, train_seconds: float) -> float:
        share = None
        if self.comm.Get_rank() == 0:
            share = auto_share(train_seconds, self.n, self.dpu_cost, self.mv_ranks, self.host_cost,
                               self.comm.Get_size())
        return float(self.comm.bcast(share, root=0))


class OffloadedValidation:
    def __init__(self, model: nn.Module, val_set: Dataset, batch_size: int, topo: Topology,
                 dpu: int, dpu_leader: int, timeout: float) -> None:
        self.model, self.val_set, self.batch_size, self.topo = model, val_set, batch_size, topo
        self.comm, self.dpu, self.dpu_leader, self.timeout = topo.side_comm, dpu, dpu_leader, timeout
        tensors = state_tensors(model.state_dict())
        self.plan = plan_shards([t.numel() for t in tensors], self.comm.Get_size())
        self.pieces = self.plan.rank_pieces(self.comm.Get_rank())
        self.staging = np.zeros(STATE_HEADER_BYTES + packed_nbytes(tensors, self.pieces), dtype=np.uint8)
        self.send_req: Optional["MPI.Request"] = None
        self.pending: deque[tuple[int, Sums, np.ndarray, "MPI.Request"]] = deque()

    def epoch_end(self, epoch: int, dpu_share: float) -> None:
        self.send_state(epoch, dpu_share)
        n = len(self.val_set)
        tail = range(dpu_count(n, dpu_share), n)
        mine = shard_range(len(tail), self.comm.Get_rank(), self.comm.Get_size())
        indices = tail[mine.start: mine.stop]
        host_sums = allreduce_sums(self.comm, evaluate_sums(self.model, self.val_set, indices, self.batch_size))
        if self.comm.Get_rank() == 0:
            buf = np.zeros(len(METRICS_FIELDS), dtype=np.float64)
            req = self.topo.world.Irecv(buf, source=self.dpu_leader, tag=Tag.METRICS)
            self.pending.append((epoch, host_sums, buf, req))

    def send_state(self, epoch: int, dpu_share: float) -> None:
        """Stage this rank's slices (the only blocking part) and send them without waiting."""
        if self.send_req is not None:
            wait(self.send_req, self.timeout, f"{self.topo.describe(self.dpu)} to receive the model state")
        nbytes = pack_pieces(state_tensors(self.model.state_dict()), self.pieces, self.staging[STATE_HEADER_BYTES:])
        self.staging[:STATE_HEADER_BYTES].view(np.int64)[:] = STATE_HEADER.pack(
            epoch=epoch, sender=self.comm.Get_rank(), nbytes=nbytes, dpu_share_ppm=round(dpu_share * 1e6))
        self.send_req = self.topo.world.Isend(self.staging, dest=self.dpu, tag=Tag.STATE)

    def ready(self) -> list[tuple[int, Sums]]:
        out = []
        while self.pending and self.pending[0][3].Test():
            out.append(self._merge(self.pending.popleft()))
        return out

    def finish(self) -> list[tuple[int, Sums]]:
        out = []
        while self.pending:
            epoch, _, _, req = self.pending[0]
            wait(req, self.timeout, f"epoch {epoch + 1} validation results from the DPU validation ranks")
            out.append(self._merge(self.pending.popleft()))
        if self.send_req is not None:
            wait(self.send_req, self.timeout, f"{self.topo.describe(self.dpu)} to receive the model state")
        return out

    def _merge(self, item: tuple[int, Sums, np.ndarray, "MPI.Request"]) -> tuple[int, Sums]:
        epoch, host_sums, buf, _ = item
        if int(buf[0]) != epoch:
            raise RuntimeError(f"DPU validation results for epoch {int(buf[0])} arrived, expected {epoch}")
        return epoch, host_sums + buf[1:]


class JobValidation:
    """The public API's `job.validate`: one epoch's validation on the DPU validation ranks (`--mode
    mv`/`hybrid`, `OffloadedValidation`) or on the host ranks (`LocalValidation`), same sums.

    Built at the first `job.validate`; host rank 0 then sends the model and the validation set
    once to every DPU validation rank (`ValidatorSetup`); later calls send only the state slices.
    Before each validation the model's buffers (BatchNorm statistics) are made host rank 0's on
    every host rank, as DDP does, so the state assembled from every rank's slice is one state.
    """

    def __init__(self, model: nn.Module, val_set: Dataset, batch_size: int, comm: Optional["MPI.Comm"],
                 topo: Optional[Topology], plan: Optional[OffloadPlan], share: float, timeout: float) -> None:
        self.model, self.val_set, self.comm, self.share = model, val_set, comm, share
        self.results: dict[int, dict[str, float]] = {}
        self.offloaded = topo is not None and plan is not None and bool(plan.mv_ranks)
        clone = topo is not None and topo.role is Role.CLONE
        self.label, self.ranks = ("[clone]", "clone ranks") if clone else ("[dpuoffload]", "host ranks")
        self.inner: Validation
        if self.offloaded:
            topo, plan = cast(Topology, topo), cast(OffloadPlan, plan)
            if topo.side_rank == 0:
                send_setup(topo, plan.mv_ranks, ValidatorSetup(model, val_set, batch_size), timeout)
            self.inner = OffloadedValidation(model, val_set, batch_size, topo, plan.mv_target[topo.world_rank],
                                             plan.mv_ranks[0], timeout)
        else:
            self.inner = LocalValidation(model, val_set, batch_size, comm)

    def check_same(self, model: nn.Module, val_set: Dataset) -> None:
        if model is not self.model or val_set is not self.val_set:
            raise ConfigError("job.validate: pass the same model and validation set objects every epoch (the DPU "
                              "validation ranks received them at the first call)")

    def epoch_end(self, epoch: int) -> None:
        if self.comm is not None and self.comm.Get_size() > 1:
            for buffer in self.model.buffers():
                staged = to_host(buffer).contiguous()  # the buffer itself on the CPU; a copy from a GPU
                self.comm.Bcast(staged.numpy(), root=0)
                if staged.data_ptr() != buffer.data_ptr():
                    buffer.copy_(staged)
        self.inner.epoch_end(epoch, self.share if self.offloaded else 0.0)
        self.collect(self.inner.ready())

    def collect(self, done: list[tuple[int, Sums]]) -> dict[int, dict[str, float]]:
        """Record (and print) arrived results; on host rank 0 only, wherever they were computed."""
        if self.comm is not None and self.comm.Get_rank() != 0:
            return self.results
        for epoch, sums in done:
            loss, accuracy = metrics_from_sums(sums)
            self.results[epoch] = {"loss": loss, "accuracy": accuracy, "count": int(sums[2])}
            where = "on the DPU ranks" if self.offloaded else f"on the {self.ranks}"
            print(f"{self.label} validation of epoch {epoch}: loss {loss:.4f} accuracy {accuracy:.1%} "
                  f"({int(sums[2])} samples, {where})", flush=True)
        return self.results

    def poll(self) -> dict[int, dict[str, float]]:
        return self.collect(self.inner.ready())

    def finish(self) -> dict[int, dict[str, float]]:
        return self.collect(self.inner.finish())


def send_setup(topo: Topology, mv_ranks: Sequence[int], setup: ValidatorSetup, timeout: float) -> None:
    """Host rank 0: the pickled model and validation set to every DPU validation rank."""
    data = encode(setup)
    reqs = [topo.world.isend(data, dest=d, tag=Tag.VALIDATOR) for d in mv_ranks]
    for d, req in zip(mv_ranks, reqs):
        wait(req, timeout, f"{topo.describe(d)} to take the model and validation set")
