"""Heartbeats: how a rank that waits without a deadline on purpose still proves it is alive.

A clone rank stands by for the state of `--clone-at STEP`, which may be hours into training, so
its wait cannot have a fixed deadline; yet a dead or hung keeper must not leave it waiting
forever. While a clone rank has not been served, every keeper that will serve it sends it a
header-only `StateKind.HEARTBEAT` every `interval_for(peer_timeout)` seconds (a quarter of
`--peer-timeout`: three beats may be late or lost before the clone gives up). The clone rank waits
for each next message (heartbeat, PREPARE or the state) with the ordinary `--peer-timeout`
deadline, so it fails with a `PeerError` naming the keeper when nothing came from it for that long,
and never while the keeper is merely waiting for the clone step. Pure: no MPI here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

BEATS_PER_TIMEOUT = 4


def interval_for(peer_timeout: float) -> float:
    """Seconds between beats for a receiver that gives up after `peer_timeout` seconds of silence."""
    return peer_timeout / BEATS_PER_TIMEOUT


@dataclass
class Heartbeat:
    """The sender's schedule: the first beat at once, then one every `interval` seconds."""

    interval: float
    last: Optional[float] = None  # when the last beat was sent (a monotonic clock's seconds)

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError(f"Heartbeat interval must be > 0 seconds, got {self.interval}")

    def take(self, now: float) -> bool:
        """True when a beat is due at `now`; the caller sends it, and it counts as sent."""
        if self.last is not None and now - self.last < self.interval:
            return False
        self.last = now
        return True
