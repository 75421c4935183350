"""Epoch-end validation on the host side: all on the host ranks, or handed to DPU ranks (`--mode mv`).

`LocalValidation` evaluates the whole validation set on the host ranks before the next epoch.
`OffloadedValidation` follows the published O-MV design: at the end of epoch i each host rank
stages its 1/N slice of the model state (parameters and buffers, `common.sharding`) and sends it
to its DPU validation rank, evaluates the host's part of the validation set (the `1 - f` tail,
split over host ranks; f = `--mv-dpu-fraction`), and starts epoch i+1. Host rank 0 collects the
DPU ranks' sums for epoch i when they arrive and merges them with the host part. The host only
blocks for the staging copy; the buffer is reused only after its previous send completed.
`FallbackValidation` (`--dpu-failure fallback`) moves validation to the host ranks when a DPU
validation rank dies; `SurvivingValidation` (`--recovery`) follows a host group that loses ranks.
`assemble_validation` is the one place that picks among them, for the built-in trainer
(`build_validation`) and for scripts (`JobValidation`, behind `job.validate`) alike.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional, Sequence, Sized, cast

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from dpuoffload.common.data.streams import ValidatorSetup, encode
from dpuoffload.common.errors import ConfigError, PeerError
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.plan.offload import OffloadPlan
from dpuoffload.common.plan.validation_split import auto_share, dpu_count
from dpuoffload.common.runtime.hostgroup import FixedGroup, HostGroup, seat_hosts
from dpuoffload.common.runtime.messages import (
    METRICS_FIELDS,
    STATE_HEADER,
    STATE_HEADER_BYTES,
    Tag,
)
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.runtime.waits import is_failure, wait
from dpuoffload.common.state.sharding import (
    Piece,
    allgather_bytes,
    cached_plan,
    pack_pieces,
    packed_nbytes,
    state_tensors,
    unpack_states,
)
from dpuoffload.common.train.allreduce import MpiSync
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

    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.train.loop import TrainJob
    from dpuoffload.host.recovery.survivors import SurvivorGroup



def fixed_share(f: float) -> SharePolicy:
    return lambda train_seconds: f


class AutoShare:
    """`--mv-dpu-fraction auto`: each epoch, the largest DPU share that the DPU validation ranks can
    finish within the next host epoch (`validation_split.auto_share`), from evaluation costs measured
    on host rank 0 and on DPU validation rank 0 and host rank 0's training time of this epoch.
    Collective over the host ranks (host rank 0 decides and broadcasts), so they all split alike."""

    def __init__(self, topo: Topology, model: nn.Module, val_set: Dataset, batch_size: int,
                 dpu_leader: int, mv_ranks: int, timeout: float) -> None:
        self.comm, self.n, self.mv_ranks = topo.side_comm, len(cast(Sized, val_set)), mv_ranks
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
                 mv_target: Mapping[int, int], mv_ranks: Sequence[int], timeout: float, keep: bool = False,
                 group: Optional["SurvivorGroup"] = None) -> None:
        """`mv_target`: host world rank -> its validation rank; `keep`: stage each epoch's state in a
        fresh buffer and never wait for the last send, so `FallbackValidation` can keep the message
        until the epoch's DPU results are in. `group`: the host ranks' `SurvivorGroup` under
        --recovery (`SurvivingValidation`): each epoch's slices follow the group as it is then (its
        size, and the seats its ranks fill), and every sender gets the results."""
        self.model, self.val_set, self.batch_size, self.topo = model, val_set, batch_size, topo
        self.comm: HostGroup = FixedGroup.of_side(topo) if group is None else group
        self.surviving = group is not None
        self.mv_target, self.mv_ranks, self.dpu_leader, self.timeout = mv_target, tuple(mv_ranks), mv_ranks[0], timeout
        self.numels = tuple(t.numel() for t in state_tensors(model.state_dict()))
        self.staging = np.zeros(STATE_HEADER_BYTES + packed_nbytes(state_tensors(model.state_dict()), self.pieces()),
                                dtype=np.uint8)
        self.sent = self.staging[:0]  # the last STATE message (a view of `staging`)
        self.send_req: Optional["MPI.Request"] = None
        self.notices: list[tuple[np.ndarray, "MPI.Request"]] = []
        self.pending: deque[tuple[int, Sums, np.ndarray, "MPI.Request"]] = deque()
        self.keep = keep
        self.confirmed = -1  # host rank 0: the last epoch whose DPU results were merged

    def pieces(self) -> tuple[Piece, ...]:
        """This rank's slices, in the plan for the group's size now."""
        return cached_plan(self.numels, self.comm.Get_size()).rank_pieces(self.comm.Get_rank())

    def seat_hosts(self) -> list[int]:
        """World ranks of the host ranks whose seats the group's ranks fill, in group rank order: a
        spare in a dead host rank's seat sends to that rank's validation rank."""
        return seat_hosts(self.comm, self.topo.host_ranks)

    @property
    def dpu(self) -> int:
        """The validation rank this rank's STATE message goes to."""
        if not self.surviving:
            return self.mv_target[self.topo.world_rank]
        return self.mv_target[self.seat_hosts()[self.comm.Get_rank()]]

    def epoch_end(self, epoch: int, dpu_share: float) -> None:
        self.send_state(epoch, dpu_share)
        self.validate_host_part(epoch, dpu_share)

    def validate_host_part(self, epoch: int, dpu_share: float) -> None:
        """Evaluate the host ranks' part (the 1 - f tail); host rank 0 (every rank under --recovery)
        posts the receive of the DPU part's sums."""
        n = len(cast(Sized, self.val_set))
        tail = range(dpu_count(n, dpu_share), n)
        mine = shard_range(len(tail), self.comm.Get_rank(), self.comm.Get_size())
        indices = tail[mine.start: mine.stop]
        host_sums = allreduce_sums(self.comm, evaluate_sums(self.model, self.val_set, indices, self.batch_size))
        if self.comm.Get_rank() == 0 or self.surviving:
            buf = np.zeros(len(METRICS_FIELDS), dtype=np.float64)
            req = self.topo.world.Irecv(buf, source=self.dpu_leader, tag=Tag.METRICS)
            self.pending.append((epoch, host_sums, buf, req))

    def send_state(self, epoch: int, dpu_share: float) -> None:
        """Stage this rank's slices (the only blocking part) and send them without waiting."""
        dpu, pieces = self.dpu, self.pieces()
        tensors = state_tensors(self.model.state_dict())
        need = STATE_HEADER_BYTES + packed_nbytes(tensors, pieces)
        if self.keep:
            self.staging = np.zeros(need, dtype=np.uint8)  # (the last one is kept by its owner)
        elif self.send_req is not None:
            wait(self.send_req, self.timeout, f"{self.topo.describe(dpu)} to receive the model state")
        if len(self.staging) < need:  # (the group shrank: a larger slice)
            self.staging = np.zeros(need, dtype=np.uint8)
        nbytes = pack_pieces(tensors, pieces, self.staging[STATE_HEADER_BYTES:])
        hosts = self.seat_hosts() if self.surviving else list(self.mv_target)
        targets = [self.mv_target.get(h) for h in hosts]  # (each sender's validation rank)
        self.staging[:STATE_HEADER_BYTES].view(np.int64)[:] = STATE_HEADER.pack(
            epoch=epoch, sender=self.comm.Get_rank(), nbytes=nbytes, dpu_share_ppm=round(dpu_share * 1e6),
            senders=self.comm.Get_size(), to_me=targets.count(dpu), source=self.topo.world_rank)
        self.sent = self.staging[:STATE_HEADER_BYTES + nbytes]
        self.send_req = self.topo.world.Isend(self.sent, dest=dpu, tag=Tag.STATE)
        if self.surviving and self.comm.Get_rank() == 0:
            self.send_notices(epoch, dpu_share, [v for v in self.mv_ranks if v not in targets])

    def send_notices(self, epoch: int, dpu_share: float, idle: Sequence[int]) -> None:
        """Under --recovery: tell each validation rank that no seat sends to this epoch (its host
        ranks died) that the epoch's state is out, in a header-only message."""
        for buf, req in self.notices:
            wait(req, self.timeout, "a validation rank to take the state notice")
        self.notices = []
        for v in idle:
            buf = STATE_HEADER.pack(epoch=epoch, sender=-1, nbytes=0, dpu_share_ppm=round(dpu_share * 1e6),
                                    senders=self.comm.Get_size(), to_me=0, source=self.topo.world_rank)
            self.notices.append((buf, self.topo.world.Isend(buf, dest=v, tag=Tag.STATE)))

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
        self.finish_sends()
        return out

    def finish_sends(self) -> None:
        if self.send_req is not None and not self.keep:
            wait(self.send_req, self.timeout, f"{self.topo.describe(self.dpu)} to receive the model state")
        for _, req in self.notices:
            wait(req, self.timeout, "a validation rank to take the state notice")

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

    def __init__(self, offloaded: OffloadedValidation, mv_ranks: Sequence[int], timeout: float, faults: Faults) -> None:
        """`faults`: the run's failure record (the validation ranks its watch found dead)."""
        self.off, self.mv, self.timeout = offloaded, frozenset(mv_ranks), timeout
        self.group = offloaded.comm  # (never a SurvivorGroup: `assemble_validation`)
        self.comm = self.group.comm  # (its communicator, for the pickled broadcasts and the gather)
        self.faults = faults
        self.kept: dict[int, KeptState] = {}
        self.local: Optional[LocalValidation] = None
        self.done: list[tuple[int, Sums]] = []
        self.failed = False  # a request of this rank found a validation rank dead
        self.abandoned: list["MPI.Request"] = []  # sends nobody will receive (they hold their buffers)
        self.shadow: Optional[nn.Module] = None  # a copy of the model, to validate kept states in

    @property
    def offloads(self) -> bool:
        """Whether the DPU validation ranks still take a share (the epoch record's `val_dpu_share`)."""
        return self.local is None

    def epoch_end(self, epoch: int, dpu_share: float) -> None:
        if self.local is None and self.agree()[0]:
            self.fall_back(epoch)
        if self.local is not None:
            self.local.epoch_end(epoch)
            return
        self.off.send_state(epoch, dpu_share)
        self.kept[epoch] = KeptState(dpu_share, self.off.sent, cast("MPI.Request", self.off.send_req))
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

        lost = self.failed or bool(self.mv & self.faults.dead_ranks())
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
        self.local = LocalValidation(self.off.model, self.off.val_set, self.off.batch_size, self.group)
        self.faults.note({"event": "validation_fallback", "epoch": epoch, "revalidated": redo, "time": time.time()})
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
        unpack_states(gathered, state_tensors(self.shadow.state_dict()))
        n_dpu = dpu_count(len(cast(Sized, self.off.val_set)), self.kept[epoch].share)
        mine = shard_range(n_dpu, self.comm.Get_rank(), self.comm.Get_size())
        return allreduce_sums(self.group, evaluate_sums(self.shadow, self.off.val_set, mine, self.off.batch_size))


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


