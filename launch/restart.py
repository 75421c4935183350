"""`dpurun --restarts N`: relaunch a job that lost a rank, resuming from DPU memory.

The design's checkpoint-restart answer to a lost process (the recovery study's C/R), made cheap:
the keepers already hold the newest checkpoints in DPU memory (`--ckpt-mem-keep`, which `--restarts`
turns on), so the relaunched job's host ranks get their state back from the DPU ranks instead of
the checkpoint disk (`common.state.memstore`). What decides and what is reported:

- a job is relaunched when a rank *died* (a signal, a lost machine or connection) and restarts are
  left; a rank that raised an exception is not (the same bug would fail again), nor a job that was
  interrupted or rejected its flags;
- the relaunch has the same launcher flags and training flags, with `--resume auto` (the newest state
  kept, or the beginning when the failure came before any: the ranks decide, since the DPUs' memory
  may be on machines this one cannot see) and of `--inject` only the failures at steps after the one
  that ended the job (an injected failure stands for a real one, which does not come back at the same
  step; a later one stands for the next failure, which a run that takes failures at a rate meets after
  the relaunch too);
- one report per restart (printed, and in `<log-dir>/restarts.jsonl`): detected after (the failure
  until mpirun reported it; known for injected failures), job ended after, relaunch until training
  resumed, state transfer time and size, where the state came from, steps replayed (for a rank killed
  from outside, whose step is printed nowhere: the bound `--ckpt-every` sets).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

from dpuoffload.common.faults.inject import parse as parse_injection
from dpuoffload.common.faults.inject import split_specs
from dpuoffload.common.state.ckptdirs import RESUME_AUTO
from dpuoffload.launch.supervise import PREFIX, JobOutcome

MEMORY_KEEP = "2"   # --ckpt-mem-keep that --restarts sets when the user did not


def _flag_value(args: Sequence[str], flag: str) -> Optional[str]:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _without(args: Sequence[str], flag: str) -> list[str]:
    """`args` less every `flag VALUE` / `flag=VALUE`."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def first_launch_args(training_args: Sequence[str]) -> list[str]:
    """The first launch keeps its checkpoints in DPU memory too (unless the user chose K)."""
    if _flag_value(training_args, "--ckpt-mem-keep") is not None:
        return list(training_args)
    return [*training_args, "--ckpt-mem-keep", MEMORY_KEEP]


def relaunch_args(training_args: Sequence[str], failed_step: Optional[int] = None) -> list[str]:
    """The training flags of a relaunch: `--resume auto` (the newest state kept, in DPU memory or on
    disk, or the beginning when none was: the ranks look, where the DPUs' memory is, since this
    machine may not see it), and of `--inject` only the failures due after `failed_step`, the step at
    which the injected failure that ended the job fired (see the module docstring): a later one stands
    for the next real failure, which a run that takes failures at a rate must meet after a relaunch too.
    A failure given as a fraction of the run, or a job ended by no injected failure, keeps none."""
    kept = [spec for spec in split_specs(_values(training_args, "--inject")) if _due_after(spec, failed_step)]
    args = _without(_without(training_args, "--inject"), "--resume")
    return [*args, *(["--inject", ",".join(kept)] if kept else []), "--resume", RESUME_AUTO]


