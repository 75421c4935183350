"""What every benchmark script shares: paths, running one dpurun job and reading its logs,
medians with spread, the machine description, markdown tables and plots.

The scripts import it as `benchmarks.harness` (they put the repository root on `sys.path`), so
`python benchmarks/<name>.py` and `python benchmarks/run.py` work from anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DATA = ROOT / ".cache" / "data"
RESULTS = ROOT / "benchmarks" / "results"
NODES = ROOT / "scripts" / "nodes.sh"


def job_env() -> dict[str, str]:
    """The environment of every job: mpirun may run as root here; the repository root is importable
    (user factories such as `benchmarks.augfactories:heavy` are resolved on every rank)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PYTHONPATH": path}


def make_data(datasets: Sequence[str] = ("cifar10", "svhn", "tinyimagenet")) -> Path:
    """Write the bundled data sets (idempotent, seconds) and return their parent directory."""
    subprocess.run([str(BIN / "dpurun"), "make-data", str(DATA), "--datasets", *datasets], check=True,
                   stdout=subprocess.DEVNULL, env=job_env())
    return DATA


def data_flags(flags: Sequence[str], data: Path) -> list[str]:
    """`@name` in a workload's flags stands for the bundled data set directory `data/name`."""
    return [str(data / a[1:]) if a.startswith("@") else a for a in flags]


