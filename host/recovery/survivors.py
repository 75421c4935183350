"""`--recovery lossy-forward`: the host ranks go on without a dead host rank, inside the job.

The recovery study's lossy forward (`../shared/papers/low-overhead-resilience-rollback-lossy-forward.txt`)
done with real lost processes, under MPI's fault tolerance (ULFM, `mpirun --with-ft ulfm`):

- `SurvivorGroup` is the host ranks' communicator. Every collective on it is followed by
  `MPI_Comm_agree` on whether it succeeded everywhere: ULFM may fail a collective on some ranks
  and complete it on others (a rank that died after contributing), and ranks that disagree about a
  step would update different weights. A rank whose call failed revokes the communicator (so no
  survivor stays blocked in it); when the agreement says "failed", the survivors `Shrink` to a new
  communicator of themselves and redo the call. Horovod and torch.distributed cannot shrink, so
  the gradients go through a plain MPI allreduce (`common.train.allreduce.MpiSync`).
- The step whose allreduce failed is finished by the survivors: the sum of their gradients over
  the survivor count (their sample-weighted mean when batches differ). The dead ranks' samples of
  that step are lost, and so are their remaining steps of the epoch, unless `--reassign`.
- `Takeover`: from the next epoch (from the next step with `--reassign`) every survivor also
  trains its slice of each dead rank's batch of the step, so each step still sees the failure-free
  run's samples, the global batch and the LR schedule stay, and every sample is seen once per epoch.
  The slices are built on the host (per-sample seeds: the same samples, augmented the same way).
- One report per failure (`LossyForward.report`): who died, the failed step, when MPI told us,
  shrink time, the failed step's time against a normal one, and the lost samples' ids, printed
  by the new host rank 0 and written to `metrics.jsonl`.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate

from dpuoffload.common.data.feeds import Batch
from dpuoffload.common.data.loaders import Sampling, epoch_order
from dpuoffload.common.data.shards import sharded_of
from dpuoffload.common.errors import InternalError, PeerLost
from dpuoffload.common.faults.abort import PREFIX
from dpuoffload.common.faults.policy import Recovery
from dpuoffload.common.runtime.waits import is_failure, wait

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.faults.watch import Faults
    from dpuoffload.common.runtime.roles import Topology
    from dpuoffload.common.state.trainstate import EpochProgress, Position
    from dpuoffload.common.train.step import StepOutcome
    from dpuoffload.host.recovery.growback import GrewBack, GrowBack
    from dpuoffload.host.recovery.spares import Regroup, SparePool


COLLECTIVE_SPIN = 0.05         # poll a collective without sleeping this long (a blocking MPI call would spin)...
COLLECTIVE_MAX_SLEEP = 0.001   # ...then sleep at most this long between polls


@dataclass(frozen=True)
class Shrink:
    """One shrink of the host group: the host ranks lost, and what it cost."""

    lost: tuple[int, ...]        # host ranks (of the job's start) that died
    before: tuple[int, ...]      # host ranks alive before it (in group rank order)
    survivors: tuple[int, ...]   # host ranks alive after it
    failed_call_s: float         # from the start of the collective that failed to the agreement on it
    shrink_s: float              # MPI_Comm_shrink
    learnt_time: float           # time.time() when the agreement said "failed"


class SurvivorGroup:
    """The host ranks' communicator, shrunk to the survivors when host ranks die.

    It offers the few `MPI.Comm` calls the host side needs (`common.runtime.hostgroup.HostGroup`:
    `Get_rank`, `Get_size`, `Allreduce`, `Bcast`, `Barrier`), each redone on the survivors after a
    death; `generation` counts the shrinks, so a caller can tell that its collective lost a member
    (and recompute what depended on the group's size). Every call is non-blocking underneath and
    waited for with a deadline (`timeout`, --peer-timeout): a host rank that hangs instead of dying
    (which ULFM cannot see) ends the job with a `PeerError` naming the wait, instead of hanging it.

    A shrink that finds every member alive (the agreement said "failed", yet no member's death was
    known to any survivor when they shrank: seen in a CI run of the rollback tests and in 2 of 180
    rollback tries of `benchmarks/faults.py`) changes nothing: the group takes the new communicator
    and redoes the call, with no recovery record and no `generation` step, only a line that it did
    (`redone` counts them); the death, once MPI knows it, fails the redone call and makes the next
    shrink, which is reported.
    """

    def __init__(self, topo: "Topology", faults: "Faults", timeout: Optional[float] = None,
                 spares: Optional["SparePool"] = None) -> None:
        """Collective over the host ranks (it duplicates their communicator). With `spares`
        (`--recovery rollback`) it is the pool's seated ranks instead, and a death calls a spare
        into the dead rank's seat (`host.recovery.spares`) rather than leaving the group smaller.
        `faults`: the run's failure record, told of the deaths a collective finds."""
        from mpi4py import MPI

        self.topo, self.faults, self.timeout, self.spares = topo, faults, timeout, spares
        self.comm: "MPI.Comm" = topo.side_comm.Dup() if spares is None else spares.active
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self._start_group = self.comm.Get_group()
        self.alive: tuple[int, ...] = tuple(range(self.comm.Get_size())) if spares is None else spares.positions()
        self.shrinks: list[Shrink] = []
        self.regroups: list[tuple[Shrink, "Regroup"]] = []  # rollback: each death's shrink and call-in, and fills
        self.generation = 0   # counts changes of the group (a caller recomputes what depended on it)
        self.redone = 0       # calls redone after a shrink that found every member alive
        self.seen: Optional[Seen] = None   # what MPI told this rank in its last call (None: it completed)

    @property
    def start_size(self) -> int:
        return len(self.topo.host_ranks)

    def seats(self) -> tuple[int, ...]:
        """The seats the group's ranks fill, in rank order (`HostGroup.seats`): the survivors', and
        under rollback the seats spares took."""
        return self.alive

    def members(self) -> list[int]:
        """World ranks of the group's ranks (`HostGroup.members`): under rollback a spare in a seat
        is itself, not the host rank whose seat it fills."""
        if self.spares is not None:
            return self.spares.seated_in_order()
        return [self.topo.host_ranks[s] for s in self.alive]

    def Get_rank(self) -> int:  # noqa: N802 - the mpi4py name, so this stands in for a communicator
        return self.comm.Get_rank()

    def Get_size(self) -> int:  # noqa: N802
        return self.comm.Get_size()

    def Allreduce(self, send: np.ndarray, out: np.ndarray, op: Optional["MPI.Op"] = None) -> None:  # noqa: N802
        """`out` = the reduction of every survivor's `send` (`send` is left untouched, so a retry
        after a shrink reduces the same contributions)."""
        from mpi4py import MPI

        self.run(lambda c: c.Iallreduce(send, out, op=MPI.SUM if op is None else op), "an allreduce")

    def Bcast(self, buf: np.ndarray, root: int = 0) -> None:  # noqa: N802
        """From rank `root` of the group as it is when the call completes (rank 0: the lowest survivor)."""
        self.run(lambda c: c.Ibcast(buf, root=root), "a broadcast")

    def Barrier(self) -> None:  # noqa: N802
        self.run(lambda c: c.Ibarrier(), "a barrier")

    def run(self, call: Callable[["MPI.Comm"], "MPI.Request"], what: str) -> None:
        """Run the non-blocking collective `call(comm)` until every survivor agrees it succeeded."""
        while True:
            t0, ok, self.seen = time.perf_counter(), 1, None
            try:
                wait(call(self.comm), self.timeout, f"{what} of the host ranks", max_sleep=COLLECTIVE_MAX_SLEEP,
                     spin=COLLECTIVE_SPIN)
            except PeerLost as e:
                ok, self.seen = 0, Seen.of("", e.__cause__ or e)
                self.comm.Revoke()  # the survivors still inside the call leave it now
            if self._agree(ok):
                return
            self._shrink(time.perf_counter() - t0, what)

    def _agree(self, ok: int) -> bool:
        """ULFM's agreement (a fault-tolerant AND) on `ok`. A death not yet acknowledged makes it
        raise on every rank alike (ULFM's uniform return), which means "failed" too."""
        from mpi4py import MPI

        while True:
            try:
                self.comm.Ack_failed()
                return bool(self.comm.Agree(ok))
            except MPI.Exception as e:
                if not is_failure(e):
                    raise
                ok, self.seen = 0, self.seen or Seen.of("the agreement: ", e)

    def _shrink(self, failed_call_s: float, what: str) -> None:
        from mpi4py import MPI

        learnt = time.time()
        if self.spares is not None:
            return self._regroup(failed_call_s, learnt, what)
        t0 = time.perf_counter()
        new = self.comm.Shrink()
        shrink_s = time.perf_counter() - t0
        new.Set_errhandler(MPI.ERRORS_RETURN)
        survivors = tuple(new.Get_group().Translate_ranks(list(range(new.Get_size())), self._start_group))
        lost = tuple(sorted(set(self.alive) - set(survivors)))
        before, self.comm, self.alive = self.alive, new, survivors
        if not lost:   # nobody had died (see the class): redo the call, no recovery to report
            return self._redone(what)
        self.shrinks.append(Shrink(lost, before, survivors, failed_call_s, shrink_s, learnt))
        self.generation += 1
        self.faults.mark_dead(self.topo.host_ranks[h] for h in lost)

    def _regroup(self, failed_call_s: float, learnt: float, what: str) -> None:
        """Rollback: the pool shrinks and, inside a step, spares take the dead ranks' seats now."""
        before = self.alive
        if self.spares is None:
            raise InternalError("a regroup of a host group without spares")
        regroup = self.spares.regroup()  # (inside a step, with the state `Rollback` offers it)
        if not regroup.changed:   # nobody had died (see the class): redo the call, no recovery to report
            self._adopt(changed=False)
            return self._redone(what)
        survivors = tuple(s for s in before if s not in regroup.lost)
        shrink = Shrink(regroup.lost, before, survivors, failed_call_s, regroup.shrink_s, learnt)
        self.shrinks.append(shrink)
        self.regroups.append((shrink, regroup))
        self._adopt()
        self.faults.mark_dead(regroup.lost_world)

    def _redone(self, what: str) -> None:
        """One line from the group's rank 0 that a call failed with every member alive and is redone:
        no recovery, yet the run should not hide an event MPI reported (nor its cost, the shrink). It
        says what MPI told rank 0; a rank whose own call met an error other than the revoke that
        spreads one (the rank where the alarm began) says which in a line of its own."""
        from mpi4py import MPI

        self.redone += 1
        rank = self.comm.Get_rank()
        seat = self.alive[rank]   # (the host rank whose seat this rank holds)
        if rank == 0:
            print(f"{PREFIX} {what} of the host ranks failed (MPI's agreement), yet the shrink found all "
                  f"{self.comm.Get_size()} host ranks alive: redone on the same ranks (host rank {seat}'s call: "
                  f"{self.seen or 'completed'})", flush=True)
        elif self.seen is not None and self.seen.error_class != MPI.ERR_REVOKED:
            print(f"{PREFIX} host rank {seat}'s call, in {what} redone after a shrink with every rank alive: "
                  f"{self.seen}", flush=True)

    def fill(self, state: Callable[[], tuple["Position", bytes]], every: bool = True) -> None:
        """At a step boundary, spares into vacant seats: under rollback the seats a death outside a
        step left vacant (`every` one), under lossy forward those its deaths left, as many as spares
        are left (`every` False)."""
        if self.spares is None:
            raise InternalError("a fill of a host group without spares")
        regroup = self.spares.fill(state, every=every)
        self.regroups.append((Shrink((), self.alive, self.alive, 0.0, 0.0, time.time()), regroup))
        self._adopt()

    def _adopt(self, changed: bool = True) -> None:
        """The pool's new seated communicator (its error handler set by the pool) is the group now
        (`changed` False: the same ranks in the same seats, so no `generation` step)."""
        if self.spares is None:
            raise InternalError("adopting the seats of a host group without spares")
        self.comm, self.alive = self.spares.active, self.spares.positions()
        self.generation += int(changed)


class Seen(NamedTuple):
    """What MPI told a rank in a collective that failed, for the line that says so: where, MPI's
    error class and its own words ('MPI_ERR_REVOKED: Communication Object Revoked')."""

    where: str          # "" (the call itself) or "the agreement: "
    error_class: int
    text: str

    @classmethod
    def of(cls, where: str, e: BaseException) -> "Seen":
        """From an `MPI.Exception` (what `PeerLost` wraps)."""
        from mpi4py import MPI

        if isinstance(e, MPI.Exception):
            return cls(where, e.Get_error_class(), e.Get_error_string())
        return cls(where, MPI.ERR_OTHER, str(e))

    def __str__(self) -> str:
        return self.where + self.text


@functools.lru_cache(maxsize=16)
def _order(dataset: Any, sampling: Sampling, rank: int, epoch: int) -> tuple[int, ...]:
    """Host rank `rank`'s sample order of `epoch` in the failure-free run (`epoch_order`: its
    `DistributedSampler`'s, or a stream's shard plan)."""
    return tuple(epoch_order(dataset, sampling, epoch, rank))


def batch_ids(dataset: Any, sampling: Sampling, epoch: int, step: int, rank: int) -> list[int]:
    """Sample ids of host rank `rank`'s batch at `step` of `epoch` (the failure-free run's)."""
    b = sampling.batch_size
    stream = sharded_of(dataset)
    key = stream if stream is not None else range(len(dataset))  # (what the order depends on, hashable: cached)
    return list(_order(key, sampling, rank, epoch)[step * b: (step + 1) * b])


class Takeover:
    """This survivor's slices of the dead host ranks' batches, step by step.

    Dead rank d's batch of step i is the one its own loader would have built (`DistributedSampler`
    of the start's host count, rank d); survivor j of s takes the j-th of s near-equal parts of it.
    """

    def __init__(self, dataset: Any, sampling: Sampling, dead: tuple[int, ...], rank: int, survivors: int) -> None:
        self.sampling, self.dead, self.rank, self.survivors = sampling, dead, rank, survivors
        self.train = sampling.seeded(dataset)  # its own: the feed's may be mid-epoch

    def mine(self, epoch: int, step: int, rank: Optional[int] = None) -> list[int]:
        """The ids survivor `rank` (default: this one) trains at (epoch, step) for the dead ranks."""
        j = self.rank if rank is None else rank
        out: list[int] = []
        for d in self.dead:
            ids = batch_ids(self.train, self.sampling, epoch, step, d)
            out += [int(i) for i in np.array_split(np.asarray(ids), self.survivors)[j]]
        return out

    def extend(self, epoch: int, step: int, batch: Batch) -> tuple[Batch, int]:
        """`batch` (this rank's own) with its slices of the dead ranks' batches appended, and the
        step's failure-free global sample count (each rank's batch of a step has the same size)."""
        x, y = batch
        total = len(y) * self.sampling.replicas
        ids = self.mine(epoch, step)
        if not ids:
            return batch, total
        self.train.set_epoch(epoch)
        xs, ys = default_collate(self.train.__getitems__(ids))
        return (torch.cat([x, xs.to(x.dtype)]), torch.cat([y, ys.to(y.dtype)])), total


@dataclass
class Failure:
    """What one shrink cost, for its report."""

    shrink: Shrink
    epoch: int
    step: int                     # step of the epoch whose collective failed (-1: at the epoch's end)
    global_step: int
    lost_ids: list[int] = field(default_factory=list)


class LossyForward:
    """The trainer's side of `--recovery lossy-forward`: notice shrinks, account for the lost
    samples, take the dead ranks' batches over, report; with spare ranks (`growth`), fill the vacant
    seats between epochs and stop taking their batches over (`host.recovery.growback`)."""

    def __init__(self, group: SurvivorGroup, dataset: Any, sampling: Sampling, steps: int, reassign: bool,
                 growth: Optional["GrowBack"] = None) -> None:
        self.group, self.dataset, self.sampling, self.steps, self.reassign = group, dataset, sampling, steps, reassign
        self.growth = growth
        self.seen = 0                      # shrinks already handled
        self.takeovers: list[tuple[tuple[int, int], Takeover]] = []  # ((epoch, step) it applies from, it)

    def takeover_at(self, epoch: int, step: int) -> Optional[Takeover]:
        """The takeover that applies at (epoch, step): the newest one begun by then (an older one
        still applies until a newer failure's takeover begins)."""
        begun = [t for start, t in self.takeovers if start <= (epoch, step)]
        return begun[-1] if begun else None

    def replayable(self, outcome: "StepOutcome", at: "Position") -> contextlib.AbstractContextManager[None]:
        """(Rollback's hook around a step's allreduce; lossy forward replays nothing.)"""
        return contextlib.nullcontext()

    def resumed(self, epoch: int, seats: Sequence["EpochProgress"]) -> None:
        """(Nothing: the survivors' records are their own.)"""

    def epoch_totals(self, epoch: int, sums: np.ndarray, losses: list[float]) -> tuple[np.ndarray, list[float]]:
        """(The survivors' own: the dead ranks' samples are lost.)"""
        return sums, losses

    def reports(self, event: "Failure | GrewBack", leader: bool) -> bool:
        """The new host rank 0 reports a failure; the rank that sent the state a growth."""
        if isinstance(event, Failure) or self.growth is None:
            return leader
        return self.growth.reports(event)

    def between_epochs(self, epoch: int, global_step: int) -> bool:
        """After epoch `epoch` is done: with spare ranks, fill the seats deaths left vacant (the group
        grows back) and take over only the batches of seats still vacant from the next epoch on;
        whether spares were called in. Without spares, lossy forward goes on without the dead ranks."""
        if self.growth is None or not self.growth.fill(epoch, global_step):
            return False
        self.joined(epoch + 1)
        return True

    def joined(self, epoch: int) -> None:
        """The group's seats changed before `epoch` (spares called in; on a called spare, the group it
        joined): from there each seated rank takes over its slice of the seats still vacant only."""
        self._take_over_from((epoch, 0))

    def _take_over_from(self, start: tuple[int, int]) -> None:
        dead = tuple(h for h in range(self.group.start_size) if h not in self.group.alive)
        takeover = Takeover(self.dataset, self.sampling, dead, self.group.Get_rank(), self.group.Get_size())
        self.takeovers = [(s, t) for s, t in self.takeovers if s < start] + [(start, takeover)]

    def batch(self, epoch: int, step: int, batch: Batch, total: Optional[int]) -> tuple[Batch, Optional[int]]:
        """The step's batch and sample total, with this rank's share of the dead ranks' batches."""
        takeover = self.takeover_at(epoch, step)
        return (batch, total) if takeover is None else takeover.extend(epoch, step, batch)

    def check(self, epoch: int, step: int, global_step: int) -> list["Failure | GrewBack"]:
        """After a step (`step` of `epoch`, -1: after the epoch's end work): the failures its
        collectives met, with their lost samples; the takeover is set up for what follows. Between
        epochs, with spares: the growths back (`between_epochs`)."""
        new = self.group.shrinks[self.seen:]
        self.seen = len(self.group.shrinks)
        out: list[Failure | GrewBack] = [self._account(s, epoch, step, global_step) for s in new]
        if new:
            self._take_over_from((epoch, step + 1) if self.reassign and 0 <= step < self.steps - 1 else (epoch + 1, 0))
        if self.growth is not None:
            out += self.growth.events(epoch + 1 if step < 0 else epoch, global_step)
        return out

    def _account(self, shrink: Shrink, epoch: int, step: int, global_step: int) -> Failure:
        """The samples the dead ranks did not train: their batch of the failed step, and without
        --reassign their steps left in the epoch (none when it failed at the epoch's end)."""
        failure = Failure(shrink, epoch, step, global_step)
        if step < 0:
            return failure
        last = step + 1 if self.reassign else self.steps
        for d in shrink.lost:
            for s in range(step, last):
                failure.lost_ids += batch_ids(self.dataset, self.sampling, epoch, s, d)
                earlier = self.takeover_at(epoch, s)
                if earlier is not None:  # and its share of the batches of ranks that died before it
                    failure.lost_ids += earlier.mine(epoch, s, shrink.before.index(d))
        return failure

    def report(self, failure: "Failure | GrewBack", topo: "Topology", step_times: list[float]) -> dict[str, Any]:
        """The failure's line (printed by the caller, the new host rank 0) and metrics record; a
        growth's (`growback.GrowBack.report`)."""
        if not isinstance(failure, Failure):
            if self.growth is None:
                raise InternalError("a growth back of a host group without spares")
            return self.growth.report(failure, topo)
        s = failure.shrink
        who = ", ".join(topo.describe(topo.host_ranks[h]) for h in s.lost)
        normal = statistics.median(step_times[:-1]) if len(step_times) > 1 else None
        where = (f"global step {failure.global_step} (epoch {failure.epoch + 1}, step {failure.step + 1})"
                 if failure.step >= 0 else f"the end of epoch {failure.epoch + 1}")
        took = f"; that step took {step_times[-1]:.3f} s (normal: {normal:.3f} s)" if normal and failure.step >= 0 \
            else ""
        left = "" if failure.step < 0 or self.reassign else " (the rest of its epoch; --reassign hands them on)"
        line = (f"{PREFIX} {who} died at {where}: lossy forward, the {len(s.survivors)} surviving host rank(s) "
                f"finished the step with their own gradients (agreed failed after {s.failed_call_s * 1e3:.0f} ms, "
                f"group shrunk in {s.shrink_s * 1e3:.1f} ms){took}; {len(failure.lost_ids)} samples lost{left}; "
                f"{self._next(failure)}")
        record = {"event": "recovery", "strategy": Recovery.LOSSY_FORWARD, "reassign": self.reassign,
                  "lost_host_ranks": list(s.lost), "survivors": list(s.survivors), "epoch": failure.epoch,
                  "step": failure.step, "global_step": failure.global_step, "failed_call_s": s.failed_call_s,
                  "shrink_s": s.shrink_s, "learnt_time": s.learnt_time,
                  "failed_step_s": step_times[-1] if step_times and failure.step >= 0 else None,
                  "normal_step_s": normal, "samples_lost": len(failure.lost_ids), "lost_ids": failure.lost_ids,
                  "reported_time": time.time()}  # (right after the failed step: the study's "next completed step")
        return {"line": line, "record": record}

    def _next(self, failure: Failure) -> str:
        """What becomes of the dead ranks' batches: taken over, and with a spare standing by (`growth`)
        until it takes the seat, before the next epoch (`between_epochs`)."""
        taken = f"they take its batches over from {self._from()}"
        if self.growth is None or not self.growth.pool.free or failure.epoch + 1 >= self.growth.epochs:
            return taken
        spare = f"a spare rank takes its seat before epoch {failure.epoch + 2}"
        return spare if self.takeovers[-1][0] >= (failure.epoch + 1, 0) else f"{taken}, until {spare}"

    def _from(self) -> str:
        epoch, step = self.takeovers[-1][0]
        return f"epoch {epoch + 1}" if step == 0 else f"step {step + 1} of epoch {epoch + 1}"
