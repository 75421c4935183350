"""Surviving a dead rank (`--dpu-failure fallback`, `--recovery lossy-forward` / `rollback`) with
MPI's fault tolerance (ULFM).

Without it, Open MPI ends the whole job when any rank dies: a lost DPU would cost the run although
its host ranks can build their own batches (the same ones: augmentation is seeded per sample).
With `mpirun --with-ft ulfm` (dpurun adds it) the job goes on and MPI reports the death:

- to a rank that talks to the dead one, as an error of that very call (`ERR_PROC_FAILED`); `wait`
  turns it into `PeerLost`, and a host rank's loader falls back to loading itself
  (`host.loader.FallbackSource`);
- to everyone else through `FailureWatch`: a thread per rank keeps one receive from any source
  posted on its own duplicate of COMM_WORLD, which ULFM completes with `ERR_PROC_FAILED_PENDING`
  when any rank dies (20-60 ms on this box). Deaths the run cannot survive (a host rank without
  `--recovery`, the last host rank, a DPU rank that keeps checkpoints or trains) end the
  job in one line naming the rank, instead of leaving survivors waiting on it. A dead validation
  rank moves validation to the host ranks (`host.validation.FallbackValidation`). A host rank's death
  under `--recovery lossy-forward` is survived by the host group itself (`host.recovery.survivors`);
  under `--recovery rollback` a spare rank takes its seat (`host.recovery.spares`).
- Ranks leave without MPI_Finalize under fault tolerance (`common.runtime.fastexit`), so at the end
  a leaving rank looks like a dead one: a rank whose part is over (`Faults.ending`) ignores that.

A process's failure state (the watch, the deaths known, its failure log) is one `Faults` object,
built at start-up and passed to whatever reads it.

mpi4py quietly turns ULFM's calls into ordinary ones when the runtime does not detect failures, so
the flag is refused unless the runtime was really started with fault tolerance (`require_ft`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

import numpy as np

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.abort import PREFIX, abort_job
from dpuoffload.common.runtime.metrics import JsonlLog
from dpuoffload.common.runtime.waits import is_failure

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.plan.offload import OffloadPlan
    from dpuoffload.common.runtime.roles import Topology

FT_ENV = "OMPI_MCA_mpi_ft_enable"   # what `mpirun --with-ft ulfm` sets in every rank's environment
FALLBACK = "--dpu-failure fallback"
WATCH_POLL_S = 0.02                 # how often the watch thread tests its receive
WATCH_TAG = 1                       # on the watch's own communicator: nothing is ever sent on it
ABORT_BACKUP_S = 5.0                # a rank other than the first survivor aborts this much later


def ft_active() -> bool:
    """Whether this process runs under an MPI that reports failed ranks instead of ending the job:
    Open MPI 5 started with `--with-ft ulfm` (MPICH's ULFM support is partial: not used)."""
    from mpi4py import MPI

    return MPI.Get_library_version().startswith("Open MPI v5") and os.environ.get(FT_ENV, "").lower() in ("1", "true")


def require_ft(cfg: "RunConfig") -> None:
    """Refuse `--dpu-failure fallback` and `--recovery` where a death would still end the job (or hang it)."""
    if cfg.fault_tolerant and not ft_active():
        raise ConfigError(f"{cfg.recovery_policy.flag} needs MPI fault tolerance: Open MPI 5 started with "
                          "`mpirun --with-ft ulfm` (dpurun adds it); this run was started without it, so a dead "
                          "rank would end the job anyway")


@dataclass(frozen=True)
class Verdict:
    """What a rank's death means for the run: survived (and what changes), or the end of the job."""

    survivable: bool
    what: str     # 'it augmented for host rank 1 (...), which builds ...' / 'it validated (...)'
    by: str = ""  # the flag that makes it survivable, for the line that reports it


def verdict(dead: int, topo: "Topology", cfg: "RunConfig", plan: "OffloadPlan",
            gone: frozenset[int] = frozenset(), seated: Optional[frozenset[int]] = None) -> Verdict:
    """Pure: whether the run survives the death of world rank `dead` (`gone`: every rank known
    dead, `dead` included) under `--dpu-failure fallback` and `--recovery`. `seated`: under
    --recovery rollback, the world ranks in host rank seats (original or spare) as a host or
    spare rank knows them; None where they are not known (a DPU rank)."""
    from dpuoffload.common.plan.assign import StateAssignment

    if dead not in topo.dpu_ranks:
        return _host_verdict(dead, topo, cfg, gone, seated)
    policy = cfg.recovery_policy
    fed = plan.fed_by(dead)
    if policy.survives_host_loss and fed and all(h in gone for h in fed):
        return Verdict(True, "it fed only host ranks that died with it")
    if not policy.survives_dpu_loss:
        return Verdict(False, "a lost DPU rank ends the job without --dpu-failure fallback")
    if cfg.mode.dpu_trains:
        return Verdict(False, f"DPU ranks train in --mode {cfg.mode}: a replica is lost")
    assign = StateAssignment.of(topo)
    kept = assign.hosts_kept_by(dead)
    if kept and cfg.hands_state_off:
        whose = "it kept the checkpoint state of " + ", ".join(topo.describe(h) for h in kept)
        if not policy.survives_keeper_loss:
            return Verdict(False, whose + " (a lost keeper is survived only with checkpoints, without clones)")
        if all(k in gone for k in assign.keeper_ranks):
            return Verdict(False, whose + " (and no other keeper is left)")
        work = _work_verdict(dead, topo, cfg, plan)
        return Verdict(work.survivable, whose + " (the living keepers take it from the next checkpoint); "
                       + work.what, FALLBACK)
    return _work_verdict(dead, topo, cfg, plan)


def _work_verdict(dead: int, topo: "Topology", cfg: "RunConfig", plan: "OffloadPlan") -> Verdict:
    """What the loss of DPU rank `dead`'s offloaded work (augmentation, validation, none) means."""
    from dpuoffload.common.plan.offload import DA, IDLE

    fed = plan.fed_by(dead)
    work = plan.work.get(dead, IDLE)
    if work == DA:
        if not fed:
            return Verdict(True, "it had no host rank to feed", FALLBACK)
        return Verdict(True, "it augmented for " + ", ".join(topo.describe(h) for h in fed)
                       + (", which build" if len(fed) > 1 else ", which builds") + " its own batches from here on",
                       FALLBACK)
    if work == IDLE:
        return Verdict(True, "it was idle", FALLBACK)
    return Verdict(True, "it validated; the host ranks validate from here on", FALLBACK)


def _host_verdict(dead: int, topo: "Topology", cfg: "RunConfig", gone: frozenset[int],
                  seated: Optional[frozenset[int]] = None) -> Verdict:
    policy = cfg.recovery_policy
    if policy.fills_seats(len(topo.spare_ranks)):
        return _seats_verdict(dead, topo, gone, seated, policy.uses_spares)
    if not policy.survives_host_loss or dead not in topo.host_ranks:
        return Verdict(False, "it trained (--recovery lossy-forward or rollback survive host ranks; dpurun "
                              "--restarts N relaunches after a lost host rank)")
    left = [h for h in topo.host_ranks if h not in gone]
    if not left:
        return Verdict(False, "it was the last host rank")
    return Verdict(True, f"it trained; the {len(left)} surviving host rank(s) go on without it",
                   f"--recovery {cfg.recovery}")


def _seats_verdict(dead: int, topo: "Topology", gone: frozenset[int], seated: Optional[frozenset[int]],
                   replays: bool) -> Verdict:
    """Spares fill seats (--recovery rollback, or lossy-forward with spare ranks): a death is survived
    while a seated rank lives to hand a spare the state (a spare seated in a dead host rank's place
    counts: the original host ranks may all be gone). Without the seats (a DPU rank), only the loss of
    every host and spare rank is judged fatal here; the host and spare ranks, who know the seats, end
    the job otherwise. `replays`: rollback (a spare takes the seat at once), else lossy forward (the
    survivors go on, a spare takes the seat at the next epoch)."""
    flag = "--recovery rollback" if replays else "--recovery lossy-forward"
    left = [r for r in (seated if seated is not None else (*topo.host_ranks, *topo.spare_ranks)) if r not in gone]
    if not left:
        return Verdict(False, "it was the last host rank in a seat (no rank is left to hand a spare the state)")
    if dead in topo.spare_ranks and (seated is None or dead not in seated):
        return Verdict(True, "it was a spare rank (one that had taken a seat is replaced in turn)", flag)
    if replays:
        return Verdict(True, "it trained; a spare rank takes its seat", flag)
    return Verdict(True, "it trained; the surviving host ranks go on without it, and a spare rank takes its seat "
                         "at the next epoch if one is left", flag)


class FailureWatch:
    """A daemon thread that learns of any rank's death and either notes it or ends the job."""

    def __init__(self, topo: "Topology", cfg: "RunConfig", plan: "OffloadPlan", faults: "Faults") -> None:
        """Collective over COMM_WORLD (it duplicates it). `faults`: the run's record it belongs to
        (the deaths collectives found, the seats under --recovery rollback)."""
        from mpi4py import MPI

        self.topo, self.cfg, self.plan, self.faults = topo, cfg, plan, faults
        self.comm: "MPI.Comm" = topo.world.Dup()
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.dead: dict[int, float] = {}     # world rank -> time.time() its death was learnt here
        self.log = JsonlLog(cfg.log_dir, "failures.jsonl") if topo.world_rank == 0 else None
        self._stop = threading.Event()
        self.ending = threading.Event()     # this rank's part in the job is over (`ending`)
        self._thread = threading.Thread(target=self._run, name="dpuoffload-failure-watch", daemon=True)

    def start(self) -> "FailureWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the watch (before MPI_Finalize): its receive is cancelled by the thread itself."""
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        from mpi4py import MPI

        buf = np.zeros(1, dtype=np.int64)
        req = self.comm.Irecv(buf, source=MPI.ANY_SOURCE, tag=WATCH_TAG)
        while not self._stop.is_set():
            try:
                req.Test()
            except MPI.Exception as e:
                if not is_failure(e):
                    raise
                self._learn()
                req = self.comm.Irecv(buf, source=MPI.ANY_SOURCE, tag=WATCH_TAG)
            time.sleep(WATCH_POLL_S)
        req.Cancel()
        try:
            req.Wait()
        except MPI.Exception:  # (a death learnt at the very end: nothing to do about it now)
            pass

    def _learn(self) -> None:
        """Acknowledge the failures MPI reports (so receives from any source work again) and judge
        each new one."""
        failed = self.comm.Get_failed()
        self.comm.Ack_failed()
        ranks = failed.Translate_ranks(list(range(failed.Get_size())), self.comm.Get_group())
        new = [r for r in ranks if r not in self.dead]
        for rank in new:
            self.dead[rank] = time.time()
        for rank in new:
            self._judge(rank)

    def _first_survivor(self) -> bool:
        """Whether this rank reports deaths (and ends the job on a fatal one): the lowest living host or
        spare rank, else the lowest living rank. Why the pool first: under --recovery rollback, once
        every original host rank is dead, the DPU ranks (lower world ranks than the spares) would
        report, and a DPU rank learns of the job's end by message, later than the seated spares who
        train (a death in a run's last second once went unrecorded that way)."""
        gone = self.faults.dead_ranks()
        pool = [r for r in (*self.topo.host_ranks, *self.topo.spare_ranks) if r not in gone]
        living = pool or [r for r in range(self.topo.world.Get_size()) if r not in gone]
        return self.topo.world_rank == min(living)

    def _over(self) -> bool:
        """Whether the job is ending for this rank, so a rank that leaves is no death. No timer: no
        host rank leaves before every DPU rank and every spare standing by has said it knows
        (`host.control.end_with_dpus`, `SparePool.release`)."""
        return self.ending.is_set() or self._stop.is_set()

    def _judge(self, rank: int) -> None:
        if self._over():
            return
        v = verdict(rank, self.topo, self.cfg, self.plan, frozenset(self.dead), self.faults.seated())
        if v.survivable:
            if self._first_survivor():  # one line per death, from one rank
                by = f" ({v.by})" if v.by else ""
                print(f"{PREFIX} {self.topo.describe(rank)} died; {v.what}{by}", flush=True)
                self._record(rank, v, True)
            return
        if not self._first_survivor():
            time.sleep(ABORT_BACKUP_S)  # the first survivor ends the job; the others only if it could not
            if self.ending.is_set():    # (the job ended here meanwhile: the first survivor, past its end, let it be)
                return
        self._record(rank, v, False)
        abort_job(death_line(self.topo, rank, v), 1)

    def _record(self, rank: int, v: Verdict, survived: bool) -> None:
        if self.log is None and self.cfg.log_dir:  # world rank 0 died: the first survivor writes on
            self.log = JsonlLog(self.cfg.log_dir, "failures.jsonl", replace=False)
        if self.log is not None:
            self.log.write({"event": "rank_died", "world_rank": rank, "rank": self.topo.describe(rank),
                            "survived": survived, "what": v.what, "learnt_time": self.dead[rank]})


def death_line(topo: "Topology", rank: int, v: Verdict) -> str:
    """The one line that ends a job after a death it does not survive (`launch.supervise` reads it)."""
    return f"{topo.describe(rank)} died; {v.what}: ending the job"


class Faults:
    """What this rank knows of rank failures, and its part in reporting them: one per process.

    Built by `common.startup.start_program` (on `Started.run`) and passed to every object
    that asks which ranks are dead, records a failure or ends its part in the job; nothing reads
    it from a module global. It holds the `FailureWatch` thread (under `--dpu-failure fallback` or
    `--recovery`, from the end of start-up), the deaths collectives found first (`mark_dead`), where
    the seats are read under `--recovery rollback` (`track_seats`) and this rank's
    `failures-rank<N>.jsonl` (`note`). A process that never ran start-up (unit tests, a script
    started without dpurun) gets `Faults.inert()`: no watch, no dead ranks, notes dropped.
    """

    def __init__(self) -> None:
        self.watch: Optional[FailureWatch] = None
        self.marked: set[int] = set()
        self.seats: Optional[Callable[[], frozenset[int]]] = None
        self.rank_log: Optional[JsonlLog] = None

    @classmethod
    def inert(cls) -> "Faults":
        """The record of a process without a run: no watch ever starts, `dead_ranks` stays empty."""
        return cls()

    def start(self, topo: "Topology", cfg: "RunConfig") -> None:
        """At the end of start-up: open this rank's failure log and, under `--dpu-failure fallback`
        or `--recovery`, start the watch. Collective over COMM_WORLD (the watch duplicates it)."""
        self.rank_log = JsonlLog(cfg.log_dir, f"failures-rank{topo.world_rank}.jsonl") if cfg.log_dir else None
        if not cfg.fault_tolerant:
            return
        from dpuoffload.common.plan.offload import plan_offload

        self.watch = FailureWatch(topo, cfg, plan_offload(topo.ranks, cfg), self).start()

    def track_seats(self, seats: Callable[[], frozenset[int]]) -> None:
        """Register where this rank reads the seated world ranks (`host.recovery.spares.SparePool`), so
        its failure watch judges a death under --recovery rollback by the seats, not the start."""
        self.seats = seats

    def seated(self) -> Optional[frozenset[int]]:
        return self.seats() if self.seats is not None else None

    def ending(self) -> None:
        """This rank's part in the job is over (a host rank past `job.finish`'s barrier, a DPU rank
        told to shut down): ranks that leave from now on are leaving, not dying."""
        if self.watch is not None:
            self.watch.ending.set()

    def stop(self) -> None:
        """End the watch, if any (before the process exits)."""
        if self.watch is not None:
            self.watch.stop()

    def death_behind(self, wait_s: float = 1.0) -> Optional[str]:
        """For a rank about to end the job on an error: if a rank death the run does not survive is
        (or, within `wait_s`, becomes) known here, the line naming it, which says more than this rank's
        own error (a collective that failed because of it). None without a watch or such a death."""
        watch = self.watch
        if watch is None:
            return None
        deadline = time.monotonic() + wait_s
        while True:
            gone = frozenset(watch.dead)
            for rank in sorted(gone):
                v = verdict(rank, watch.topo, watch.cfg, watch.plan, gone, self.seated())
                if not v.survivable:
                    return death_line(watch.topo, rank, v)
            if time.monotonic() > deadline:
                return None
            time.sleep(WATCH_POLL_S)

    def dead_ranks(self) -> frozenset[int]:
        """World ranks known dead here (empty without `--dpu-failure fallback` or `--recovery`)."""
        return frozenset(self.watch.dead).union(self.marked) if self.watch is not None else frozenset()

    def mark_dead(self, ranks: Iterable[int]) -> None:
        """World ranks a collective found dead (`host.recovery.survivors`), maybe before the watch did:
        whoever asks `dead_ranks` next (who sends the DPU ranks their shutdown) must know."""
        self.marked.update(ranks)

    def note(self, record: dict[str, Any]) -> None:
        """A line of `<log-dir>/failures-rank<N>.jsonl` from this rank (an injected failure, a fallback)."""
        if self.rank_log is not None:
            self.rank_log.write(record)
