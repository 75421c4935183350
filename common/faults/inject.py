"""Failure injection (`--inject WHO@WHEN[:HOW]`): a rank that fails on purpose, at a chosen step.

The fault tests and the recovery work need every kind of failure at a deterministic point of the
training, not a signal sent from outside at a moment that races it. A spec names

- WHO: `host:R` (host rank R), `dpu:R` (DPU rank R, numbered among the DPU ranks), or `node:N`
  (host rank N and the DPU ranks paired with it, as when a machine goes down);
- WHEN: a global step (an integer >= 1) or a fraction of the run's steps (0 < f < 1: the step
  ceil(f x steps));
- HOW: `kill` (SIGKILL, the default), `term` (SIGTERM), `stop` (SIGSTOP: a hung rank) or `raise`
  (an exception in the program, which ends the job the way a bug would).

Where it fires: a host rank right after the optimizer step of that global step; an augmentation DPU
rank when it starts building that step's batch (it runs up to `--da-buffers` batches ahead of its
host); a validation DPU rank (`--mode mv`/`hybrid`) when it has received the state of the epoch that
step belongs to (it validates epoch i while the host ranks train epoch i+1); a DPU rank that keeps
checkpoints when it gets the state of the first checkpoint from that step on, before writing it (an
augmentation or validation rank may fail earlier, at its own work). DPU ranks that idle and keep
nothing have no steps to fail at: naming one is refused at start-up.
Pure and torch-free, so `dpurun` checks the specs before launch.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from dpuoffload.common.errors import ConfigError, DpuOffloadError, InternalError

if TYPE_CHECKING:
    from dpuoffload.common.runtime.roles import Topology

WHO = ("host", "dpu", "node")
HOW = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP, "raise": None}
FORM = "WHO@WHEN[:HOW] with WHO host:R, dpu:R or node:N, WHEN a step >= 1 or a fraction in (0, 1), " \
       "HOW kill, term, stop or raise"


class InjectedFailure(DpuOffloadError):
    """The failure `--inject ...:raise` asked for (its message names the spec)."""


@dataclass(frozen=True)
class Injection:
    who: str                    # host | dpu | node
    index: int                  # host rank, DPU rank (among the DPU ranks) or node (its host rank)
    step: Optional[int]         # a global step ...
    fraction: Optional[float]   # ... or a fraction of the run's steps
    how: str = "kill"

    def at(self, total_steps: int) -> int:
        """The global step it fires at, in a run of `total_steps` steps."""
        if self.step is not None:
            return self.step
        if self.fraction is None:
            raise InternalError("an injection with neither a step nor a fraction (`_who_when` gives one)")
        return max(1, math.ceil(float(self.fraction) * total_steps))

    @property
    def when(self) -> "int | float":
        return self.step if self.step is not None else float(self.fraction)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.who}:{self.index}@{self.when}:{self.how}"


class _Bad(ValueError):
    """Why a spec does not parse (each flag's parser wraps it with the spec and its form)."""


def _who_when(spec: str) -> tuple[str, int, Optional[int], Optional[float], str]:
    """WHO@WHEN[:REST] -> (who, index, step, fraction, REST): the part both flags share."""
    target, at, rest = spec.partition("@")
    who, colon, index = target.partition(":")
    if not at or not colon or who not in WHO:
        raise _Bad(f"WHO must be one of {', '.join(f'{w}:N' for w in WHO)}")
    if not index.isdigit():
        raise _Bad(f"{index!r} is not a rank number")
    when, _, tail = rest.partition(":")
    try:
        value = float(when)
    except ValueError:
        raise _Bad(f"WHEN {when!r} is neither a step nor a fraction") from None
    if value.is_integer() and "." not in when and value >= 1:
        return who, int(index), int(value), None, tail
    if 0 < value < 1:
        return who, int(index), None, value, tail
    raise _Bad(f"WHEN {when!r} is neither a step >= 1 nor a fraction strictly between 0 and 1")


def split_specs(specs: Sequence[str]) -> list[str]:
    """The flag's values, repeated or comma-separated."""
    return [s for part in specs for s in part.split(",") if s.strip()]


def parse(spec: str) -> Injection:
    """One spec; a ConfigError naming the spec and the expected form otherwise."""
    try:
        who, index, step, fraction, how = _who_when(spec)
        how = how or "kill"
        if how not in HOW:
            raise _Bad(f"HOW {how!r} is not one of {', '.join(HOW)}")
    except _Bad as e:
        raise ConfigError(f"--inject {spec!r}: {e}; expected {FORM} (e.g. host:0@12 or dpu:1@0.5:stop)") from None
    return Injection(who, index, step, fraction, how)


def parse_all(specs: Sequence[str]) -> tuple[Injection, ...]:
    return tuple(parse(s) for s in split_specs(specs))


# --------------------------------------------------------------- simulated failures (the study's)
SIMULATE_FORM = "WHO@WHEN[:P] with WHO host:R or node:N, WHEN a step >= 1 or a fraction in (0, 1), P the " \
                "share of the step's gradients computed before the failure, e.g. 25% or 0.75 (default 50%)"


@dataclass(frozen=True)
class Simulated:
    """`--inject-simulate`: host rank `index` becomes a casualty during the backward pass of a step,
    after `progress` of the gradients (in backward order, last layer first): no process is lost."""

    injection: Injection        # who and when (`how` unused)
    progress: float             # in [0, 1]

    def __str__(self) -> str:
        return f"{self.injection.who}:{self.injection.index}@{self.injection.when}:{self.progress:.0%}"


def parse_simulated(spec: str) -> Simulated:
    """One `--inject-simulate` spec; a ConfigError naming it and the expected form otherwise."""
    try:
        who, index, step, fraction, share = _who_when(spec)
        progress = _progress(share)
        if who == "dpu":
            raise _Bad("only host ranks compute gradients (name host:R or node:N)")
    except _Bad as e:
        raise ConfigError(f"--inject-simulate {spec!r}: {e}; expected {SIMULATE_FORM} (e.g. host:1@12:25%)") from None
    return Simulated(Injection(who, index, step, fraction), progress)


def _progress(share: str) -> float:
    """P of a simulated failure: 25% or 0.25 (default 50%)."""
    text = share.strip() or "50%"
    try:
        progress = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise _Bad(f"P {share!r} is not a share such as 25% or 0.25") from None
    if not 0 <= progress <= 1:
        raise _Bad(f"P {share!r} is outside 0..100 %")
    return progress


def parse_simulated_all(specs: Sequence[str]) -> tuple[Simulated, ...]:
    return tuple(parse_simulated(s) for s in split_specs(specs))


def targets_me(inj: Injection, host_rank: Optional[int], dpu_rank: Optional[int],
               partners_of_host: Sequence[int] = ()) -> bool:
    """Whether `inj` names this rank: host rank `host_rank`, or DPU rank `dpu_rank` whose paired
    host ranks are `partners_of_host` (for node:N)."""
    if inj.who == "host" or (inj.who == "node" and host_rank is not None):
        return host_rank == inj.index
    if inj.who == "dpu":
        return dpu_rank == inj.index
    return inj.index in partners_of_host  # node:N on a DPU rank: paired with host rank N


Note = Callable[[dict[str, Any]], None]   # a line of this rank's failure log (`Faults.note`)


class Injector:
    """This rank's injections; `check(global_step, total_steps)` fires the one due at that step.
    `note`: where the moment an injection fires is recorded (the run's `Faults.note`)."""

    def __init__(self, mine: Sequence[Injection], label: str, note: Note) -> None:
        self.mine, self.label, self.note = tuple(mine), label, note

    def __bool__(self) -> bool:
        return bool(self.mine)

    def check(self, global_step: int, total_steps: int) -> None:
        for inj in self.mine:
            if inj.at(total_steps) == global_step:
                fire(inj, self.label, global_step, self.note)


    def check_through(self, steps: range, total_steps: int) -> None:
        """Fire the injection due at any global step of `steps` (a validation rank: the epoch whose
        state it just received); the failure is reported at the last of them."""
        for inj in self.mine:
            if inj.at(total_steps) in steps:
                fire(inj, self.label, steps[-1], self.note)


def fire(inj: Injection, label: str, global_step: int, note: Note) -> None:
    """Fail now as `inj` says (a signal's moment goes to `note` first: detection times are measured
    from it). `stop` returns only if someone sends SIGCONT."""
    what = f"injected failure {inj} at global step {global_step}"
    if inj.how == "raise":
        raise InjectedFailure(what)
    print(f"[dpuoffload] {label}: {what}", file=sys.stderr, flush=True)
    note({"event": "injected", "spec": str(inj), "global_step": global_step, "time": time.time()})
    sig = HOW[inj.how]
    if sig is None:
        raise InternalError(f"injection kind {inj.how!r} has no signal to kill with")
    os.kill(os.getpid(), sig)


def for_rank(specs: Sequence[str], topo: "Topology", note: Note) -> Injector:
    """This rank's injector: the injections that name it (`named`), their moments to `note`."""
    return Injector(named(specs, topo), topo.describe(), note)


def named(specs: Sequence[str], topo: "Topology") -> list[Injection]:
    """The injections that name this rank (host and DPU ranks; clone ranks are never named)."""
    from dpuoffload.common.runtime.roles import Role

    injections = parse_all(specs)
    host_rank = topo.side_rank if topo.role is Role.HOST else None
    dpu_rank = topo.side_rank if topo.role is Role.DPU else None
    partners = [topo.host_ranks.index(h) for h in topo.pairing.dpu_to_hosts.get(topo.world_rank, ())] \
        if dpu_rank is not None else []
    return [i for i in injections if topo.role is not Role.CLONE and targets_me(i, host_rank, dpu_rank, partners)]
