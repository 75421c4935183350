"""The pre-launch validation pass: every mistake `dpurun` can see is reported before any rank starts.

`dpurun` calls `check_before_launch` once, after flag parsing and before `mpirun`. Each problem is
one line naming the problem and its fix (`dpurun: error: ...`); all of them are printed at once
and the exit code is 2. The checks that import nothing answer first, in a fraction of a second: when
they find an error, the dry import of the user's factories (seconds) waits for the next try, and a
warning says so. Warnings are printed and the job still starts.

What is checked:
- rank counts against the mode (offloading, the hybrid split, checkpoints and clones need DPU
  ranks; clone ranks and `--clone-at` go together) and `--clone-override` (parsed as the clone
  ranks will parse it);
- model and data set names, and the `--data` files of a built-in data set;
- `--ckpt-dir` (when checkpoints are written) and `--log-dir`: created if missing, then a probe file
  is written and removed, so an unwritable directory fails now instead of after training;
- `--resume`: a complete (COMMITTED) checkpoint;
- the dry import (`launch.probe`, a child process under the ranks' Python): the user's factories
  are imported and called, one item and one collated batch are fetched and checked.

In cluster mode (`--hosts`/`--hostfile`) the data set, the checkpoints and the logs live on the
compute nodes: `--data` files are not looked at and the dry import builds no data set; `--ckpt-dir`,
`--log-dir` and `--resume` are checked only where they are absolute paths that exist here (a shared
file system), and nothing is created here.

Only the dry import is slow (about 3-5 s: it imports torch), so it runs only when a `module:function`
factory is involved and can be skipped with `dpurun --skip-checks`.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from dpuoffload.common.clones import clone_config
from dpuoffload.common.config import RunConfig, parse_run_config
from dpuoffload.common.data.datasets import FAKE_TRAIN_SIZE, check_dataset
from dpuoffload.common.errors import ConfigError, InternalError
from dpuoffload.common.factories import is_factory_spec
from dpuoffload.common.models.zoo import check_model
from dpuoffload.common.plan.offload import split_counts

PROBE_TIMEOUT = 60.0  # seconds for the dry import; a data set that needs longer for one batch is unusual
PROBE_MARK = "dpurun-probe: "  # prefixes the probe's JSON lines, so a factory's own prints are ignored


@dataclass(frozen=True)
class Problem:
    """One line for the user: what is wrong and how to fix it. A warning does not stop the launch."""

    message: str
    warning: bool = False


@dataclass(frozen=True, kw_only=True)
class LaunchFacts:
    """What the pass needs from the launcher flags.

    Attributes:
        cluster: the ranks run on other machines (their files are not necessarily visible here).
        python: the host program's Python, which runs the dry import.
        skip_slow: `--skip-checks`: no dry import.
        create_dirs: create missing directories (not under `--dry-run`, which changes nothing).
    """

    host_ranks: int = 1
    dpu_ranks: int = 1
    clone_ranks: int = 0
    spare_ranks: int = 0
    cluster: bool = False
    python: str = sys.executable
    skip_slow: bool = False
    create_dirs: bool = True


# ------------------------------------------------------------------------------------ parsing
def parse_training(training_args: Sequence[str], prog: str = "dpurun") -> RunConfig:
    """Resolve the training flags exactly as the ranks will.

    Raises:
        ConfigError: any problem, including argparse usage errors (reworded to one line).
        SystemExit: `dpurun -- --help` (code 0).
    """
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return parse_run_config(list(training_args), prog=f"{prog} --")
    except SystemExit as e:
        if e.code in (0, None):  # `dpurun -- --help` printed the training flags
            raise
        lines = [ln for ln in captured.getvalue().splitlines() if ": error: " in ln]
        reason = lines[-1].split(": error: ", 1)[1] if lines else "invalid training flags"
        raise ConfigError(f"training flags: {reason} (see '{prog} -- --help')") from None


# ---------------------------------------------------------------------------------- the pass
def check_before_launch(cfg: RunConfig, facts: LaunchFacts, training_args: Sequence[str]) -> list[Problem]:
    """Every check, each independent group reporting its own problem; the dry import last.

    The dry import runs only when the names resolved (otherwise it would repeat their error) and the
    other checks found no error: a flag mistake is told in a fraction of a second, not after the
    seconds the user's factories take to import.
    """
    if cfg.script is not None:  # a user's script owns its model and data: ranks, file, directories, resume
        return _collect(lambda: check_ranks(cfg, facts), lambda: check_script(cfg, facts),
                        lambda: check_log_dir(cfg, facts), lambda: check_ckpt_dir(cfg, facts),
                        lambda: check_resume(cfg, facts))
    dry = needs_dry_import(cfg) and not facts.skip_slow
    problems = _collect(lambda: check_ranks(cfg, facts), lambda: check_clones(cfg),
                        lambda: check_injections(cfg, facts))
    names = _collect(lambda: check_names(cfg, facts.cluster, import_factories=not dry))
    problems += names
    problems += _collect(lambda: check_ckpt_dir(cfg, facts), lambda: check_log_dir(cfg, facts),
                         lambda: check_resume(cfg, facts))
    if names:
        return problems
    if dry and any(not p.warning for p in problems):  # (the cheap checks answer first: no seconds of import)
        return problems + [Problem("the model and data set factories were not imported yet (a dry import takes "
                                   "seconds): they are checked once the errors below are fixed", warning=True)]
    if dry:
        return problems + dry_import(facts, training_args)
    return problems + _collect(lambda: check_known_sizes(cfg, facts.host_ranks))


def _collect(*checks: Callable[[], Optional[Problem]]) -> list[Problem]:
    """Run each check; a raised ConfigError or a returned Problem (a warning) is collected."""
    out = []
    for check in checks:
        try:
            found = check()
        except ConfigError as e:  # CheckpointError (--resume) is one too
            found = Problem(str(e))
        if found is not None:
            out.append(found)
    return out


def report(problems: Sequence[Problem], prog: str = "dpurun") -> bool:
    """Print warnings, then errors, one line each; True when there is an error (do not launch)."""
    for p in sorted(problems, key=lambda p: not p.warning):
        print(f"{prog}: {'warning' if p.warning else 'error'}: {p.message}", file=sys.stderr, flush=True)
    return any(not p.warning for p in problems)


# ------------------------------------------------------------------------------- rank counts
def check_ranks(cfg: RunConfig, facts: LaunchFacts) -> None:
    """The mode's DPU work, checkpoints and clones against the rank counts (first problem only:
    the later checks would repeat it)."""
    if facts.dpu_ranks == 0 and cfg.mode.offloads:
        raise ConfigError(f"--mode {cfg.mode} offloads work to DPU ranks, but --dpu-ranks is 0; "
                          "use --dpu-ranks 1 or more (or --mode none)")
    split_counts(cfg, facts.host_ranks, facts.dpu_ranks)  # hybrid: enough DPU ranks for both kinds of work?
    if cfg.hands_state_off and facts.dpu_ranks == 0:
        raise ConfigError("checkpoints and clones are handed to DPU ranks, but --dpu-ranks is 0; use "
                          "--dpu-ranks 1 or more")
    if cfg.clone_at is not None and facts.clone_ranks == 0:
        raise ConfigError("--clone-at needs clone ranks: add --clone-ranks C before '--'")
    if facts.clone_ranks and cfg.clone_at is None:
        raise ConfigError(f"--clone-ranks {facts.clone_ranks} without --clone-at STEP: the clones would never "
                          "start; add --clone-at STEP after '--'")
    if cfg.recovery_policy.uses_spares and facts.spare_ranks == 0:
        raise ConfigError("--recovery rollback puts a spare rank in a dead host rank's place: add --spare-ranks S "
                          "before '--'")
    if facts.spare_ranks and not cfg.recovery_policy.fills_seats(facts.spare_ranks):
        raise ConfigError(f"--spare-ranks {facts.spare_ranks} without --recovery rollback or lossy-forward: the spares "
                          "would only stand by; add --recovery rollback (a spare replays the lost step) or "
                          "--recovery lossy-forward (a spare fills the seat at the next epoch) after '--'")
    if not facts.cluster and cfg.ckpt_mem_keep and cfg.ckpt_mem_replicas:  # (across machines: the ranks check it)
        from dpuoffload.common.state.memstore import place_copies

        place_copies(["this machine"], cfg.ckpt_mem_replicas)


def check_injections(cfg: RunConfig, facts: LaunchFacts) -> None:
    """`--inject` names ranks that exist (a spec naming none would silently inject nothing)."""
    from dpuoffload.common.faults.inject import parse_all, parse_simulated_all

    for inj in (*parse_all(cfg.inject), *(s.injection for s in parse_simulated_all(cfg.inject_simulate))):
        count, what = (facts.dpu_ranks, "DPU") if inj.who == "dpu" else (facts.host_ranks, "host")
        if inj.index >= count:
            raise ConfigError(f"--inject {inj}: there is no {what} rank {inj.index} (this job has {count}: "
                              f"{inj.who}:0..{count - 1})" if count else
                              f"--inject {inj}: this job has no {what} ranks")


def check_script(cfg: RunConfig, facts: LaunchFacts) -> None:
    """The training script exists (here, unless the ranks run on other machines)."""
    if not facts.cluster and not Path(str(cfg.script)).is_file():
        raise ConfigError(f"training script {cfg.script} not found (from {os.getcwd()}); give its path after "
                          "dpurun's flags: dpurun -- --mode da path/to/train.py [its arguments]")


def check_clones(cfg: RunConfig) -> None:
    """`--clone-override`s, parsed here as the clone ranks will parse them."""
    if cfg.clone_at is not None:
        clone_config(cfg)


def check_names(cfg: RunConfig, cluster: bool, import_factories: bool = True) -> None:
    """Model and data set names; a built-in data set's files too, unless they live on the nodes.

    `import_factories=False` leaves `module:function` to the dry import: user modules usually import
    torch (seconds), and the dry import imports them anyway, with the same messages.
    """
    if import_factories or not is_factory_spec(cfg.model):
        check_model(cfg)
    if import_factories or not is_factory_spec(cfg.dataset):
        check_dataset(cfg, files=not cluster)


# ------------------------------------------------------------------------------- directories
def check_ckpt_dir(cfg: RunConfig, facts: LaunchFacts) -> None:
    """Checkpoints will be written: the directory must take files (a failure after launch is found
    only when the first checkpoint is lost)."""
    if cfg.checkpointing:
        if cfg.ckpt_dir is None:
            raise InternalError("checkpointing without --ckpt-dir")
        check_writable(cfg.ckpt_dir, "--ckpt-dir", facts)


def check_log_dir(cfg: RunConfig, facts: LaunchFacts) -> None:
    if cfg.log_dir:
        check_writable(cfg.log_dir, "--log-dir", facts)


def check_writable(path: str, flag: str, facts: LaunchFacts) -> None:
    """Create `path` if missing and write (then remove) a probe file in it.

    Cluster mode: only an absolute path that exists here is probed (and nothing is created), since
    the ranks may see another file system. `create_dirs=False` (dry run) probes the nearest
    existing parent instead of creating anything.

    Raises:
        ConfigError: the path is a file, or cannot be created or written; names the path and the fix.
    """
    target = Path(path)
    if facts.cluster and not (target.is_absolute() and target.is_dir()):
        return
    blocker = _file_in_the_way(target)
    if blocker is not None:
        raise ConfigError(f"{flag} {path}: {blocker} is a file, not a directory; pass a directory path "
                          f"(or move the file)")
    if facts.create_dirs and not facts.cluster:
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{flag} {path}: cannot create it ({e.strerror or e}); pass a directory you can "
                              "write to") from None
    else:
        target = _nearest_existing(target)
    try:
        fd, probe = tempfile.mkstemp(prefix=".dpurun-probe-", dir=target)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write files in {target} ({e.strerror or e}); pass a directory "
                          "you can write to") from None


def _file_in_the_way(path: Path) -> Optional[Path]:
    """The path itself or a parent that exists and is not a directory."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def _nearest_existing(path: Path) -> Path:
    return next(p for p in (path, *path.absolute().parents) if p.exists())


