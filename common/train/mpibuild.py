"""Which MPI a compiled extension was linked against: Horovod's against the MPI this job runs.

Why: a Horovod built against Open MPI, imported in a job that runs MPICH (the test command's MPICH
venv sees the main venv's packages), dies in `hvd.init` with Open MPI's "MPI_Comm_dup() function was
called before MPI_INIT", and the job ends without naming why. The extension's ELF `DT_NEEDED`
entries name its MPI library by soname (`libmpi.so.40`: Open MPI 3-5; `libmpi.so.12`: MPICH and
its derivatives), which can be read without loading it. Only little-endian ELF64 is read (x86-64,
aarch64); anything else answers None (unknown), never a false alarm.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import struct
from typing import Optional

SONAMES = {"libmpi.so.40": "Open MPI", "libmpi.so.12": "MPICH"}
_DT_NEEDED, _DT_STRTAB, _SHT_DYNAMIC = 1, 5, 6


def needed(path: str) -> list[str]:
    """The `DT_NEEDED` sonames of an ELF64 little-endian shared object ([] where it is not one)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return []
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
        f.seek(shoff)
        sections = [struct.unpack_from("<IIQQQQIIQQ", f.read(shentsize)) for _ in range(shnum)]
        for sec in sections:
            if sec[1] != _SHT_DYNAMIC:
                continue
            strtab = sections[sec[6]]  # sh_link: the string table the dynamic section uses
            f.seek(strtab[4])
            strings = f.read(strtab[5])
            f.seek(sec[4])
            raw = f.read(sec[5])
            entries = [struct.unpack_from("<qQ", raw, i) for i in range(0, len(raw) - 15, 16)]
            return [strings[v:strings.index(b"\0", v)].decode() for tag, v in entries if tag == _DT_NEEDED]
    return []


def horovod_mpi() -> Optional[str]:
    """The MPI (by `SONAMES`) Horovod's torch extension was linked against, or None if unknown."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or spec.origin is None:
        return None
    for lib in glob.glob(os.path.join(os.path.dirname(spec.origin), "torch", "mpi_lib*.so")):
        for soname in needed(lib):
            if soname in SONAMES:
                return SONAMES[soname]
    return None


# mpi4py's vendor names, by the family whose soname their library has (derivatives of MPICH keep its ABI)
FAMILIES = {"Open MPI": "Open MPI", "MPICH": "MPICH", "Intel MPI": "MPICH", "MVAPICH": "MPICH", "MVAPICH2": "MPICH"}


def running_mpi() -> Optional[str]:
    """The MPI family this process's mpi4py runs ('Open MPI' or 'MPICH'; None without mpi4py or unknown)."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return FAMILIES.get(str(MPI.get_vendor()[0]))


def horovod_mismatch() -> Optional[str]:
    """Why Horovod cannot run in this job (built against another MPI family), or None (it fits, or unknown)."""
    built, running = horovod_mpi(), running_mpi()
    if built is None or running is None or built == running:
        return None
    return (f"this Horovod was built against {built}, but this job runs {running}: its MPI calls would go to a library "
            f"the job never initialized (Open MPI's 'MPI_Comm_dup() function was called before MPI_INIT'); use "
            f"--allreduce torch (or mpi), or build Horovod against {running}")
