"""Resolving `module:function` user factories (models, data sets) with errors a user can act on."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from dpuoffload.common.errors import ConfigError

BUILT_IN_PREFIXES = ("webdataset:",)  # `--dataset webdataset:PATTERN`: built in, not a module


def is_factory_spec(name: str) -> bool:
    return ":" in name and not name.startswith(BUILT_IN_PREFIXES)


def load_factory(spec: str, flag: str) -> Callable[..., Any]:
    """Import `module:function`; raise `ConfigError` naming the flag, the module and the fix."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{flag} {spec!r}: expected module:function, e.g. mypkg.models:build")
    _cwd_on_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{flag} {spec!r}: cannot import module {module_name!r} ({e}); run dpurun from "
                          "the directory that holds it, or make it importable on every host and DPU "
                          "(PYTHONPATH or pip install)") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{flag} {spec!r}: module {module_name!r} has no callable {attr!r}")
    return fn


def _cwd_on_path() -> None:
    """`python -m`'s rule: the current directory is searched first. The ranks run `python -m`, so
    they find `mymodels.py` in the directory dpurun was started from; the `dpurun` console script
    (whose sys.path[0] is the script's folder) must find it too."""
    cwd = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        sys.path.insert(0, cwd)
