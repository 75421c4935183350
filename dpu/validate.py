"""`--mode mv`: DPU validation ranks evaluate epoch i while the host ranks train epoch i+1.

Per epoch: each validation rank receives the state slices of the host ranks paired with it,
the validation ranks all-gather the packed slices over their communicator (DeepClone, Alg. 2) and
rebuild the full state (parameters and buffers) into their own model, evaluate their shard of the
DPU part of the validation set (the first f, unshuffled), reduce (loss sum, correct, count) over
their communicator, and rank 0 sends the sums to host rank 0. Waits for the next state have no
deadline (an epoch may take hours); a dead host rank makes Open MPI end the job.

Under `--recovery lossy-forward`/`rollback` the host group that sends an epoch's state can lose
ranks or seat spares: each validation rank then takes whatever STATE messages come (as many as
their headers say, the slices planned for the sender count they carry), and rank 0 sends the
results to every sender (`host.validation.SurvivingValidation`).

Under `--dpu-failure fallback` a dead validation rank is survived: the others stop validating
(whoever learns of it first revokes their communicator, which wakes the rest from its
collectives), and the host ranks validate from then on (`host.validation.FallbackValidation`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Sized, cast

import numpy as np
from torch import nn
from torch.utils.data import Dataset

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.streams import ValidatorSetup, decode
from dpuoffload.common.errors import PeerError, PeerLost
from dpuoffload.common.faults import inject
from dpuoffload.common.faults.abort import arrive
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.plan.validation_split import dpu_count
from dpuoffload.common.runtime.messages import STATE_HEADER, STATE_HEADER_BYTES, Tag
from dpuoffload.common.runtime.metrics import PhaseTimer
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.runtime.waits import lost_peer, probe_any, wait, wait_unless_lost
from dpuoffload.common.state.sharding import (
    allgather_bytes,
    byte_buffer,
    cached_plan,
    packed_nbytes,
    state_digest,
    state_tensors,
    unpack_states,
)
from dpuoffload.common.train.evaluation import (
    eval_seconds_per_sample,
    evaluate_sums,
    shard_range,
)
from dpuoffload.dpu.control import ControlInbox

if TYPE_CHECKING:
    from mpi4py import MPI

STATE_POLL_MAX_SLEEP = 0.01


class ValidationLost(PeerLost):
    """Another DPU validation rank died (`--dpu-failure fallback`): this one stops validating."""


class Validator:
    inbox = None  # (it returns after the last epoch; the rank then idles until the end)

    def __init__(self, cfg: RunConfig, topo: Topology, faults: Faults, comm: "MPI.Comm", model: nn.Module,
                 val_set: Dataset, hosts: tuple[int, ...], epochs: Sequence[int], steps: Mapping[int, range] = {},
                 total_steps: int = 0, validators: Sequence[int] = ()) -> None:
        """`faults`: the run's failure record (which ranks are dead). `epochs`: the epochs the host
        ranks complete in this run (a resumed or stopped run skips some); `steps`: each epoch's global
        steps and `total_steps` the run's (for `--inject`); `validators`: the world ranks of every
        validation rank (for `--dpu-failure fallback`)."""
        self.cfg, self.topo, self.comm, self.model, self.val_set = cfg, topo, comm, model, val_set
        self.faults = faults
        self.epochs, self.steps, self.total_steps = tuple(epochs), steps, total_steps
        self.hosts = hosts  # world ranks of the host ranks whose slices this rank receives
        self.fallback = cfg.recovery_policy.survives_dpu_loss
        self.validators = frozenset(validators)
        self.injector = inject.for_rank(cfg.inject, topo, faults.note)
        self.tensors = state_tensors(model.state_dict())
        plan = cached_plan(tuple(t.numel() for t in self.tensors), len(topo.host_ranks))
        self.sizes = [STATE_HEADER_BYTES + packed_nbytes(self.tensors, plan.rank_pieces(k))
                      for k in range(len(topo.host_ranks))]
        self.surviving = cfg.recovery_policy.survives_host_loss   # the senders of an epoch's state can change
        self.early: dict[int, list[np.ndarray]] = {}   # (--recovery) messages of a later epoch, received
        self.sources: tuple[int, ...] = ()   # world ranks that sent the epoch's state (the results go back there)
        self.timer = PhaseTimer()

    def run(self) -> list[dict[str, Any]]:
        if self.cfg.mv_dpu_fraction == "auto" and self.comm.Get_rank() == 0:
            self.send_profile()
        records = []
        for epoch in self.epochs:
            try:
                records.append(self.run_epoch(epoch, self.check_fellows if self.fallback else None))
            except PeerLost as e:
                if not self.fallback:
                    raise
                self.stop(epoch, e)
                break
        return records

    def check_fellows(self) -> None:
        """While a state is awaited: stop if another validation rank is known dead (the host ranks
        validate from now on, so no state may come)."""
        dead = sorted(self.validators & self.faults.dead_ranks())
        if dead:
            raise ValidationLost(", ".join(self.topo.describe(r) for r in dead) + " died")

    def stop(self, epoch: int, why: Exception) -> None:
        """Stop validating (a validation rank died): revoke the validation ranks' communicator, so
        one still waiting in a collective on it wakes up and stops too."""
        from mpi4py import MPI

        try:
            self.comm.Revoke()
        except MPI.Exception:  # (revoked already by another validation rank)
            pass
        print(f"[dpuoffload] {self.topo.describe()}: validation stops at epoch {epoch + 1} ({why}); the host ranks "
              "validate from here on", flush=True)
        self.faults.note({"event": "validation_stopped", "epoch": epoch, "why": str(why), "time": time.time()})

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
            received = self.receive_surviving(epoch, on_poll) if self.surviving else self.receive(on_poll)
        if epoch is not None and epoch in self.steps:  # (None is never a key: the steps are by epoch number)
            self.injector.check_through(self.steps[epoch], self.total_steps)
        t0 = time.perf_counter()
        with self.timer.phase("gather_state"), lost_peer("the other DPU validation ranks"):
            epoch, share = self.rebuild(epoch, self.allgather(received))
        with self.timer.phase("evaluate"):
            n_dpu = dpu_count(len(cast(Sized, self.val_set)), share)  # (map-style validation sets have a length)
            mine = shard_range(n_dpu, self.comm.Get_rank(), self.comm.Get_size())
            sums = evaluate_sums(self.model, self.val_set, mine, self.cfg.val_batch_size)
        with self.timer.phase("report"), lost_peer("the other DPU validation ranks"):
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

    def receive_surviving(self, epoch: Optional[int], on_poll: Optional[Callable[[], None]] = None) -> bytes:
        """Under --recovery: this epoch's STATE messages from whichever ranks send them (the host
        group may have shrunk, or seated a spare, since the start), as many as their header's
        `to_me` says, in arrival order. A message of a later epoch (the host ranks may be an epoch
        ahead) is kept for it. If a sender dies before its message came whole the epoch cannot be
        validated, and the job ends saying so (`stalled`)."""
        from mpi4py import MPI

        got = self.early.pop(epoch, []) if epoch is not None else []
        expect = max(1, _head(got[0])["to_me"]) if got else None
        status, last = MPI.Status(), time.monotonic()
        while expect is None or len(got) < expect:
            msg = probe_any(self.topo.world, Tag.STATE, status, matched=True)  # (from any rank: see above)
            if msg is None:
                if on_poll is not None:
                    on_poll()
                self.stalled(epoch, len(got), expect, last)
                time.sleep(STATE_POLL_MAX_SLEEP)
                continue
            source, buf = status.Get_source(), byte_buffer(status.Get_count(MPI.BYTE))
            wait(msg.Irecv(buf), self.cfg.peer_timeout, f"the model state from {self.topo.describe(source)}")
            head, last = _head(buf), time.monotonic()
            if epoch is not None and head["epoch"] != epoch:
                self.early.setdefault(head["epoch"], []).append(buf)
                continue
            epoch = head["epoch"] if epoch is None else epoch
            got.append(buf)
            expect = max(1, head["to_me"])
        return b"".join(b.tobytes() for b in got)

    def stalled(self, epoch: Optional[int], n: int, expect: Optional[int], last: float) -> None:
        """End the wait if part of an epoch's state came, the rest has not for --peer-timeout, and
        a host or spare rank died: the senders send at the same moment, so a dead one's part will
        not come."""
        if not n or expect is None or time.monotonic() - last < self.cfg.peer_timeout:
            return
        dead = sorted(self.faults.dead_ranks() & {*self.topo.host_ranks, *self.topo.spare_ranks})
        if dead:
            raise PeerError(f"epoch {epoch}: {n} of the {expect} model state messages due here came, and "
                            f"{', '.join(self.topo.describe(r) for r in dead)} died: the rest cannot come, so this "
                            "epoch cannot be validated (a host rank died while handing its state over)")

    def allgather(self, mine: bytes) -> np.ndarray:
        """Every validation rank's received slices, on every validation rank (raw Allgatherv).

        A validation rank no host rank sends slices to (more validation ranks than host ranks)
        gets here at once and would wait out the epoch inside the collective, which spins: across
        machines (no --oversubscribe, so no yielding) two such ranks took 0.8 of this box's 2 cores
        from the host ranks, and `mv` ran at 2.2x `none`'s epoch. So they wait in a sleeping barrier."""
        arrive(self.comm, "the other DPU validation ranks")
        return allgather_bytes(self.comm, np.frombuffer(mine, dtype=np.uint8))

    def rebuild(self, epoch: Optional[int], gathered: np.ndarray) -> tuple[int, float]:
        """Unpack every host rank's slices into the model; return the epoch and its DPU share f."""
        heads = unpack_states(gathered, self.tensors)
        epoch = heads[0]["epoch"] if epoch is None and heads else epoch
        wrong = [h["epoch"] for h in heads if h["epoch"] != epoch]
        if wrong:
            raise PeerError(f"model state of epoch {wrong[0]} arrived while validating epoch {epoch}")
        slices = [h for h in heads if h["sender"] >= 0]
        shares, seen = {h["dpu_share_ppm"] for h in heads}, {h["sender"] for h in slices}
        senders = {h["senders"] for h in heads}
        if len(senders) != 1 or seen != set(range(min(senders))) or len(shares) != 1:
            raise PeerError(f"epoch {epoch}: state slices from host ranks {sorted(seen)} of {sorted(senders)} with "
                            f"shares {shares}; expected one slice from every sender and one share")
        self.sources = tuple(sorted(h["source"] for h in slices))
        return int(epoch), shares.pop() / 1e6  # type: ignore[arg-type]

    def report(self, epoch: int, sums: np.ndarray) -> None:
        from mpi4py import MPI

        total = np.zeros_like(sums)
        self.comm.Reduce(sums, total, op=MPI.SUM, root=0)
        if self.comm.Get_rank() != 0:
            return
        msg = np.array([epoch, *total], dtype=np.float64)
        if not self.surviving:
            req = self.topo.world.Isend(msg, dest=self.topo.host_ranks[0], tag=Tag.METRICS)
            wait(req, self.cfg.peer_timeout, "host rank 0 to receive the validation results")
            return
        # --recovery: to every rank that sent the state (host rank 0 may die before they come); a
        # sender that died since is skipped (the survivors agree on the results among themselves)
        reqs = [(r, self.topo.world.Isend(msg, dest=r, tag=Tag.METRICS)) for r in self.sources]
        for r, req in reqs:
            wait_unless_lost(req, self.cfg.peer_timeout, f"{self.topo.describe(r)} to receive the validation results")


