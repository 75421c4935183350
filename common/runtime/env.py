"""Environment variables through which `dpurun` passes per-side settings to the programs.

These are launcher concerns that may differ between host and DPU ranks (so they are not part of
`RunConfig` and its hash). Both the launcher (which sets them) and the programs (which read them)
import the names from here. Also here: whether Horovod is installed (`horovod_available`), which
every rank reports at start-up without importing torch.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Mapping, Optional

from dpuoffload.common.errors import ConfigError

THREADS = "DPUOFFLOAD_THREADS"          # torch intra-op threads of this rank (also OMP_NUM_THREADS)
NODE_MAP = "DPUOFFLOAD_NODE_MAP"        # "dpu-host=host-node,..." : which node a DPU hostname belongs to
CGROUP = "DPUOFFLOAD_CGROUP"            # informational: cgroup the DPU ranks were put in (throttling)
PROGRESS_TTY = "DPUOFFLOAD_PROGRESS_TTY"  # "1": the user watches a terminal; draw progress bars
SCRIPT_ARGS = "DPUOFFLOAD_ARGS"         # a user's script on the host ranks: dpurun's flags for `dpuoffload.init()`
STANDBY = "DPUOFFLOAD_STANDBY"          # "spare": app context 2 holds spare host ranks (--spare-ranks), not clones

# The ranks' opt-outs of start-up and exit cuts, each "0" to turn its cut off. The ranks read them;
# dpurun passes those set in its own environment on to every rank (`rank_opt_outs`), because mpirun
# does not forward the environment to ranks on other nodes.
FAST_EXIT = "DPUOFFLOAD_FAST_EXIT"        # exit the ordinary way, teardown included (common/runtime/fastexit.py)
MALLOC = "DPUOFFLOAD_MALLOC"              # leave the allocator alone (common/runtime/malloc.py)
GC_FREEZE = "DPUOFFLOAD_GC_FREEZE"        # leave Python's garbage collector alone (common/runtime/malloc.py)
INIT_TIMEOUT = "DPUOFFLOAD_INIT_TIMEOUT"  # seconds MPI init may take (common/runtime/roles.py, init_mpi)
IMPORT_AHEAD = "DPUOFFLOAD_IMPORT_AHEAD"  # import torch at first use, not before MPI init (runtime/torchsetup.py)
LEAN_TORCHVISION = "DPUOFFLOAD_LEAN_TORCHVISION"  # DPU ranks: torchvision with torch's compiler (runtime/torchsetup.py)
RANK_OPT_OUTS = (FAST_EXIT, MALLOC, GC_FREEZE, IMPORT_AHEAD, LEAN_TORCHVISION)


def format_node_map(dpu_to_node: Mapping[str, str]) -> str:
    return ",".join(f"{dpu}={node}" for dpu, node in dpu_to_node.items())


def parse_node_map(text: Optional[str]) -> dict[str, str]:
    """Parse `NODE_MAP` ("node1-bf=node1,node2-bf=node2"); empty or unset gives {}."""
    if not text:
        return {}
    out: dict[str, str] = {}
    for item in text.split(","):
        dpu, sep, node = item.partition("=")
        if not sep or not dpu or not node:
            raise ConfigError(f"{NODE_MAP}: bad entry {item!r}, expected dpu-hostname=host-node")
        out[short_hostname(dpu)] = short_hostname(node)
    return out


def short_hostname(name: str) -> str:
    """Hostnames compare by their first label: MPI may report 'n1.cluster' where users write 'n1'."""
    return name.split(".", 1)[0]


def threads_from_env(environ: Mapping[str, str] = os.environ) -> Optional[int]:
    value = environ.get(THREADS)
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"{THREADS}={value!r} is not an integer") from None
    if n < 1:
        raise ConfigError(f"{THREADS} must be >= 1, got {n}")
    return n


def progress_wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Progress bars only for a human at a terminal: under mpirun the ranks' own stdout is a pipe,
    so dpurun says whether *its* stdout is a terminal. Logs and CI get the epoch lines only."""
    return environ.get(PROGRESS_TTY) == "1"


def horovod_available() -> bool:
    """Horovod's torch binding is installed (found, not imported: importing it loads torch)."""
    return importlib.util.find_spec("horovod") is not None and importlib.util.find_spec("horovod.torch") is not None


def rank_opt_outs(environ: Mapping[str, str] = os.environ) -> tuple[tuple[str, str], ...]:
    """The ranks' opt-outs set in `environ` (dpurun's), to set on every rank of the job."""
    return tuple((name, environ[name]) for name in RANK_OPT_OUTS if name in environ)
