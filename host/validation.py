"""Epoch-end validation on the host side: all on the host ranks, or handed to DPU ranks (`--mode mv`).

`LocalValidation` evaluates the whole validation set on the host ranks before the next epoch.
`OffloadedValidation` follows the published O-MV design: at the end of epoch i each host rank
stages its 1/N slice of the model state (parameters and buffers, `common.sharding`) and sends it
to its DPU validation rank, evaluates the host's part of the validation set (the `1 - f` tail,
split over host ranks; f = `--mv-dpu-fraction`), and starts epoch i+1. Host rank 0 collects the
DPU ranks' sums for epoch i when they arrive and merges them with the host part. The host only
blocks for the staging copy; the buffer is reused only after its previous send completed.
`FallbackValidation` (`--dpu-failure fallback`) moves validation to the host ranks when a DPU
validation rank dies.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, cast

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from dpuoffload.common.data.streams import ValidatorSetup, encode
from dpuoffload.common.errors import ConfigError, PeerError
from dpuoffload.common.plan.offload import OffloadPlan
from dpuoffload.common.plan.validation_split import auto_share, dpu_count
from dpuoffload.common.runtime import faults
from dpuoffload.common.runtime.messages import (
    METRICS_FIELDS,
    STATE_HEADER,
    STATE_HEADER_BYTES,
    Tag,
)
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.runtime.waits import is_failure, wait
from dpuoffload.common.state.sharding import (
    allgather_bytes,
    pack_pieces,
    packed_nbytes,
    plan_shards,
    state_tensors,
    unpack_states,
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
                 dpu: int, dpu_leader: int, timeout: float, keep: bool = False) -> None:
        """`keep`: stage each epoch's state in a fresh buffer and never wait for the last send, so
        `FallbackValidation` can keep the message until the epoch's DPU results are in."""
        self.model, self.val_set, self.batch_size, self.topo = model, val_set, batch_size, topo
        self.comm, self.dpu, self.dpu_leader, self.timeout = topo.side_comm, dpu, dpu_leader, timeout
        tensors = state_tensors(model.state_dict())
        self.plan = plan_shards([t.numel() for t in tensors], self.comm.Get_size())
        self.pieces = self.plan.rank_pieces(self.comm.Get_rank())
        self.staging = np.zeros(STATE_HEADER_BYTES + packed_nbytes(tensors, self.pieces), dtype=np.uint8)
        self.send_req: Optional["MPI.Request"] = None
        self.pending: deque[tuple[int, Sums, np.ndarray, "MPI.Request"]] = deque()
        self.keep = keep
        self.confirmed = -1  # host rank 0: the last epoch whose DPU results were merged

    def epoch_end(self, epoch: int, dpu_share: float) -> None:
        self.send_state(epoch, dpu_share)
        self.validate_host_part(epoch, dpu_share)

    def validate_host_part(self, epoch: int, dpu_share: float) -> None:
        """Evaluate the host ranks' part (the 1 - f tail); host rank 0 posts the receive of the DPU part's sums."""
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
        if self.keep:
            self.staging = np.zeros_like(self.staging)  # (the last one is kept by its owner)
        elif self.send_req is not None:
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
        if self.send_req is not None and not self.keep:
            wait(self.send_req, self.timeout, f"{self.topo.describe(self.dpu)} to receive the model state")
        return out

    def _merge(self, item: tuple[int, Sums, np.ndarray, "MPI.Request"]) -> tuple[int, Sums]:
        epoch, host_sums, buf, _ = item
        if int(buf[0]) != epoch:
            raise RuntimeError(f"DPU validation results for epoch {int(buf[0])} arrived, expected {epoch}")
        self.confirmed = epoch
        return epoch, host_sums + buf[1:]


FINISH_POLL_S = 0.01


@dataclass
class KeptState:
    """One epoch's STATE message of this host rank, kept until host rank 0 has its DPU results."""

    share: float
    staging: np.ndarray
    send: "MPI.Request"