def _head(buf: np.ndarray) -> Mapping[str, int]:
    return STATE_HEADER.unpack(buf[:STATE_HEADER_BYTES].view(np.int64).copy())


class ShutdownReceived(Exception):
    """Host rank 0 ended the job while this rank waited for a state."""


class ScriptValidation:
    """`--mode mv`/`hybrid` under a user's script: the DPU validation ranks learn the model and the
    validation set at the script's first `job.validate` (`ValidatorSetup`, from host rank 0), then
    validate whichever epochs the script hands them until `job.finish()` sends SHUTDOWN."""

    def __init__(self, cfg: RunConfig, topo: Topology, faults: Faults, comm: "MPI.Comm",
                 hosts: tuple[int, ...]) -> None:
        self.cfg, self.topo, self.faults, self.comm, self.hosts = cfg, topo, faults, comm, hosts
        self.inbox = ControlInbox(topo, any_host=False)  # (a script's run has no --recovery: from host rank 0)

    def check_shutdown(self) -> None:
        if self.inbox.shut_down():
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
        if not isinstance(setup, ValidatorSetup):
            raise PeerError(f"expected the validator set-up from world rank {source}, got {type(setup).__name__}")
        validator = Validator(self.cfg.replace(val_batch_size=setup.batch_size), self.topo, self.faults, self.comm,
                              setup.model, setup.val_set, self.hosts, ())
        records = []
        while True:
            try:
                records.append(validator.run_epoch(None, self.check_shutdown))
            except ShutdownReceived:
                return records

    def close(self) -> None:
        """Nothing pending: the shutdown message was received."""
