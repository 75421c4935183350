"""The run config shared by host and DPU programs, its command-line parser, presets and hash.

Both programs receive the same training flags from `dpurun` and resolve them to the same
`RunConfig`; `handshake.check_peers` compares `config_hash()` across all ranks at start-up so a
mismatch (e.g. a hand-written mpirun line with different flags per side) stops the job at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import hashlib
import importlib.util
import json
import sys
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.policy import (
    SIMULATED_SPELLINGS,
    DpuFailure,
    Recovery,
    RecoveryPolicy,
    SimulatedRecovery,
)
from dpuoffload.common.modes import Mode, Numerics, StateCopy, Wire
from dpuoffload.common.state.ckptdirs import RESUME_AUTO, RESUME_LATEST

MODES = tuple(m.value for m in Mode)
ALLREDUCE_BACKENDS = ("auto", "horovod", "torch", "mpi")
DEVICES = ("auto", "cpu", "cuda")
AMPS = ("off", "bf16", "fp16")
LR_SCHEDULES = ("cosine", "step", "constant")
CKPT_ERRORS = ("continue", "fail")
DPU_FAILURES = tuple(f.value for f in DpuFailure)
RECOVERY = tuple(r.value for r in Recovery)  # what a dead host rank does to the run
NUMERICS = tuple(n.value for n in Numerics)
WIRES = tuple(w.value for w in Wire)
CKPT_COPIES = tuple(c.value for c in StateCopy)
AUTO_ALLOWS = ("naive",)  # modes that change the math, which --mode auto considers only on request
SCRIPT_MODES = (Mode.NONE, Mode.DA, Mode.MV, Mode.HYBRID)  # the modes the public API (a user's script) serves so far


# ------------------------------------------------------------------------------ field declarations
class Concern(enum.Enum):
    """What part of a run a `RunConfig` field configures (its section in the class body)."""

    DATA = "data"
    TRAINING = "model and training"
    OFFLOAD = "offload"
    CHECKPOINT = "checkpoints and clones"
    RECOVERY = "failures and recovery"
    REPORTING = "logs and reports"
    LAUNCH = "launch"


class OnResume(enum.Enum):
    """What `--resume` does when the field differs from the checkpoint's run."""

    NOTE = "note"    # resumes, and host rank 0 names the field in a note (e.g. another --lr)
    FREE = "free"    # resumes silently: where and how this run works, not what it computes from the state
    FATAL = "fatal"  # refuses: the state is another model's or another label space's


class InClone(enum.Flag):
    """What the clone group (`--clone-at`, `common.clones.clone_config`) does with the original's value."""

    KEEP = 0
    RESET = enum.auto()     # the field's default: the clone offloads nothing and hands nothing off itself
    OVERRIDE = enum.auto()  # `--clone-override KEY=VALUE` may set it (parsed as the field's type)
    SUBDIR = enum.auto()    # a directory: the clone's is `clone/` inside the original's


@dataclass(frozen=True)
class Meaning:
    """What a field means beyond its flag, declared next to the field with `flag(...)`.

    The tables that code consults (`SCRIPT_FIELDS`, `state.resume.FREE`/`FATAL`, `clones.OVERRIDABLE`,
    what a clone resets, what `--recovery` refuses) are derived from these, so a new field says what it
    means where it is added and no table is forgotten.
    """

    concern: Concern
    script: bool = False                       # still means something with a user's script (`dpurun -- train.py`)
    resume: OnResume = OnResume.NOTE
    clone: InClone = InClone.KEEP
    refused_by_recovery: Optional[str] = None  # set (not its default), --recovery refuses it: what to name


