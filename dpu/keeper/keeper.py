"""The keeper thread: receive each hand-off over its route, write it, then commit or report it."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import InternalError, PeerError
from dpuoffload.common.faults import inject
from dpuoffload.common.faults.abort import abort_job, ending_line
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.runtime.messages import StateKind
from dpuoffload.common.runtime.metrics import JsonlLog
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.state import ckptfiles
from dpuoffload.common.state.ckptfiles import Received
from dpuoffload.common.state.memstore import MemoryPoint
from dpuoffload.dpu.keeper.clone import CloneForwarder
from dpuoffload.dpu.keeper.commit import Death, KeeperReport
from dpuoffload.dpu.keeper.committer import Committer
from dpuoffload.dpu.keeper.direct import FixedRoute, ReroutedRoute
from dpuoffload.dpu.keeper.inbox import Inbox
from dpuoffload.dpu.keeper.memory import DpuMemory
from dpuoffload.dpu.keeper.recovery import SeatsRoute, SurvivingRoute
from dpuoffload.dpu.keeper.routes import Handoff, Route

if TYPE_CHECKING:
    from mpi4py import MPI


def route_for(cfg: RunConfig, topo: Topology, inbox: Inbox, idle: Callable[[], None], faults: Faults) -> Route:
    """The one route this run's hand-offs and reports take, from what the run survives."""
    policy = cfg.recovery_policy
    if policy.fills_seats(len(topo.spare_ranks)):
        return SeatsRoute(cfg, topo, inbox, faults)
    if policy.survives_host_loss:
        return SurvivingRoute(cfg, topo, inbox, faults)
    if policy.survives_keeper_loss:
        return ReroutedRoute(cfg, topo, inbox)
    return FixedRoute(cfg, topo, inbox, idle)


