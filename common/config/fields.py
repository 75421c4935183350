"""How a `RunConfig` field is declared (`flag`: its default and what it means beyond its flag), the
`Section` every concern's dataclass is, and the small checks the sections share.

Pure config logic: no torch, no MPI (the launcher imports it before any rank starts).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.modes import FlagValue


class Concern(enum.Enum):
    """What part of a run a `RunConfig` field configures (its section: one dataclass per concern)."""

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


def meaning(f: dataclasses.Field) -> Meaning:
    """The `Meaning` declared with a `RunConfig` field (`flag(...)`)."""
    return f.metadata["meaning"]


class Section:
    """One concern's fields (a frozen dataclass in `sections`) and `check`, the checks on them alone.

    A section built on its own is checked (`OffloadConfig(mode="da")`); `RunConfig`, which inherits
    every section, checks each of them and then what spans two.
    """

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError naming the flag for a value this section refuses; turn flag strings
        into their enum members (a frozen dataclass: through `object.__setattr__`)."""


def flag_name(field_name: str) -> str:
    return field_name.replace("_", "-")


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"--{flag_name(name)} {value!r} is not one of: {', '.join(choices)}")


def choose(section: Section, name: str, kind: type[FlagValue]) -> None:
    """Field `name` as a member of `kind`: its flag string turned into the member (a member stays
    itself), or ConfigError naming the choices."""
    value = getattr(section, name)
    check_choice(name, value, tuple(m.value for m in kind))
    object.__setattr__(section, name, kind(value))


def at_least(section: Section, low: int, *names: str, why: str = "") -> None:
    """Fields `names` (None: not given) are >= `low`, or ConfigError `--name must be >= low{why}, got value`."""
    for name in names:
        value = getattr(section, name)
        if value is not None and value < low:
            raise ConfigError(f"--{flag_name(name)} must be >= {low}{why}, got {value}")


def installed(package: str) -> bool:
    """Whether `package` can be imported, without importing it (both users are slow to import)."""
    return importlib.util.find_spec(package) is not None
