"""PyTorch Lightning on the job's host ranks: the cluster environment a `DDPStrategy` needs.

Lightning picks its cluster environment by looking at the process's surroundings. Under dpurun it
would find Open MPI's and take every rank of `COMM_WORLD` (host *and* DPU ranks) for a training
replica, and its rendezvous would wait forever for the DPU ranks. `HostRanks` says what the
replicas really are: the job's host ranks, with the process group already formed over them by
`job.init_process_group` (Lightning then skips its own rendezvous). Lightning is imported here
only: the rest of the package never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.fabric.plugins.environments import ClusterEnvironment

if TYPE_CHECKING:
    from dpuoffload.host.library import Job


class HostRanks(ClusterEnvironment):
    """The job's host ranks as Lightning's world: rank, size, and the node/local rank pair that
    places one process per device. `devices` (host ranks on this node) is what the Trainer's
    `devices=` must be: Lightning indexes its device list by the local rank."""

    def __init__(self, job: "Job", local_rank: int, node_rank: int, devices: int) -> None:
        self.job, self._local_rank, self._node_rank, self.devices = job, local_rank, node_rank, devices

    @property
    def creates_processes_externally(self) -> bool:
        return True  # dpurun started them

    @property
    def main_address(self) -> str:
        return "127.0.0.1"  # unused: the process group exists before Lightning looks for it

    @property
    def main_port(self) -> int:
        return 0

    @staticmethod
    def detect() -> bool:
        return False  # chosen explicitly, never by Lightning's search

    def world_size(self) -> int:
        return self.job.size

    def set_world_size(self, size: int) -> None:
        """Lightning's count (nodes x devices) is ignored: dpurun chose the host ranks."""

    def global_rank(self) -> int:
        return self.job.rank

    def set_global_rank(self, rank: int) -> None:
        """Ignored for the same reason."""

    def local_rank(self) -> int:
        return self._local_rank

    def node_rank(self) -> int:
        return self._node_rank


def host_ranks(job: "Job", backend: str) -> HostRanks:
    """Form the process group over the host ranks (if the script has not) and describe them."""
    import torch.distributed as dist

    local_rank, node_rank, devices = 0, 0, 1
    if job.comm is not None:
        from mpi4py import MPI

        if not dist.is_initialized():
            job.init_process_group(backend)
        node = job.comm.Split_type(MPI.COMM_TYPE_SHARED, key=job.rank)
        local_rank, devices = node.Get_rank(), node.Get_size()
        node.Free()
        names: list[Any] = job.comm.allgather(MPI.Get_processor_name())
        node_rank = list(dict.fromkeys(names)).index(names[job.rank])
    return HostRanks(job, local_rank, node_rank, devices)
