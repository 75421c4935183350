"""`RunConfig`'s sections: one frozen dataclass per concern (`Concern`), each declaring its fields
with `flag(...)` and checking them in `check`. `RunConfig` inherits them all (`common.config.runconfig`),
so code reads one flat config (`cfg.batch_size`) and its JSON form is the checkpoints' and the start-up
handshake's, field for field in this file's order. What a section checks needs its own fields alone;
checks that span two sections are `RunConfig.check`'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

from dpuoffload.common.config.fields import (
    Concern,
    InClone,
    OnResume,
    Section,
    at_least,
    check_choice,
    choose,
    flag,
    flag_name,
    installed,
)
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.policy import (
    SIMULATED_SPELLINGS,
    DpuFailure,
    Recovery,
    RecoveryPolicy,
    SimulatedRecovery,
)
from dpuoffload.common.modes import AllReduce, Amp, CkptErrors, Device, LrSchedule, Mode, Numerics, StateCopy, Wire
from dpuoffload.common.state.ckptdirs import RESUME_AUTO, RESUME_LATEST

# The flags' choices (`--help`, and what a bad value's message lists), in the enums' order.
MODES = tuple(m.value for m in Mode)
ALLREDUCE_BACKENDS = tuple(a.value for a in AllReduce)
DEVICES = tuple(d.value for d in Device)
AMPS = tuple(a.value for a in Amp)
LR_SCHEDULES = tuple(s.value for s in LrSchedule)
CKPT_ERRORS = tuple(e.value for e in CkptErrors)
DPU_FAILURES = tuple(f.value for f in DpuFailure)
RECOVERY = tuple(r.value for r in Recovery)  # what a dead host rank does to the run
NUMERICS = tuple(n.value for n in Numerics)
WIRES = tuple(w.value for w in Wire)
CKPT_COPIES = tuple(c.value for c in StateCopy)
AUTO_ALLOWS = ("naive",)  # modes that change the math, which --mode auto considers only on request


@dataclass(frozen=True, kw_only=True)
class DataConfig(Section):
    """What the model is trained and validated on."""

    dataset: str = flag("cifar10", Concern.DATA, resume=OnResume.FATAL)
    data: Optional[str] = flag(None, Concern.DATA, resume=OnResume.FREE)
    download: bool = flag(False, Concern.DATA, resume=OnResume.FREE)
    num_classes: Optional[int] = flag(None, Concern.DATA, resume=OnResume.FATAL)
    train_subset: Optional[int] = flag(None, Concern.DATA, clone=InClone.OVERRIDE)
    val_subset: Optional[int] = flag(None, Concern.DATA, clone=InClone.OVERRIDE)
    skip_corrupt: int = flag(0, Concern.DATA, script=True, resume=OnResume.FREE)

    def check(self) -> None:
        at_least(self, 0, "skip_corrupt")
        at_least(self, 1, "train_subset", "val_subset", "num_classes")


@dataclass(frozen=True, kw_only=True)
class TrainingConfig(Section):
    """The model, the optimizer, and where the host ranks compute."""

    model: str = flag("resnet20", Concern.TRAINING, resume=OnResume.FATAL)
    epochs: int = flag(3, Concern.TRAINING, clone=InClone.OVERRIDE)
    batch_size: int = flag(32, Concern.TRAINING, clone=InClone.OVERRIDE)
    val_batch_size: int = flag(128, Concern.TRAINING, resume=OnResume.FREE)
    drop_last: bool = flag(False, Concern.TRAINING, clone=InClone.OVERRIDE)
    lr: float = flag(0.05, Concern.TRAINING, clone=InClone.OVERRIDE)
    momentum: float = flag(0.9, Concern.TRAINING, clone=InClone.OVERRIDE)
    weight_decay: float = flag(5e-4, Concern.TRAINING, clone=InClone.OVERRIDE)
    lr_schedule: LrSchedule = flag(LrSchedule.COSINE, Concern.TRAINING, clone=InClone.OVERRIDE)
    seed: int = flag(0, Concern.TRAINING, clone=InClone.OVERRIDE)
    allreduce: AllReduce = flag(AllReduce.AUTO, Concern.TRAINING, resume=OnResume.FREE, clone=InClone.OVERRIDE)
    device: Device = flag(Device.AUTO, Concern.TRAINING, script=True, resume=OnResume.FREE)
    amp: Amp = flag(Amp.OFF, Concern.TRAINING, resume=OnResume.FREE)
    channels_last: bool = flag(False, Concern.TRAINING, resume=OnResume.FREE)

    def check(self) -> None:
        for name, kind in (("allreduce", AllReduce), ("lr_schedule", LrSchedule), ("device", Device), ("amp", Amp)):
            choose(self, name, kind)
        at_least(self, 1, "epochs", "batch_size", "val_batch_size")
        if self.lr <= 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"--momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ConfigError(f"--weight-decay must be >= 0, got {self.weight_decay}")


@dataclass(frozen=True, kw_only=True)
class OffloadConfig(Section):
    """What the DPU ranks do for the host ranks."""

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

    def check(self) -> None:
        choose(self, "mode", Mode)
        at_least(self, 1, "da_buffers")
        if self.mv_dpu_fraction != "auto" and not (
                isinstance(self.mv_dpu_fraction, (int, float)) and 0 <= self.mv_dpu_fraction <= 1):
            raise ConfigError(f"--mv-dpu-fraction must be a number in [0, 1] or 'auto', got {self.mv_dpu_fraction!r}")
        choose(self, "numerics", Numerics)
        choose(self, "wire", Wire)
        if self.numerics_samples < 1:
            raise ConfigError(f"--numerics-samples must be >= 1, got {self.numerics_samples} (to skip the check: "
                              "--numerics off)")
        self._check_feeding()
        for name in ("dpu_da_ranks", "dpu_mv_ranks", "da_fanout"):
            at_least(self, 1, name)
            if getattr(self, name) is not None and self.mode not in (Mode.HYBRID, Mode.AUTO):
                raise ConfigError(f"--{flag_name(name)} only applies to --mode hybrid (got --mode {self.mode})")
        if self.dpu_batch_size is not None:
            if self.mode not in (Mode.NAIVE, Mode.AUTO):
                raise ConfigError(f"--dpu-batch-size only applies to --mode naive (got --mode {self.mode})")
            valid = isinstance(self.dpu_batch_size, int) and self.dpu_batch_size >= 1
            if self.dpu_batch_size != "auto" and not valid:
                raise ConfigError(f"--dpu-batch-size must be an integer >= 1 or 'auto', got {self.dpu_batch_size!r}")
        if self.auto_allow is not None:
            check_choice("auto_allow", self.auto_allow, AUTO_ALLOWS)
            if self.mode is not Mode.AUTO:
                raise ConfigError(f"--auto-allow only applies to --mode auto (got --mode {self.mode})")

    def _check_feeding(self) -> None:
        """--dpu-workers K (cores per stream on the DPU) and --da-host-share f with --da-host-workers H
        (the host ranks build a share of the steps themselves): only where DPU ranks augment."""
        at_least(self, 0, "dpu_workers", "da_host_workers")
        if self.da_host_share != "auto" and not (
                isinstance(self.da_host_share, (int, float)) and 0 <= self.da_host_share <= 1):
            raise ConfigError(f"--da-host-share must be in [0, 1] (the share of every epoch's steps the host ranks "
                              f"build themselves) or 'auto', got {self.da_host_share!r}")
        augmenting = ("numerics", "numerics_samples", "wire")  # (what DPU ranks that augment do)
        given = [f.name for f in dataclasses.fields(self)
                 if f.name in augmenting and getattr(self, f.name) != f.default]
        for name in given + [n for n in ("dpu_workers", "da_host_share") if getattr(self, n)]:
            if self.mode not in (Mode.DA, Mode.HYBRID, Mode.AUTO):
                raise ConfigError(f"--{flag_name(name)} only applies where DPU ranks augment (--mode da or hybrid), "
                                  f"not --mode {self.mode}")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig(Section):
    """State handed to the DPU ranks, written, resumed, or continued by clones."""

    ckpt_dir: Optional[str] = flag(None, Concern.CHECKPOINT, script=True, resume=OnResume.FREE, clone=InClone.RESET)
    ckpt_every: Optional[int] = flag(None, Concern.CHECKPOINT, resume=OnResume.FREE, clone=InClone.RESET)
    ckpt_every_epoch: bool = flag(False, Concern.CHECKPOINT, resume=OnResume.FREE, clone=InClone.RESET)
    ckpt_keep: int = flag(2, Concern.CHECKPOINT, script=True, resume=OnResume.FREE)
    ckpt_mem_keep: int = flag(0, Concern.CHECKPOINT, resume=OnResume.FREE)
    ckpt_mem_replicas: Optional[int] = flag(None, Concern.CHECKPOINT, resume=OnResume.FREE)
    ckpt_mem_budget: Optional[int] = flag(None, Concern.CHECKPOINT, resume=OnResume.FREE)
    ckpt_copy: StateCopy = flag(StateCopy.STAGED, Concern.CHECKPOINT, script=True, resume=OnResume.FREE)
    ckpt_errors: CkptErrors = flag(CkptErrors.CONTINUE, Concern.CHECKPOINT, script=True)
    resume: Optional[str] = flag(None, Concern.CHECKPOINT, script=True, resume=OnResume.FREE, clone=InClone.RESET)
    stop_at_step: Optional[int] = flag(None, Concern.CHECKPOINT, resume=OnResume.FREE,
                                       clone=InClone.RESET | InClone.OVERRIDE)
    clone_at: Optional[int] = flag(None, Concern.CHECKPOINT, script=True, resume=OnResume.FREE, clone=InClone.RESET,
                                   refused_by_recovery="clones (the clone ranks wait for every host rank's slice)")
    clone_override: tuple[str, ...] = flag((), Concern.CHECKPOINT, resume=OnResume.FREE, clone=InClone.RESET)

    def check(self) -> None:
        choose(self, "ckpt_copy", StateCopy)
        choose(self, "ckpt_errors", CkptErrors)
        at_least(self, 1, "ckpt_every", "stop_at_step", "clone_at", why=" (a global step number)")
        at_least(self, 1, "ckpt_keep")
        at_least(self, 0, "ckpt_mem_keep", why=" (0: off)")
        at_least(self, 0, "ckpt_mem_replicas", why=" (0: no partner copies)")
        if self.ckpt_mem_budget is not None and self.ckpt_mem_budget < 1:
            raise ConfigError(f"--ckpt-mem-budget must be a size above 0 (e.g. 512M, 4G), got {self.ckpt_mem_budget}")
        if self.ckpt_mem_keep and not self.ckpt_dir:
            raise ConfigError("--ckpt-mem-keep keeps copies of the checkpoints in DPU memory: add --ckpt-dir DIR "
                              "(the disk copy, used when DPU memory is lost too)")
        if self.scheduled_checkpoints and not self.ckpt_dir:
            raise ConfigError("--ckpt-every/--ckpt-every-epoch need --ckpt-dir DIR (where DPU ranks write "
                              "the checkpoint shards)")
        if self.resumes_newest and not self.ckpt_dir:
            raise ConfigError(f"--resume {self.resume} needs --ckpt-dir DIR to look in (or pass --resume DIR of "
                              "one checkpoint)")
        if self.clone_override and self.clone_at is None:
            raise ConfigError("--clone-override only applies with --clone-at STEP")

    @property
    def scheduled_checkpoints(self) -> bool:
        """--ckpt-every or --ckpt-every-epoch: the built-in trainer checkpoints at steps of its own."""
        return self.ckpt_every is not None or self.ckpt_every_epoch

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


@dataclass(frozen=True, kw_only=True)
class RecoveryConfig(Section):
    """What a dead rank does to the run, and failures on purpose."""

    dpu_failure: DpuFailure = flag(DpuFailure.STOP, Concern.RECOVERY, resume=OnResume.FREE)
    recovery: Recovery = flag(Recovery.STOP, Concern.RECOVERY, resume=OnResume.FREE)
    reassign: bool = flag(False, Concern.RECOVERY, resume=OnResume.FREE)
    inject: tuple[str, ...] = flag((), Concern.RECOVERY, resume=OnResume.FREE)
    inject_simulate: tuple[str, ...] = flag(
        (), Concern.RECOVERY, resume=OnResume.FREE,
        refused_by_recovery="--inject-simulate (simulated and real failures: one at a time)")
    simulate_recovery: SimulatedRecovery = flag(SimulatedRecovery.LOSSY_FORWARD, Concern.RECOVERY,
                                                resume=OnResume.FREE)

    def check(self) -> None:
        choose(self, "dpu_failure", DpuFailure)
        choose(self, "recovery", Recovery)
        if self.reassign and not RecoveryPolicy(self.recovery, self.dpu_failure).shrinks_group:
            raise ConfigError("--reassign hands a dead host rank's samples to the survivors: add --recovery "
                              "lossy-forward")
        from dpuoffload.common.faults.inject import parse_all, parse_simulated_all

        parse_all(self.inject)
        parse_simulated_all(self.inject_simulate)
        check_choice("simulate_recovery", self.simulate_recovery, SIMULATED_SPELLINGS)
        object.__setattr__(self, "simulate_recovery", SimulatedRecovery.parse(self.simulate_recovery))


@dataclass(frozen=True, kw_only=True)
class ReportingConfig(Section):
    """What the run writes and prints besides training."""

    log_dir: Optional[str] = flag(None, Concern.REPORTING, script=True, resume=OnResume.FREE, clone=InClone.SUBDIR)
    progress: bool = flag(True, Concern.REPORTING, script=True, resume=OnResume.FREE)
    digest_batches: bool = flag(False, Concern.REPORTING, resume=OnResume.FREE)
    save_weights: Optional[str] = flag(None, Concern.REPORTING, resume=OnResume.FREE,
                                       clone=InClone.RESET | InClone.OVERRIDE)
    trace: Optional[str] = flag(None, Concern.REPORTING, resume=OnResume.FREE, clone=InClone.RESET,
                                refused_by_recovery="--trace (its end-of-run gather needs every rank)")
    tensorboard: Optional[str] = flag(None, Concern.REPORTING)
    plots: bool = flag(False, Concern.REPORTING)

    def check(self) -> None:
        """--tensorboard and --plots need optional packages: say so before launch, not after start-up."""
        if self.tensorboard is not None and not installed("tensorboard"):
            raise ConfigError("--tensorboard needs the tensorboard package, which is not installed: "
                              "pip install tensorboard (or drop --tensorboard)")
        if self.plots and not self.log_dir:
            raise ConfigError("--plots writes <log-dir>/training.png: add --log-dir DIR")
        if self.plots and not installed("matplotlib"):
            raise ConfigError("--plots needs matplotlib, which is not installed: pip install matplotlib")


@dataclass(frozen=True, kw_only=True)
class LaunchConfig(Section):
    """How the ranks find and wait for each other, and what the host ranks run."""

    peer_timeout: float = flag(600.0, Concern.LAUNCH, script=True, resume=OnResume.FREE)
    script: Optional[str] = flag(None, Concern.LAUNCH, script=True,
                                 refused_by_recovery="a training script (the built-in trainer only, so far)")

    def check(self) -> None:
        if self.peer_timeout <= 0:
            raise ConfigError(f"--peer-timeout must be > 0 seconds, got {self.peer_timeout}")


# In declaration order: `RunConfig`'s fields are these sections' fields, in this order.
SECTIONS: tuple[type[Section], ...] = (DataConfig, TrainingConfig, OffloadConfig, CheckpointConfig, RecoveryConfig,
                                       ReportingConfig, LaunchConfig)
