"""A keeper's DPU memory (`--ckpt-mem-keep K`): the K newest checkpoints kept in memory that outlives
the job (`common.state.memstore`), so a relaunched job that restarts from them gets each host rank's
hand-off back from its keeper (RESTORE) before anything else, without reading the disk. A run that
ends normally clears that memory; a new run forgets what it holds.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from dpuoffload.common.faults.abort import PREFIX
from dpuoffload.common.runtime.messages import CKPT_HEADER, StateKind, Tag
from dpuoffload.common.runtime.waits import wait_all
from dpuoffload.common.state.ckptfiles import Received
from dpuoffload.common.state.memstore import MemoryPoint, MemoryStore, memory_root
from dpuoffload.dpu.keeper.inbox import SLICE_POLL_MAX_SLEEP

if TYPE_CHECKING:
    from mpi4py import MPI

    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.runtime.roles import Topology


class DpuMemory:
    """The checkpoints this keeper keeps in DPU memory, for the host ranks `hosts`.

    Args:
        comm: the keepers' communicator (a keeper's rank in it names its memory store).
        note: keeps a record of a restore (the keeper's records and its JSON-lines log).
        point: the state start-up agreed to restart from (`memstore.agree_restart`), or None.
    """

    def __init__(self, cfg: "RunConfig", topo: "Topology", comm: "MPI.Comm", hosts: Sequence[int],
                 note: Callable[[dict[str, Any]], None], point: Optional[MemoryPoint]) -> None:
        self.cfg, self.topo, self.comm, self.hosts, self.note = cfg, topo, comm, hosts, note
        self.point = point
        self.store = MemoryStore(memory_root(cfg.ckpt_dir), comm.Get_rank(), cfg.ckpt_mem_keep) \
            if cfg.ckpt_mem_keep and cfg.ckpt_dir else None

    def restore_or_forget(self) -> None:
        """Restarting from DPU memory: send each kept host rank its hand-off of the agreed step, as
        received (RESTORE). Otherwise what this DPU's memory holds is stale: a new run forgets it."""
        point = self.point
        if point is None:
            self.clear()
            return
        store = MemoryStore(point.root, self.comm.Get_rank(), max(self.cfg.ckpt_mem_keep, 1))
        t0 = time.perf_counter()
        reqs, sent = [], 0
        for host in self.hosts:
            head, small, shared = store.get(point.step, self.topo.host_ranks.index(host))
            restore = CKPT_HEADER.pack(**{**CKPT_HEADER.unpack(head), "kind": StateKind.RESTORE, "shared_parts": 1})
            reqs += [self.topo.world.Isend(buf, dest=host, tag=Tag.RESTORE) for buf in (restore, small, shared)]
            sent += small.nbytes + shared.nbytes
        wait_all(reqs, self.cfg.peer_timeout, "a host rank to take its state back from DPU memory",
                 max_sleep=SLICE_POLL_MAX_SLEEP)
        self.note({"restored_step": point.step, "restore_bytes": sent, "restore_send_s": time.perf_counter() - t0})

    def remember(self, batch: Sequence[Received], missed: Sequence[int]) -> None:
        """Keep this checkpoint's hand-offs in DPU memory too (the disk copy follows). A memory that
        cannot take it (RAM file system full) costs the fast restart, not the checkpoint: warn.
        Under --recovery only a whole one: a checkpoint a dead host rank tore (`missed`), or a
        notice, leaves nothing here, so a relaunch never restarts from it (`memstore.restart_step`
        takes only a step every keeper holds)."""
        if self.store is None or not batch or missed:
            return
        step = batch[0].head["global_step"]
        try:
            self.store.put(step, [(CKPT_HEADER.pack(**r.head), r.small, r.shared) for r in batch])
        except OSError as e:
            print(f"{PREFIX} warning: {self.topo.describe()}: could not keep step {step} in DPU memory "
                  f"({self.store.dir}: {e}); a restart will read the disk", file=sys.stderr, flush=True)

    def clear(self) -> None:
        """Forget every checkpoint kept here (the run is over, or a new one starts)."""
        if self.store is not None:
            self.store.clear()