# ------------------------------------------------------------------------------------- one run
@dataclass
class RunLog:
    """The logs of one finished job (`--log-dir`), parsed."""

    epochs: list[dict[str, Any]]                 # metrics.jsonl epoch records, by epoch
    host: list[dict[str, Any]]                   # phases-rank0.jsonl (host rank 0), by epoch
    dpus: dict[int, list[dict[str, Any]]]        # world rank -> its per-epoch phase records
    auto: Optional[dict[str, Any]]               # auto.jsonl (--mode auto)
    wall: float                                  # seconds the whole job took
    stdout: str = ""
    machine_ms: Optional[float] = None           # `machine_speed`'s fixed step just before the job (workloads)
    end: Optional[dict[str, Any]] = None         # metrics.jsonl's end record (host rank 0's `startup_s`, ...)

    def steady(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Epochs 2.. (epoch 1 pays one-off warm-up), or all of them when there is only one."""
        return records[1:] or records

    def epoch_times(self) -> list[float]:
        return [e["epoch_time"] for e in self.steady(self.epochs)]

    def host_phase(self, name: str) -> list[float]:
        """Seconds per steady epoch the host rank spent in phase `name`."""
        return [h["phases"].get(name, 0.0) for h in self.steady(self.host)]

    def dpu_phase(self, names: Iterable[str]) -> list[float]:
        """Seconds per steady epoch summed over `names`, of the busiest DPU rank."""
        names = tuple(names)
        per_rank = [[sum(r["phases"].get(n, 0.0) for n in names) for r in self.steady(recs)]
                    for recs in self.dpus.values()]
        return [max(col) for col in zip(*per_rank)] if per_rank else []


def read_log(log: Path, wall: float, stdout: str = "") -> RunLog:
    def lines(name: str) -> list[dict[str, Any]]:
        path = log / name
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []

    epochs = sorted((m for m in lines("metrics.jsonl") if m.get("event") == "epoch"), key=lambda m: m["epoch"])
    host = sorted((h for h in lines("phases-rank0.jsonl") if "epoch" in h), key=lambda h: h["epoch"])
    dpus = {}
    for path in sorted(log.glob("phases-rank*.jsonl")):
        rank = int(path.stem.removeprefix("phases-rank"))
        if rank != 0:
            recs = [r for r in lines(path.name) if r.get("role") == "dpu" and "epoch" in r and "phases" in r]
            dpus[rank] = sorted(recs, key=lambda r: r["epoch"])
    auto = lines("auto.jsonl")
    end = next((m for m in lines("metrics.jsonl") if m.get("event") == "end"), None)
    return RunLog(epochs, host, {k: v for k, v in dpus.items() if v}, auto[-1] if auto else None, wall, stdout,
                  end=end)


def run_logged(cmd: Sequence[str], what: str, timeout: float = 1800) -> RunLog:
    """Run `cmd` (which must contain the placeholder `{log}` for its --log-dir) and parse its logs."""
    with tempfile.TemporaryDirectory(prefix="dpubench-") as log:
        argv = [a.replace("{log}", log) for a in cmd]
        t0 = time.perf_counter()
        res = subprocess.run(argv, capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=timeout)
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            sys.exit(f"benchmark run failed ({what}): {' '.join(argv)}\n{res.stdout[-1500:]}\n{res.stderr[-3000:]}")
        return read_log(Path(log), wall, res.stdout)


def dpurun_cmd(launcher: Sequence[str], training: Sequence[str]) -> list[str]:
    """A dpurun command logging to `{log}` (see `run_logged`)."""
    return [str(BIN / "dpurun"), *launcher, "--", *training, "--log-dir", "{log}", "--no-progress"]


def emulated_node(dpu_ranks: int, dpu_speed: float, host_ranks: int = 1) -> list[str]:
    """Launcher flags of the emulated node: host rank(s) on core 0, DPU rank(s) on core 1, throttled.
    `--skip-checks`: the benchmarks' own data-set factories (`augfactories`) are not dry-imported
    before every job (3-5 s each, outside the epochs they measure)."""
    return ["--host-ranks", str(host_ranks), "--dpu-ranks", str(dpu_ranks), "--dpu-cores", "1",
            "--dpu-speed", str(dpu_speed),
            "--host-threads", "1", "--dpu-threads", "1", "--oversubscribe", "--skip-checks"]


# ------------------------------------------------------------------------- emulated machines
def machines_env(prefix: str, subnet: str, rate: Optional[str] = None, delay: Optional[str] = None) -> dict[str, str]:
    """The job environment for `scripts/nodes.sh` machines of one benchmark.

    Every benchmark names its own namespace prefix and /24 so two of them (or a test's machines)
    never collide on one box; `rate` shapes every machine's link (tbf), `delay` puts the delay line
    between them (see nodes.sh's header).
    """
    env = {**job_env(), "DPUOFFLOAD_NETNS_PREFIX": prefix, "DPUOFFLOAD_NETNS_SUBNET": subnet}
    if rate:
        env["DPUOFFLOAD_NETNS_RATE"] = rate
    if delay:
        env["DPUOFFLOAD_NETNS_DELAY"] = delay
    return env


@contextmanager
def emulated_machines(names: Sequence[str], env: dict[str, str], what: str) -> Iterator[None]:
    """Machines `names` up for the block and down on every way out of it (an error, a timeout,
    sys.exit, Ctrl-C), so a failed benchmark leaves no namespace or delay line behind.

    Raises:
        SystemExit: `nodes.sh up` failed (its message says why, e.g. not root).
    """
    up = subprocess.run(["bash", str(NODES), "up", *names], capture_output=True, text=True, env=env)
    if up.returncode != 0:
        sys.exit(f"{what}: could not create the emulated machines: {up.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["bash", str(NODES), "down", *names], capture_output=True, env=env)


def mpirun_on_machines(env: dict[str, str], parts: Sequence[tuple[str, Sequence[str]]],
                       timeout: float = 600) -> subprocess.CompletedProcess:
    """One plain `mpirun` (no dpurun) with one rank per (machine, argv) in `parts`, started on the
    first part's machine with the flags the emulated machines need (`nodes.sh mpi-flags`)."""
    flags = subprocess.run(["bash", str(NODES), "mpi-flags"], capture_output=True, text=True, env=env,
                           check=True).stdout.split()
    cmd = ["bash", str(NODES), "run", parts[0][0], str(BIN / "mpirun"), *flags, "--bind-to", "none"]
    for i, (name, argv) in enumerate(parts):
        cmd += ([":"] if i else []) + ["-np", "1", "--host", f"{name}:1", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


# ------------------------------------------------------------------------------------ statistics
def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and count of `values`."""
    if not values:
        raise ValueError("no values to summarize")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def ratio_spread(num: Sequence[float], den: Sequence[float]) -> dict[str, float]:
    """Ratio of medians, and the min-max of the per-repetition ratios (paired rep by rep)."""
    pairs = [a / b for a, b in zip(num, den) if b > 0]
    return {"median": statistics.median(num) / statistics.median(den), "min": min(pairs), "max": max(pairs),
            "n": len(pairs)}


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


# --------------------------------------------------------------------------------------- machine
def machine() -> dict[str, Any]:
    """What the numbers were measured on (goes into every JSON and RESULTS.md section)."""
    import psutil

    info: dict[str, Any] = {
        "platform": platform.platform(), "machine": platform.machine(), "processor": _cpu_model(),
        "cpus_logical": psutil.cpu_count(logical=True), "cpus_physical": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "python": platform.python_version(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }
    for name in ("torch", "torchvision", "mpi4py", "horovod"):
        try:
            info[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a missing optional package is just not listed
            info[name] = None
    try:
        from mpi4py import MPI

        info["mpi"] = MPI.Get_library_version().splitlines()[0].split(",")[0].strip()
    except Exception:  # noqa: BLE001
        info["mpi"] = None
    info["commit"] = code_commit()
    return info


def code_commit() -> Optional[str]:
    """The commit the measured code is at (`+dirty` with uncommitted changes under the code folders),
    so a results file says what it measured; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "api", "common", "host", "dpu", "launch",
                                "benchmarks/*.py"], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty.strip() else "")


def machine_speed(seconds: float = 20.0, core: int = 0) -> dict[str, Any]:
    """How this machine's speed moves: one fixed piece of CPU work (10 forward/backward passes of a
    16-channel 3x3 convolution on a 16x32x32 batch, one thread, pinned to `core`) timed back to back
    for `seconds`, as the median of each second. On the 2-core VM of 2026-11-26 it switched between
    32 and 47 ms in episodes of 15 s and more: a `--mode auto` profile taken in one and epochs run in
    the other read up to 45 % apart, which no model of the job can predict. Recorded beside the
    benchmark's numbers so that a reader can tell the machine's noise from the code's."""
    import torch

    mask, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    try:
        conv, x = torch.nn.Conv2d(16, 16, 3, padding=1), torch.randn(16, 16, 32, 32)

        def unit() -> float:
            t0 = time.perf_counter()
            for _ in range(10):
                conv(x).sum().backward()
            return time.perf_counter() - t0

        unit()
        per_second, current, start, end = [], [], time.perf_counter(), time.perf_counter() + seconds
        while time.perf_counter() < end:
            current.append(unit())
            if time.perf_counter() - start >= 1.0:
                per_second.append(1e3 * statistics.median(current))
                current, start = [], time.perf_counter()
        if not per_second:  # (a probe of about one second can end a hair before its first whole second)
            per_second.append(1e3 * statistics.median(current))
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, mask)
    fast, slow = min(per_second), max(per_second)
    return {"seconds": seconds, "core": core, "unit_ms_per_second": [round(v, 1) for v in per_second],
            "fast_ms": round(fast, 1), "slow_ms": round(slow, 1), "slow_over_fast": round(slow / fast, 3)}


def speed_line(speed: dict[str, Any]) -> str:
    """One sentence of `machine_speed`'s result for a RESULTS.md section."""
    return (f"Machine speed just before the run (`harness.machine_speed`: a fixed convolution step on core "
            f"{speed['core']}, {speed['seconds']:.0f} s): the median of each second {speed['fast_ms']:.1f}-"
            f"{speed['slow_ms']:.1f} ms, slow / fast {speed['slow_over_fast']:.2f}; a profile and epochs in "
            "different seconds can differ by as much.")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_line(m: dict[str, Any]) -> str:
    return (f"{m['cpus_logical']} logical CPUs ({m['processor']}), {m['memory_gib']} GiB, {m['platform']}, "
            f"Python {m['python']}, torch {m['torch']}, torchvision {m['torchvision']}, mpi4py {m['mpi4py']}, "
            f"{m['mpi']}, Horovod {m['horovod']}; load average at start {m['load_avg_at_start']}")


# --------------------------------------------------------------------------------------- output
def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def fmt_spread(s: dict[str, float], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def pyplot():
    """matplotlib with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --quick (the test suite's smoke runs): DPU ranks unthrottled in the benchmarks that start jobs. A
# throttled DPU rank also imports torch at that speed (4-5 s of CPU: 8-10 s at 0.5), which the host
# waits for at the start-up handshake, so throttling doubled every quick job's cost while proving
# nothing a quick run checks. The throttle itself: interference and sweep (quick too), and
# tests/jobs/test_supervise.py.
QUICK_DPU_SPEED = 1.0


def bench_parser(doc: str, name: str, quick: str, *, reps: int = 2, epochs: bool = True,
                 dpu_speed: bool = True, plots: bool = True) -> argparse.ArgumentParser:
    """The flags every benchmark script shares (its own go on top)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--reps", type=int, default=reps, help=f"interleaved repetitions (default: {reps})")
    if epochs:
        p.add_argument("--epochs", type=int, default=3, help="epochs per run; epoch 1 is warm-up (default: 3)")
    if dpu_speed:
        p.add_argument("--dpu-speed", type=float, default=0.5, help="DPU ranks' fraction of a core (default: 0.5)")
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--out", type=Path, default=RESULTS / f"{name}.json")
    if plots:
        p.add_argument("--plots", type=Path, default=RESULTS, help="directory for the PNG plots")
    return p


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The flags a result was measured with (without output paths)."""
    return {k: v for k, v in vars(args).items() if k not in ("out", "plots", "worker")}


def legend_outside(ax: Any, where: str = "right", fontsize: int = 8) -> None:
    """A legend next to the axes ("right") or under them ("below"), so it never covers a bar or a
    point; `save_figure` grows the image to keep it (bbox_inches="tight")."""
    if where == "right":
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize=fontsize, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, borderaxespad=0.0)


def save_figure(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # keeps legends placed outside the axes
    pyplot().close(fig)
    return path


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=float) + "\n")


@dataclass
class Section:
    """One benchmark's output: its JSON payload, a markdown section and the plots it wrote."""

    name: str
    payload: dict[str, Any]
    markdown: str
    plots: list[Path] = field(default_factory=list)