class SurvivingValidation:
    """`--recovery lossy-forward`/`rollback` with DPU validation ranks (mv, hybrid): `OffloadedValidation`
    over a host group that loses ranks or seats spares.

    Each epoch's state goes from the group as it is at the epoch's end (slices planned for its
    size, each to the validation rank of its sender's seat; `dpu.validate` reads the sender count
    from the headers), and the results come back to every sender rather than to host rank 0 alone,
    which may die before they come. Which rank got them then differs (a spare seated since has
    none of its own), so at each epoch's end the host ranks agree in one allreduce (MAX) of every
    epoch's host and DPU sums, a rank that lacks one contributing zeros (sums are never negative),
    and each returns an epoch once both parts are in somewhere. The epoch records a spare needs
    came with its state (`host.recovery.spares.pack_state`).
    """

    def __init__(self, offloaded: OffloadedValidation, epochs: int, timeout: float) -> None:
        self.off, self.comm, self.epochs, self.timeout = offloaded, offloaded.comm, epochs, timeout
        self.host: dict[int, Sums] = {}   # epoch -> the host part's sums, on the ranks that validated it
        self.dpu: dict[int, Sums] = {}    # epoch -> the DPU part's sums, on the ranks they came to
        self.returned: set[int] = set()
        self.done: list[tuple[int, Sums]] = []

    def epoch_end(self, epoch: int, dpu_share: float) -> None:
        """Hand the epoch off and agree on the results so far, here: a spare may take a vacant seat
        right after the epoch's end work, and it joins the group's collectives at the next step."""
        self.off.epoch_end(epoch, dpu_share)
        self.host[epoch] = self.off.pending[-1][1]
        self.done += self.agree()[0]

    def ready(self) -> list[tuple[int, Sums]]:
        out, self.done = self.done, []
        return out

    def finish(self) -> list[tuple[int, Sums]]:
        """Collective: wait until every epoch's DPU results are in somewhere and every rank's own
        receive of them completed (the validation rank waits for its sends)."""
        deadline, out = time.monotonic() + self.timeout, self.ready()
        while True:
            done, due = self.agree()
            out += done
            if not due:
                break
            if time.monotonic() > deadline:
                raise PeerError(f"timed out after {self.timeout:.0f} s waiting for the validation results of the "
                                "DPU validation ranks (raise --peer-timeout if they are slow)")
            time.sleep(FINISH_POLL_S)
        self.off.finish_sends()
        return out

    def agree(self) -> tuple[list[tuple[int, Sums]], bool]:
        """Collective over the host group: the epochs whose results are complete now (each returned
        once), and whether results are still due anywhere."""
        from mpi4py import MPI

        self.collect()
        mine = np.zeros((self.epochs + 1, 8), dtype=np.float64)
        for epoch, sums in self.host.items():
            mine[epoch, :4] = [1, *sums]
        for epoch, sums in self.dpu.items():
            mine[epoch, 4:] = [1, *sums]
        mine[self.epochs, 0] = len(self.off.pending)
        got = np.empty_like(mine)
        self.comm.Allreduce(mine, got, op=MPI.MAX)
        complete = [e for e in range(self.epochs) if got[e, 0] and got[e, 4] and e not in self.returned]
        self.returned.update(complete)
        due = bool(got[self.epochs, 0]) or bool(np.any(got[:self.epochs, 0] > got[:self.epochs, 4]))
        return [(e, got[e, 1:4] + got[e, 5:]) for e in complete], due

    def collect(self) -> None:
        """This rank's DPU results that came (in epoch order: one sender, one tag)."""
        while self.off.pending and self.off.pending[0][3].Test():
            epoch, _, buf, _ = self.off.pending.popleft()
            if int(buf[0]) != epoch:
                raise RuntimeError(f"DPU validation results for epoch {int(buf[0])} arrived, expected {epoch}")
            self.dpu[epoch] = buf[1:].copy()