class FallbackValidation:
    """`--dpu-failure fallback` with DPU validation ranks (mv, hybrid): `OffloadedValidation` until a
    validation rank dies, then `LocalValidation` on the host ranks.

    The epochs whose DPU results host rank 0 lacks by then are validated again on the host ranks.
    The host ranks trained on since, so each keeps its STATE message of an epoch until rank 0 has
    that epoch's results (one slice of the state per epoch in flight, about two); they all-gather
    and unpack them into a copy of the model, as the validation ranks would have. The host ranks
    must switch at the same epoch and drop kept messages together, so at each epoch end (and while
    `finish` waits) they agree in one allreduce whether a validation rank is known dead (the
    failure watch, or a request of their own) and how far rank 0's results go.
    """

    def __init__(self, offloaded: OffloadedValidation, mv_ranks: Sequence[int], timeout: float) -> None:
        self.off, self.comm, self.mv, self.timeout = offloaded, offloaded.comm, frozenset(mv_ranks), timeout
        self.kept: dict[int, KeptState] = {}
        self.local: Optional[LocalValidation] = None
        self.done: list[tuple[int, Sums]] = []
        self.failed = False  # a request of this rank found a validation rank dead
        self.abandoned: list["MPI.Request"] = []  # sends nobody will receive (they hold their buffers)
        self.shadow: Optional[nn.Module] = None  # a copy of the model, to validate kept states in

    def epoch_end(self, epoch: int, dpu_share: float) -> None:
        if self.local is None and self.agree()[0]:
            self.fall_back(epoch)
        if self.local is not None:
            self.local.epoch_end(epoch)
            return
        self.off.send_state(epoch, dpu_share)
        self.kept[epoch] = KeptState(dpu_share, self.off.staging, cast("MPI.Request", self.off.send_req))
        self.off.validate_host_part(epoch, dpu_share)

    def ready(self) -> list[tuple[int, Sums]]:
        self.done += self.local.ready() if self.local is not None else self.poll()
        out, self.done = self.done, []
        return out

    def finish(self) -> list[tuple[int, Sums]]:
        """Wait for the DPU results still due, or validate them here if a validation rank dies meanwhile."""
        deadline = time.monotonic() + self.timeout
        while self.local is None:
            self.done += self.poll()
            lost, all_in = self.agree()
            if lost:
                self.fall_back(None)
            elif all_in:
                break
            elif time.monotonic() > deadline:
                raise PeerError(f"timed out after {self.timeout:.0f} s waiting for the validation results of the "
                                "DPU validation ranks (raise --peer-timeout if they are slow)")
            else:
                time.sleep(FINISH_POLL_S)
        return self.ready()

    def poll(self) -> list[tuple[int, Sums]]:
        """Host rank 0: the DPU results that came. A receive that reports its validation rank dead
        is noted for the next agreement and never tested again (it completed, with an error)."""
        from mpi4py import MPI

        if self.failed:
            return []
        try:
            return self.off.ready()
        except MPI.Exception as e:
            if not is_failure(e):
                raise
            self.failed = True
            return []

    def agree(self) -> tuple[bool, bool]:
        """Collective over the host ranks: (a validation rank is known dead here or on another host
        rank, host rank 0 has every DPU result due); drops the messages of epochs rank 0 has."""
        from mpi4py import MPI

        lost = self.failed or bool(self.mv & faults.dead_ranks())
        mine = np.array([lost, self.off.confirmed, len(self.off.pending)], dtype=np.int64)
        got = np.empty_like(mine)
        self.comm.Allreduce(mine, got, op=MPI.MAX)
        for epoch in [e for e in self.kept if e <= got[1]]:
            self.abandoned.append(self.kept.pop(epoch).send)  # (received: its results are in)
        self.abandoned = [r for r in self.abandoned if not _settled(r)]
        return bool(got[0]), bool(got[2] == 0)

    def fall_back(self, epoch: Optional[int]) -> None:
        """Collective: validate here what the DPU ranks did not report, and everything from now on."""
        first = self.comm.Get_rank() == 0
        if first:  # (results that came meanwhile need no second evaluation)
            self.done += self.poll()
        redo = self.comm.bcast(sorted(item[0] for item in self.off.pending) if first else None, root=0)
        host_part = {item[0]: item[1] for item in self.off.pending}
        for e in redo:
            sums = self.validate_kept(e)
            if first:
                self.done.append((e, host_part[e] + sums))
        for item in self.off.pending:
            _cancel(item[3])
        self.off.pending.clear()
        self.abandoned += [k.send for k in self.kept.values()]
        self.kept.clear()
        self.local = LocalValidation(self.off.model, self.off.val_set, self.off.batch_size, self.comm)
        faults.note({"event": "validation_fallback", "epoch": epoch, "revalidated": redo, "time": time.time()})
        if first:
            again = f"; epoch(s) {', '.join(str(e + 1) for e in redo)} validated again here from the state kept " \
                    "for them" if redo else ""
            print(f"[dpuoffload] a DPU validation rank died: the host ranks validate from here on{again} "
                  "(--dpu-failure fallback)", flush=True)

    def validate_kept(self, epoch: int) -> Sums:
        """The DPU part of `epoch`'s validation, here: the host ranks' kept messages rebuild that
        epoch's state (parameters and buffers) in a copy of the model."""
        gathered = allgather_bytes(self.comm, self.kept[epoch].staging)
        if self.shadow is None:
            self.shadow = copy.deepcopy(self.off.model)
        unpack_states(gathered, self.off.plan, state_tensors(self.shadow.state_dict()))
        n_dpu = dpu_count(len(self.off.val_set), self.kept[epoch].share)
        mine = shard_range(n_dpu, self.comm.Get_rank(), self.comm.Get_size())
        return allreduce_sums(self.comm, evaluate_sums(self.shadow, self.off.val_set, mine, self.off.batch_size))


def _settled(req: "MPI.Request") -> bool:
    """Whether a send is over: completed, or failed because its receiver died."""
    from mpi4py import MPI

    try:
        return bool(req.Test())
    except MPI.Exception as e:
        if not is_failure(e):
            raise
        return True


def _cancel(req: "MPI.Request") -> None:
    """Drop a receive that will not be answered (its sender died or stopped). One that reported
    the death already completed with it, and MPI calls it an invalid request now."""
    from mpi4py import MPI

    try:
        req.Cancel()
        req.Wait()
    except MPI.Exception as e:
        if not (is_failure(e) or e.Get_error_class() == MPI.ERR_REQUEST):
            raise


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