def flag(default: Any, concern: Concern, *, script: bool = False, resume: OnResume = OnResume.NOTE,
         clone: InClone = InClone.KEEP, refused_by_recovery: Optional[str] = None) -> Any:
    """A `RunConfig` field with its default and its `Meaning`."""
    return dataclasses.field(default=default, metadata={"meaning": Meaning(concern, script, resume, clone,
                                                                           refused_by_recovery)})


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything that must be identical on every rank of a run.

    One field per training flag (`--batch-size` is `batch_size`), grouped by concern; each field's
    `flag(...)` declares what it means beyond its flag (see `Meaning`). The dataclass stays flat: its
    JSON form is the checkpoints' and the start-up handshake's. Per-side knobs that may legitimately
    differ (threads per rank, core pinning, throttling) are launcher concerns passed through the
    environment, not part of this config or its hash.
    """

    # -- data: what the model is trained and validated on
    dataset: str = flag("cifar10", Concern.DATA, resume=OnResume.FATAL)
    data: Optional[str] = flag(None, Concern.DATA, resume=OnResume.FREE)
    download: bool = flag(False, Concern.DATA, resume=OnResume.FREE)
    num_classes: Optional[int] = flag(None, Concern.DATA, resume=OnResume.FATAL)
    train_subset: Optional[int] = flag(None, Concern.DATA, clone=InClone.OVERRIDE)
    val_subset: Optional[int] = flag(None, Concern.DATA, clone=InClone.OVERRIDE)
    skip_corrupt: int = flag(0, Concern.DATA, script=True, resume=OnResume.FREE)
    # -- model and training: the model, the optimizer, and where the host ranks compute
    model: str = flag("resnet20", Concern.TRAINING, resume=OnResume.FATAL)
    epochs: int = flag(3, Concern.TRAINING, clone=InClone.OVERRIDE)
    batch_size: int = flag(32, Concern.TRAINING, clone=InClone.OVERRIDE)
    val_batch_size: int = flag(128, Concern.TRAINING, resume=OnResume.FREE)
    drop_last: bool = flag(False, Concern.TRAINING, clone=InClone.OVERRIDE)
    lr: float = flag(0.05, Concern.TRAINING, clone=InClone.OVERRIDE)
    momentum: float = flag(0.9, Concern.TRAINING, clone=InClone.OVERRIDE)
    weight_decay: float = flag(5e-4, Concern.TRAINING, clone=InClone.OVERRIDE)
    lr_schedule: str = flag("cosine", Concern.TRAINING, clone=InClone.OVERRIDE)
    seed: int = flag(0, Concern.TRAINING, clone=InClone.OVERRIDE)
    allreduce: str = flag("auto", Concern.TRAINING, resume=OnResume.FREE, clone=InClone.OVERRIDE)
    device: str = flag("auto", Concern.TRAINING, script=True, resume=OnResume.FREE)
    amp: str = flag("off", Concern.TRAINING, resume=OnResume.FREE)
    channels_last: bool = flag(False, Concern.TRAINING, resume=OnResume.FREE)
    # -- offload: what the DPU ranks do for the host ranks
    mode: Mode = flag(Mode.NONE, Concern.OFFLOAD, script=True, resume=OnResume.FREE, clone=InClone.RESET)
    da_buffers: int = flag(4, Concern.OFFLOAD, script=True, resume=OnResume.FREE)
    dpu_workers: int = flag(0, Concern.OFFLOAD, script=True, resume=OnResume.FREE)
    da_host_share: Union[float, str] = flag(0.0, Concern.OFFLOAD, script=True, resume=OnResume.FREE)
    da_host_workers: int = flag(1, Concern.OFFLOAD, script=True, resume=OnResume.FREE)
    numerics: Numerics = flag(Numerics.WARN, Concern.OFFLOAD, script=True)
    numerics_samples: int = flag(16, Concern.OFFLOAD, script=True)
    wire: Wire = flag(Wire.AUTO, Concern.OFFLOAD, script=True)
    mv_dpu_fraction: Union[float, str] = flag(1.0, Concern.OFFLOAD, script=True, resume=OnResume.FREE)
    dpu_da_ranks: Optional[int] = flag(None, Concern.OFFLOAD, script=True, resume=OnResume.FREE)
    dpu_mv_ranks: Optional[int] = flag(None, Concern.OFFLOAD, script=True, resume=OnResume.FREE)
    da_fanout: Optional[int] = flag(None, Concern.OFFLOAD, script=True, resume=OnResume.FREE)
    dpu_batch_size: Union[int, str, None] = flag(None, Concern.OFFLOAD)
    auto_allow: Optional[str] = flag(None, Concern.OFFLOAD)
    # -- checkpoints and clones: state handed to the DPU ranks, written, resumed, or continued by clones
    ckpt_dir: Optional[str] = flag(None, Concern.CHECKPOINT, script=True, resume=OnResume.FREE, clone=InClone.RESET)
    ckpt_every: Optional[int] = flag(None, Concern.CHECKPOINT, resume=OnResume.FREE, clone=InClone.RESET)
    ckpt_every_epoch: bool = flag(False, Concern.CHECKPOINT, resume=OnResume.FREE, clone=InClone.RESET)
    ckpt_keep: int = flag(2, Concern.CHECKPOINT, script=True, resume=OnResume.FREE)
    ckpt_mem_keep: int = flag(0, Concern.CHECKPOINT, resume=OnResume.FREE)
    ckpt_mem_replicas: Optional[int] = flag(None, Concern.CHECKPOINT, resume=OnResume.FREE)
    ckpt_mem_budget: Optional[int] = flag(None, Concern.CHECKPOINT, resume=OnResume.FREE)
    ckpt_copy: StateCopy = flag(StateCopy.STAGED, Concern.CHECKPOINT, script=True, resume=OnResume.FREE)
    ckpt_errors: str = flag("continue", Concern.CHECKPOINT, script=True)
    resume: Optional[str] = flag(None, Concern.CHECKPOINT, script=True, resume=OnResume.FREE, clone=InClone.RESET)
    stop_at_step: Optional[int] = flag(None, Concern.CHECKPOINT, resume=OnResume.FREE,
                                       clone=InClone.RESET | InClone.OVERRIDE)
    clone_at: Optional[int] = flag(None, Concern.CHECKPOINT, script=True, resume=OnResume.FREE, clone=InClone.RESET,
                                   refused_by_recovery="clones (the clone ranks wait for every host rank's slice)")
    clone_override: tuple[str, ...] = flag((), Concern.CHECKPOINT, resume=OnResume.FREE, clone=InClone.RESET)
    # -- failures and recovery: what a dead rank does to the run, and failures on purpose
    dpu_failure: DpuFailure = flag(DpuFailure.STOP, Concern.RECOVERY, resume=OnResume.FREE)
    recovery: Recovery = flag(Recovery.STOP, Concern.RECOVERY, resume=OnResume.FREE)
    reassign: bool = flag(False, Concern.RECOVERY, resume=OnResume.FREE)
    inject: tuple[str, ...] = flag((), Concern.RECOVERY, resume=OnResume.FREE)
    inject_simulate: tuple[str, ...] = flag(
        (), Concern.RECOVERY, resume=OnResume.FREE,
        refused_by_recovery="--inject-simulate (simulated and real failures: one at a time)")
    simulate_recovery: SimulatedRecovery = flag(SimulatedRecovery.LOSSY_FORWARD, Concern.RECOVERY,
                                                resume=OnResume.FREE)
    # -- logs and reports: what the run writes and prints besides training
    log_dir: Optional[str] = flag(None, Concern.REPORTING, script=True, resume=OnResume.FREE, clone=InClone.SUBDIR)
    progress: bool = flag(True, Concern.REPORTING, script=True, resume=OnResume.FREE)
    digest_batches: bool = flag(False, Concern.REPORTING, resume=OnResume.FREE)
    save_weights: Optional[str] = flag(None, Concern.REPORTING, resume=OnResume.FREE,
                                       clone=InClone.RESET | InClone.OVERRIDE)
    trace: Optional[str] = flag(None, Concern.REPORTING, resume=OnResume.FREE, clone=InClone.RESET,
                                refused_by_recovery="--trace (its end-of-run gather needs every rank)")
    tensorboard: Optional[str] = flag(None, Concern.REPORTING)
    plots: bool = flag(False, Concern.REPORTING)
    # -- launch: how the ranks find and wait for each other, and what the host ranks run
    peer_timeout: float = flag(600.0, Concern.LAUNCH, script=True, resume=OnResume.FREE)
    script: Optional[str] = flag(None, Concern.LAUNCH, script=True,
                                 refused_by_recovery="a training script (the built-in trainer only, so far)")

    def __post_init__(self) -> None:
        _check_choice("mode", self.mode, MODES)
        object.__setattr__(self, "mode", Mode(self.mode))
        _check_choice("allreduce", self.allreduce, ALLREDUCE_BACKENDS)
        _check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _check_choice("device", self.device, DEVICES)
        _check_choice("amp", self.amp, AMPS)
        if self.device == "cuda" and self.mode in (Mode.NAIVE, Mode.AUTO):
            raise ConfigError(f"--device cuda with --mode {self.mode}: the DPU ranks would train as replicas on "
                              "their CPUs beside GPU host ranks; use --mode none, da, mv or hybrid")
        for name in ("epochs", "batch_size", "val_batch_size", "da_buffers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{_flag(name)} must be >= 1, got {getattr(self, name)}")
        if self.skip_corrupt < 0:
            raise ConfigError(f"--skip-corrupt must be >= 0, got {self.skip_corrupt}")
        if self.skip_corrupt and self.mode is Mode.NAIVE:
            raise ConfigError("--skip-corrupt with --mode naive: its replicas' batches are dealt by size from one "
                              "plan, which a left-out sample would break; use --mode none, da, mv or hybrid")
        for name in ("train_subset", "val_subset", "num_classes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{_flag(name)} must be >= 1, got {value}")
        if self.lr <= 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"--momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ConfigError(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if self.mv_dpu_fraction != "auto" and not (
                isinstance(self.mv_dpu_fraction, (int, float)) and 0 <= self.mv_dpu_fraction <= 1):
            raise ConfigError(f"--mv-dpu-fraction must be a number in [0, 1] or 'auto', got {self.mv_dpu_fraction!r}")
        _check_choice("numerics", self.numerics, NUMERICS)
        object.__setattr__(self, "numerics", Numerics(self.numerics))
        _check_choice("wire", self.wire, WIRES)
        object.__setattr__(self, "wire", Wire(self.wire))
        if self.numerics_samples < 1:
            raise ConfigError(f"--numerics-samples must be >= 1, got {self.numerics_samples} (to skip the check: "
                              "--numerics off)")
        self._check_feeding()
        for name in ("dpu_da_ranks", "dpu_mv_ranks", "da_fanout"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{_flag(name)} must be >= 1, got {value}")
            if value is not None and self.mode not in (Mode.HYBRID, Mode.AUTO):
                raise ConfigError(f"--{_flag(name)} only applies to --mode hybrid (got --mode {self.mode})")
        if self.dpu_batch_size is not None:
            if self.mode not in (Mode.NAIVE, Mode.AUTO):
                raise ConfigError(f"--dpu-batch-size only applies to --mode naive (got --mode {self.mode})")
            valid = isinstance(self.dpu_batch_size, int) and self.dpu_batch_size >= 1
            if self.dpu_batch_size != "auto" and not valid:
                raise ConfigError(f"--dpu-batch-size must be an integer >= 1 or 'auto', got {self.dpu_batch_size!r}")
        if self.auto_allow is not None:
            _check_choice("auto_allow", self.auto_allow, AUTO_ALLOWS)
            if self.mode is not Mode.AUTO:
                raise ConfigError(f"--auto-allow only applies to --mode auto (got --mode {self.mode})")
        self._check_reporting()
        if self.peer_timeout <= 0:
            raise ConfigError(f"--peer-timeout must be > 0 seconds, got {self.peer_timeout}")
        self._check_checkpointing()
        self._check_script()

    def _check_feeding(self) -> None:
        """--dpu-workers K (cores per stream on the DPU) and --da-host-share f with --da-host-workers H
        (the host ranks build a share of the steps themselves): only where DPU ranks augment."""
        for name in ("dpu_workers", "da_host_workers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.da_host_share != "auto" and not (
                isinstance(self.da_host_share, (int, float)) and 0 <= self.da_host_share <= 1):
            raise ConfigError(f"--da-host-share must be in [0, 1] (the share of every epoch's steps the host ranks "
                              f"build themselves) or 'auto', got {self.da_host_share!r}")
        augmenting = ("numerics", "numerics_samples", "wire")  # (what DPU ranks that augment do)
        for f in (f for f in dataclasses.fields(self) if f.name in augmenting):
            name = f.name
            if getattr(self, name) != f.default and self.mode not in (Mode.DA, Mode.HYBRID, Mode.AUTO):
                raise ConfigError(f"--{_flag(name)} only applies where DPU ranks augment (--mode da or hybrid), not "
                                  f"--mode {self.mode}")
        for name in ("dpu_workers", "da_host_share"):
            if getattr(self, name) and self.mode not in (Mode.DA, Mode.HYBRID, Mode.AUTO):
                raise ConfigError(f"--{_flag(name)} only applies where DPU ranks augment (--mode da or hybrid), not "
                                  f"--mode {self.mode}")

    def _check_script(self) -> None:
        """A user's script: only the offload flags apply (the rest configure the built-in trainer)."""
        if self.script is None:
            return
        if self.mode not in SCRIPT_MODES:
            raise ConfigError(f"--mode {self.mode} with a training script: the public API offloads data loading "
                              f"and validation so far; use --mode {', '.join(m.value for m in SCRIPT_MODES)} "
                              "(naive and auto run under the built-in trainer)")
        if self.mv_dpu_fraction == "auto":
            raise ConfigError("--mv-dpu-fraction auto needs the built-in trainer's epoch timings; with a script give "
                              "a number in [0, 1]")
        if self.da_host_share == "auto":
            raise ConfigError("--da-host-share auto measures the built-in trainer's training set at start-up, and a "
                              "script's loaders get their data sets later; with a script give a number in [0, 1] "
                              "(the built-in trainer on the same data prints the share auto picks)")
        defaults = RunConfig()
        for f in dataclasses.fields(self):
            if f.name not in SCRIPT_FIELDS and getattr(self, f.name) != getattr(defaults, f.name):
                raise ConfigError(f"--{_flag(f.name)} configures dpurun's built-in trainer; {self.script} runs "
                                  "its own loop: set it in the script (its own arguments go after the script's "
                                  "name) or drop it")

    def _check_reporting(self) -> None:
        """--tensorboard and --plots need optional packages: say so before launch, not after start-up."""
        if self.tensorboard is not None and not _installed("tensorboard"):
            raise ConfigError("--tensorboard needs the tensorboard package, which is not installed: "
                              "pip install tensorboard (or drop --tensorboard)")
        if self.plots and not self.log_dir:
            raise ConfigError("--plots writes <log-dir>/training.png: add --log-dir DIR")
        if self.plots and not _installed("matplotlib"):
            raise ConfigError("--plots needs matplotlib, which is not installed: pip install matplotlib")

    def _check_checkpointing(self) -> None:
        _check_choice("ckpt_copy", self.ckpt_copy, CKPT_COPIES)
        object.__setattr__(self, "ckpt_copy", StateCopy(self.ckpt_copy))
        _check_choice("ckpt_errors", self.ckpt_errors, CKPT_ERRORS)
        _check_choice("dpu_failure", self.dpu_failure, DPU_FAILURES)
        object.__setattr__(self, "dpu_failure", DpuFailure(self.dpu_failure))
        _check_choice("recovery", self.recovery, RECOVERY)
        object.__setattr__(self, "recovery", Recovery(self.recovery))
        if self.recovery_policy.survives_dpu_loss and self.trace:
            raise ConfigError("--trace gathers every rank's events at the end, which a dead rank would break: "
                              "leave out --trace or --dpu-failure fallback")
        if self.recovery_policy.survives_dpu_loss and self.mode.dpu_trains:
            raise ConfigError(f"--dpu-failure fallback: in --mode {self.mode} DPU ranks train, so a lost one is a "
                              "lost replica; use --mode da, mv, hybrid or none")
        self._check_recovery()
        for name in ("ckpt_every", "stop_at_step", "clone_at"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{_flag(name)} must be >= 1 (a global step number), got {value}")
        if self.ckpt_keep < 1:
            raise ConfigError(f"--ckpt-keep must be >= 1, got {self.ckpt_keep}")
        if self.ckpt_mem_keep < 0:
            raise ConfigError(f"--ckpt-mem-keep must be >= 0 (0: off), got {self.ckpt_mem_keep}")
        if self.ckpt_mem_replicas is not None and self.ckpt_mem_replicas < 0:
            raise ConfigError(f"--ckpt-mem-replicas must be >= 0 (0: no partner copies), got {self.ckpt_mem_replicas}")
        if self.ckpt_mem_budget is not None and self.ckpt_mem_budget < 1:
            raise ConfigError(f"--ckpt-mem-budget must be a size above 0 (e.g. 512M, 4G), got {self.ckpt_mem_budget}")
        if self.ckpt_mem_keep and not self.ckpt_dir:
            raise ConfigError("--ckpt-mem-keep keeps copies of the checkpoints in DPU memory: add --ckpt-dir DIR "
                              "(the disk copy, used when DPU memory is lost too)")
        wants = self.ckpt_every is not None or self.ckpt_every_epoch
        if wants and not self.ckpt_dir:
            raise ConfigError("--ckpt-every/--ckpt-every-epoch need --ckpt-dir DIR (where DPU ranks write "
                              "the checkpoint shards)")
        if self.resumes_newest and not self.ckpt_dir:
            raise ConfigError(f"--resume {self.resume} needs --ckpt-dir DIR to look in (or pass --resume DIR of "
                              "one checkpoint)")
        uses_state = wants or self.resume is not None or self.clone_at is not None
        if uses_state and self.mode in (Mode.NAIVE, Mode.AUTO):
            raise ConfigError(f"checkpoints, --resume and clones need DPU ranks that do not train, chosen up "
                              f"front: use --mode none, da, mv or hybrid, not {self.mode}")
        if self.clone_override and self.clone_at is None:
            raise ConfigError("--clone-override only applies with --clone-at STEP")
        from dpuoffload.common.faults.inject import parse_all, parse_simulated_all

        parse_all(self.inject)
        parse_simulated_all(self.inject_simulate)
        _check_choice("simulate_recovery", self.simulate_recovery, SIMULATED_SPELLINGS)
        object.__setattr__(self, "simulate_recovery", SimulatedRecovery.parse(self.simulate_recovery))
        if self.inject_simulate and self.mode in (Mode.NAIVE, Mode.AUTO):
            raise ConfigError(f"--inject-simulate fails host ranks' gradients in a run whose replicas are the host "
                              f"ranks: use --mode none, da, mv or hybrid, not {self.mode}")

    def _check_recovery(self) -> None:
        """`--recovery lossy-forward` / `rollback`: what they can survive so far, and the flags they cannot go with."""
        policy = self.recovery_policy
        if self.reassign and not policy.shrinks_group:
            raise ConfigError("--reassign hands a dead host rank's samples to the survivors: add --recovery "
                              "lossy-forward")
        if not policy.survives_host_loss:
            return
        validators = self.mode in (Mode.MV, Mode.HYBRID)
        refused: list[tuple[bool, Optional[str]]]  # (each `what` is set: the fields of _REFUSED_BY_RECOVERY have one)
        refused = [(self.mode not in (Mode.NONE, Mode.DA, Mode.MV, Mode.HYBRID), f"--mode {self.mode} (use none, "
                    "da, mv or hybrid: naive replicas are not survived yet)"),
                   (validators and policy.survives_dpu_loss, f"--dpu-failure fallback in --mode {self.mode} "
                    "(a dead DPU validation rank and a dead host rank are not survived in one run yet: drop one)"),
                   (validators and self.mv_dpu_fraction == "auto", "--mv-dpu-fraction auto (it measures on host "
                    "rank 0 at the start: give the DPU share as a number)"),
                   (self.allreduce in ("horovod", "torch"), f"--allreduce {self.allreduce} (Horovod and "
                    "torch.distributed cannot shrink their group: leave --allreduce out, or use mpi)"),
                   (policy.survives_dpu_loss and (self.ckpt_every is not None or self.ckpt_every_epoch),
                    "--dpu-failure fallback with checkpoints (a dead keeper and a dead host rank are not survived "
                    "in one run yet: drop one)")]
        refused += [(getattr(self, f.name) != f.default, meaning(f).refused_by_recovery) for f in _REFUSED_BY_RECOVERY]
        for bad, what in refused:
            if bad:
                raise ConfigError(f"--recovery {self.recovery} cannot go with {what}")
        object.__setattr__(self, "allreduce", "mpi")

    @property
    def recovery_policy(self) -> RecoveryPolicy:
        """What the run survives (`common.faults.policy`): every decision about a death asks this."""
        return RecoveryPolicy.of(self)

    @property
    def fault_tolerant(self) -> bool:
        """Whether the run must survive a dead rank: MPI started with fault tolerance (ULFM)."""
        return self.recovery_policy.needs_ulfm

    @property
    def resumes_newest(self) -> bool:
        """`--resume latest` or `--resume auto`: from the newest state kept (DPU memory or --ckpt-dir),
        not from one named directory."""
        return self.resume in (RESUME_LATEST, RESUME_AUTO)

    @property
    def resumes_if_any(self) -> bool:
        """`--resume auto`: as latest, but a run with nothing kept yet starts from the beginning (a
        relaunch by `dpurun --restarts`, a requeued batch job) instead of failing."""
        return self.resume == RESUME_AUTO

    @property
    def checkpointing(self) -> bool:
        """Whether host ranks hand checkpoint slices to DPU ranks during this run (a script decides
        when, with `job.checkpoint`: --ckpt-dir alone turns the keepers on)."""
        return self.ckpt_dir is not None and (self.script is not None or self.ckpt_every is not None
                                               or self.ckpt_every_epoch or self.stop_at_step is not None)

    @property
    def hands_state_off(self) -> bool:
        """Whether host ranks hand their state to DPU keepers at all in this run: for checkpoints, or
        for a clone at --clone-at (which also needs clone ranks, known only from the topology)."""
        return self.checkpointing or self.clone_at is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def config_hash(self) -> str:
        """A short stable digest of the resolved config, compared across ranks at start-up."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)


def meaning(f: dataclasses.Field) -> Meaning:
    """The `Meaning` declared with a `RunConfig` field (`flag(...)`)."""
    return f.metadata["meaning"]


def field_names(test: Callable[[Meaning], bool]) -> tuple[str, ...]:
    """`RunConfig`'s fields whose declared `Meaning` passes `test`, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(RunConfig) if test(meaning(f)))


# Derived from the declarations, for the code that asks (kept importable under their old names).
SCRIPT_FIELDS = field_names(lambda m: m.script)  # the flags that still mean something with a user's script
TUPLE_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig) if isinstance(f.default, tuple))  # repeatable
_REFUSED_BY_RECOVERY = tuple(f for f in dataclasses.fields(RunConfig) if meaning(f).refused_by_recovery)


