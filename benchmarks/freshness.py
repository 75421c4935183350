"""Which results files measured code that has changed since: a stale table says so.

    python benchmarks/freshness.py            # one line per results file measured on older code
    python benchmarks/report.py --check       # the marked figures, then the same list

A results file records the commit it measured (`machine.commit`, `harness.code_commit`, since
2026-11-29; `+dirty` when uncommitted changes were under the code folders). Older files have none:
for them the commit that brought the file into the repository stands in (the code measured was at or
before it). A file is *stale* when a commit since touched a path its benchmark exercises
(`EXERCISES`: the benchmark's own scripts and the product code its numbers come from). Stale is not
wrong: it says a re-run may change the numbers, and which change to look at first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PRODUCT = ("api", "common", "host", "dpu", "launch")  # a benchmark not listed below: all of it

# What each benchmark's numbers depend on, beyond benchmarks/<name>.py and benchmarks/harness.py.
EXERCISES: dict[str, tuple[str, ...]] = {
    "checkpoint": ("host/checkpoint.py", "host/capture.py", "common/state", "dpu/keeper", "benchmarks/ckpt_host.py"),
    "clone": ("host/checkpoint.py", "host/capture.py", "host/clone.py", "common/state", "dpu/keeper",
              "benchmarks/clone_host.py"),
    "recovery": ("host/recovery", "common/faults", "common/state", "dpu/keeper", "launch/restart.py",
                 "launch/supervise.py", "common/train/loop.py"),
    "faults": ("host/recovery", "common/faults", "dpu", "launch/restart.py", "launch/supervise.py",
               "common/train/loop.py"),
    "study": ("common/faults/simulate.py", "common/train/loop.py", "common/train/allreduce.py"),
    "transport": ("common/data/batches.py", "common/data/feeds.py", "common/runtime/waits.py", "dpu/serve.py"),
    "startup": ("common/startup.py", "common/runtime/torchsetup.py", "launch", "host/main.py", "dpu/main.py",
                "benchmarks/plain_train.py", "benchmarks/startup_probe.py"),
    "crossarch": ("common/data", "host/numerics.py", "scripts/aarch64.sh"),
    "goodput": ("host/recovery", "host/spare.py", "common/faults", "common/state", "dpu/keeper", "launch/restart.py",
                "launch/supervise.py", "common/train"),
}


@dataclass(frozen=True)
class Freshness:
    """One results file: the commit it measured (or the one that brought it) and the commits since
    that touched what its benchmark exercises."""

    name: str
    measured: Optional[str]
    inferred: bool
    since: tuple[str, ...]       # commits (short hash, subject) touching its paths since `measured`
    paths: tuple[str, ...]       # those commits' changed files among its paths

    def line(self) -> str:
        if self.measured is None:
            return f"{self.name}: no commit recorded and not in git history: its code is unknown"
        how = "brought in at" if self.inferred else "measured"
        if not self.since:
            return f"{self.name}: {how} {self.measured}, nothing it exercises changed since"
        shown = ", ".join(self.paths[:4]) + (f" and {len(self.paths) - 4} more" if len(self.paths) > 4 else "")
        return (f"{self.name}: STALE: {how} {self.measured}; {len(self.since)} commit(s) since changed what it "
                f"exercises ({shown}); newest: {self.since[0][:70]}")


def benchmark_of(results_file: Path) -> str:
    """`recovery-long-epoch.json` -> `recovery`; `own_loop.json` -> `own_loop`."""
    return results_file.stem.split("-")[0]


def exercised(bench: str) -> tuple[str, ...]:
    own = [f"benchmarks/{bench}.py", "benchmarks/harness.py"]
    return tuple(own) + EXERCISES.get(bench, PRODUCT)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()


def measured_commit(results_file: Path) -> tuple[Optional[str], bool]:
    """The commit a file measured (its record, `+dirty` dropped), else the commit that added it."""
    try:
        machine = json.loads(results_file.read_text()).get("machine") or {}
    except (ValueError, AttributeError):
        machine = {}
    recorded = machine.get("commit") if isinstance(machine, dict) else None
    if recorded:
        return recorded.removesuffix("+dirty"), False
    added = git("log", "--diff-filter=A", "--format=%h", "-1", "--", str(results_file.relative_to(ROOT)))
    return (added or None), True


def freshness(results_file: Path) -> Freshness:
    commit, inferred = measured_commit(results_file)
    if commit is None:
        return Freshness(results_file.name, None, inferred, (), ())
    paths = [p for p in exercised(benchmark_of(results_file)) if (ROOT / p).exists()]
    since = git("log", "--format=%h %s", f"{commit}..HEAD", "--", *paths)
    changed = git("diff", "--name-only", commit, "HEAD", "--", *paths) if since else ""
    return Freshness(results_file.name, commit, inferred, tuple(s[:100] for s in since.splitlines()),
                     tuple(changed.splitlines()))


def report(files: Optional[list[Path]] = None) -> list[str]:
    """One line per results file that measured older code (the stale ones)."""
    files = sorted(RESULTS.glob("*.json")) if files is None else files
    return [f.line() for f in map(freshness, files) if f.since or f.measured is None]


def main() -> int:
    if not git("rev-parse", "--git-dir"):
        print("not a git checkout: which code a results file measured cannot be told")
        return 0
    lines = report()
    print("\n".join(lines) if lines else "every results file measured the code it exercises as it is now")
    return 0


if __name__ == "__main__":
    sys.exit(main())
