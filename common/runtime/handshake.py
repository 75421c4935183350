"""Start-up check: every rank runs the same project version, protocol version and run config, on
machines of the same byte order.

A job started by hand (or with a stale install on the DPUs) could otherwise run for hours with
host and DPU programs disagreeing on message layouts or batch shapes. Architectures may differ (an
aarch64 DPU beside an x86-64 host): every raw message is little-endian numbers of fixed sizes, and
pickles and safetensors are portable, but a big-endian peer would misread them, so byte order is
compared too (numerics differences are the loaders' check, `common.data.numerics`). `check_peers` is a collective
over COMM_WORLD; on mismatch every rank raises the same `HandshakeError`, naming both values.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import HandshakeError
from dpuoffload.common.modes import FlagValue
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.version import PROTOCOL_VERSION, __version__


@dataclass(frozen=True)
class Identity:
    world_rank: int
    role: Role
    version: str
    protocol: int
    config_hash: str
    config: Mapping[str, Any]
    machine: str = ""          # platform.machine(): x86_64, aarch64, ...
    byteorder: str = "little"

    def label(self) -> str:
        return f"{self.role.program} (world rank {self.world_rank})"


def local_identity(world_rank: int, role: Role, cfg: RunConfig) -> Identity:
    return Identity(world_rank, role, __version__, PROTOCOL_VERSION, cfg.config_hash(), cfg.to_dict(),
                    platform.machine(), sys.byteorder)


def find_mismatch(ids: Sequence[Identity]) -> Optional[str]:
    """Return a message naming the first disagreement against world rank 0, or None."""
    ref = ids[0]
    for other in ids[1:]:
        if other.version != ref.version:
            return (f"project version mismatch: {ref.label()} runs dpuoffload {ref.version}, "
                    f"{other.label()} runs {other.version}; install the same version on hosts and DPUs")
        if other.protocol != ref.protocol:
            return (f"protocol version mismatch: {ref.label()} speaks protocol {ref.protocol}, "
                    f"{other.label()} speaks {other.protocol}; install the same version on hosts and DPUs")
        if other.byteorder != ref.byteorder:
            return (f"byte order mismatch: {ref.label()} runs on {ref.machine} ({ref.byteorder}-endian), "
                    f"{other.label()} on {other.machine} ({other.byteorder}-endian); batches and state travel as raw "
                    "little-endian buffers: run host and DPU programs on machines of one byte order")
        if other.config_hash != ref.config_hash:
            diffs = [f"{k}={_shown(ref.config.get(k))} vs {_shown(other.config.get(k))}"
                     for k in sorted(set(ref.config) | set(other.config))
                     if ref.config.get(k) != other.config.get(k)]
            return (f"run config mismatch: {ref.label()} has config {ref.config_hash}, {other.label()} "
                    f"has {other.config_hash} ({'; '.join(diffs)}); pass the same training flags to "
                    "both programs (dpurun does)")
    return None


def _shown(value: Any) -> str:
    """A config value as its flag is written: a flag enum's string ('mpi'), not the member's repr."""
    return repr(value.value if isinstance(value, FlagValue) else value)


def check_peers(topo: Topology, cfg: RunConfig) -> None:
    """Collective over `topo.world`. Raises `HandshakeError` on every rank when any rank disagrees."""
    ids = topo.world.allgather(local_identity(topo.world_rank, topo.role, cfg))
    problem = find_mismatch(ids)
    if problem:
        raise HandshakeError(problem)
