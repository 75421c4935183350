"""`--mode mv`: DPU validation ranks evaluate epoch i while the host ranks train epoch i+1.

Per epoch: each validation rank receives the state slices of the host ranks paired with it,
the validation ranks all-gather the packed slices over their communicator (DeepClone, Alg. 2) and
rebuild the full state (parameters and buffers) into their own model, evaluate their shard of the
DPU part of the validation set (the first f, unshuffled), reduce (loss sum, correct, count) over
their communicator, and rank 0 sends the sums to host rank 0. Waits for the next state have no
deadline (an epoch may take hours); a dead host rank makes Open MPI end the job.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import PeerError
from dpuoffload.common.plan.validation_split import dpu_count
from dpuoffload.common.runtime.messages import STATE_HEADER, STATE_HEADER_BYTES, Tag
from dpuoffload.common.runtime.metrics import PhaseTimer
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import wait
from dpuoffload.common.state.sharding import (
    byte_buffer,
    packed_nbytes,
    plan_shards,
    state_digest,
    state_tensors,
    unpack_pieces,
)
from dpuoffload.common.train.evaluation import (
    eval_seconds_per_sample,
    evaluate_sums,
    shard_range,
)

if TYPE_CHECKING:
    from mpi4py import MPI

STATE_POLL_MAX_SLEEP = 0.01


class Validator:
    def __init__(self, cfg: RunConfig, topo: Topology, comm: "MPI.Comm", model: nn.Module, val_set: Dataset,
                 hosts: tuple[int, ...], epochs: Sequence[int]) -> None:
        """`epochs`: the epochs the host ranks complete in this run (a resumed or stopped run skips some)."""
        self.cfg, self.topo, self.comm, self.model, self.val_set = cfg, topo, comm, model, val_set
        self.epochs = tuple(epochs)
        self.hosts = hosts  # world ranks of the host ranks whose slices this rank receives
        self.tensors = state_tensors(model.state_dict())
        self.plan = plan_shards([t.numel() for t in self.tensors], len(topo.host_ranks))
        self.sizes = [STATE_HEADER_BYTES + packed_nbytes(self.tensors, self.plan.rank_pieces(k))
                      for k in range(len(topo.host_ranks))]
        self.timer = PhaseTimer()

    def run(self) -> list[dict[str, Any]]:
        if self.cfg.mv_dpu_fraction == "auto" and self.comm.Get_rank() == 0:
            self.send_profile()
        return [self.run_epoch(epoch) for epoch in self.epochs]

    def send_profile(self) -> None:
        """Tell host rank 0 what a validation sample costs here (it picks the DPU share from it)."""
        cost = eval_seconds_per_sample(self.model, self.val_set, self.cfg.val_batch_size)
        req = self.topo.world.Isend(np.array([cost], dtype=np.float64), dest=self.topo.host_ranks[0], tag=Tag.PROFILE)
        wait(req, self.cfg.peer_timeout, "host rank 0 to receive the DPU evaluation profile")

    def run_epoch(self, epoch: int) -> dict[str, Any]:
        self.timer.reset()
        with self.timer.phase("wait_state"):
            received = self.receive()
        t0 = time.perf_counter()
        with self.timer.phase("gather_state"):
            share = self.rebuild(epoch, self.allgather(received))
        with self.timer.phase("evaluate"):
            n_dpu = dpu_count(len(self.val_set), share)
            mine = shard_range(n_dpu, self.comm.Get_rank(), self.comm.Get_size())
            sums = evaluate_sums(self.model, self.val_set, mine, self.cfg.val_batch_size)
        with self.timer.phase("report"):
            self.report(epoch, sums)
        return {"epoch": epoch, "busy_time": time.perf_counter() - t0, "val_samples": len(mine),
                "dpu_share": share, "phases": dict(self.timer.totals), "weights_sha256": state_digest(self.model),
                "val_sums": sums.tolist()}

    def close(self) -> None:
        """Nothing pending: every send was waited for in `report`."""

    def receive(self) -> bytes:
        """The packed slices of every paired host rank, concatenated in host order."""
        bufs, reqs = [], []
        for h in self.hosts:
            buf = byte_buffer(self.sizes[self.topo.host_ranks.index(h)])
            bufs.append(buf)
            reqs.append(self.topo.world.Irecv(buf, source=h, tag=Tag.STATE))
        for h, req in zip(self.hosts, reqs):
            wait(req, None, f"the model state from {self.topo.describe(h)}", max_sleep=STATE_POLL_MAX_SLEEP)
        return b"".join(b.tobytes() for b in bufs)

    def allgather(self, mine: bytes) -> np.ndarray:
        """Every validation rank's received slices, on every validation rank (raw Allgatherv)."""
        counts = self.comm.allgather(len(mine))
        out = byte_buffer(sum(counts))
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        self.comm.Allgatherv(np.frombuffer(mine, dtype=np.uint8), [out, counts, displs, _byte_type()])
        return out

    def rebuild(self, epoch: int, gathered: np.ndarray) -> float:
        """Unpack every host rank's slices into the model; return the DPU share f of this epoch."""
        offset, shares, seen = 0, set(), set()
        while offset < len(gathered):
            head = STATE_HEADER.unpack(gathered[offset: offset + STATE_HEADER_BYTES].view(np.int64).copy())
            if head["epoch"] != epoch:
                raise PeerError(f"model state of epoch {head['epoch']} arrived while validating epoch {epoch}")
            start = offset + STATE_HEADER_BYTES
            unpack_pieces(gathered[start: start + head["nbytes"]], self.plan.rank_pieces(head["sender"]), self.tensors)
            shares.add(head["dpu_share_ppm"])
            seen.add(head["sender"])
            offset = start + head["nbytes"]
        if len(seen) != len(self.topo.host_ranks) or len(shares) != 1:
            raise PeerError(f"epoch {epoch}: state slices from host ranks {sorted(seen)} with shares {shares}; "
                            f"expected all {len(self.topo.host_ranks)} host ranks and one share")
        return shares.pop() / 1e6

    def report(self, epoch: int, sums: np.ndarray) -> None:
        from mpi4py import MPI

        total = np.zeros_like(sums)
        self.comm.Reduce(sums, total, op=MPI.SUM, root=0)
        if self.comm.Get_rank() == 0:
            msg = np.array([epoch, *total], dtype=np.float64)
            req = self.topo.world.Isend(msg, dest=self.topo.host_ranks[0], tag=Tag.METRICS)
            wait(req, self.cfg.peer_timeout, "host rank 0 to receive the validation results")


def _byte_type():
    from mpi4py import MPI

    return MPI.BYTE
