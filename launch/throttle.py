"""Slow the emulated DPU ranks down with a CPU cgroup (`--dpu-speed F`, local emulation only).

A BlueField Arm core is several times slower than a server x86 core, so an emulated DPU rank on an
x86 core would make offloading look better than it is. A child cgroup with a CFS quota of
F * period * (number of DPU cores) caps the DPU ranks' CPU time at fraction F of their cores.

The cgroup is planned first (pure, also for --dry-run), created just before the job, entered by
the DPU ranks through the shell prefix from `command.cgexec_prefix`, and removed after the job.
Where it cannot be created (not root, no cpu controller) the caller prints one warning and runs
unthrottled: emulation is still useful, just less faithful.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from dpuoffload.common.errors import ConfigError

PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel rejects CFS quotas below 1 ms


@dataclass(frozen=True)
class CgroupPlan:
    """A cgroup to create: its directory, cgroup version (1 or 2) and CFS period/quota."""

    path: str
    version: int
    period_us: int
    quota_us: int


class ThrottleUnavailable(Exception):
    """Throttling is impossible here; the message says why (shown in the one warning)."""


def check_speed(speed: float, local: bool) -> None:
    """Reject speeds outside (0, 1] and throttling of real DPUs."""
    if not 0 < speed <= 1:
        raise ConfigError(f"--dpu-speed must be in (0, 1] (a fraction of a core's speed, e.g. "
                          f"0.25), got {speed}")
    if not local:
        raise ConfigError("--dpu-speed only works in local emulation: real DPUs run at their own "
                          "speed; drop --dpu-speed or --hosts/--dpus")


def quota_us(speed: float, ncores: int, period_us: int = PERIOD_US) -> int:
    """CPU time per period for `ncores` cores at fraction `speed` of their speed."""
    return max(MIN_QUOTA_US, round(speed * period_us * ncores))


def plan_cgroup(speed: float, ncores: int, pid: Optional[int] = None,
                root: Union[str, Path] = "/sys/fs/cgroup",
                proc_cgroup: Union[str, Path] = "/proc/self/cgroup") -> CgroupPlan:
    """Find where a throttling cgroup can go, without creating anything.

    Prefers the cgroup v1 cpu controller (a child of this process's own cpu cgroup, so limits of
    an enclosing container still apply), else cgroup v2 at the root of the unified hierarchy
    (v2 forbids enabling controllers below a cgroup that holds processes, such as our own).

    Raises:
        ThrottleUnavailable: no cpu controller, or no write access.
    """
    root = Path(root)
    name = f"dpuoffload-{os.getpid() if pid is None else pid}"
    quota = quota_us(speed, ncores)
    v1 = _v1_parent(root, Path(proc_cgroup))
    if v1 is not None:
        return CgroupPlan(str(_writable(v1) / name), 1, PERIOD_US, quota)
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return CgroupPlan(str(_writable(root) / name), 2, PERIOD_US, quota)
    raise ThrottleUnavailable(f"no cgroup cpu controller under {root}")


def _v1_parent(root: Path, proc_cgroup: Path) -> Optional[Path]:
    for mount in (root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"):
        if (mount / "cpu.cfs_quota_us").exists():
            return mount / _own_v1_path(proc_cgroup).lstrip("/")
    return None


def _own_v1_path(proc_cgroup: Path) -> str:
    """This process's path in the v1 cpu hierarchy ("/" when unknown)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return "/"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return "/"


def _writable(directory: Path) -> Path:
    if not os.access(directory, os.W_OK):
        raise ThrottleUnavailable(f"no write access to {directory} (run as root, or delegate a "
                                  "cgroup to this user)")
    return directory


def create(plan: CgroupPlan) -> None:
    """Create the cgroup and set its quota.

    Raises:
        ThrottleUnavailable: the kernel refused (the half-made cgroup is removed again).
    """
    path = Path(plan.path)
    try:
        if plan.version == 2:
            _enable_v2_cpu(path.parent)
        path.mkdir()
    except OSError as e:
        raise ThrottleUnavailable(f"cannot create {path}: {e.strerror}") from None
    try:
        if plan.version == 1:
            (path / "cpu.cfs_period_us").write_text(str(plan.period_us))
            (path / "cpu.cfs_quota_us").write_text(str(plan.quota_us))
        else:
            (path / "cpu.max").write_text(f"{plan.quota_us} {plan.period_us}")
    except OSError as e:
        remove(plan)
        raise ThrottleUnavailable(f"cannot set the CPU quota in {path}: {e.strerror}") from None


def _enable_v2_cpu(parent: Path) -> None:
    control = parent / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def remove(plan: CgroupPlan, timeout: float = 5.0) -> Optional[str]:
    """Remove the cgroup; retries while the last ranks finish exiting.

    Returns:
        None on success (or when it never existed), else a message for a warning.
    """
    path = Path(plan.path)
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
            return None
        except FileNotFoundError:
            return None
        except OSError as e:
            if time.monotonic() >= deadline:
                return f"could not remove cgroup {path}: {e.strerror}; remove it with rmdir"
            time.sleep(0.1)