def check_resume(cfg: RunConfig, facts: LaunchFacts) -> Optional[Problem]:
    """`--resume latest|DIR` names a complete checkpoint (in cluster mode: if its path is visible
    here); `latest` skipping a damaged newer one is a warning (the ranks skip it the same way)."""
    if not cfg.resume:
        return None
    where = cfg.ckpt_dir if cfg.resumes_newest else cfg.resume
    if facts.cluster and not (where and Path(where).is_absolute() and Path(where).exists()):
        return None
    if cfg.resumes_newest and cfg.ckpt_mem_keep:  # (DPU memory may hold a newer state: the ranks decide)
        return None
    from dpuoffload.common.state.ckptdirs import committed, resolve

    if cfg.resumes_if_any and not committed(str(cfg.ckpt_dir)):  # (the ranks say it starts from the beginning)
        return None

    skipped: list[str] = []
    path = resolve(cfg.resume, cfg.ckpt_dir, skipped)
    if not skipped:
        return None
    return Problem(f"--resume {cfg.resume}: {'; '.join(skipped)}; resuming from {path}", warning=True)


# ------------------------------------------------------------------------------ data set size
def check_known_sizes(cfg: RunConfig, host_ranks: int) -> Optional[Problem]:
    """A batch larger than each host rank's share, for sizes known without reading data."""
    size = cfg.train_subset or (FAKE_TRAIN_SIZE if cfg.dataset == "fake" else None)
    return None if size is None else batch_vs_size(cfg, size, host_ranks)


