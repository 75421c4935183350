"""The clone group's config: `--clone-override KEY=VALUE` parsed once, for `dpurun` and the ranks.

`dpurun` calls `clone_config` before launch (so a bad override fails in a second, not after the
original training has run to `--clone-at`); the clone ranks call it again to build their config.
Pure config logic: no torch, no MPI.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.modes import Mode


def _boolean(value: str) -> bool:
    return value.lower() in ("1", "true", "yes")


# flag -> how to read its value; the clone keeps its model, data set and mode
OVERRIDABLE: dict[str, Callable[[str], Any]] = {
    "lr": float, "momentum": float, "weight_decay": float, "lr_schedule": str, "seed": int, "epochs": int,
    "batch_size": int, "train_subset": int, "val_subset": int, "drop_last": _boolean,
    "allreduce": str, "save_weights": str, "stop_at_step": int}


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
    log_dir = os.path.join(cfg.log_dir, "clone") if cfg.log_dir else None
    try:
        return cfg.replace(**{"mode": Mode.NONE, "clone_at": None, "clone_override": (), "ckpt_dir": None,
                              "ckpt_every": None, "ckpt_every_epoch": False, "resume": None, "stop_at_step": None,
                              "log_dir": log_dir, "trace": None, "save_weights": None, **changes})
    except ConfigError as e:
        raise ConfigError(f"--clone-override: the clone's config is invalid: {e}") from None
