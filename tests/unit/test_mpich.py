"""The MPMD job under MPICH for real (PyPI's `mpich` wheel: Hydra's `mpiexec`), not only its
command line: scripts/test.sh sets up `.venv-mpich` (mpi4py's binary wheel on MPICH 5, torch shared
with `.venv`). dpurun detects the flavor from `mpirun --version` and writes Hydra's syntax; `da`
trains to the bit as `none` does, and as the same run does under Open MPI.

(The tests of this feature that start processes: tests/jobs/test_mpich.py.)
"""

from __future__ import annotations

import pytest

from dpuoffload.common.errors import ConfigError


def test_horovod_built_against_another_mpi_is_refused_in_one_line_and_auto_takes_torch(monkeypatch):
    """The MPICH venv sees the main venv's Horovod (linked against Open MPI's libmpi.so.40): `hvd.init`
    there died with Open MPI's 'MPI_Comm_dup() ... before MPI_INIT', the job ending unnamed."""
    import glob
    import os

    import mpi4py

    from dpuoffload.common.train import allreduce, mpibuild

    mpi4py_lib = glob.glob(os.path.join(os.path.dirname(mpi4py.__file__), "MPI*.so"))[0]
    assert "libmpi.so.40" in mpibuild.needed(mpi4py_lib)  # (this venv's mpi4py: Open MPI's soname, read from its ELF)
    assert mpibuild.needed(__file__) == []                 # (not an ELF file: nothing, no error)
    monkeypatch.setattr(mpibuild, "horovod_mpi", lambda: "Open MPI")
    monkeypatch.setattr(mpibuild, "running_mpi", lambda: "MPICH")
    monkeypatch.setattr(allreduce, "horovod_available", lambda: True)
    with pytest.raises(ConfigError, match=r"--allreduce horovod: this Horovod was built against Open MPI, but this "
                                          r"job runs MPICH: .* use --allreduce torch \(or mpi\)"):
        allreduce.resolve_backend("horovod")
    assert allreduce.resolve_backend("auto") == "torch"
    monkeypatch.setattr(mpibuild, "running_mpi", lambda: "Open MPI")
    assert allreduce.resolve_backend("horovod") == "horovod" and allreduce.resolve_backend("auto") == "horovod"
