"""`--mode auto`'s profile in one process: the trainer-shaped steps.

What the MPI job test (`test_auto.py`) cannot see from outside: the profile's steps walk the rank's
own loader past the end of a small training set, leave the model, the global random state and the
backend as they found them, and time the same calls the trainer's phases time.
"""

import types

import pytest
import torch
from mpi4py import MPI
from torch import nn
from torch.utils.data import TensorDataset

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.loaders import RankLoader, Sampling
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime.hostgroup import FixedGroup
from dpuoffload.common.runtime.roles import Role
from dpuoffload.common.train.allreduce import MpiSync
from dpuoffload.common.train.autoselect import (
    Measuring,
    endless_batches,
    loop_costs,
    step_costs,
    timed_calls,
    untouched_random_state,
    wire_costs,
)


def tiny_set(n: int = 20) -> PerSampleSeeded:
    gen = torch.Generator().manual_seed(1)
    return PerSampleSeeded(TensorDataset(torch.randn(n, 3, 8, 8, generator=gen), torch.arange(n) % 4), seed=0)


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 4))


def test_endless_batches_go_on_into_the_next_epochs_shuffle():
    """20 samples in batches of 8: 3 batches an epoch; a profile of 6 steps gets epoch 0's and then
    epoch 1's, each a permutation of the whole set, in another order."""
    batches = endless_batches(RankLoader(Sampling(batch_size=8), tiny_set()))
    got = [next(batches) for _ in range(6)]
    assert [len(y) for _, y in got] == [8, 8, 4, 8, 8, 4]
    epochs = [torch.cat([x.flatten(1) for x, _ in got[i:i + 3]]) for i in (0, 3)]
    assert all(e.shape == (20, 3 * 8 * 8) for e in epochs)
    assert not torch.equal(epochs[0], epochs[1])  # (epoch 1 is shuffled anew)
    assert torch.allclose(epochs[0].sum(0), epochs[1].sum(0))  # (the same samples, in another order)


def test_loop_costs_time_every_phase_and_leave_the_model_and_random_state_alone():
    """The trainer's step on a copy (the gradients through the run's backend: `mpi` over this one
    process here): every phase timed, and the model, its gradients and the global random state
    as they were."""
    model = tiny_model()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    topo = types.SimpleNamespace(host_ranks=(0,), side_rank=0, side_comm=MPI.COMM_SELF)
    with untouched_random_state():  # (as `gather_profile` runs it: the loader draws its seed from torch's)
        costs = loop_costs(RunConfig(batch_size=8, lr_schedule="cosine"), topo, model, tiny_set(),
                           MpiSync(FixedGroup(MPI.COMM_SELF, [0])))
    assert set(costs) == {"aug", "train", "allreduce", "opt", "spread"} and all(v > 0 for v in costs.values())
    assert costs["spread"] >= 1.0  # (the steps' upper over lower quartile: `quartile_spread`)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())


def test_timed_calls_is_the_median_after_a_warm_up_call():
    calls = []
    assert timed_calls(lambda: calls.append(1), 4) >= 0 and len(calls) == 5


def test_host_ranks_on_a_gpu_and_on_cpus_are_refused_before_the_steps():
    """`--device auto` finding a GPU on some host ranks only: one clear error on every host rank,
    not a CPU loop's allreduce calls waiting for a GPU rank's (which time theirs apart)."""
    class Side:
        def allgather(self, mine):
            return [True, False, False]

    topo = types.SimpleNamespace(role=Role.HOST, side_comm=Side())
    with pytest.raises(ConfigError, match=r"host ranks \[0\] train on a GPU and \[1, 2\] on CPUs \(--device auto\)"):
        step_costs(RunConfig(device="auto"), topo, Measuring(tiny_model(), tiny_set(), tiny_set(), None))


def test_wire_costs_follow_the_runs_wire_on_each_side():
    """Where the loaders split the transform (`--wire auto`, CPU host), a host rank times the float
    steps on a uint8 batch of the run's size and sends uint8 bytes, a DPU rank times its integer
    part; on the float wire, and under auto on a GPU host (float there), nothing changes."""
    from tests.unit.test_wire import PIPELINES

    data = PIPELINES["cifar"]()  # 12 RGB images, RandomCrop(32) ... ToTensor, Normalize
    host, dpu = types.SimpleNamespace(role=Role.HOST), types.SimpleNamespace(role=Role.DPU)
    cfg = RunConfig(batch_size=4)
    mine = wire_costs(cfg, host, data, on_gpu=False)
    assert set(mine) == {"finish", "batch_bytes"} and mine["finish"] > 0
    assert mine["batch_bytes"] == 4 * 3 * 32 * 32  # uint8: a quarter of the float batch
    assert set(wire_costs(cfg, dpu, data, on_gpu=False)) == {"aug_wire"}
    assert wire_costs(RunConfig(batch_size=4, mode="auto", wire="float"), host, data, on_gpu=False) == {}
    assert wire_costs(cfg, host, data, on_gpu=True) == {}
