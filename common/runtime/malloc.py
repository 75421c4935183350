"""Keep freed tensor memory in the process instead of returning it to the OS after every step.

PyTorch on the CPU allocates each activation and gradient with the C library's `malloc`. glibc
serves blocks above its *mmap threshold* with a fresh `mmap` and gives the top of its heap back
to the OS once more than the *trim threshold* is free; both thresholds start low (128 KiB /
256 KiB) and only grow when a large block is freed. So a rank whose only large blocks are the
training step's keeps faulting the same megabytes in anew every step, while a rank that also
evaluates (larger batches, bigger blocks) has raised the thresholds and does not. Measured here
(resnet20, batch 16, 1 thread): host steps in `--mode mv` (the DPU validates, the host never
does) took 100-107 ms against 88-92 ms in `none`; with the thresholds fixed high both take
~90 ms. Fixing them is what jemalloc/tcmalloc users get by default and what PyTorch's own
caching allocator does on GPUs.

The same module keeps Python's own collector off start-up (`pause_collector`: it would walk the
objects imports make while they are made, to find no garbage) and off the steps
(`freeze_startup_objects`: a full collection would otherwise walk every object start-up made).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Mapping

from dpuoffload.common.runtime import env

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20   # glibc's largest allowed value on 64-bit (blocks above it still use mmap)
TRIM_THRESHOLD = 256 << 20  # keep up to this much freed memory before trimming the heap
OPT_OUT = env.MALLOC  # "0": leave the allocator alone


def tune_malloc(environ: Mapping[str, str] = os.environ) -> bool:
    """Fix glibc's mmap and trim thresholds high for this process; True if applied.

    Left alone (False): not Linux/glibc, `DPUOFFLOAD_MALLOC=0`, or the user already tunes malloc
    (`GLIBC_TUNABLES` with malloc settings, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`,
    or another allocator through `LD_PRELOAD`).
    """
    if not sys.platform.startswith("linux") or environ.get(OPT_OUT) == "0" or user_tunes_malloc(environ):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def user_tunes_malloc(environ: Mapping[str, str]) -> bool:
    return ("glibc.malloc" in environ.get("GLIBC_TUNABLES", "")
            or any(k in environ for k in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"))
            or any(lib in environ.get("LD_PRELOAD", "") for lib in ("jemalloc", "tcmalloc", "mimalloc")))


GC_OPT_OUT = env.GC_FREEZE  # "0": leave Python's garbage collector alone


def pause_collector(environ: Mapping[str, str] = os.environ) -> bool:
    """Turn Python's garbage collector off until `freeze_startup_objects`, at a program's entry
    (`host/__main__.py`, `dpu/__main__.py`); True if done.

    Why: start-up makes ~340k objects that live as long as the process (torch's and torchvision's
    modules, torchvision pulling in torch._dynamo and sympy), and the collector walks them again and
    again while they are made, to find no garbage: `import torch, torchvision` took 3.3 s with the
    collector off against 4.2 s with it on (medians of 5 on this box), about a fifth of a rank's
    start-up CPU, in every rank of every job. A process forked meanwhile (a data loader's worker)
    starts with the collector on: it never reaches the freeze. `DPUOFFLOAD_GC_FREEZE=0` leaves the
    collector alone.
    """
    if environ.get(GC_OPT_OUT) == "0":
        return False
    import gc

    gc.disable()
    os.register_at_fork(after_in_child=gc.enable)
    return True


def freeze_startup_objects(environ: Mapping[str, str] = os.environ) -> bool:
    """Move every object start-up made into the collector's permanent generation (`gc.freeze`), and
    turn the collector back on (`pause_collector` turned it off at the entry); True if done.

    A rank holds ~340k GC-tracked objects after start-up (torch, torchvision, the data sets), and
    a full collection walks them all: 270 ms on this box, due once in a 2-epoch run of each host
    rank and landing wherever the allocations happen to cross the threshold: a training step, or
    under `--recovery rollback` the state packed for a called spare (a 0.4 s step's recovery grew by
    120 ms). Frozen, they are never walked again; what training allocates is still collected. No
    `gc.collect()` first (one more full pass, at start-up): start-up's own garbage cycles, if any,
    stay, once. `DPUOFFLOAD_GC_FREEZE=0` opts out (of both).
    """
    if environ.get(GC_OPT_OUT) == "0":
        return False
    import gc

    gc.freeze()
    gc.enable()
    return True
