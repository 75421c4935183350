"""Where a command's CPU goes, process by process: `python -m tests.census OUT -- COMMAND...`.

Runs COMMAND, reads every process's CPU seconds (psutil, from `/proc`) every quarter second while it
runs, and writes to OUT (JSON) the CPU seconds every process used meanwhile, with what it was (a host
rank, a DPU rank, dpurun's dry import, a benchmark, mpirun, a pytest worker, ...) and the test whose run
started it (`PYTEST_CURRENT_TEST`, which pytest sets in its worker's environment and every process it
starts inherits); a summary goes to stderr.
`DPUOFFLOAD_TEST_CENSUS=OUT bash scripts/test.sh` runs the suite under it.

Why: the suite's time on two cores is its CPU seconds over two, and `DPUOFFLOAD_TEST_TIMES` undercounts
them: a test's CPU there is what its worker's children left in `getrusage`, which misses every process
not waited for up the chain (RESULTS.md, "The test suite's own time", has one run counted both ways). It
also shows what the seconds buy: mostly ranks importing torch.

A process seen for less than a quarter second may be missed; processes that were there before the
command count only what they used after. A pytest worker's own CPU (the tests that run in it) counts as
outside any test: `/proc` shows the environment a process started with, not the one it set since.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import psutil

PERIOD = 0.25
# (what a process is, a string its command line holds), first match wins: the program's own parts first.
KINDS: tuple[tuple[str, str], ...] = (
    ("census", "tests.census"), ("host rank", "dpuoffload.host"), ("DPU rank", "dpuoffload.dpu"),
    ("dry import", "dpuoffload.launch.probe"),
    ("benchmark", "benchmarks/"), ("benchmark", "benchmarks."), ("example", "examples/"),
    ("script", "api_scripts/"), ("dpurun", "dpurun"), ("mpirun", "prterun"), ("mpirun", "prted"),
    ("mpirun", "mpirun"), ("mpirun", "mpiexec"), ("mpirun", "hydra_pmi_proxy"), ("aarch64 (qemu)", "qemu-"),
    ("pytest", "pytest"), ("pytest", "exec(eval(sys.stdin.readline()))"), ("Slurm", "slurm"),
)


def kind_of(cmdline: Sequence[str]) -> str:
    """What a process is, from its command line (`KINDS`); a kernel thread has none."""
    if not cmdline:
        return "kernel"
    text = " ".join(cmdline)
    for kind, marker in KINDS:
        if marker in text:
            return kind
    return os.path.basename(cmdline[0]) or "?"


def started_by(environ: Mapping[str, str]) -> str:
    """The test file in a process's environment (`PYTEST_CURRENT_TEST`), "" outside any test."""
    return environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]


@dataclass
class Process:
    pid: int
    kind: str
    test: str
    command: str
    cpu_s: float = 0.0       # used while the census ran
    baseline_s: float = 0.0  # (what it had used before the census first saw it, if it was there at the start)


class Census:
    """The sampling loop (psutil reads `/proc`); `seen` keys processes by (pid, start time), so a reused
    pid is a new process."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, float], Process] = {}
        self.first = True
        self.stop = threading.Event()

    def sample(self) -> None:
        for ps in psutil.process_iter():
            try:
                times = ps.cpu_times()
                cpu, key = times.user + times.system, (ps.pid, ps.create_time())
                proc = self.seen.get(key)
                if proc is None:
                    cmdline = ps.cmdline()
                    environ = ps.environ() if cmdline else {}
                    proc = Process(ps.pid, kind_of(cmdline), started_by(environ), " ".join(cmdline)[:300],
                                   baseline_s=cpu if self.first else 0.0)
                    self.seen[key] = proc
                proc.cpu_s = max(proc.cpu_s, cpu - proc.baseline_s)
            except psutil.Error:
                continue  # (gone between listing and reading, or not ours to read)
        self.first = False

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(PERIOD)
        self.sample()


def summary(processes: Sequence[Process], wall_s: float, top: int = 25) -> str:
    """CPU seconds by kind of process, then by test file (each file's kinds, largest first)."""
    total = sum(p.cpu_s for p in processes)
    lines = [f"census: {total:,.0f} CPU s in {wall_s:,.0f} s of wall ({total / max(wall_s, 1e-9):.2f} cores busy)"]
    by_kind: dict[str, list[float]] = defaultdict(list)
    for p in processes:
        if p.cpu_s > 0:
            by_kind[p.kind].append(p.cpu_s)
    for kind, cpus in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {sum(cpus):8.1f} s  {len(cpus):5d} processes  {sum(cpus) / len(cpus):5.2f} s each  {kind}")
    by_file: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for p in processes:
        by_file[p.test or "(outside any test)"][p.kind] += p.cpu_s
    lines.append("by test file:")
    for name, kinds in sorted(by_file.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        parts = ", ".join(f"{k} {s:.0f}" for k, s in sorted(kinds.items(), key=lambda kv: -kv[1]) if s >= 1)
        lines.append(f"  {sum(kinds.values()):8.1f} s  {name}: {parts}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.census", description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="the JSON file to write (every process, and the summary's totals)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run under the census")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to run after --, e.g. python -m tests.census census.json -- pytest tests/jobs")
    census = Census()
    census.sample()  # (what is there already: its CPU so far is not the command's)
    sampler = threading.Thread(target=census.run, name="census", daemon=True)
    started = time.perf_counter()
    sampler.start()
    try:
        rc = subprocess.call(command)
    finally:
        census.stop.set()
        sampler.join()
    wall = time.perf_counter() - started
    processes = [p for p in census.seen.values() if p.cpu_s > 0]
    payload = {"command": command, "returncode": rc, "wall_s": round(wall, 1),
               "cpu_s": round(sum(p.cpu_s for p in processes), 1), "processes": [asdict(p) for p in processes]}
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(args.out)  # (whole or not at all)
    print(summary(processes, wall), file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
