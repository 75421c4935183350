"""A DPU keeper thread that raises: the job must end with one line, not hang or dump a traceback.

Run under mpirun with 2 ranks: rank 1 plays the keeper's DPU rank (its keeper loop raises in the
thread), rank 0 waits in a receive that would never complete if the abort did not happen.
"""

import threading
import time

from mpi4py import MPI

from dpuoffload.common.faults.abort import set_rank_label
from dpuoffload.dpu.keeper import Keeper


class BrokenKeeper:
    """Just what `Keeper._main` touches: a loop that fails like a real one could (disk, peer)."""

    hands_off = True

    def restore_or_forget(self) -> None:  # (not restarting from DPU memory)
        pass

    def loop(self) -> None:
        raise OSError(28, "No space left on device")


if MPI.COMM_WORLD.Get_rank() == 1:
    set_rank_label("DPU rank 0 (world rank 1)")
    threading.Thread(target=Keeper._main, args=(BrokenKeeper(),), daemon=True).start()
    time.sleep(60)
else:
    MPI.COMM_WORLD.recv(source=1)  # never sent: only the keeper's abort ends this
