"""Per-rank phase timers and JSON-lines logs, written by host and DPU ranks alike.

Each rank appends one JSON object per epoch to `<log_dir>/phases-rank<R>.jsonl`; host rank 0 also
appends the epoch summary to `<log_dir>/metrics.jsonl`. Lines are flushed and fsynced as written so
a crashed run keeps every completed epoch.
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


class JsonlLog:
    """JSON lines file owned by one rank, started afresh by each run; a no-op when `log_dir` is None."""

    def __init__(self, log_dir: Optional[str], name: str) -> None:
        self.path: Optional[Path] = None
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            self.path = Path(log_dir) / name
            self.path.unlink(missing_ok=True)  # a re-run into the same --log-dir replaces, not mixes

    def write(self, record: Mapping[str, Any]) -> None:
        if self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_jsonl(path: os.PathLike | str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