def batch_vs_size(cfg: RunConfig, size: int, host_ranks: int) -> Optional[Problem]:
    """One short step per epoch (a warning), or no step at all with --drop-last (an error)."""
    share = math.ceil(size / host_ranks)
    if cfg.batch_size <= share:
        return None
    what = (f"--batch-size {cfg.batch_size} is larger than the {share} training samples each host rank gets "
            f"({size} samples / {host_ranks} host rank(s))")
    if cfg.drop_last:
        return Problem(f"{what}: with --drop-last no step is left; use --batch-size {share} or less")
    return Problem(f"{what}: one short step of {share} per epoch; use --batch-size {share} or less "
                   "for full batches", warning=True)


# -------------------------------------------------------------------------------- dry import
def needs_dry_import(cfg: RunConfig) -> bool:
    """Only user code can fail in ways the names do not show. The built-in models and data sets are
    tested here, and the dry import costs 3-5 s (torch import) on a small box."""
    return is_factory_spec(cfg.model) or is_factory_spec(cfg.dataset)


def dry_import(facts: LaunchFacts, training_args: Sequence[str],
               timeout: float = PROBE_TIMEOUT) -> list[Problem]:
    """Run `launch.probe` in a child process (the ranks' Python, this directory on sys.path as the
    ranks' `python -m` has it) and turn its report into Problems; a crash of the child is one too."""
    python = facts.python
    if facts.cluster and not shutil.which(python):  # --python names the nodes' interpreter
        python = sys.executable
    cmd = [python, "-m", "dpuoffload.launch.probe", "--host-ranks", str(facts.host_ranks)]
    cmd += ["--no-data"] if facts.cluster else []
    try:
        proc = subprocess.run([*cmd, "--", *training_args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [Problem(f"the dry import of your factories did not finish in {timeout:.0f} s (building the "
                        "model, the data sets and one batch); check them, or pass dpurun --skip-checks")]
    except OSError as e:
        return [Problem(f"cannot run the dry import with --python {python} ({e.strerror or e}); pass "
                        "a working --python (or dpurun --skip-checks)")]
    problems = [Problem(r["message"], r.get("warning", False)) for r in _probe_records(proc.stdout)]
    if proc.returncode != 0 and not any(not p.warning for p in problems):
        problems.append(Problem(_crash_line(proc)))
    return problems


def _probe_records(stdout: str) -> list[dict]:
    return [json.loads(line[len(PROBE_MARK):]) for line in stdout.splitlines() if line.startswith(PROBE_MARK)]


def _crash_line(proc: subprocess.CompletedProcess) -> str:
    """The dry import died without a report (a crash in native code, a broken install)."""
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit code {proc.returncode}"
    return (f"the dry import of your factories crashed ({last}); run the same flags with "
            "dpurun --skip-checks to see it on the ranks, or import your factories in python to debug")
