"""The DPU program under a user's training script (`dpurun ... train.py`): serve the host's loaders.

The script on the host ranks calls the public API (`import dpuoffload`); this rank does what it is
told over the loader stream protocol (`common.data.streams`): for every loader a fed host rank
opens, it builds that host's own `RankLoader` over the host's data set and produces its batches
per the host's plans, each stream through its own ring of `--da-buffers` send buffers. Streams are
served round-robin and a stream whose ring is full (its host is busy computing) is skipped, so one
slow host never stalls another's batches. The loop sleeps with a back-off when no stream can move,
and ends when host rank 0 sends SHUTDOWN (`job.finish()`, after every host closed its loaders).

There is no deadline on a full ring: the host decides when it wants its next batch (a user's own
validation may take an hour). A dead host rank ends the job through mpirun.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, Iterator, Optional

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.loaders import RankLoader, probe_layout
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.data.streams import STOP, OpenLoader, Plan, decode, stream_tag
from dpuoffload.common.errors import ConfigError, PeerError
from dpuoffload.common.runtime.messages import CONTROL, ControlKind, Tag
from dpuoffload.common.runtime.metrics import PhaseTimer
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.dpu.augment import SendRing, transform_name

if TYPE_CHECKING:
    from mpi4py import MPI

IDLE_MAX_SLEEP = 0.002   # nothing to do: poll for the host's receives and messages at least this often


class Stream:
    """One host rank's loader on this DPU rank: its sampler, its send ring, where its plan stands."""

    def __init__(self, world: "MPI.Comm", host: int, host_label: str, opened: OpenLoader, buffers: int,
                 timer: PhaseTimer) -> None:
        self.world, self.host, self.host_label, self.timer = world, host, host_label, timer
        train = PerSampleSeeded(opened.dataset, opened.sampling.seed)
        self.loader = RankLoader(opened.sampling, train, collate=False)
        self.layout = probe_layout(train, opened.sampling)
        self.ring = SendRing(world, self.layout, buffers, None, tag=stream_tag(opened.loader))
        self.transform = transform_name(opened.dataset)
        self.steps = len(self.loader)
        self.epoch, self.step = STOP, 0
        self.batches: Optional[Iterator[list]] = None
        self.sent = 0

    @property
    def active(self) -> bool:
        return self.epoch != STOP and self.steps > 0

    def replan(self, plan: Plan) -> None:
        """Start `plan`: the marker first (the host discards what came before it), then its batches."""
        if plan.epoch != STOP and not 0 <= plan.start < max(self.steps, 1):
            raise PeerError(f"{self.host_label} asked for step {plan.start} of an epoch of {self.steps} steps")
        self.epoch, self.step, self.batches = plan.epoch, plan.start, None
        slot, buf = self.ring.acquire()  # the host is receiving: it waits for this marker
        self.ring.send(slot, self.layout.pack_marker(buf, plan.seq), self.host)

    def produce(self) -> None:
        """Augment and send the next batch (the caller checked `ring.ready()`), then advance."""
        if self.batches is None:
            self.loader.set_epoch(self.epoch)
            self.batches = self.loader.batches(self.step)
        with self.timer.phase("augment"):
            items = next(self.batches)
        with self.timer.phase("send"):
            slot, buf = self.ring.acquire()
            try:
                nbytes = self.layout.pack_items(buf, self.epoch, self.step, items)
            except ValueError as e:
                raise ConfigError(f"--mode da needs every training sample to have the same shape and dtype, but "
                                  f"the training transform {self.transform} does not ({e}); end it with a "
                                  "fixed-size step such as RandomResizedCrop(size) or Resize(size) + "
                                  "CenterCrop(size)") from None
            self.ring.send(slot, nbytes, self.host)
        self.sent += 1
        self.step += 1
        if self.step == self.steps:  # run on into the next epoch: the host most likely wants it next
            self.epoch, self.step, self.batches = self.epoch + 1, 0, None


class LoaderService:
    """This DPU rank's work under a user's script: the loaders of the host ranks it feeds."""

    def __init__(self, cfg: RunConfig, topo: Topology, hosts: tuple[int, ...]) -> None:
        self.cfg, self.topo, self.hosts = cfg, topo, hosts
        self.streams: dict[tuple[int, int], Stream] = {}
        self.timer = PhaseTimer()
        self.turn = 0
        if cfg.script is not None:  # the script's own modules import as they do on the host
            folder = os.path.dirname(os.path.abspath(cfg.script))
            if folder not in sys.path:
                sys.path.insert(0, folder)

    def run(self) -> list[dict[str, Any]]:
        """Serve until SHUTDOWN; one record with the batches sent and the phase totals."""
        t0 = time.perf_counter()
        shutdown = CONTROL.empty()
        ctl = self.topo.world.Irecv(shutdown, source=self.topo.host_ranks[0], tag=CONTROL.tag)
        sleep = 0.0
        while True:
            moved = self.poll_messages()
            if ctl.Test():
                if CONTROL.unpack(shutdown)["kind"] == ControlKind.SHUTDOWN:
                    break
                ctl = self.topo.world.Irecv(shutdown, source=self.topo.host_ranks[0], tag=CONTROL.tag)
            moved = self.produce_round() or moved
            if moved:
                sleep = 0.0
                continue
            with self.timer.phase("idle"):
                time.sleep(sleep)
            sleep = min(max(sleep * 2, 1e-4), IDLE_MAX_SLEEP)
        return [{"epoch": -1, "epoch_time": time.perf_counter() - t0, "loaders": len(self.streams),
                 "batches": sum(s.sent for s in self.streams.values()), "phases": dict(self.timer.totals)}]

    def poll_messages(self) -> bool:
        """Handle every loader message that has arrived; whether there was one."""
        from mpi4py import MPI

        status, got = MPI.Status(), False
        while self.topo.world.Iprobe(source=MPI.ANY_SOURCE, tag=Tag.LOADER, status=status):
            host = status.Get_source()
            data = self.topo.world.recv(source=host, tag=Tag.LOADER)
            self.handle(host, decode(data, self.cfg.script))
            got = True
        return got

    def handle(self, host: int, message: Any) -> None:
        if host not in self.hosts:
            raise PeerError(f"{self.topo.describe(host)} sent a loader message to {self.topo.describe()}, "
                            "which does not feed it: host and DPU programs disagree on the offload plan")
        if isinstance(message, OpenLoader):
            self.streams[(host, message.loader)] = Stream(self.topo.world, host, self.topo.describe(host), message,
                                                          self.cfg.da_buffers, self.timer)
        elif isinstance(message, Plan):
            stream = self.streams.get((host, message.loader))
            if stream is None:
                raise PeerError(f"{self.topo.describe(host)} planned loader {message.loader}, which it never opened")
            stream.replan(message)
        else:
            raise PeerError(f"unknown loader message {type(message).__name__} from {self.topo.describe(host)}")

    def produce_round(self) -> bool:
        """One batch for each active stream whose ring has a free buffer, starting where the last
        round stopped (fairness between the hosts of a fan-out); whether any batch was made."""
        streams = [s for s in self.streams.values() if s.active]
        moved = False
        for i in range(len(streams)):
            stream = streams[(self.turn + i) % len(streams)]
            if stream.ring.ready():
                stream.produce()
                moved = True
        self.turn += 1
        return moved

    def close(self) -> None:
        for stream in self.streams.values():
            stream.ring.drain()