def _installed(package: str) -> bool:
    """Whether `package` can be imported, without importing it (both are slow to import)."""
    return importlib.util.find_spec(package) is not None


def _flag(field_name: str) -> str:
    return field_name.replace("_", "-")


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"--{_flag(name)} {value!r} is not one of: {', '.join(choices)}")


# --------------------------------------------------------------------------------------- presets
def debug_preset() -> dict[str, Any]:
    """A tiny run (seconds per epoch on one core) that the demo and the tests reuse."""
    return dict(model="resnet20", dataset="cifar10", epochs=3, batch_size=16, val_batch_size=128,
                train_subset=512, val_subset=256, lr=0.05)


def default_preset() -> dict[str, Any]:
    """No overrides: the dataclass defaults."""
    return {}


PRESETS: dict[str, Callable[[], dict[str, Any]]] = {"default": default_preset, "debug": debug_preset}


# ---------------------------------------------------------------------------------------- parser
def build_parser(prog: str = "dpuoffload") -> argparse.ArgumentParser:
    """The training flags, shared by the host program, the DPU program and `dpurun` (after `--`)."""
    p = argparse.ArgumentParser(prog=prog, add_help=True,
                                description="Training flags (identical for host and DPU programs).")
    S = argparse.SUPPRESS  # unset flags fall back to the preset, then to the dataclass default
    p.add_argument("--preset", choices=sorted(PRESETS), default="default",
                   help="start from a named preset; explicit flags override it. debug = resnet20 on "
                        "cifar10, 3 epochs, batch 16, first 512 train / 256 val samples (default: default)")
    p.add_argument("--config", default=S, metavar="FILE.toml",
                   help="read training settings from a TOML file (keys: these flags' names, e.g. batch_size "
                        "or batch-size); order: --preset, then the file, then flags given here")
    p.add_argument("--mode", choices=MODES, default=S,
                   help="none: host ranks do everything; da: DPU ranks load and augment batches; mv: DPU "
                        "ranks validate epoch i during epoch i+1; hybrid: both; naive: DPU ranks train "
                        "as extra replicas; auto: profile a few steps, predict every mode's epoch time, "
                        "run the fastest")
    p.add_argument("--model", default=S, help="resnet20 | resnet56 | shufflenet_v2 | resnet50 | "
                   "module:function (a factory taking num_classes)")
    p.add_argument("--dataset", default=S, help="cifar10 | svhn | tinyimagenet | fake | "
                   "webdataset:PATTERN (tar shards, e.g. DIR/train-{000000..000005}.tar; val: the same with val) | "
                   "module:function (a factory taking root, train, download)")
    p.add_argument("--data", default=S, metavar="DIR", help="dataset root directory")
    p.add_argument("--download", action="store_true", default=S,
                   help="let torchvision download the dataset where it supports it")
    p.add_argument("--skip-corrupt", type=int, default=S, metavar="N",
                   help="leave out of its batch a training sample that fails to load (a corrupt file), each named in "
                        "a line, at most N per epoch and host rank; 0 (default): the first one stops the job")
    p.add_argument("--num-classes", type=int, default=S,
                   help="number of classes for a user dataset without a .classes attribute")
    p.add_argument("--epochs", type=int, default=S, help="training epochs")
    p.add_argument("--batch-size", type=int, default=S, help="per host rank batch size")
    p.add_argument("--val-batch-size", type=int, default=S, help="validation batch size")
    p.add_argument("--drop-last", action="store_true", default=S,
                   help="drop each rank's last partial batch of an epoch")
    p.add_argument("--train-subset", type=int, default=S, metavar="N",
                   help="train on the first N samples only (quick runs)")
    p.add_argument("--val-subset", type=int, default=S, metavar="N",
                   help="validate on the first N samples only")
    p.add_argument("--lr", type=float, default=S, help="peak SGD learning rate")
    p.add_argument("--momentum", type=float, default=S, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=S, help="SGD weight decay")
    p.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=S,
                   help="per-step learning-rate schedule")
    p.add_argument("--seed", type=int, default=S, help="seed for weights, sampler, augmentation and dropout")
    p.add_argument("--allreduce", choices=ALLREDUCE_BACKENDS, default=S,
                   help="gradient allreduce: horovod, torch (torch.distributed gloo), mpi (one MPI allreduce "
                        "through host memory) or auto = horovod when it imports (mpi under --recovery)")
    p.add_argument("--device", choices=DEVICES, default=S,
                   help="where host ranks train: cuda (one GPU per host rank, by its rank on its node), cpu, or "
                        "auto (cuda when torch sees a GPU) (default: auto); with a script, job.device says which")
    p.add_argument("--amp", choices=AMPS, default=S,
                   help="autocast the forward pass to bf16 or fp16 (fp16 with loss scaling) (default: off)")
    p.add_argument("--channels-last", action="store_true", default=S,
                   help="model and image batches in the channels-last memory layout (faster convolutions on GPUs)")
    p.add_argument("--log-dir", default=S, metavar="DIR",
                   help="write metrics.jsonl and per-rank phase timers (phases-rank<R>.jsonl) here")
    p.add_argument("--digest-batches", action="store_true", default=S,
                   help="log a sha256 of every epoch's training batches per host rank (to check that "
                        "offloaded batches equal locally built ones)")
    p.add_argument("--save-weights", default=S, metavar="PATH",
                   help="host rank 0 writes the final model state_dict here (torch.save; load with "
                        "torch.load(PATH, weights_only=True))")
    p.add_argument("--trace", default=S, metavar="PATH",
                   help="write one Chrome trace-event JSON of all ranks (steps, batches, validation "
                        "phases) to PATH; open it in https://ui.perfetto.dev")
    p.add_argument("--tensorboard", default=S, metavar="DIR",
                   help="host rank 0 writes the epoch metrics and step losses as TensorBoard events to DIR "
                        "(needs pip install tensorboard)")
    p.add_argument("--plots", action="store_true", default=S,
                   help="host rank 0 redraws <log-dir>/training.png (loss and accuracy per epoch, train and "
                        "val) after every epoch (needs --log-dir and matplotlib)")
    p.add_argument("--da-buffers", type=int, default=S, metavar="K",
                   help="--mode da: batch buffers per DPU rank, used as a circular send queue; "
                        "memory stays bounded by K batches")
    p.add_argument("--da-host-share", type=_fraction_or_auto, default=S, metavar="F|auto",
                   help="--mode da/hybrid: share of every epoch's steps each host rank builds itself (spread evenly: "
                        "0.25 is every 4th step), the DPU ranks the rest, so host and DPU cores feed together; "
                        "batches stay identical to --mode none; 'auto' picks it at start-up from measured "
                        "augmentation speeds on both sides so that neither waits for the other")
    p.add_argument("--da-host-workers", type=int, default=S, metavar="H",
                   help="--mode da/hybrid with --da-host-share: worker processes each host rank uses for its "
                        "share (0: in the training process itself)")
    p.add_argument("--numerics", choices=NUMERICS, default=S,
                   help="--mode da/hybrid: before training, every host rank builds the first --numerics-samples "
                        "samples of each loader itself and compares them, byte for byte, with its DPU rank's "
                        "(another CPU architecture or library version can round differently); on a difference "
                        "strict stops the job, warn prints the first differing transform step and trains on, "
                        "off skips the check")
    p.add_argument("--numerics-samples", type=int, default=S, metavar="N",
                   help="--numerics: samples of the training set compared per loader")
    p.add_argument("--wire", choices=WIRES, default=S,
                   help="--mode da/hybrid: what DPU ranks send. uint8: when the transform ends in element-wise float "
                        "steps (ToTensor, ConvertImageDtype, ToDtype, Normalize), the DPU ranks run the steps before "
                        "them and send uint8 images, and the host ranks run the float steps on each batch: 4x fewer "
                        "bytes, and no DPU float arithmetic to round differently; auto: uint8 where possible (float on "
                        "a GPU host rank, whose CPU would be slower than its GPU); float: the transform's output")
    p.add_argument("--dpu-workers", type=int, default=S, metavar="K",
                   help="--mode da/hybrid: worker processes each augmentation DPU rank forks per host rank it "
                        "feeds, to build that host's batches on K cores (0: in the DPU rank itself; a GPU host "
                        "needs several cores); batches stay identical to --mode none")
    p.add_argument("--mv-dpu-fraction", type=_fraction_or_auto, default=S, metavar="F|auto",
                   help="--mode mv/hybrid: fraction of the validation set the DPU ranks evaluate; the "
                        "host ranks evaluate the rest at epoch end; 'auto' picks it from measured "
                        "evaluation speeds")
    p.add_argument("--dpu-da-ranks", type=int, default=S, metavar="A",
                   help="--mode hybrid: DPU ranks doing data augmentation (default: host ranks / "
                        "--da-fanout, else half the DPU ranks)")
    p.add_argument("--dpu-mv-ranks", type=int, default=S, metavar="B",
                   help="--mode hybrid: DPU ranks doing validation (default: the other DPU ranks)")
    p.add_argument("--da-fanout", type=int, default=S, metavar="F",
                   help="--mode hybrid: host ranks fed by each augmentation rank (published layout: 2)")
    p.add_argument("--dpu-batch-size", type=_int_or_auto, default=S, metavar="b|auto",
                   help="--mode naive: batch size of each DPU replica; 'auto' measures a few steps on "
                        "both sides and balances step times (the published balance was 2 vs 16) "
                        "(default: auto)")
    p.add_argument("--auto-allow", choices=AUTO_ALLOWS, default=S, metavar="naive",
                   help="--mode auto: also consider naive, which trains a different model (other batch sizes "
                        "and step counts); without it auto picks only modes that keep the math of none")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=S,
                   help="no progress bar on host rank 0")
    p.add_argument("--peer-timeout", type=float, default=S, metavar="SECONDS",
                   help="abort the job when a peer does not answer within this time")
    p.add_argument("--script", default=S, metavar="PATH",
                   help="the user's training script the host ranks run (dpurun sets it from `dpurun -- [flags] "
                        "train.py [args]`; the DPU ranks import its module-level classes)")
    add_checkpoint_flags(p)
    _append_defaults(p)
    return p


