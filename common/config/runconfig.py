"""`RunConfig`: every section of the run config (`common.config.sections`) in one flat, frozen,
hashable dataclass, checked across its sections; and the tables derived from its fields' declarations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

from dpuoffload.common.config.fields import Meaning, flag_name, meaning
from dpuoffload.common.config.sections import (
    SECTIONS,
    CheckpointConfig,
    DataConfig,
    LaunchConfig,
    OffloadConfig,
    RecoveryConfig,
    ReportingConfig,
    TrainingConfig,
)
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.policy import RecoveryPolicy
from dpuoffload.common.modes import AllReduce, Device, Mode

SCRIPT_MODES = (Mode.NONE, Mode.DA, Mode.MV, Mode.HYBRID)  # the modes the public API (a user's script) serves so far
_REPLICA_MODES = (Mode.NAIVE, Mode.AUTO)  # the DPU ranks train (naive), or may, decided at start-up (auto)


@dataclass(frozen=True, kw_only=True)
class RunConfig(LaunchConfig, ReportingConfig, RecoveryConfig, CheckpointConfig, OffloadConfig, TrainingConfig,
                DataConfig):
    """Everything that must be identical on every rank of a run.

    One field per training flag (`--batch-size` is `batch_size`), declared in the section of its concern
    (`DataConfig`, `TrainingConfig`, ... in `sections`), with what it means beyond its flag (`flag(...)`,
    `Meaning`). The config itself stays flat: `cfg.batch_size`, and a JSON form (`to_dict`, `config_hash`)
    that is the checkpoints' and the start-up handshake's. The bases are listed last section first because
    a dataclass collects its bases' fields in reverse MRO order: the fields come out data first, launch last,
    in `SECTIONS` order (tests/unit/test_config_sections.py holds the order and the hashes).

    Checked when built (`check`): each section's own checks, then the checks that span two sections, here.
    Per-side knobs that may legitimately differ (threads per rank, core pinning, throttling) are launcher
    concerns passed through the environment, not part of this config or its hash.
    """

    def check(self) -> None:
        """Each section's checks (in `SECTIONS` order), then the checks across sections: what modes whose
        DPU ranks train refuse, what fault tolerance refuses, and what a user's script leaves out."""
        for section in SECTIONS:
            section.check(self)
        self._check_replicas()
        self._check_fault_tolerance()
        self._check_script()

    def _check_replicas(self) -> None:
        """--mode naive (and auto, which may pick it): the DPU ranks train as replicas, chosen at start-up."""
        if self.device is Device.CUDA and self.mode in _REPLICA_MODES:
            raise ConfigError(f"--device cuda with --mode {self.mode}: the DPU ranks would train as replicas on "
                              "their CPUs beside GPU host ranks; use --mode none, da, mv or hybrid")
        if self.skip_corrupt and self.mode is Mode.NAIVE:
            raise ConfigError("--skip-corrupt with --mode naive: its replicas' batches are dealt by size from one "
                              "plan, which a left-out sample would break; use --mode none, da, mv or hybrid")
        uses_state = self.scheduled_checkpoints or self.resume is not None or self.clone_at is not None
        if uses_state and self.mode in _REPLICA_MODES:
            raise ConfigError(f"checkpoints, --resume and clones need DPU ranks that do not train, chosen up "
                              f"front: use --mode none, da, mv or hybrid, not {self.mode}")
        if self.inject_simulate and self.mode in _REPLICA_MODES:
            raise ConfigError(f"--inject-simulate fails host ranks' gradients in a run whose replicas are the host "
                              f"ranks: use --mode none, da, mv or hybrid, not {self.mode}")

    def _check_fault_tolerance(self) -> None:
        """`--dpu-failure fallback`, `--recovery lossy-forward` / `rollback`: what they can survive so far,
        and the flags they cannot go with. A run that survives a host rank's death reduces with MPI."""
        policy = self.recovery_policy
        if policy.survives_dpu_loss and self.trace:
            raise ConfigError("--trace gathers every rank's events at the end, which a dead rank would break: "
                              "leave out --trace or --dpu-failure fallback")
        if policy.survives_dpu_loss and self.mode.dpu_trains:
            raise ConfigError(f"--dpu-failure fallback: in --mode {self.mode} DPU ranks train, so a lost one is a "
                              "lost replica; use --mode da, mv, hybrid or none")
        if not policy.survives_host_loss:
            return
        validators = self.mode.validates_on_dpu
        refused: list[tuple[bool, Optional[str]]]  # (each `what` is set: the fields of _REFUSED_BY_RECOVERY have one)
        refused = [(self.mode not in (Mode.NONE, Mode.DA, Mode.MV, Mode.HYBRID), f"--mode {self.mode} (use none, "
                    "da, mv or hybrid: naive replicas are not survived yet)"),
                   (validators and policy.survives_dpu_loss, f"--dpu-failure fallback in --mode {self.mode} "
                    "(a dead DPU validation rank and a dead host rank are not survived in one run yet: drop one)"),
                   (validators and self.mv_dpu_fraction == "auto", "--mv-dpu-fraction auto (it measures on host "
                    "rank 0 at the start: give the DPU share as a number)"),
                   (not self.allreduce.shrinks, f"--allreduce {self.allreduce} (Horovod and "
                    "torch.distributed cannot shrink their group: leave --allreduce out, or use mpi)"),
                   (policy.survives_dpu_loss and self.scheduled_checkpoints,
                    "--dpu-failure fallback with checkpoints (a dead keeper and a dead host rank are not survived "
                    "in one run yet: drop one)")]
        refused += [(getattr(self, f.name) != f.default, meaning(f).refused_by_recovery) for f in _REFUSED_BY_RECOVERY]
        for bad, what in refused:
            if bad:
                raise ConfigError(f"--recovery {self.recovery} cannot go with {what}")
        object.__setattr__(self, "allreduce", AllReduce.MPI)

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
                raise ConfigError(f"--{flag_name(f.name)} configures dpurun's built-in trainer; {self.script} runs "
                                  "its own loop: set it in the script (its own arguments go after the script's "
                                  "name) or drop it")

    @property
    def recovery_policy(self) -> RecoveryPolicy:
        """What the run survives (`common.faults.policy`): every decision about a death asks this."""
        return RecoveryPolicy.of(self)

    @property
    def fault_tolerant(self) -> bool:
        """Whether the run must survive a dead rank: MPI started with fault tolerance (ULFM)."""
        return self.recovery_policy.needs_ulfm

    @property
    def checkpointing(self) -> bool:
        """Whether host ranks hand checkpoint slices to DPU ranks during this run (a script decides
        when, with `job.checkpoint`: --ckpt-dir alone turns the keepers on)."""
        return self.ckpt_dir is not None and (self.script is not None or self.scheduled_checkpoints
                                               or self.stop_at_step is not None)

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


def field_names(test: Callable[[Meaning], bool]) -> tuple[str, ...]:
    """`RunConfig`'s fields whose declared `Meaning` passes `test`, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(RunConfig) if test(meaning(f)))


# Derived from the declarations, for the code that asks (kept importable under their old names).
SCRIPT_FIELDS = field_names(lambda m: m.script)  # the flags that still mean something with a user's script
TUPLE_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig) if isinstance(f.default, tuple))  # repeatable
_REFUSED_BY_RECOVERY = tuple(f for f in dataclasses.fields(RunConfig) if meaning(f).refused_by_recovery)