# ------------------------------------------------------------------------------------------ assembly
@dataclass(frozen=True, kw_only=True)
class ValidationSpec:
    """What epoch-end validation needs, from the built-in trainer (`build_validation`) or a script
    (`JobValidation`): `assemble_validation` picks where it runs from this alone."""

    model: nn.Module
    val_set: Dataset
    batch_size: int
    timeout: float
    faults: Faults                          # the run's failure record (`FallbackValidation` asks it)
    comm: Optional[HostGroup] = None        # the host ranks (None: one process, no MPI)
    topo: Optional[Topology] = None         # None: no DPU ranks (a script started without dpurun)
    plan: Optional[OffloadPlan] = None      # its `mv_ranks` validate (None or none: the host ranks do)
    fallback: bool = False                  # --dpu-failure fallback: a dead validation rank's work moves here
    group: Optional["SurvivorGroup"] = None  # --recovery: the host group, which loses ranks or seats spares
    epochs: int = 0                         # the run's epochs (the surviving group agrees over all of them)

    @property
    def offloaded(self) -> bool:
        """Whether DPU validation ranks take a share of every epoch's validation."""
        return self.topo is not None and self.plan is not None and bool(self.plan.mv_ranks)


def assemble_validation(spec: ValidationSpec) -> Validation:
    """Epoch-end validation for the built-in trainer and for scripts alike: on the host ranks
    (`LocalValidation`), or handed to the DPU validation ranks (`OffloadedValidation`), which a
    surviving host group (`SurvivingValidation`) or `--dpu-failure fallback` (`FallbackValidation`)
    wraps. The one place that chooses, so both drivers validate the same way."""
    hosts = spec.comm if spec.group is None else spec.group
    if not spec.offloaded:
        return LocalValidation(spec.model, spec.val_set, spec.batch_size, hosts)
    topo, plan = cast(Topology, spec.topo), cast(OffloadPlan, spec.plan)
    offloaded = OffloadedValidation(spec.model, spec.val_set, spec.batch_size, topo, plan.mv_target, plan.mv_ranks,
                                    spec.timeout, keep=spec.fallback, group=spec.group)
    if spec.group is not None:
        return SurvivingValidation(offloaded, spec.epochs, spec.timeout)
    if spec.fallback:
        return FallbackValidation(offloaded, plan.mv_ranks, spec.timeout, spec.faults)
    return offloaded


