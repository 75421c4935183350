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
from typing import TYPE_CHECKING, Optional

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from dpuoffload.common.plan.validation_split import auto_share, dpu_count
from dpuoffload.common.runtime.messages import (
    METRICS_FIELDS,
    STATE_HEADER,
    STATE_HEADER_BYTES,
    Tag,
)
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait
from dpuoffload.common.state.sharding import (
    pack_pieces,
    packed_nbytes,
    plan_shards,
    state_tensors,
)
from dpuoffload.common.train.evaluation import (
    SharePolicy,
    Sums,
    allreduce_sums,
    eval_seconds_per_sample,
    evaluate_sums,
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
