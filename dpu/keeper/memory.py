"""A keeper's DPU memory (`--ckpt-mem-keep K`): the K newest checkpoints kept in memory that outlives
the job (`common.state.memstore`), so a relaunched job that restarts from them gets each host rank's
hand-off back from DPU memory (RESTORE) before anything else, without reading the disk. A run that
ends normally clears that memory; a new run forgets what it holds.

Partner copies (`--ckpt-mem-replicas R`): after keeping a checkpoint, the keeper sends its hand-offs
to the keepers that hold its copy (DPU to DPU, while the host ranks train on: they wait for nothing
of it), and a thread of each holder (`CopyReceiver`) keeps what its sources send. On a restart the
holder of a copy sends the host ranks of a keeper whose memory is gone their state.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import numpy as np

from dpuoffload.common.errors import InternalError
from dpuoffload.common.faults.abort import PREFIX
from dpuoffload.common.plan.assign import StateAssignment
from dpuoffload.common.runtime.messages import CKPT_HEADER, COPY_HEADER, StateKind, Tag
from dpuoffload.common.runtime.waits import wait, wait_all
from dpuoffload.common.state.ckptfiles import Received
from dpuoffload.common.state.memstore import (
    MemoryBudget,
    MemoryPoint,
    MemoryStore,
    Placement,
    RunLock,
    keeper_ranks,
    memory_placement,
    memory_root,
    reclaim,
)
from dpuoffload.dpu.keeper.inbox import SLICE_POLL_MAX_SLEEP

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.runtime.roles import Topology

Handoffs = Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]   # (CKPT header, small, shared) per host rank


def _warn(text: str) -> None:
    print(f"{PREFIX} warning: {text}", file=sys.stderr, flush=True)


class Keeping:
    """Puts into DPU memory under the run's budget: a step over it is not kept, said once per keeper."""

    def __init__(self, topo: "Topology", root: Any, budget: MemoryBudget) -> None:
        self.topo, self.root, self.budget, self.said = topo, root, budget, False

    def put(self, store: MemoryStore, step: int, handoffs: Handoffs, what: str) -> bool:
        incoming = sum(a.nbytes for part in handoffs for a in part)
        try:
            refused = self.budget.refusal(self.root, incoming)
        except OSError as e:
            refused = f"its use could not be counted ({type(e).__name__}: {e})"
        if refused:
            if not self.said:
                _warn(f"{self.topo.describe()}: {what} of step {step} not kept in DPU memory: {refused}; this and "
                      "later steps over the budget are kept on disk only (said once)")
                self.said = True
            return False
        try:
            store.put(step, handoffs)
        except OSError as e:
            _warn(f"{self.topo.describe()}: could not keep {what} of step {step} in DPU memory ({store.dir}: {e}); "
                  "a restart will read the disk")
            return False
        return True


class CopyReceiver:
    """A holder's thread: keeps the partner copies its source keepers send (Tag.MEM_COPY) until each
    said it is done, or `stop` (the keeper's end, after waiting for them)."""

    def __init__(self, cfg: "RunConfig", topo: "Topology", keepers: Sequence[int], sources: Sequence[int],
                 keeping: Keeping) -> None:
        self.cfg, self.topo, self.keepers, self.keeping = cfg, topo, keepers, keeping
        self.pending = {k: None for k in sources}
        self.root = memory_root(cfg.ckpt_dir or "")
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._main, name="dpuoffload-copies", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def finish(self, timeout: float) -> None:
        """Wait (bounded) for every source's last copy and its `done`, then stop."""
        self.thread.join(timeout)
        self.stopping.set()
        self.thread.join()

    def _main(self) -> None:
        try:
            heads = {k: COPY_HEADER.empty() for k in self.pending}
            reqs = {k: self.topo.world.Irecv(heads[k], source=self.keepers[k], tag=Tag.MEM_COPY) for k in heads}
            while reqs and not self.stopping.is_set():
                for k in [k for k, r in reqs.items() if r.Test()]:
                    head = COPY_HEADER.unpack(heads[k])
                    if head["done"]:
                        del reqs[k]
                        continue
                    self._keep(k, head)
                    reqs[k] = self.topo.world.Irecv(heads[k], source=self.keepers[k], tag=Tag.MEM_COPY)
                time.sleep(0.005)
            for r in reqs.values():  # (stopped: a source that never said done, e.g. a dead keeper)
                r.Cancel()
        except BaseException as e:  # noqa: BLE001 - a lost copy costs a restart's fast path, not the run
            _warn(f"{self.topo.describe()}: stopped keeping partner copies ({type(e).__name__}: {e}); a restart "
                  "after a whole node is lost will read the disk")

    def _keep(self, keeper: int, head: Mapping[str, int]) -> None:
        source, what = self.keepers[keeper], f"a partner copy from {self.topo.describe(self.keepers[keeper])}"
        parts = []
        for _ in range(head["parts"]):
            ckpt = CKPT_HEADER.empty()
            wait(self.topo.world.Irecv(ckpt, source=source, tag=Tag.MEM_COPY), self.cfg.peer_timeout, what)
            h = CKPT_HEADER.unpack(ckpt)
            small, shared = np.empty(h["small_nbytes"], np.uint8), np.empty(h["shared_nbytes"], np.uint8)
            wait_all([self.topo.world.Irecv(b, source=source, tag=Tag.MEM_COPY) for b in (small, shared)],
                     self.cfg.peer_timeout, what, max_sleep=SLICE_POLL_MAX_SLEEP)
            parts.append((ckpt, small, shared))
        store = MemoryStore(self.root, keeper, self.cfg.ckpt_mem_keep, copy=True)
        self.keeping.put(store, head["global_step"], parts, f"keeper {keeper}'s partner copy")