def _append_defaults(p: argparse.ArgumentParser) -> None:
    """Write every flag's default into its help from `RunConfig` itself, so the two never disagree.

    Flags are parsed with `default=SUPPRESS` (unset flags fall back to the preset, then to the
    dataclass default), so argparse cannot show the default; this does. Flags whose help already
    explains a computed default (`(default: ...)`) and flags off by default are left alone.
    """
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for action in p._actions:
        value = defaults.get(action.dest)
        if action.help is None or "(default" in action.help or value in (None, False, True, ()):
            continue
        action.help += f" (default: {value})"


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'512M', '4G', '1.5G', '2048' (bytes) -> bytes; binary units (K = 1024), an optional trailing B."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write e.g. 512M, 4G or a number of bytes") from None
    return int(value * _UNITS[unit])


def add_checkpoint_flags(p: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS
    g = p.add_argument_group("checkpoints and clones (state goes host -> DPU in slices; DPU ranks write it)")
    g.add_argument("--ckpt-dir", default=S, metavar="DIR",
                   help="directory for checkpoints (step-<N>/ with shards, manifest.json, COMMITTED); must be "
                        "visible to every rank (a shared file system on a cluster)")
    g.add_argument("--ckpt-every", type=int, default=S, metavar="N",
                   help="checkpoint after every N optimizer steps (global step count)")
    g.add_argument("--ckpt-every-epoch", action="store_true", default=S,
                   help="checkpoint at the end of every epoch (after validation hand-off)")
    g.add_argument("--ckpt-keep", type=int, default=S, metavar="K",
                   help="keep the K newest complete checkpoints, delete older ones")
    g.add_argument("--ckpt-mem-keep", type=int, default=S, metavar="K",
                   help="DPU ranks also keep the K newest checkpoints in their memory (/dev/shm, it outlives "
                        "the job), so `--resume latest` after a failure restarts from DPU memory without "
                        "reading the disk; 0 = off (dpurun --restarts sets 2)")
    g.add_argument("--ckpt-mem-replicas", type=int, default=S, metavar="R",
                   help="with --ckpt-mem-keep: each DPU also keeps a copy of the hand-offs of the DPUs of R "
                        "other nodes (a ring by node), so a restart after a whole node is lost still finds "
                        "every shard in DPU memory; default 1 with DPU ranks on >= 2 nodes, else 0")
    g.add_argument("--ckpt-mem-budget", type=parse_size, default=S, metavar="SIZE",
                   help="with --ckpt-mem-keep: the most this run keeps in one DPU's memory (its own "
                        "hand-offs and the copies it holds), e.g. 512M or 4G; a step over it is kept on "
                        "disk only (said once); default a quarter of the DPU's RAM")
    g.add_argument("--ckpt-copy", choices=CKPT_COPIES, default=S,
                   help="staged: host ranks copy their slice into a send buffer and go on (blocks for the "
                        "copy); overlap: the copy runs in the background beside the next step's forward and "
                        "backward (a GPU's on a side stream into pinned memory), the next optimizer step waits "
                        "for what is left of it (a script's job.checkpoint waits at once); zero: send straight "
                        "from the weights and wait for the send before the next optimizer step (CPU only)")
    g.add_argument("--ckpt-errors", choices=CKPT_ERRORS, default=S,
                   help="a checkpoint that cannot be written (disk full, permissions): continue = train on, "
                        "try again at the next one and exit non-zero at the end naming the newest intact "
                        "checkpoint; fail = stop the job at the first failure")
    g.add_argument("--resume", default=S, metavar="DIR|latest|auto",
                   help="continue from a checkpoint directory (step-<N>) or the newest state kept (DPU "
                        "memory or --ckpt-dir; auto: start from the beginning if none is, as a relaunch "
                        "or a requeued job does); same host rank count resumes to the bit, another "
                        "count re-slices")
    g.add_argument("--stop-at-step", type=int, default=S, metavar="N",
                   help="stop after global step N (e.g. before a job time limit); with --ckpt-dir a "
                        "checkpoint is taken there. The LR schedule still spans --epochs")
    g.add_argument("--clone-at", type=int, default=S, metavar="STEP",
                   help="hand the state after global step STEP to the clone ranks (dpurun --clone-ranks M), "
                        "which continue as their own data-parallel group")
    g.add_argument("--clone-override", action="append", default=S, metavar="KEY=VALUE",
                   help="a training flag the clone group uses instead of the original's (repeatable), e.g. "
                        "lr=0.01, seed=1, weight_decay=0, epochs=5, train_subset=256")
    g.add_argument("--inject", action="append", default=S, metavar="WHO@WHEN[:HOW]",
                   help="fail a rank on purpose (repeatable, or comma-separated): WHO host:R, dpu:R or node:N; "
                        "WHEN a global step or a fraction of the run's steps; HOW kill (default), term, stop "
                        "(a hang) or raise, e.g. host:1@12 or dpu:0@0.5:stop")
    g.add_argument("--dpu-failure", choices=DPU_FAILURES, default=S,
                   help="a DPU rank that dies: stop = the job ends (Open MPI's way); fallback = training goes on "
                        "under MPI fault tolerance (dpurun adds mpirun --with-ft ulfm): the host ranks a dead "
                        "augmentation rank fed build their own batches from that step, the same ones; after a dead "
                        "validation rank the host ranks validate (what it had not reported again, from state "
                        "they kept); a dead checkpoint keeper's host ranks hand their state to the living keepers "
                        "from the next checkpoint (the one it died in is never committed; not with clones). A host "
                        "rank's death still ends the job, naming it")
    g.add_argument("--recovery", choices=RECOVERY, default=S,
                   help="a host rank that dies: stop = the job ends, naming it (dpurun --restarts N relaunches "
                        "it); lossy-forward = the survivors finish the failed step with their own gradients and "
                        "go on under MPI fault tolerance (dpurun adds mpirun --with-ft ulfm; --allreduce mpi), "
                        "its samples of that step and of the rest of its epoch lost, then taken over by the "
                        "survivors; rollback = a spare rank (dpurun --spare-ranks S) takes its place with a "
                        "survivor's state and replays the failed step, bit-exact with a run without the failure; "
                        "--mode none, da, mv or hybrid (the DPU validation ranks take each epoch's state from the "
                        "host ranks alive then); with checkpoints, both: lossy-forward slices them among the "
                        "survivors (one torn by the death is never committed), rollback's spare sends the dead "
                        "rank's part, so none is torn")
    g.add_argument("--reassign", action="store_true", default=S,
                   help="with --recovery lossy-forward: the survivors take a dead host rank's batches over from "
                        "the very next step, so only the failed step's samples are lost")
    g.add_argument("--inject-simulate", action="append", default=S, metavar="WHO@WHEN[:P]",
                   help="simulate a failure as the recovery study does, no process lost (repeatable, or "
                        "comma-separated): host rank R (host:R, node:N) loses the gradients after share P of the "
                        "backward pass of global step WHEN (default 50%%), e.g. host:1@12:25%%")
    g.add_argument("--simulate-recovery", choices=SIMULATED_SPELLINGS, default=S, metavar="{lossy-forward,rollback}",
                   help="--inject-simulate's recovery, named as --recovery names them: lossy-forward (the survivors "
                        "average the lost gradients and go on) or rollback (immediate rollback: replay the "
                        "mini-batch) (default: lossy-forward; the old lf / ir still work, with a deprecation message)")


def _or_auto(cast: Callable[[str], Any], expected: str) -> Callable[[str], Any]:
    """An argparse type accepting 'auto' or a value `cast` can parse."""
    def parse(text: str) -> Any:
        if text == "auto":
            return "auto"
        try:
            return cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected} or 'auto', got {text!r}") from None
    return parse