def build_validation(cfg: "RunConfig", topo: Topology, job: "TrainJob", faults: Faults,
                     group: Optional["SurvivorGroup"] = None) -> tuple[Validation, Optional[SharePolicy]]:
    """The built-in trainer's validation (`assemble_validation`) and the DPU share of each epoch's
    (None without DPU validation ranks). `group` a `SurvivorGroup` (--recovery): the state slices and
    the results follow the group as it shrinks or seats spares. The trainer makes the buffers host rank
    0's before each epoch end itself, through its `GradientSync`, and prints the results in its epoch lines."""
    spec = ValidationSpec(model=job.model, val_set=job.data.val, batch_size=cfg.val_batch_size,
                          timeout=cfg.peer_timeout, faults=faults, comm=FixedGroup.of_side(topo), topo=topo,
                          plan=job.plan, fallback=cfg.recovery_policy.survives_dpu_loss, group=group, epochs=cfg.epochs)
    validation = assemble_validation(spec)
    if not spec.offloaded:
        return validation, None
    if cfg.mv_dpu_fraction == "auto":
        return validation, AutoShare(topo, job.model, job.data.val, cfg.val_batch_size, job.plan.mv_ranks[0],
                                     len(job.plan.mv_ranks), cfg.peer_timeout)
    return validation, fixed_share(float(cfg.mv_dpu_fraction))


