"""Failing user factories (`--model tests.fault_factories:...`, tests/jobs/test_rank_errors.py)."""

import torch

from tests.user_factories import tiny_model


class _RaisesAtStep3(torch.nn.Module):
    """Raises in its 3rd training forward on world rank 0 (host rank 0): a user bug mid-training,
    while the DPU rank that feeds it is still busy (it must not be the one blamed)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.body = tiny_model(num_classes)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from mpi4py import MPI

        if self.training and MPI.COMM_WORLD.Get_rank() == 0:
            self.calls += 1
            if self.calls == 3:
                raise ValueError("user model broke at step 3 on purpose")
        return self.body(x)


def raises_at_step3(num_classes: int) -> torch.nn.Module:
    return _RaisesAtStep3(num_classes)
