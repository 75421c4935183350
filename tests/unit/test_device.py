"""`--device`, `--amp`, `--channels-last` (pure, on the CPU; the GPU runs are marked `gpu`).

(The tests of this feature that start processes: tests/jobs/test_device.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.state.sharding import pack_pieces, plan_shards, state_digest, unpack_pieces
from dpuoffload.common.train.device import Compute, CudaCopier, Staging, numpy_dtype, resolve_device, to_host

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bash scripts/test.sh -m gpu "
                                                                     "on a GPU node)")


def test_auto_is_the_cpu_without_a_gpu_and_cuda_names_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", 3) == torch.device("cpu") == resolve_device("cpu", 0)
    with pytest.raises(ConfigError, match="--device cuda, but torch .* sees no GPU here .* use --device cpu"):
        resolve_device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto", 1) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match="host rank 2 of its node has no GPU of its own .2 GPU.s. here"):
        resolve_device("cuda", 2)


def test_flags_and_what_they_refuse():
    cfg = parse_run_config(["--device", "cpu", "--amp", "bf16", "--channels-last"])
    assert (cfg.device, cfg.amp, cfg.channels_last) == ("cpu", "bf16", True)
    with pytest.raises(ConfigError, match="--device cuda with --mode naive"):
        parse_run_config(["--device", "cuda", "--mode", "naive"])
    with pytest.raises(SystemExit):
        parse_run_config(["--amp", "fp8"])


def test_compute_places_autocasts_and_lays_out_on_the_cpu():
    compute = Compute.of(torch.device("cpu"), "bf16", True)
    model = compute.place(nn.Conv2d(3, 4, 3))
    x, y = compute.inputs(torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))
    assert x.is_contiguous(memory_format=torch.channels_last) and model.weight.is_contiguous(
        memory_format=torch.channels_last)
    with compute.autocast():
        assert model(x).dtype == torch.bfloat16
    assert model(x).dtype == torch.float32 and not compute.scales_loss and Compute.of(
        torch.device("cpu"), "fp16", False).scales_loss
    assert compute.describe() == "cpu, bf16 autocast, channels-last" and Compute().describe() == "cpu"


def test_state_crosses_to_host_memory_the_same_bytes(tmp_path):
    """Packing, unpacking and digests go through `to_host`: on the CPU the tensor's own memory."""
    t = torch.arange(10, dtype=torch.float32)
    assert to_host(t).data_ptr() == t.data_ptr() and numpy_dtype(torch.int64) == np.int64
    conv = torch.randn(8, 4, 16, 16).contiguous(memory_format=torch.channels_last)  # no flat view
    tensors = [torch.randn(5000), torch.randn(7), conv]
    plan = plan_shards([x.numel() for x in tensors], 2, 4096)
    out = [torch.zeros_like(x) for x in tensors]  # (zeros_like keeps the channels-last layout)
    assert not out[2].is_contiguous()
    for rank in (0, 1):
        pieces = plan.rank_pieces(rank)
        buf = np.empty(sum((p.stop - p.start) * 4 for p in pieces), dtype=np.uint8)
        pack_pieces(tensors, pieces, buf)
        unpack_pieces(buf, pieces, out)
    assert all(torch.equal(a, b) for a, b in zip(tensors, out))


def reused_buffer_feed(n: int, pinned: bool = False):
    """A feed like `RemoteSource` with copy=False: every batch is a view of one buffer, which the
    next `next()` overwrites (on the GPU path the buffer would be back in an MPI receive)."""
    x, y = torch.zeros(4, 3, 2, 2), torch.zeros(4, dtype=torch.int64)
    if pinned:
        x, y = x.pin_memory(), y.pin_memory()
    for k in range(n):
        x.fill_(k)
        y.fill_(k)
        yield x, y


