"""dpuoffload: data-parallel PyTorch training with data loading offloaded to BlueField DPU ranks.

The public host-side API (semantic versioning, `API_VERSION`; README "Your own training script"):

    import dpuoffload as dpu
    job = dpu.init()                                   # under `dpurun -- --mode da train.py`
    loader = job.loader(train_set, batch_size=64, seed=0)
    for epoch in range(epochs):
        for x, y in loader.epoch(epoch):
            ...                                        # your own forward / backward / step
    job.finish()

Everything else in the package (`dpuoffload.common`, `.host`, `.dpu`, `.launch`) is internal.
Names are imported on first use (PEP 562): every `dpuoffload.*` import runs this file first, and
the launcher and the torch-free planning code must not pay for importing torch here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dpuoffload.common.version import API_VERSION, __version__

if TYPE_CHECKING:  # what a type checker sees of the names `__getattr__` imports on first use (`_EXPORTS`)
    from dpuoffload.common.data.hfdata import huggingface as huggingface
    from dpuoffload.common.data.sampling import seeded as seeded
    from dpuoffload.common.data.shards import ShardedSet as ShardedSet
    from dpuoffload.common.data.shards import ShardSource as ShardSource
    from dpuoffload.common.data.tarshards import webdataset as webdataset
    from dpuoffload.common.errors import ConfigError as ConfigError
    from dpuoffload.common.errors import DpuOffloadError as DpuOffloadError
    from dpuoffload.common.errors import PeerError as PeerError
    from dpuoffload.host.library import Job as Job
    from dpuoffload.host.library import init as init
    from dpuoffload.host.loader import DpuLoader as DpuLoader
    from dpuoffload.host.script_state import Restored as Restored

_EXPORTS = {
    "init": "dpuoffload.host.library",
    "Job": "dpuoffload.host.library",
    "Restored": "dpuoffload.host.script_state",
    "DpuLoader": "dpuoffload.host.loader",
    "seeded": "dpuoffload.common.data.sampling",
    "webdataset": "dpuoffload.common.data.tarshards",
    "huggingface": "dpuoffload.common.data.hfdata",
    "ShardedSet": "dpuoffload.common.data.shards",
    "ShardSource": "dpuoffload.common.data.shards",
    "ConfigError": "dpuoffload.common.errors",
    "DpuOffloadError": "dpuoffload.common.errors",
    "PeerError": "dpuoffload.common.errors",
}

__all__ = ["API_VERSION", "__version__", *_EXPORTS]


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dpuoffload' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
