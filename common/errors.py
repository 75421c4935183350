"""Typed exceptions. User mistakes are `ConfigError` (a `ValueError`); wire faults are `PeerError`."""


class DpuOffloadError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(DpuOffloadError, ValueError):
    """A flag, file or combination the user can fix. The message names the problem and the fix."""


class SampleError(ConfigError):
    """A training sample that could not be loaded or augmented (a truncated JPEG, a corrupt record):
    the message names the sample (its index, and its file or shard where the data set knows it) and
    the original error, which is its `__cause__` (where the error line says it was raised)."""


class NumericsError(ConfigError):
    """`--numerics strict`: the samples a DPU rank builds differ from the host rank's own. The message
    is the check's one line: which transform step first differs, by how much, and what to do."""


class HandshakeError(DpuOffloadError):
    """Host and DPU programs disagree on version, protocol or run config."""


class InternalError(DpuOffloadError, RuntimeError):
    """A state the code rules out was met after all: a defect in dpuoffload, never a user's mistake. Raised
    where an `assert` would do, so the check holds under `python -O` too and names what was broken."""

    def __init__(self, what: str) -> None:
        super().__init__(f"internal error: {what} (a defect in dpuoffload: please report it)")


class PeerError(DpuOffloadError):
    """A peer rank did not answer in time or sent something unexpected."""


class PeerLost(PeerError):
    """MPI reported the peer rank dead (only under fault tolerance, `--dpu-failure fallback`:
    otherwise Open MPI ends the job first)."""


class WorkerError(Exception):
    """An exception raised by the user's data set in a data worker process (`--dpu-workers`),
    re-raised in the parent. Tracebacks do not cross processes, so it carries the worker's one-line
    description ('ValueError: ... (at data.py:12 in __getitem__)') and its traceback as text."""

    def __init__(self, description: str, traceback_text: str = "") -> None:
        super().__init__(description, traceback_text)
        self.description, self.traceback_text = description, traceback_text

    def __str__(self) -> str:
        return self.description


class DeathNotSurvived(DpuOffloadError):
    """A rank's death that the run turns out not to survive, found by a rank's own code rather than
    by the failure watch's verdict (under --recovery rollback: no spare left for its seat). The
    message is the death's one line (`common.faults.watch.death_line`), so `dpurun` reports a
    death, not an error, and `--restarts` relaunches the job."""
