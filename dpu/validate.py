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
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.streams import decode
from dpuoffload.common.errors import PeerError
from dpuoffload.common.plan.validation_split import dpu_count
from dpuoffload.common.runtime.failure import arrive
from dpuoffload.common.runtime.messages import CONTROL, STATE_HEADER, STATE_HEADER_BYTES, ControlKind, Tag
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
    ends_on_shutdown = False

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

    def run_epoch(self, epoch: Optional[int], on_poll: Optional[Callable[[], None]] = None) -> dict[str, Any]:
        """Validate one epoch; `epoch` None: whichever epoch the host ranks' state is of (a user's
        script decides when it validates). `on_poll` runs while the state is awaited (it may raise
        to stop waiting)."""
        self.timer.reset()
        with self.timer.phase("wait_state"):
            received = self.receive(on_poll)
        t0 = time.perf_counter()
        with self.timer.phase("gather_state"):
            epoch, share = self.rebuild(epoch, self.allgather(received))
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

    def receive(self, on_poll: Optional[Callable[[], None]] = None) -> bytes:
        """The packed slices of every paired host rank, concatenated in host order (receives still
        pending are cancelled if `on_poll` raises)."""
        bufs, reqs = [], []
        for h in self.hosts:
            buf = byte_buffer(self.sizes[self.topo.host_ranks.index(h)])
            bufs.append(buf)
            reqs.append(self.topo.world.Irecv(buf, source=h, tag=Tag.STATE))
        try:
            for h, req in zip(self.hosts, reqs):
                wait(req, None, f"the model state from {self.topo.describe(h)}", max_sleep=STATE_POLL_MAX_SLEEP,
                     on_poll=on_poll)
        except BaseException:
            for req in reqs:
                if not req.Test():
                    req.Cancel()
                    req.Wait()
            raise
        return b"".join(b.tobytes() for b in bufs)

    def allgather(self, mine: bytes) -> np.ndarray:
        """Every validation rank's received slices, on every validation rank (raw Allgatherv).

        A validation rank no host rank sends slices to (more validation ranks than host ranks)
        gets here at once and would wait out the epoch inside the collective, which spins: across
        machines (no --oversubscribe, so no yielding) two such ranks took 0.8 of this box's 2 cores
        from the host ranks, and `mv` ran at 2.2x `none`'s epoch. So they wait in a sleeping barrier."""
        arrive(self.comm, "the other DPU validation ranks")
        counts = self.comm.allgather(len(mine))
        out = byte_buffer(sum(counts))
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
        self.comm.Allgatherv(np.frombuffer(mine, dtype=np.uint8), [out, counts, displs, _byte_type()])
        return out

    def rebuild(self, epoch: Optional[int], gathered: np.ndarray) -> tuple[int, float]:
        """Unpack every host rank's slices into the model; return the epoch and its DPU share f."""
        offset, shares, seen = 0, set(), set()
        while offset < len(gathered):
            head = STATE_HEADER.unpack(gathered[offset: offset + STATE_HEADER_BYTES].view(np.int64).copy())
            epoch = head["epoch"] if epoch is None else epoch
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
        return int(epoch), shares.pop() / 1e6  # type: ignore[arg-type]

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


class ShutdownReceived(Exception):
    """Host rank 0 ended the job while this rank waited for a state."""


class ScriptValidation:
    """`--mode mv`/`hybrid` under a user's script: the DPU validation ranks learn the model and the
    validation set at the script's first `job.validate` (`ValidatorSetup`, from host rank 0), then
    validate whichever epochs the script hands them until `job.finish()` sends SHUTDOWN."""

    ends_on_shutdown = True

    def __init__(self, cfg: RunConfig, topo: Topology, comm: "MPI.Comm", hosts: tuple[int, ...]) -> None:
        self.cfg, self.topo, self.comm, self.hosts = cfg, topo, comm, hosts
        self.shutdown = CONTROL.empty()
        self.ctl = topo.world.Irecv(self.shutdown, source=topo.host_ranks[0], tag=CONTROL.tag)

    def check_shutdown(self) -> None:
        if self.ctl.Test() and CONTROL.unpack(self.shutdown)["kind"] == ControlKind.SHUTDOWN:
            raise ShutdownReceived()

    def run(self) -> list[dict[str, Any]]:
        source = self.topo.host_ranks[0]
        try:
            # The setup, or the end of a job that never validated. (Probe, then receive: mpi4py's
            # `irecv` without a buffer would post one of a fixed size, too small for a model.)
            while not self.topo.world.Iprobe(source=source, tag=Tag.VALIDATOR):
                self.check_shutdown()
                time.sleep(STATE_POLL_MAX_SLEEP)
        except ShutdownReceived:
            return []
        data = self.topo.world.recv(source=source, tag=Tag.VALIDATOR)
        setup = decode(data, self.cfg.script)
        validator = Validator(self.cfg.replace(val_batch_size=setup.batch_size), self.topo, self.comm, setup.model,
                              setup.val_set, self.hosts, ())
        records = []
        while True:
            try:
                records.append(validator.run_epoch(None, self.check_shutdown))
            except ShutdownReceived:
                return records

    def close(self) -> None:
        """Nothing pending: the shutdown message was received."""