def _values(args: Sequence[str], flag: str) -> list[str]:
    """Every value of `flag VALUE` / `flag=VALUE` in `args`."""
    out = [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    return out + [b for a, b in zip(args, args[1:]) if a == flag]


def _due_after(spec: str, failed_step: Optional[int]) -> bool:
    injection = parse_injection(spec)
    return failed_step is not None and injection.step is not None and injection.step > failed_step


def refusal(outcome: JobOutcome) -> Optional[str]:
    """Why this failed job is not restarted (None: restart it)."""
    if outcome.interrupted:
        return "the job was interrupted"
    if outcome.code == 2 and not outcome.failures:
        return "the job stopped on its flags or data (exit 2), which a restart would repeat"
    if not outcome.failures:
        return f"mpirun exited with code {outcome.code} without naming a dead rank"
    first = outcome.failures[0]
    if first.verb == "failed first" and "injected failure" not in first.cause:
        return f"a rank raised an exception ({first.cause.split(' (at ')[0]}), which a restart would repeat"
    return None


@dataclass(frozen=True)
class RestartReport:
    """One restart, in seconds; None where the output did not say (e.g. no injected failure line)."""

    restart: int
    failed_step: Optional[int]      # the global step the injected failure fired at
    resumed_step: Optional[int]
    source: str                     # "dpu-memory", "disk" or "start" (nothing was kept)
    detected_s: Optional[float]     # failure -> mpirun's report of it
    ended_s: Optional[float]        # mpirun's report -> mpirun exited (the job torn down)
    resumed_s: Optional[float]      # mpirun exited -> the relaunched job resumed training
    transfer_s: Optional[float]     # the state back from DPU memory, rebuilt (part of resumed_s)
    transfer_mb: Optional[float]
    ckpt_every: Optional[int] = None  # --ckpt-every: bounds the steps replayed when the death's step is not known

    @property
    def replayed_steps(self) -> Optional[int]:
        if self.failed_step is None or self.resumed_step is None:
            return None
        return self.failed_step - self.resumed_step

    def line(self) -> str:
        """One line; where a figure cannot be known (a rank killed from outside has no injected-failure
        line, so neither its moment nor its step is printed anywhere) it says what is known instead."""
        def s(v: Optional[float]) -> str:
            return "an unknown time" if v is None else f"{v:.2f} s"

        state = {"dpu-memory": "state from DPU memory", "disk": "state from the checkpoint disk",
                 "start": "no state kept: from the beginning"}[self.source]
        if self.transfer_s is not None:
            state += f" ({self.transfer_mb:.1f} MB in {self.transfer_s * 1e3:.0f} ms)"
        detected = (f"failure detected after {s(self.detected_s)}" if self.detected_s is not None else
                    "a rank died outside the program (mpirun's report is the first sign of it)")
        resumed = "the start" if self.resumed_step is None else f"global step {self.resumed_step}"
        return (f"{PREFIX} restart {self.restart}: {detected}, job ended {s(self.ended_s)} later, training resumed "
                f"{s(self.resumed_s)} after that at {resumed}; {state}; {self._replayed()}")

    def _replayed(self) -> str:
        if self.replayed_steps is not None:
            return f"{self.replayed_steps} step(s) replayed"
        if self.ckpt_every is not None and self.source != "start":
            return (f"up to {self.ckpt_every - 1} step(s) replayed (checkpoints every {self.ckpt_every} steps; "
                    "the step the rank died in is not known)")
        return "the steps since then replayed (the step the rank died in is not known)"


def report(restart: int, failed: JobOutcome, relaunched: JobOutcome, ckpt_every: Optional[int] = None) -> RestartReport:
    """The restart report from the failed job's and the relaunched job's outcomes (`ckpt_every`: the run's
    --ckpt-every, which bounds the steps replayed when the failure was not injected)."""
    ev, rev = failed.events, relaunched.events
    injected, noticed = ev.get("injected"), ev.get("noticed")
    resumed, memory = rev.get("resumed"), rev.get("from_memory")
    started = None if resumed else rev.get("started")  # no state was kept: it began again at step 0
    if started is not None:
        resumed = (started[0], ("0",))
    return RestartReport(
        restart=restart,
        failed_step=int(injected[1][0]) if injected else None,
        resumed_step=int(resumed[1][0]) if resumed else None,
        source="dpu-memory" if memory else "disk" if started is None else "start",
        detected_s=noticed[0] - injected[0] if injected and noticed else None,
        ended_s=failed.ended - noticed[0] if noticed else None,
        resumed_s=resumed[0] - failed.ended if resumed else None,
        transfer_s=int(memory[1][2]) / 1e3 if memory else None,
        transfer_mb=float(memory[1][1]) if memory else None,
        ckpt_every=ckpt_every)


def record(log_dir: Optional[str], rep: RestartReport) -> None:
    """Print the report and append it to `<log-dir>/restarts.jsonl`."""
    print(rep.line(), file=sys.stderr, flush=True)
    if log_dir:
        path = Path(log_dir) / "restarts.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps({**asdict(rep), "replayed_steps": rep.replayed_steps}) + "\n")
