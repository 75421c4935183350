"""The clone group's config: `--clone-override KEY=VALUE` parsed once, for `dpurun` and the ranks.

`dpurun` calls `clone_config` before launch (so a bad override fails in a second, not after the
original training has run to `--clone-at`); the clone ranks call it again to build their config.
Pure config logic: no torch, no MPI.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any, Callable

from dpuoffload.common.config import InClone, RunConfig, field_names
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.modes import FlagValue


def _boolean(value: str) -> bool:
    return value.lower() in ("1", "true", "yes")


def _parser(name: str) -> Callable[[str], Any]:
    """How `--clone-override` reads a value of field `name`: by the field's type (`Optional[int]`: int; an
    enum such as `LrSchedule`: its string, which `RunConfig` turns into the member, or refuses naming the choices)."""
    hint = typing.get_type_hints(RunConfig)[name]
    types = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    types = [str if isinstance(t, type) and issubclass(t, FlagValue) else t for t in types]
    if len(types) != 1 or types[0] not in (bool, int, float, str):
        raise TypeError(f"RunConfig.{name} is declared InClone.OVERRIDE, but --clone-override cannot parse a {hint}")
    return _boolean if types[0] is bool else types[0]


def _in_clone(part: InClone) -> tuple[str, ...]:
    return field_names(lambda m: part in m.clone)


# Derived from the fields' declarations (`RunConfig`, `InClone`): the clone keeps its model, data set
# and mode, and may change these (field -> how to read its value) ...
OVERRIDABLE: dict[str, Callable[[str], Any]] = {name: _parser(name) for name in _in_clone(InClone.OVERRIDE)}
# ... and starts these from their defaults: it offloads nothing and hands nothing off of its own.
RESET: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(RunConfig) if f.name in _in_clone(InClone.RESET)}
SUBDIRS = _in_clone(InClone.SUBDIR)  # directories: the clone's is `clone/` inside the original's


def parse_clone_overrides(items: tuple[str, ...]) -> dict[str, Any]:
    """`("lr=0.01", "seed=1")` -> `{"lr": 0.01, "seed": 1}`.

    Raises:
        ConfigError: an item is not KEY=VALUE, KEY cannot be overridden, or VALUE does not parse.
    """
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not sep or key not in OVERRIDABLE:
            raise ConfigError(f"--clone-override {item!r}: expected KEY=VALUE with KEY one of "
                              f"{', '.join(sorted(OVERRIDABLE))}")
        try:
            changes[key] = OVERRIDABLE[key](value.strip())
        except ValueError:
            raise ConfigError(f"--clone-override {item!r}: {value!r} is not a valid {key}") from None
    return changes


def clone_config(cfg: RunConfig) -> RunConfig:
    """The clone group's config: the original's with `--clone-override`s, no offload, no hand-offs.

    Raises:
        ConfigError: a bad override, or an overridden value `RunConfig` refuses (e.g. batch_size=0).
    """
    changes = parse_clone_overrides(cfg.clone_override)
    subdirs = {name: os.path.join(getattr(cfg, name), "clone") if getattr(cfg, name) else None for name in SUBDIRS}
    try:
        return cfg.replace(**{**RESET, **subdirs, **changes})
    except ConfigError as e:
        raise ConfigError(f"--clone-override: the clone's config is invalid: {e}") from None