class DpuMemory:
    """The checkpoints this keeper keeps in DPU memory, for the host ranks `hosts`, and the partner
    copies of other keepers' it holds.

    Args:
        comm: the keepers' communicator (a keeper's rank in it names its memory store).
        note: keeps a record of a restore (the keeper's records and its JSON-lines log).
        point: the state start-up agreed to restart from (`memstore.agree_restart`), or None.
    """

    def __init__(self, cfg: "RunConfig", topo: "Topology", comm: "MPI.Comm", hosts: Sequence[int],
                 note: Callable[[dict[str, Any]], None], point: Optional[MemoryPoint]) -> None:
        self.cfg, self.topo, self.comm, self.hosts, self.note = cfg, topo, comm, hosts, note
        self.point, self.index = point, comm.Get_rank()
        self.root = memory_root(cfg.ckpt_dir) if cfg.ckpt_mem_keep and cfg.ckpt_dir else None
        on = self.root is not None  # (--ckpt-mem-keep, with --ckpt-dir)
        self.store = MemoryStore(self.root, self.index, cfg.ckpt_mem_keep) if self.root is not None else None
        self.keepers = keeper_ranks(topo) if on else ()
        self.placement = memory_placement(cfg, topo) if on else Placement(())
        self.holders = [self.keepers[k] for k in self.placement.holders[self.index]] if self.placement.holders else []
        self.keeping = Keeping(topo, self.root, MemoryBudget.of(cfg.ckpt_mem_budget)) if on else None
        self.lock: Optional[RunLock] = None
        self.sending: list["MPI.Request"] = []
        self.receiver: Optional[CopyReceiver] = None

    def restore_or_forget(self) -> None:
        """Take this run's memory (a lock, then reclaim what dead runs left), start keeping partner
        copies, then: restarting from DPU memory, send each host rank whose part this keeper serves its
        hand-off of the agreed step, as received (RESTORE); otherwise what this memory holds is stale: a
        new run forgets it."""
        if self.root is None:
            return
        self.lock = RunLock(self.root)
        runs, freed = reclaim(self.root)
        if runs:
            print(f"[dpuoffload] {self.topo.describe()}: freed {freed / 1e6:.1f} MB of DPU memory that {runs} earlier "
                  "run(s) left (no job held them, unused for over 10 min)", flush=True)
        sources = self.placement.sources(self.index) if self.placement.holders else ()
        if sources and self.cfg.checkpointing:
            if self.keeping is None:
                raise InternalError("partner copies to receive with no DPU memory kept")
            self.receiver = CopyReceiver(self.cfg, self.topo, self.keepers, sources, self.keeping)
        if self.point is None:
            self.clear()
        else:
            self.restore(self.point)
        if self.receiver is not None:
            self.receiver.start()

    def restore(self, point: MemoryPoint) -> None:
        t0 = time.perf_counter()
        reqs, sent, assign = [], 0, StateAssignment.of(self.topo)
        for k, server in enumerate(point.servers or range(len(point.keepers))):
            if server != self.index:
                continue
            store = MemoryStore(point.root, k, max(self.cfg.ckpt_mem_keep, 1), copy=k != self.index)
            for host in assign.hosts_kept_by(point.keepers[k]):
                head, small, shared = store.get(point.step, self.topo.host_ranks.index(host))
                restore = CKPT_HEADER.pack(**{**CKPT_HEADER.unpack(head), "kind": StateKind.RESTORE,
                                              "shared_parts": 1, "chunk_bytes": 0})  # (sent as one buffer)
                reqs += [self.topo.world.Isend(buf, dest=host, tag=Tag.RESTORE) for buf in (restore, small, shared)]
                sent += small.nbytes + shared.nbytes
        wait_all(reqs, self.cfg.peer_timeout, "a host rank to take its state back from DPU memory",
                 max_sleep=SLICE_POLL_MAX_SLEEP)
        self.note({"restored_step": point.step, "restore_bytes": sent, "restore_send_s": time.perf_counter() - t0,
                   "served_copies": [k for k, s in enumerate(point.servers) if s == self.index and k != self.index]})

    def remember(self, batch: Sequence[Received], missed: Sequence[int]) -> None:
        """Keep this checkpoint's hand-offs in DPU memory too (the disk copy follows), and send them to
        the holders of this keeper's partner copies. A memory that cannot take it (over the budget, RAM
        file system full) costs the fast restart, not the checkpoint: warn. Under --recovery only a
        whole one: a checkpoint a dead host rank tore (`missed`), or a notice, leaves nothing here, so a
        relaunch never restarts from it (`memstore.restart_plan` takes only a step whose every part is
        held)."""
        if self.store is None or self.keeping is None or not batch or missed:
            return
        step = batch[0].head["global_step"]
        handoffs = [(CKPT_HEADER.pack(**r.head), r.small, r.shared) for r in batch]
        self.keeping.put(self.store, step, handoffs, "this keeper's hand-offs")
        self.flush()
        for holder in self.holders:
            self.sending.append(self.topo.world.Isend(COPY_HEADER.pack(global_step=step, keeper=self.index,
                                                                       parts=len(handoffs)),
                                                      dest=holder, tag=Tag.MEM_COPY))
            self.sending += [self.topo.world.Isend(np.ascontiguousarray(a), dest=holder, tag=Tag.MEM_COPY)
                             for part in handoffs for a in part]

    def flush(self) -> None:
        """Wait for the partner copies in flight (before their buffers take the next hand-off). A holder
        that does not take them within --peer-timeout is dropped, with a warning."""
        if not self.sending:
            return
        reqs, self.sending = self.sending, []
        try:
            wait_all(reqs, self.cfg.peer_timeout, "a keeper to take a partner copy", max_sleep=SLICE_POLL_MAX_SLEEP)
        except Exception as e:  # noqa: BLE001 - the copy is a spare; the checkpoint itself went to disk
            _warn(f"{self.topo.describe()}: partner copies stopped ({type(e).__name__}: {e}); a restart after a "
                  "whole node is lost will read the disk")
            self.holders = []

    def finish(self) -> None:
        """The run is over: settle the copies in flight, tell the holders no more come, wait (bounded)
        for the copies this keeper holds, then forget everything kept (nothing to restart from)."""
        self.flush()
        done = [self.topo.world.Isend(COPY_HEADER.pack(done=1), dest=h, tag=Tag.MEM_COPY) for h in self.holders]
        if self.receiver is not None:
            self.receiver.finish(self.cfg.peer_timeout)
        try:
            wait_all(done, self.cfg.peer_timeout, "a keeper to take the end of the partner copies")
        except Exception:  # noqa: BLE001 - (a holder that is gone needs no end)
            pass
        self.clear()
        if self.lock is not None and self.root is not None:
            self.lock.release(self.root)

    def clear(self) -> None:
        """Forget every checkpoint kept here and every partner copy held (the run is over, or a new one starts)."""
        if self.store is not None and self.root is not None:
            self.store.clear()
            for k in self.placement.sources(self.index) if self.placement.holders else ():
                MemoryStore(self.root, k, 1, copy=True).clear()