class JobValidation:
    """The public API's `job.validate`: the assembled validation (`assemble_validation`), driven as
    a script calls it, with the results recorded and printed on host rank 0.

    Built at the first `job.validate`; with DPU validation ranks host rank 0 then sends them the
    model and the validation set once (`ValidatorSetup`); later calls send only the state slices.
    Before each validation the model's buffers (BatchNorm statistics) are made host rank 0's on
    every host rank, as DDP does (and as the built-in trainer's `GradientSync` does, with the same
    `MpiSync`), so the state assembled from every rank's slice is one state.
    """

    def __init__(self, model: nn.Module, val_set: Dataset, batch_size: int, comm: Optional["MPI.Comm"],
                 topo: Optional[Topology], plan: Optional[OffloadPlan], share: float, timeout: float,
                 faults: Faults) -> None:
        group = None if comm is None else FixedGroup(comm, topo.side_ranks(topo.role) if topo is not None
                                                     else range(comm.Get_size()))
        spec = ValidationSpec(model=model, val_set=val_set, batch_size=batch_size, timeout=timeout, faults=faults,
                              comm=group, topo=topo, plan=plan)
        self.model, self.val_set, self.comm, self.offloaded = model, val_set, comm, spec.offloaded
        self.share = share if spec.offloaded else 0.0
        self.buffers = MpiSync(group) if group is not None and group.Get_size() > 1 else None
        self.results: dict[int, dict[str, float]] = {}
        clone = topo is not None and topo.role is Role.CLONE
        self.label, self.ranks = ("[clone]", "clone ranks") if clone else ("[dpuoffload]", "host ranks")
        if spec.offloaded and cast(Topology, topo).side_rank == 0:
            send_setup(cast(Topology, topo), cast(OffloadPlan, plan).mv_ranks,
                       ValidatorSetup(model, val_set, batch_size), timeout)
        self.inner = assemble_validation(spec)

    def check_same(self, model: nn.Module, val_set: Dataset) -> None:
        if model is not self.model or val_set is not self.val_set:
            raise ConfigError("job.validate: pass the same model and validation set objects every epoch (the DPU "
                              "validation ranks received them at the first call)")

    def epoch_end(self, epoch: int) -> None:
        if self.buffers is not None:
            self.buffers.broadcast_buffers_(self.model)
        self.inner.epoch_end(epoch, self.share)
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
