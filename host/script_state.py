"""A script's training state through the public API: `job.checkpoint` and `job.restore`.

`Job` (`host.library`) hands out loaders, validation and the end of the run; what happens to the
state of a user's own loop is this module's one concern: which hand-offs a `job.checkpoint` call
makes (a checkpoint under `--ckpt-dir`, the clone ranks' state at `--clone-at`), the position it
names and its checks, and `job.restore` from `--resume` or, on a clone rank, from the state the
keepers forward, loaded by the one state loader (`common.state.load.load_state`).

Calls, per host rank, in the script's order: `checkpoint(...)` after an optimizer step, any number
of times with a growing global step (collective over the host ranks: each sends its slice);
`restore(...)` before training (not collective); `finish()` once, from `job.finish`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, cast

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime.messages import StateKind
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.state import ckptfiles
from dpuoffload.common.state.load import Live, Reader, StateSource, load_state
from dpuoffload.common.state.meta import Slicing
from dpuoffload.common.state.resume import nothing_kept, starting_line
from dpuoffload.common.state.trainstate import EpochProgress, Position
from dpuoffload.host.checkpoint import StateHandoff


@dataclass(frozen=True)
class Restored:
    """Where a resumed script starts (`job.restore`): `step` steps of `epoch` were done when the
    checkpoint was taken, `global_step` is the count given to `job.checkpoint`, `extra` its extra=."""

    epoch: int
    step: int
    global_step: int
    extra: dict[str, object] = field(default_factory=dict)
    path: Optional[Path] = None


class ScriptState:
    """One host (or clone) rank's checkpoints and restores from a user's script.

    `handoff`: where the state goes (None: nothing is written: no `--ckpt-dir` and no clone to
    serve, or no dpurun); `topo`, `cfg`: None for a job started without dpurun.
    """

    def __init__(self, rank: int, size: int, topo: Optional[Topology], cfg: Optional[RunConfig],
                 handoff: Optional[StateHandoff]) -> None:
        self.rank, self.size, self.topo, self.cfg, self.handoff = rank, size, topo, cfg, handoff
        self.is_clone = topo is not None and topo.role is Role.CLONE
        self.cloned = False      # host ranks: the --clone-at state was handed off; clone ranks: received
        self.last_global_step = -1

    def checkpoint(self, live: Live, position: Position, extra: Optional[dict[str, object]]) -> Optional[str]:
        """Hand the state off as the kinds due at `position` need. Returns why no checkpoint is
        written (a warning for the script, once), or None."""
        extra = _json_data(extra)
        kinds = self.kinds_due(position.global_step)
        unwritten = None
        if StateKind.CHECKPOINT not in kinds:
            unwritten = "job.checkpoint: no checkpoint is written: " + (
                "a clone rank does not checkpoint" if self.is_clone else
                "add --ckpt-dir DIR to dpurun's flags" if self.topo is not None else
                "start the script with dpurun -- --ckpt-dir DIR SCRIPT")
        if kinds and self.handoff is not None:
            self.handoff.bind(live.model, live.optimizer, live.scheduler)
            for kind in sorted(kinds):
                self.handoff.send(kind, position, EpochProgress(), extra or {})
            self.handoff.sent_out()  # the bytes must be out of the weights before the script's next step
        self.cloned = self.cloned or StateKind.CLONE in kinds
        self.last_global_step = position.global_step
        return unwritten

    def kinds_due(self, global_step: int) -> set[StateKind]:
        """CHECKPOINT with --ckpt-dir; CLONE at --clone-at (host ranks: the clone ranks wait for it)."""
        kinds: set[StateKind] = set()
        if self.cfg is None or self.is_clone:
            return kinds
        if self.cfg.checkpointing:
            kinds.add(StateKind.CHECKPOINT)
        clone_at = self.cfg.clone_at
        if clone_at is not None and not self.cloned:
            if global_step == clone_at:
                kinds.add(StateKind.CLONE)
            elif global_step > clone_at:
                raise ConfigError(f"--clone-at {clone_at}: job.checkpoint was called at global step {global_step} "
                                  f"without passing step {clone_at} (the last was {self.last_global_step}); "
                                  "call it at that step, or choose a step the script checkpoints at")
        return kinds

    def position(self, epoch: int, step: int, global_step: Optional[int], steps_per_epoch: Optional[int]) -> Position:
        """The position a `job.checkpoint` call names; `steps_per_epoch`: the first loader's length
        (the default global step counts by it), None without a loader."""
        for name, value in (("epoch", epoch), ("step", step), ("global_step", global_step)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"job.checkpoint: {name} must be an integer >= 0, got {value!r}")
        if global_step is None:
            if steps_per_epoch is None:
                raise ConfigError("job.checkpoint: pass global_step= (no loader was made to count steps by)")
            global_step = epoch * steps_per_epoch + step
        if global_step <= self.last_global_step:
            raise ConfigError(f"job.checkpoint: global_step {global_step} is not after the last checkpoint's "
                              f"({self.last_global_step}); it names the checkpoint and must grow")
        return Position(epoch, step, global_step)

    def restore(self, live: Live) -> Optional[Restored]:
        """`--resume latest|auto|DIR` loaded into `live` (a clone rank: the forwarded state); None without it
        (or under auto with nothing kept)."""
        if self.is_clone:
            return self.adopt(live)
        if self.cfg is None or self.cfg.resume is None:
            return None
        if nothing_kept(self.cfg, None):
            if self.rank == 0:
                print(starting_line(self.cfg), flush=True)
            return None
        skipped: list[str] = []
        path = ckptfiles.resolve(self.cfg.resume, self.cfg.ckpt_dir, skipped)
        source = StateSource.of_checkpoint(ckptfiles.load(path))
        restored = self.load(live, source, path)
        if self.rank == 0:
            for note in skipped:
                print(f"[dpuoffload] warning: --resume {self.cfg.resume} {note}", flush=True)
            writers = source.meta.writers
            how = "exactly" if writers == self.size else f"written by {writers} host rank(s)"
            print(f"[dpuoffload] resuming from {path} ({how}): epoch {restored.epoch}, step {restored.step} "
                  f"(global step {restored.global_step})", flush=True)
        return restored

    def adopt(self, live: Live) -> Restored:
        """A clone rank: stand by for the state the host ranks hand off at --clone-at (forwarded by
        the DPU keepers, never via disk), gather every slice over the clone group, load it."""
        from dpuoffload.host.clone import assemble, receive_forwarded

        topo, cfg = cast(Topology, self.topo), cast(RunConfig, self.cfg)
        if self.rank == 0:
            print(f"[clone] {self.size} clone rank(s) standing by for the state of step {cfg.clone_at}", flush=True)
        t0 = time.perf_counter()
        restored = self.load(live, assemble(topo, receive_forwarded(topo, cfg.peer_timeout)))
        self.cloned = True
        if self.rank == 0:
            print(f"[clone] state of step {restored.global_step} received after {time.perf_counter() - t0:.1f} s; "
                  f"continuing from epoch {restored.epoch}, step {restored.step}", flush=True)
        return restored

    def load(self, live: Live, source: StateSource, path: Optional[Path] = None) -> Restored:
        """Load state into the live objects (`common.state.load.load_state`). The script's batch size is
        its own, taken as unchanged: a mid-epoch step re-slices by the host rank count alone."""
        reader = Reader(self.rank, Slicing(self.size, source.slicing.batch_size))
        start = load_state(source, live, reader).start
        self.last_global_step = start.global_step
        return Restored(start.epoch, start.step, start.global_step, dict(source.meta.user or {}), path)

    def check_clone_served(self) -> None:
        """With --clone-at, the state must have gone from the host ranks to the clone ranks: else the
        clone ranks would stand by until their keepers end, so say why now, in one line."""
        cfg = self.cfg
        clones = self.topo is not None and bool(self.topo.clone_ranks)
        if cfg is None or cfg.script is None or cfg.clone_at is None or self.cloned or not clones:
            return  # (the built-in trainer hands the clone state off itself, not through job.checkpoint)
        if self.is_clone:
            raise ConfigError("a clone rank starts from the host ranks' state: call job.restore(model, optimizer, "
                              "scheduler) before training (it stands by until the state of --clone-at arrives)")
        raise ConfigError(f"--clone-at {cfg.clone_at}: the script never called job.checkpoint at global step "
                          f"{cfg.clone_at} (the last was {self.last_global_step}), so the clone ranks got no "
                          "state; checkpoint at that step or choose one the script reaches")


def _json_data(extra: Optional[dict[str, object]]) -> Optional[dict[str, object]]:
    """`extra=` as the JSON it is stored as (a copy), or the error that names what is not JSON."""
    if extra is None:
        return None
    try:
        return json.loads(json.dumps(extra))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"job.checkpoint: extra must be JSON data (dict of numbers, strings, lists), got {e}") \
            from None
