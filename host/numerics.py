"""The host end of the numerics check (`common.data.numerics`): before a loader's first plan, compare
the samples its DPU rank builds with this host rank's own, and apply `--numerics`.

Call order, per loader of a host rank fed by a DPU rank (`host.loader.RemoteSource._open`):
    1. the host rank sends OpenLoader(check=K); the DPU rank builds the stream and its fingerprint
       of samples 0..K-1 and sends it (Tag.NUMERICS), while the host rank builds its own;
    2. on a difference, the host rank sends NumericsQuery(first differing sample, first differing
       step) and the DPU rank answers with that step's output, so the verdict says by how much;
    3. the host rank records the verdict (<log-dir>/numerics-rank<N>.jsonl), prints its line (host
       rank 0 always, others only on a difference) and, under strict, raises `NumericsError`, which
       ends the job before its first step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from dpuoffload.common.data.numerics import (
    Fingerprint,
    Magnitude,
    Numerics,
    Verdict,
    compare,
    fingerprint,
    fixes_for,
    step_output,
)
from dpuoffload.common.data.streams import NumericsQuery, encode
from dpuoffload.common.errors import NumericsError, PeerError
from dpuoffload.common.runtime.messages import Tag
from dpuoffload.common.runtime.metrics import JsonlLog
from dpuoffload.common.runtime.waits import recv_object, wait

if TYPE_CHECKING:
    from mpi4py import MPI

PREFIX = "[dpuoffload]"


@dataclass(frozen=True)
class NumericsCheck:
    """This host rank's side of the check: the policy and how to report (one per job)."""

    policy: Numerics
    samples: int
    host_label: str
    log: JsonlLog
    loud: bool               # print the verdict even when the samples agree (host rank 0)

    def run(self, world: "MPI.Comm", feeder: int, feeder_label: str, loader_id: int, dataset: Any, seed: int,
            timeout: float, wire: str = "") -> Verdict:
        """Steps 1-3 above, after the OpenLoader went out; `dataset` as the feeder builds it (its part
        of the transform under the uint8 wire, `wire` then says so). Raises `NumericsError` under strict."""
        t0 = time.perf_counter()
        mine = fingerprint(dataset, seed, self.samples)
        theirs = recv_object(world, feeder, Tag.NUMERICS, timeout, f"{feeder_label}'s sample fingerprint")
        if not isinstance(theirs, Fingerprint):
            raise PeerError(f"{feeder_label} answered the numerics check with {type(theirs).__name__}")
        difference = compare(mine, theirs)
        magnitude = None
        if difference is not None:
            _send(world, feeder, NumericsQuery(loader_id, difference.index, difference.step), timeout, feeder_label)
            there = recv_object(world, feeder, Tag.NUMERICS, timeout, f"{feeder_label}'s differing step output")
            magnitude = Magnitude.of(step_output(dataset, seed, difference.index, difference.step), there)
        verdict = Verdict(self.host_label, feeder_label, self.policy, mine.platform, theirs.platform,
                          min(len(mine.samples), len(theirs.samples)), time.perf_counter() - t0, difference,
                          magnitude, () if difference is None else
                          fixes_for(mine.platform, theirs.platform, difference.step_name), wire)
        self.report(verdict)
        return verdict

    def report(self, verdict: Verdict) -> None:
        self.log.write(verdict.record())
        if not verdict.identical and self.policy.stops:
            raise NumericsError(verdict.line())
        if self.loud or not verdict.identical:
            print(f"{PREFIX} {verdict.line()}", flush=True)


def numerics_check(policy: Numerics, samples: int, host_label: str, log_dir: Optional[str], world_rank: int,
                   loud: bool) -> Optional[NumericsCheck]:
    """The check a host rank runs on each loader its DPU rank feeds, or None under `--numerics off`."""
    if not policy.checks:
        return None
    return NumericsCheck(policy, samples, host_label, JsonlLog(log_dir, f"numerics-rank{world_rank}.jsonl"), loud)


def _send(world: "MPI.Comm", feeder: int, query: NumericsQuery, timeout: float, feeder_label: str) -> None:
    req = world.isend(encode(query), dest=feeder, tag=Tag.LOADER)
    wait(req, timeout, f"{feeder_label} to take the numerics query")
