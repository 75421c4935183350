"""The baselines of the clone benchmark: the same job, with the state reaching the clones another way.

    DPUBENCH_CLONE=file:DIR python benchmarks/clone_host.py launch [dpurun flags] -- <training flags>
    DPUBENCH_CLONE=p2p      python benchmarks/clone_host.py launch [dpurun flags] -- <training flags>

`launch` is `dpurun` (same placement, pinning and throttling) with the host program replaced by
this module, which is the project's host program (`dpuoffload.host.main`) with two changes, made
through its extension points (`host.extensions`: `hooks_factory` on the host ranks, `adopt` on
the clone ranks):

- file (DeepClone's baseline through the file system): at the clone step host rank 0
  `torch.save`s the full state (model, optimizer, scheduler, position) to DIR (durably, like ours:
  `common.files.write_atomic`); the clone ranks poll for the file, `torch.load` it and continue.
- p2p: host rank k sends its whole state (not a 1/N slice) straight to clone rank k, in ours'
  message format, staged like ours; clone rank k receives it and rebuilds as ours does.

The DPU program is unchanged: its keeper gets no clone hand-off, only the END message. Every
variant logs the same records as ours (hand-off `blocked_s`/`wall_time`, clone `clone_start`), so
`benchmarks/clone.py` reads all three alike; the clone's `state_sha256` must agree across them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpuoffload.common.errors import ConfigError  # noqa: E402
from dpuoffload.common.files import write_atomic  # noqa: E402
from dpuoffload.common.runtime.hostgroup import FixedGroup  # noqa: E402
from dpuoffload.common.runtime.messages import StateKind, Tag  # noqa: E402
from dpuoffload.common.runtime.roles import Topology  # noqa: E402
from dpuoffload.common.state.ckptfiles import Received  # noqa: E402
from dpuoffload.common.state.trainstate import Position  # noqa: E402
from dpuoffload.host.checkpoint import StateHandoff  # noqa: E402
from dpuoffload.host.clone import CLONE_POLL_MAX_SLEEP, adopt, receive_handoff, state_sha256  # noqa: E402
from dpuoffload.host.extensions import HooksFactory, HostExtensions, build_hooks  # noqa: E402

ENV = "DPUBENCH_CLONE"


def clone_file(directory: str, step: int) -> Path:
    return Path(directory) / f"clone-step-{step:09d}.pt"


class FileHandoff(StateHandoff):
    """At the clone step, host rank 0 saves the full state with `torch.save`; checkpoints as ours."""

    directory = ""  # set by `file_hooks` right after construction

    def send(self, kind: StateKind, pos: Position, progress: Any) -> None:
        if kind is not StateKind.CLONE:
            return super().send(kind, pos, progress)
        t0 = time.perf_counter()
        if self.rank == 0:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict(), "position": [pos.epoch, pos.step, pos.global_step]}
            write_atomic(clone_file(self.directory, pos.global_step), lambda f: torch.save(state, f))
        blocked = time.perf_counter() - t0
        self.blocked.append(blocked)
        self.log.write({"kind": "clone", "how": "file", "global_step": pos.global_step, "blocked_s": blocked,
                        "wall_time": time.time()})


class PointToPointHandoff(StateHandoff):
    """At the clone step, host rank k sends its whole state to clone rank k (ours' format, one sender)."""

    def _prepare(self) -> None:
        """Stage the whole state, and send PREPARE to the clone rank instead of the keeper (its
        receive buffer is warm too, as ours is: the methods differ only in the path of the bytes)."""
        clones = self.topo.clone_ranks
        if len(clones) > self.size:
            raise ConfigError(f"p2p clone baseline: {len(clones)} clone ranks but {self.size} host ranks to send")
        if self.rank >= len(clones):
            self.prepared = True
            return
        with self.alone(clones[self.rank]):
            super()._prepare()

    def send(self, kind: StateKind, pos: Position, progress: Any) -> None:
        if kind is not StateKind.CLONE:
            return super().send(kind, pos, progress)
        clones = self.topo.clone_ranks
        if self.rank >= len(clones):
            return
        with self.alone(clones[self.rank]):  # one sender, whole tensors, to the clone
            super().send(kind, pos, progress)

    @contextlib.contextmanager
    def alone(self, clone: int) -> Iterator[None]:
        """For the block, this rank is the only sender (its own communicator: the whole state is its
        slice) and `clone` is its keeper."""
        from mpi4py import MPI

        saved = self.comm, self.keeper
        self.comm, self.keeper = FixedGroup(MPI.COMM_SELF, [self.topo.host_ranks[0]]), clone  # (as before)
        try:
            yield
        finally:
            self.comm, self.keeper = saved


def receive_direct(topo: Topology, timeout: float) -> list[Received]:
    """p2p: this clone rank's whole state, straight from host rank k = its clone rank number."""
    source = topo.host_ranks[topo.side_rank]  # a host rank: it sends no heartbeats while training
    return [receive_handoff(topo, source, Tag.CKPT, 0, timeout, f"the state of {topo.describe(source)}",
                            heartbeats=False)]


def file_hooks(directory: str) -> HooksFactory:
    """file: the real program's hooks factory, building a `FileHandoff` that saves into `directory`."""
    def build(cfg: Any, topo: Topology, trainer: Any) -> Any:
        hooks = build_hooks(cfg, topo, trainer, handoff=FileHandoff)
        if hooks is not None:
            hooks.directory = directory
        return hooks
    return build


def adopt_file(directory: str, trainer: Any, topo: Topology, original: Any, clone: Any) -> dict[str, Any]:
    """file: poll for rank 0's file (as often as ours polls for the state), load it, continue."""
    t0 = time.perf_counter()
    path = clone_file(directory, original.clone_at)
    while not path.exists():
        time.sleep(CLONE_POLL_MAX_SLEEP)
    received = time.perf_counter()
    state = torch.load(path, weights_only=True)
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    pos = Position(*state["position"])
    trainer.resume_at(pos, None)
    ready = time.time()
    return {"event": "clone_start", "global_step": pos.global_step, "epoch": pos.epoch, "step": pos.step,
            "standby_s": received - t0, "rebuild_s": time.perf_counter() - received, "ready_time": ready,
            "state_sha256": state_sha256(trainer.model, trainer.optimizer), "overrides": list(original.clone_override)}


def serve(training: Sequence[str]) -> None:
    """Run as a host or clone rank: the project's host program with the baseline plugged in."""
    from dpuoffload.host import main as host

    how, _, directory = os.environ.get(ENV, "").partition(":")
    if how == "file" and directory:
        extensions = HostExtensions(hooks_factory=file_hooks(directory),
                                    adopt=functools.partial(adopt_file, directory))
    elif how == "p2p":
        extensions = HostExtensions(hooks_factory=functools.partial(build_hooks, handoff=PointToPointHandoff),
                                    adopt=functools.partial(adopt, receive=receive_direct))
    else:
        sys.exit(f"clone_host: set {ENV}=file:DIR or {ENV}=p2p (got {os.environ.get(ENV)!r})")
    host.run(list(training), extensions)


def launch(argv: Sequence[str]) -> int:
    """dpurun, with this module as the host (and clone) program."""
    from dpuoffload.launch import cli, command

    command.HOST_MODULE = "benchmarks.clone_host"
    return cli.main(list(argv))


if __name__ == "__main__":
    if sys.argv[1:2] == ["launch"]:
        sys.exit(launch(sys.argv[2:]))
    serve(sys.argv[1:])
