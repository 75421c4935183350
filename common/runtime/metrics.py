"""Per-rank phase timers and JSON-lines logs, written by host and DPU ranks alike.

Each rank appends one JSON object per epoch to `<log_dir>/phases-rank<R>.jsonl`; host rank 0 also
appends the epoch summary to `<log_dir>/metrics.jsonl`. Lines are flushed and fsynced as written so
a crashed run keeps every completed epoch, and a resumed run appends to them (`set_run`).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from dpuoffload.common.runtime import trace

PHASES = ("data", "forward_backward", "allreduce", "optimizer", "validation")


class PhaseTimer:
    """Accumulates wall time per named phase; `reset()` at each epoch start."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def reset(self) -> None:
        self.totals = {}

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase; with `--trace`, also record it as a trace event on this rank's track."""
        tracer = trace.current()
        start_ns = trace.now_ns() if tracer else 0
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)
            if tracer:
                tracer.complete(name, start_ns, trace.now_ns())

    def shares(self, total: float) -> dict[str, float]:
        return {k: v / total for k, v in self.totals.items()} if total > 0 else {}


# Which run writes the records (stamped on every one), and whether it continues an earlier run.
_run: dict[str, Any] = {"run_id": None, "resumed_from": None}
_appending = False


def new_run_id() -> str:
    """A short id for this run: its start time (readable, sortable) plus random bits (unique)."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(3).hex()


def set_run(run_id: str, resuming: bool) -> None:
    """Called once at start-up with the id world rank 0 chose (all ranks agree on it). A resumed
    run (`--resume`) appends to the logs of the run it continues; a fresh run starts them afresh."""
    global _appending
    _run["run_id"], _appending = run_id, resuming


def set_resumed_from(global_step: Optional[int]) -> None:
    """The checkpoint step this run continues from, stamped on its records (None: a fresh run)."""
    _run["resumed_from"] = global_step


class JsonlLog:
    """JSON lines file owned by one rank; a no-op when `log_dir` is None.

    A fresh run into an existing --log-dir replaces the file (no mixing of unrelated runs); a
    resumed run appends to it, so a stopped-and-resumed job keeps every epoch. Each record carries
    `run_id` and `resumed_from` (see `set_run`), so the writer of every line is known.
    """

    def __init__(self, log_dir: Optional[str], name: str, replace: bool = True) -> None:
        """`replace` False: append even in a fresh run (a rank that takes over another's file)."""
        self.path: Optional[Path] = None
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self.path = Path(log_dir) / name
            if replace and not _appending:
                self.path.unlink(missing_ok=True)

    def write(self, record: Mapping[str, Any]) -> None:
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({**_run, **record}, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_jsonl(path: os.PathLike | str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