_int_or_auto = _or_auto(int, "an integer")
_fraction_or_auto = _or_auto(float, "a number in [0, 1]")


def parse_run_config(argv: Optional[Sequence[str]] = None, prog: str = "dpuoffload") -> RunConfig:
    """Parse training flags into a `RunConfig`: the preset, then `--config FILE`, then explicit flags.

    Raises:
        ConfigError: a value is out of range or an unknown choice.
        SystemExit: argparse's own usage errors (unknown flag, wrong type).
    """
    flags = vars(build_parser(prog).parse_args(argv))
    preset, path = flags.pop("preset"), flags.pop("config", None)
    values = PRESETS[preset]()
    if path is not None:
        values.update(read_config_file(path))
    values.update(flags)
    for name in TUPLE_FIELDS:
        if name in values:
            values[name] = tuple(values[name])
    return RunConfig(**values)


# ----------------------------------------------------------------------------------- config files
def read_config_file(path: str) -> dict[str, Any]:
    """The settings of a TOML config file (`--config`), checked against `RunConfig`'s fields.

    Keys are field names (`batch_size`) or flag spellings (`batch-size`). Every rank reads the same
    file (dpurun passes the same argv to all), so they resolve the same config and the same hash.

    Raises:
        ConfigError: the file is missing or not TOML, or has unknown keys or values of the wrong
            type (all problems in one message, each with its fix).
    """
    try:
        with open(path, "rb") as f:
            table = _toml().load(f)
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read it ({e.strerror or e}); give an existing TOML file") from None
    except ValueError as e:  # tomllib.TOMLDecodeError
        raise ConfigError(f"--config {path}: not valid TOML ({e}); see examples/debug.toml") from None
    values, problems = {}, []
    for key, value in table.items():
        name = key.replace("-", "_")
        try:
            values[name] = _config_value(name, value)
        except ValueError as e:
            problems.append(f"{key!r} {e}")
    if problems:
        raise ConfigError(f"--config {path}: " + "; ".join(problems))
    return values


