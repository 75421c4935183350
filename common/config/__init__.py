"""The run config shared by host and DPU programs, its command-line parser, presets and hash.

Both programs receive the same training flags from `dpurun` and resolve them to the same
`RunConfig`; `handshake.check_peers` compares `config_hash()` across all ranks at start-up so a
mismatch (e.g. a hand-written mpirun line with different flags per side) stops the job at once.

- `fields`: how a field is declared (`flag`, `Meaning`: its concern, and what resumes, clones,
  scripts and `--recovery` do with it) and the checks the sections share;
- `sections`: one frozen dataclass per concern (`DataConfig`, `TrainingConfig`, `OffloadConfig`,
  `CheckpointConfig`, `RecoveryConfig`, `ReportingConfig`, `LaunchConfig`), its fields and its checks;
- `runconfig`: `RunConfig`, which inherits every section (flat: `cfg.batch_size`), the checks across
  sections, the JSON form and the hash, and the tables derived from the declarations;
- `parser`: the flags, presets, `--config` files and `parse_run_config`.

Everything is importable from here (`from dpuoffload.common.config import RunConfig`).
"""

from dpuoffload.common.config.fields import Concern, InClone, Meaning, OnResume, Section, flag, meaning
from dpuoffload.common.config.parser import (
    PRESETS,
    PROG_HELP,
    _config_value,
    add_checkpoint_flags,
    build_parser,
    debug_preset,
    default_preset,
    parse_run_config,
    parse_size,
    read_config_file,
)
from dpuoffload.common.config.runconfig import (
    _REFUSED_BY_RECOVERY,
    SCRIPT_FIELDS,
    SCRIPT_MODES,
    TUPLE_FIELDS,
    RunConfig,
    field_names,
)
from dpuoffload.common.config.sections import (
    ALLREDUCE_BACKENDS,
    AMPS,
    AUTO_ALLOWS,
    CKPT_COPIES,
    CKPT_ERRORS,
    DEVICES,
    DPU_FAILURES,
    LR_SCHEDULES,
    MODES,
    NUMERICS,
    RECOVERY,
    SECTIONS,
    WIRES,
    CheckpointConfig,
    DataConfig,
    LaunchConfig,
    OffloadConfig,
    RecoveryConfig,
    ReportingConfig,
    TrainingConfig,
)

__all__ = [
    "ALLREDUCE_BACKENDS", "AMPS", "AUTO_ALLOWS", "CKPT_COPIES", "CKPT_ERRORS", "DEVICES", "DPU_FAILURES",
    "LR_SCHEDULES", "MODES", "NUMERICS", "PRESETS", "PROG_HELP", "RECOVERY", "SCRIPT_FIELDS", "SCRIPT_MODES",
    "SECTIONS", "TUPLE_FIELDS", "WIRES", "CheckpointConfig", "Concern", "DataConfig", "InClone", "LaunchConfig",
    "Meaning", "OffloadConfig", "OnResume", "RecoveryConfig", "ReportingConfig", "RunConfig", "Section",
    "TrainingConfig", "_REFUSED_BY_RECOVERY", "_config_value", "add_checkpoint_flags", "build_parser",
    "debug_preset", "default_preset", "field_names", "flag", "meaning", "parse_run_config", "parse_size",
    "read_config_file",
]