class DeferredCopier:
    """The latest an asynchronous copy may read its source: when `wait_host` is called (until then
    the device tensors `ready` hands out hold nothing). A staging that asked the feed for the next
    batch before waiting would copy the next batch's bytes."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def start(self, host):
        copier, device = self, (torch.full_like(host[0], -1.0), torch.full_like(host[1], -1))

        class Deferred:
            copied = False

            def wait_host(self):
                if not self.copied:
                    self.copied = True
                    device[0].copy_(host[0])
                    device[1].copy_(host[1])
                    copier.log.append(f"copied {int(device[1][0])}")

            def ready(self):
                return device
        return Deferred()


def test_staging_copies_each_batch_before_the_feed_reuses_its_memory():
    """The trainer's order on a GPU: batch k on the device, forward/backward queued, then the
    next batch fetched (`prefetch`) while k computes; the feed's buffer is reused only after k's copy."""
    copier = DeferredCopier()
    staging = Staging(reused_buffer_feed(5), copier)
    seen = []
    for k, (hx, hy) in enumerate(staging):
        assert int(hy[0]) == k and float(hx.sum()) == 48.0 * k  # the host view (digests) is batch k's
        x, y = staging.on_device()
        staging.prefetch()                                       # while step k "computes"
        staging.prefetch()                                       # (a second call takes nothing more)
        seen.append((float(x.mean()), int(y[0])))
    assert seen == [(float(k), k) for k in range(5)]
    assert copier.log == [f"copied {k}" for k in range(5)]


def test_the_trainers_fetch_loop_takes_staged_batches_with_next():
    """The trainer's `timed` (every step's data phase) calls `next()` on the feed; on a GPU the feed
    is a `Staging`. The first GPU run failed there ('Staging' object is not an iterator): this
    drives the same method on the CPU, with the copies deferred as a side stream's would be."""

    from dpuoffload.common.runtime.metrics import PhaseTimer
    from dpuoffload.common.train.loop import timed

    staging = Staging(reused_buffer_feed(4), DeferredCopier())
    seen = []
    for hx, hy in timed(PhaseTimer(), staging):
        host = int(hy[0])  # (read before the prefetch: the feed reuses that memory, as the digest does)
        x, y = staging.on_device()
        staging.prefetch()  # as `Stepper.step` does once the backward pass is queued
        seen.append((host, int(y[0]), float(x.mean())))
    assert seen == [(k, k, float(k)) for k in range(4)]


def test_staging_without_prefetch_is_the_plain_iteration():
    """Steps that never prefetch (e.g. an empty batch) still get every batch once, in order."""
    staging = Staging(reused_buffer_feed(3), DeferredCopier())
    assert [int(y[0]) for y in [staging.on_device()[1] for _ in staging]] == [0, 1, 2]
    assert Compute().staging(iter([])) is None  # the CPU copies nothing


@needs_gpu
@pytest.mark.gpu
def test_gpu_staging_from_pinned_buffers_on_a_side_stream():
    compute = Compute.of(torch.device("cuda", 0), "off", True)
    staging = compute.staging(reused_buffer_feed(6, pinned=True))
    assert isinstance(staging, Staging) and isinstance(staging.copier, CudaCopier)
    for k, _ in enumerate(staging):
        x, y = staging.on_device()
        big = torch.randn(2048, 2048, device=compute.device) @ torch.randn(2048, 2048, device=compute.device)
        staging.prefetch()  # the next copy beside the matmul
        assert x.is_cuda and x.is_contiguous(memory_format=torch.channels_last) and bool(big.isfinite().all())
        assert float(x.mean()) == k and int(y[0]) == k


@needs_gpu
@pytest.mark.gpu
def test_gpu_state_crosses_to_host_memory_and_back():
    model = nn.Linear(300, 300)
    reference = state_digest(model)
    gpu = Compute.of(torch.device("cuda", 0), "bf16", False).place(model)
    assert state_digest(gpu) == reference
    tensors = [p.data for p in gpu.parameters()]
    plan = plan_shards([x.numel() for x in tensors], 1, 4096)
    buf = np.empty(sum((p.stop - p.start) * 4 for p in plan.rank_pieces(0)), dtype=np.uint8)
    pack_pieces(tensors, plan.rank_pieces(0), buf)
    back = [torch.zeros_like(x) for x in tensors]
    unpack_pieces(buf, plan.rank_pieces(0), back)
    assert all(torch.equal(a, b) and b.is_cuda for a, b in zip(tensors, back))