def _toml() -> Any:
    """tomllib (Python 3.11+) or its backport tomli (3.10, a dependency there)."""
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    import tomli
    return tomli


def _config_value(name: str, value: Any) -> Any:
    """`value` as field `name` takes it; ValueError (worded to follow the key) when it cannot."""
    hints = typing.get_type_hints(RunConfig)
    if name not in hints:
        close = difflib.get_close_matches(name, hints, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"is not a setting: {hint}keys are training flag names without the dashes "
                         f"(e.g. batch_size), see {PROG_HELP}")
    if name in TUPLE_FIELDS and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    allowed = _toml_types(hints[name])
    if isinstance(value, bool) != (bool in allowed) or not isinstance(value, allowed):
        wanted = " or ".join(t.__name__ for t in allowed)
        raise ValueError(f"must be {wanted}, got {type(value).__name__} {value!r}: write it as "
                         f"{name} = {_example(allowed)}")
    if float in allowed and isinstance(value, int):  # so `lr = 1` hashes like `--lr 1`
        return float(value)
    return value


def _toml_types(hint: Any) -> tuple[type, ...]:
    """The TOML value types a field accepts (a float field takes an integer too; TOML has no null)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    types: list[type] = []
    for a in args:
        a = str if a is Mode else typing.get_origin(a) or a
        types += [float, int] if a is float else [list] if a is tuple else [a]
    return tuple(dict.fromkeys(types))


def _example(types: tuple[type, ...]) -> str:
    return {bool: "true", int: "16", float: "0.05", str: '"text"', list: '["lr=0.01"]'}[types[0]]


PROG_HELP = "dpurun -- --help"
