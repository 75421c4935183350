"""Waiting on MPI requests without burning a core and without hanging forever on a dead peer.

Open MPI's blocking waits spin; on an emulated DPU that shares cores with host ranks, an idle rank
spinning would steal the host's CPU. `wait` polls `Test()` with a short back-off (sub-millisecond
at first, so hot paths lose little latency) and raises `PeerError` when the deadline passes.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from dpuoffload.common.errors import PeerError, PeerLost

if TYPE_CHECKING:
    from mpi4py import MPI

_MAX_SLEEP = 0.05
# Between ranks on different machines (TCP, no single-copy shared memory) a large message moves only
# while its sender and its receiver call into MPI (each poll pushes or pulls the next fragments), so
# both ends of a batch stream poll at least this often there (0.41 -> 0.65-0.84 of raw MPI at 3-19 MB,
# benchmarks/RESULTS.md); on one box they sleep longer and leave shared cores to the other ranks.
REMOTE_MAX_SLEEP = 0.00005
# ...and an end that awaits such a message keeps calling into MPI without sleeping for up to this long
# first: each sleep lets the pipeline of fragments run dry (without single-copy on one box, 3-19 MB
# batches moved 2-3x faster spinning than sleeping 50 us between polls).
REMOTE_SPIN = 0.005


def wait(req: "MPI.Request", timeout: Optional[float], what: str, max_sleep: float = _MAX_SLEEP,
         spin: float = 0.0, on_poll: Optional[Callable[[], None]] = None) -> float:
    """Wait for `req`; return the seconds waited.

    Args:
        req: a pending non-blocking request.
        timeout: seconds before giving up (None: wait forever, still without spinning).
        what: what is awaited and from whom, for the error message.
        max_sleep: longest sleep between polls (latency bound once the wait has been long).
        spin: poll without sleeping for this long first. A message that is about to land (a batch
            in flight) then costs microseconds, not an OS sleep of ~0.1 ms; a long wait still sleeps.
        on_poll: called after every unsuccessful poll (a keeper's heartbeats while it waits).

    Raises:
        PeerError: the deadline passed; the request is left pending (the caller aborts the job).
        PeerLost: MPI reported the peer dead (under fault tolerance only).
    """
    t0 = time.perf_counter()
    with lost_peer(what):
        while time.perf_counter() - t0 < spin:
            if req.Test():
                return time.perf_counter() - t0
        sleep = 0.0
        while not req.Test():
            waited = time.perf_counter() - t0
            if timeout is not None and waited > timeout:
                raise PeerError(f"timed out after {timeout:.0f} s waiting for {what}; the peer rank is "
                                "dead, hung or far slower than expected (raise --peer-timeout if it is slow)")
            if on_poll is not None:
                on_poll()
            time.sleep(sleep)
            sleep = min(max(sleep * 2, 1e-4), max_sleep)
    return time.perf_counter() - t0


def wait_unless_lost(req: "MPI.Request", timeout: Optional[float], what: str) -> bool:
    """`wait`, where a peer that died needs nothing any more (a send to a rank that left, the job's
    end going on without it): False if MPI reported it dead. A deadline passed still raises."""
    try:
        wait(req, timeout, what)
    except PeerLost:
        return False
    return True


@contextlib.contextmanager
def lost_peer(what: str) -> Iterator[None]:
    """MPI's report of a dead peer (ULFM's error classes) as `PeerLost`; other errors unchanged."""
    from mpi4py import MPI

    try:
        yield
    except MPI.Exception as e:
        if is_failure(e):
            raise PeerLost(f"the peer rank died while waiting for {what} ({e.Get_error_string()})") from e
        raise


def is_failure(e: BaseException) -> bool:
    """Whether `e` is MPI reporting a dead rank (or a communicator revoked because of one)."""
    from mpi4py import MPI

    return isinstance(e, MPI.Exception) and e.Get_error_class() in (
        MPI.ERR_PROC_FAILED, MPI.ERR_PROC_FAILED_PENDING, MPI.ERR_REVOKED)


def wait_all(reqs: "list[MPI.Request]", timeout: Optional[float], what: str, max_sleep: float = _MAX_SLEEP) -> float:
    """`wait` for every request of `reqs` (one `Testall` per poll progresses them all)."""
    t0, sleep = time.perf_counter(), 0.0
    while not _testall(reqs, what):
        if timeout is not None and time.perf_counter() - t0 > timeout:
            raise PeerError(f"timed out after {timeout:.0f} s waiting for {what}; the peer rank is dead, hung "
                            "or far slower than expected (raise --peer-timeout if it is slow)")
        time.sleep(sleep)
        sleep = min(max(sleep * 2, 1e-4), max_sleep)
    return time.perf_counter() - t0


def _testall(reqs: "list[MPI.Request]", what: str) -> bool:
    from mpi4py import MPI

    with lost_peer(what):
        return MPI.Request.Testall(reqs)


def wait_object(req: "MPI.Request", timeout: Optional[float], what: str) -> Any:
    """`wait` for a pickled (lower-case mpi4py) request; returns the object received."""
    t0, sleep = time.perf_counter(), 0.0
    while True:
        done, obj = req.test()
        if done:
            return obj
        if timeout is not None and time.perf_counter() - t0 > timeout:
            raise PeerError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(sleep)
        sleep = min(max(sleep * 2, 1e-4), _MAX_SLEEP)


def recv_object(comm: "MPI.Comm", source: int, tag: int, timeout: Optional[float], what: str) -> Any:
    """A pickled message of any size from `source` (a matched probe, then its receive), polled
    without spinning, with `PeerError` after `timeout` seconds."""
    t0, sleep = time.perf_counter(), 0.0
    while True:
        with lost_peer(what):
            message = comm.improbe(source=source, tag=tag)
        if message is not None:
            return message.recv()
        if timeout is not None and time.perf_counter() - t0 > timeout:
            raise PeerError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(sleep)
        sleep = min(max(sleep * 2, 1e-4), _MAX_SLEEP)


def probe_any(comm: "MPI.Comm", tag: int, status: "MPI.Status", matched: bool = False) -> Any:
    """Probe for a message from any rank with `tag`: `Iprobe` (True/False), or with `matched`
    `improbe` (the matched `MPI.Message`, or None). Under fault tolerance (ULFM) a wildcard probe
    fails once some rank has died, until this rank acknowledges the deaths it knows of: it does so,
    reports nothing this time, and the next probe works again."""
    from mpi4py import MPI

    try:
        if matched:
            return comm.improbe(source=MPI.ANY_SOURCE, tag=tag, status=status)
        return comm.Iprobe(source=MPI.ANY_SOURCE, tag=tag, status=status)
    except MPI.Exception as e:
        if not is_failure(e):
            raise
        comm.Ack_failed()
        return None if matched else False