@pytest.fixture
def deterministic_state():
    """Restore torch's process-wide deterministic setting after a test that changes it."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_deterministic_mode_fixes_the_cublas_workspace_and_only_warns_where_a_gpu_is(monkeypatch,
                                                                                      deterministic_state):
    """Every computing rank's start-up: on a GPU box a resnet50 backward (AdaptiveAvgPool2d has no
    deterministic CUDA kernel) and any matmul (cuBLAS without a fixed workspace) would raise."""
    import os

    from dpuoffload.common.runtime.torchsetup import use_deterministic_algorithms

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    use_deterministic_algorithms()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own setting is kept
    use_deterministic_algorithms()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()


@needs_gpu
@pytest.mark.gpu
def test_gpu_resnet50_trains_under_the_ranks_deterministic_mode(deterministic_state):
    from torchvision.models import resnet50

    from dpuoffload.common.runtime.torchsetup import use_deterministic_algorithms

    use_deterministic_algorithms()
    compute = Compute.of(torch.device("cuda", 0), "bf16", True)
    model = compute.place(resnet50(num_classes=10))
    x, y = compute.inputs(torch.randn(4, 3, 64, 64), torch.tensor([0, 1, 2, 3]))
    with compute.autocast():
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()  # AdaptiveAvgPool2d's CUDA backward: a warning, not an error
    assert all(p.grad is not None and bool(p.grad.isfinite().all()) for p in model.parameters())


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["cifar", "convert-dtype", "v2"])
def test_gpu_float_steps_after_the_uint8_copy_give_the_cpus_bytes(name):
    """`--wire uint8` on a GPU host rank: the uint8 batch is copied on the side stream and its float
    steps run there (`CudaCopier` with `finish`); the batch the model gets equals, to the bit, what
    the host's CPU makes of the same uint8 batch (v1 ToTensor / ConvertImageDtype, v2 ToDtype)."""
    from dpuoffload.common.data.wire import Wire, dpu_view, plan_split
    from tests.unit.test_wire import PIPELINES, whole

    ds = PIPELINES[name]()
    split = plan_split(ds, Wire.AUTO)
    wire = whole(dpu_view(ds, split)).pin_memory()
    compute = Compute.of(torch.device("cuda", 0), "bf16", True)
    staging = compute.staging(iter([(wire, torch.arange(len(wire)).pin_memory())]), split.host.batch)
    for _ in staging:
        x, _ = staging.on_device()
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
        assert to_host(x).contiguous().numpy().tobytes() == split.host(wire).numpy().tobytes()


class _Read:
    """A step's loss or count standing in for a GPU tensor: reading it is logged (`float`/`int`)."""

    def __init__(self, log: list, step: int) -> None:
        self.log, self.step = log, step

    def __float__(self) -> float:
        self.log.append(("read", self.step))
        return float(self.step)

    def __int__(self) -> int:
        return 1


def _epoch_of_logged_steps(hands_off: bool, steps: int = 4):
    """`Trainer.train_epoch` on a CPU, each step logged as it is queued and each loss as it is read."""
    from types import MethodType, SimpleNamespace

    from mpi4py import MPI

    from dpuoffload.common.runtime.hostgroup import FixedGroup
    from dpuoffload.common.runtime.metrics import PhaseTimer
    from dpuoffload.common.state.trainstate import EpochSpan
    from dpuoffload.common.train.loop import NoHooks, Trainer
    from dpuoffload.common.train.step import StepOutcome

    log: list = []

    def step(x, y, total, at, staged=True):
        k = sum(1 for kind, _ in log if kind == "step")
        log.append(("step", k))
        return StepOutcome(_Read(log, k), _Read(log, k), len(y))

    batches = [(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long))] * steps
    t = SimpleNamespace(
        model=torch.nn.Linear(1, 1), resumed_progress=None, is_leader=True, size=1, recovery=None,
        cfg=SimpleNamespace(digest_batches=False, epochs=1, progress=False), global_step=0, injector=None,
        feed=SimpleNamespace(epoch=lambda e, a, b: iter(batches), global_samples=lambda i: None),
        stepper=SimpleNamespace(epoch=lambda b: b, step=step), hooks=NoHooks(), hands_off=hands_off,
        comm=FixedGroup(MPI.COMM_SELF, [0]), timer=PhaseTimer(), total_steps=steps)
    for name in ("record_step", "recovered", "handoff"):
        setattr(t, name, MethodType(getattr(Trainer, name), t))
    sums, losses, _, samples = Trainer.train_epoch(t, EpochSpan(0, 0, steps, True))
    return log, sums, losses, samples


def test_a_steps_loss_is_read_once_the_next_step_is_queued():
    """Issue 32: reading a GPU step's loss right after queuing it (`float(loss)` every step) left the
    GPU idle while the CPU queued the optimizer and the next step. The trainer reads each step's loss
    after the next step is queued (the last at the epoch's end); the epoch's losses and sums are
    the same, in step order."""
    log, sums, losses, samples = _epoch_of_logged_steps(hands_off=False)
    assert log == [("step", 0), ("step", 1), ("read", 0), ("step", 2), ("read", 1), ("step", 3), ("read", 2),
                   ("read", 3)]
    assert losses == [0.0, 1.0, 2.0, 3.0] and samples == 8
    assert list(sums) == [2 * (0 + 1 + 2 + 3), 4, 8]  # (loss x batch, correct, count)


def test_with_checkpoints_or_clones_a_steps_loss_is_read_before_the_hand_off():
    """A hand-off after a step saves the epoch's progress, its loss included: read at once there."""
    log, _, losses, _ = _epoch_of_logged_steps(hands_off=True)
    assert log == [("step", 0), ("read", 0), ("step", 1), ("read", 1), ("step", 2), ("read", 2), ("step", 3),
                   ("read", 3)]
    assert losses == [0.0, 1.0, 2.0, 3.0]