class Keeper:
    """A DPU rank's checkpoint and clone keeper, in a thread next to the rank's offloaded work.

    Args:
        comm: the keepers only (a keeper's rank in it names its DPU memory store and its reports).
        faults: the run's failure record (the host ranks known dead; `--inject` notes its moments).
        memory: the DPU-memory point this run restarts from (`Started.run.memory`), or None.
    """

    def __init__(self, cfg: RunConfig, topo: Topology, comm: "MPI.Comm", faults: Faults,
                 memory: Optional[MemoryPoint]) -> None:
        self.cfg, self.topo, self.comm = cfg, topo, comm
        self.hosts = StateAssignment.of(topo).hosts_kept_by(topo.world_rank)
        self.log = JsonlLog(cfg.log_dir, f"keeper-rank{topo.world_rank}.jsonl")
        self.records: list[dict[str, Any]] = []
        self.clone = CloneForwarder(cfg, topo, self.hosts, self.note)
        self.memory = DpuMemory(cfg, topo, comm, self.hosts, self.note, memory)
        self.inbox = Inbox(topo, cfg.peer_timeout, relay=self.clone.relay)
        self.route = route_for(cfg, topo, self.inbox, self.clone.poll, faults)
        self.committer = Committer(cfg, topo, self.note)
        self.hands_off = cfg.checkpointing or (cfg.clone_at is not None and bool(topo.clone_ranks))
        self.latest: Optional[list[Received]] = None   # the latest state received (its buffers reused next)
        self.reported: Optional[tuple[int, int]] = None   # the last checkpoint reported: (step, to which committer)
        self.injector = inject.for_rank(cfg.inject, topo, faults.note)  # --inject: fail on getting a state
        self.last_handoff = 0
        self.thread = threading.Thread(target=self._main, name="dpuoffload-keeper", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> list[dict[str, Any]]:
        self.thread.join()
        return self.records

    def note(self, record: dict[str, Any]) -> None:
        """Keep `record` (returned by `join`) and write it to this keeper's JSON-lines log."""
        self.records.append(record)
        self.log.write(record)

    def _main(self) -> None:
        try:
            self.restore_or_forget()
            if self.hands_off:
                self.loop()
        except BaseException as e:  # noqa: BLE001 - a dead keeper thread must not leave the job hanging
            abort_job(ending_line(e, " (in its checkpoint keeper thread)"))

    def restore_or_forget(self) -> None:
        self.memory.restore_or_forget()

    def loop(self) -> None:
        """One hand-off after another until END. Waits for the next have no deadline (checkpoints
        may be hours apart); a dead host rank makes Open MPI end the job unless it is survived."""
        while True:
            handoff = self.route.receive()
            kind = self.kind_of(handoff)
            if kind is StateKind.END:
                self.end(handoff)
                return
            real = handoff.real   # (none: a notice under --recovery)
            if kind is StateKind.PREPARE:
                self.inbox.warm_up(real)
                self.clone.pass_sizes(real)
                continue
            self.memory.flush()  # (the partner copies in flight are sent from these buffers)
            self.inbox.recycle(self.latest)
            self.latest = real
            if kind is StateKind.CHECKPOINT:
                self.check_injection(handoff.head["global_step"], real)
                self.persist(handoff)
            elif kind is StateKind.CLONE:
                self.clone.forward(real, received=time.time())

    def kind_of(self, handoff: Handoff) -> StateKind:
        """What the hand-off is; its parts must agree on it and on its step."""
        kinds = {r.head["kind"] for r in handoff.parts}
        steps = {r.head["global_step"] for r in handoff.parts}
        if len(kinds) != 1 or len(steps) != 1:
            raise PeerError(f"host ranks {self.hosts} handed off different things at once: kinds {kinds}, "
                            f"steps {steps}")
        return StateKind(kinds.pop())

    def end(self, handoff: Handoff) -> None:
        """END: no more state. The clone ranks' stand-by ends, the committer settles what is left
        and sends the summary, and the DPU memory (partner copies too) is cleared (the run is over: nothing
        to restart from)."""
        self.clone.stop_beating()
        committer = self.route.living(handoff.head)[0]
        for torn in self.route.finish(committer):
            self.committer.commit(torn.meta, torn.reports)
        self.committer.send_summary(committer, self.route.summary_to(handoff.head))
        self.memory.finish()

    def check_injection(self, step: int, real: list[Received]) -> None:
        """`--inject dpu:R@STEP` on a keeper: fail on getting the first checkpoint at or after STEP,
        before writing it (a checkpoint torn by a dead keeper). An augmentation or validation rank
        may fail earlier, at its own work."""
        per_epoch = real[0].meta.get("steps_per_epoch") if self.injector and real else None  # (None: a script's)
        if per_epoch:
            self.injector.check_through(range(self.last_handoff + 1, step + 1), per_epoch * self.cfg.epochs)
        self.last_handoff = step

    def persist(self, handoff: Handoff) -> None:
        """Write this keeper's part of the checkpoint, then commit it (the committer) or report it."""
        t0 = time.perf_counter()
        real, step = handoff.real, handoff.head["global_step"]
        self.memory.remember(real, handoff.missed)
        report = self.report_of(step, real, handoff.missed, t0)
        living = self.route.living(handoff.head)
        if self.topo.world_rank != living[0]:
            self.reported = (step, living[0])
            self.route.report(report, living[0])
            return
        self.settle_orphan()
        collected = self.route.collect(step, living[1:])
        for torn in collected.earlier:
            self.committer.commit(torn.meta, torn.reports)
        reports = [report, *collected.reports]
        self.committer.commit(real[0].meta if real else next(r.meta for r in reports if r.meta), reports)

    def report_of(self, step: int, real: list[Received], missed: list[int], t0: float) -> KeeperReport:
        """This keeper's report of checkpoint `step`: the files it wrote, or why its part is not whole."""
        meta = real[0].meta if real and self.route.reports_meta else None
        files, error, death = {}, None, None
        try:
            files = self.write(real) if real else {}
        except OSError as e:
            error = f"{self.topo.describe()}: {type(e).__name__}: {e}"
        if missed and not error:
            error = ", ".join(self.topo.describe(h) for h in missed) + " died before handing its state over"
            death = Death.HOST
        return KeeperReport(step, files, error, time.perf_counter() - t0, self.comm.Get_rank(), meta, death)

    def write(self, batch: list[Received]) -> dict[str, Any]:
        """Each host rank's shard and local file (temp + fsync + rename): name -> size and checksum."""
        meta = batch[0].meta
        if self.cfg.ckpt_dir is None:
            raise InternalError("a checkpoint to write without --ckpt-dir")
        directory = ckptfiles.step_dir(self.cfg.ckpt_dir, batch[0].head["global_step"])
        directory.mkdir(parents=True, exist_ok=True)
        plan = ckptfiles.plan_for(meta)
        files = {}
        for r in batch:
            k = r.head["sender"]
            blob = ckptfiles.shard_blob(meta["catalog"], plan, k, r.shared, {"sender": str(k)})
            files[ckptfiles.shard_name(k)] = ckptfiles.write_atomic(directory / ckptfiles.shard_name(k), blob)
            files[ckptfiles.local_name(k)] = ckptfiles.write_atomic(directory / ckptfiles.local_name(k), r.local)
        return files

    def settle_orphan(self) -> None:
        """On becoming the committer (a dead keeper survived): the checkpoint this keeper last
        reported to a committer that died before committing it is torn (`Committer.settle_orphan`)."""
        if self.reported is None or self.reported[1] == self.topo.world_rank:
            return
        step, dead = self.reported
        self.reported = None
        self.committer.settle_orphan(step, dead)
