"""`--mode auto`: profile a few steps, predict every mode's epoch with `perfmodel`, run the best.

Run by every rank at start-up, right after the handshake, before any mode-specific set-up: every
rank measures its per-sample costs (load + augment, forward + backward, evaluation) on the real
data and model at the same time, so ranks that share cores measure the shared speed they will
train at, and host rank 0's and DPU rank 0's numbers stand for their sides; the host ranks time an
allreduce of the gradient size, all ranks one of the whole job (naive), and host rank 0 / DPU rank
0 one batch transfer. Everyone gathers the numbers; then the host ranks time their step again
while the DPU ranks build batches, as in `da` (`interference`: on a shared machine that work slows
the host). Everyone builds the same `Profile`, and so resolves `auto` to the same mode. A host
rank that will train on a GPU (`--device auto` finding one) times its GPU step, the copy of a
batch to the GPU and its own CPU work per batch instead of a CPU training step (`gpu_costs`).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sized, cast

import numpy as np
from torch.utils.data import default_collate

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data import wire
from dpuoffload.common.data.datasets import build_datasets, build_train_set
from dpuoffload.common.data.loaders import RankLoader, Sampling
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.abort import collective_call
from dpuoffload.common.models.zoo import build_model
from dpuoffload.common.modes import AllReduce, Mode
from dpuoffload.common.plan.offload import plan_offload
from dpuoffload.common.plan.perfmodel import (
    Prediction,
    Profile,
    balanced_host_share,
    choose,
    explain_choice,
    format_table,
    predict_all,
)
from dpuoffload.common.runtime.env import horovod_available
from dpuoffload.common.runtime.hostgroup import FixedGroup, HostGroup
from dpuoffload.common.runtime.messages import Tag
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.runtime.torchsetup import init_torch
from dpuoffload.common.runtime.waits import wait
from dpuoffload.common.train import interference
from dpuoffload.common.train.allreduce import GradientSync, build_sync
from dpuoffload.common.train.device import Compute, finished, resolve_device
from dpuoffload.common.train.evaluation import eval_seconds_per_sample
from dpuoffload.common.train.naive import forward_backward, naive_backend, train_seconds_per_sample
from dpuoffload.common.train.training_state import build_optimizer, lr_factor


@dataclass
class Measuring:
    """What this rank measures with, kept between the profile's steps (never exchanged)."""

    model: Any
    train: PerSampleSeeded
    val: Any
    compute: Optional[Compute]      # a GPU host rank's device; None on CPUs


def local_costs(cfg: RunConfig, topo: Topology) -> tuple[dict[str, Any], Measuring]:
    """Per-sample costs on this rank that need no other rank, measured while every other rank
    measures too: load + augment, evaluation, a DPU rank's training step (for naive), a GPU host
    rank's GPU step (`gpu_costs`). A CPU host rank's training step and evaluation come from
    `step_costs`."""
    data = build_datasets(cfg)
    train = PerSampleSeeded(data.train, cfg.seed)
    model = build_model(cfg, data.num_classes)
    aug, sample = rank_aug_seconds(train, cfg)
    compute = gpu_compute(cfg, topo)
    costs = {"aug": aug, "n_train": len(train), "n_val": len(cast(Sized, data.val)),
             "grad_elems": sum(p.numel() for p in model.parameters()), "horovod": horovod_available(),
             "batch_bytes": cfg.batch_size * sample.numel() * sample.element_size()}
    costs.update(wire_costs(cfg, topo, data.train, on_gpu=compute is not None))
    if compute is not None:
        costs.update(gpu_costs(cfg, model, compute, sample, data.val, gpu_wire_batch(cfg, data.train)))
    elif topo.role is not Role.HOST:  # (a DPU rank's training step matters to naive only: no loader, no allreduce)
        costs.update(train=train_seconds_per_sample(model, train, cfg.batch_size),
                     eval=eval_seconds_per_sample(model, data.val, cfg.val_batch_size))
    return costs, Measuring(model, train, data.val, compute)


def wire_costs(cfg: RunConfig, topo: Topology, dataset: Any, on_gpu: bool) -> dict[str, float]:
    """What the uint8 wire changes, where the run's loaders split the transform (`wire.policy`,
    `wire.choose`; {} on the float wire): a DPU rank's load + augment without the float steps
    ("aug_wire"), and a host rank's float steps per received sample ("finish", `wire.HostSteps` on
    a batch as the loader runs them) and the uint8 batch's bytes (the transfer). The model missed
    the float steps in `da` (0.6 ms a step for 16 CIFAR samples: 1.1 % of a resnet20 step, and da's
    predictions read 1.5-2 % low). A DPU rank cannot know whether its host trains on a GPU (float
    wire under `auto`): it measures both, and `gather_profile` takes what its host rank's wire needs."""
    wired = wire_view(cfg, dataset, on_gpu)
    if wired is None:
        return {}
    split, view = wired
    if topo.role is not Role.HOST:
        return {"aug_wire": rank_aug_seconds(view, cfg)[0]}
    batch = repeated(cfg, view[0][0])
    if on_gpu:  # the trainer runs the float steps on the GPU, after the copy (`gpu_costs`' h2d): none here
        return {"finish": 0.0, "batch_bytes": batch.numel() * batch.element_size()}
    finish = split.host
    return {"finish": timed_calls(lambda: finish(batch, reuse=True), 5) / cfg.batch_size,
            "batch_bytes": batch.numel() * batch.element_size()}


def gpu_wire_batch(cfg: RunConfig, dataset: Any) -> Optional[tuple[Any, Any]]:
    """On a GPU host rank under `--wire uint8`: a uint8 batch as the DPU sends it and the float
    steps the trainer runs on the GPU after its copy (`HostSteps`); None on the float wire."""
    wired = wire_view(cfg, dataset, on_gpu=True)
    return None if wired is None else (repeated(cfg, wired[1][0][0]), wired[0].host)


def wire_view(cfg: RunConfig, dataset: Any, on_gpu: bool) -> Optional[tuple[wire.Split, PerSampleSeeded]]:
    """The run's split of the transform on a host rank of this kind and the data set as the DPU's part
    builds it (per-sample seeded); None on the float wire (no sample built to find that out)."""
    policy = wire.policy(cfg.wire, on_gpu)
    if wire.plan_split(dataset, policy) is None:
        return None
    split = wire.choose(dataset, policy, None, Sampling(cfg.batch_size, seed=cfg.seed)).split
    return None if split is None else (split, PerSampleSeeded(wire.dpu_view(dataset, split), cfg.seed))


def repeated(cfg: RunConfig, sample: Any) -> Any:
    """A batch of one sample repeated: the profile's timings depend on a batch's shape, not its values."""
    return sample.unsqueeze(0).expand(cfg.batch_size, *sample.shape).contiguous()


def step_costs(cfg: RunConfig, topo: Topology, measuring: Measuring, steps: int = 5) -> dict[str, float]:
    """The host ranks' training step with the run's gradient allreduce live (collective over the
    host ranks; {} on other ranks).

    The `--allreduce` backend is started first, as in the run: Horovod's background thread wakes
    every cycle on the host rank's core, and a step timed without it read 7 % fast (resnet56,
    one core: 164 ms a step with --allreduce mpi, 175 ms with Horovod). A CPU host rank then runs
    `loop_costs` (the allreduce inside each step, as the trainer) and times its evaluation (the
    same thread competes there); a GPU host rank, whose step was timed on its GPU, times the
    allreduce as many times on its gradients. The backend is shut down after (the run starts it
    again)."""
    if topo.role is not Role.HOST:
        return {}
    on_gpu = topo.side_comm.allgather(measuring.compute is not None)
    if len(set(on_gpu)) > 1:
        raise ConfigError(f"--mode auto: host ranks {[i for i, g in enumerate(on_gpu) if g]} train on a GPU and "
                          f"{[i for i, g in enumerate(on_gpu) if not g]} on CPUs (--device {cfg.device}); the "
                          "replicas must train on one kind of device: give --device cpu, or --device cuda where "
                          "every host rank has a GPU")
    compute = measuring.compute
    with live_backend(cfg.allreduce, FixedGroup.of_side(topo), cfg, compute) as sync:
        if compute is None:
            return {**loop_costs(cfg, topo, measuring.model, measuring.train, sync),
                    "eval": eval_seconds_per_sample(measuring.model, measuring.val, cfg.val_batch_size)}
        grads = gradients_like(measuring.model, compute)
        return {"allreduce": timed_calls(lambda: sync.allreduce_gradients_(grads), steps)}


@contextlib.contextmanager
def live_backend(backend: AllReduce, group: HostGroup, cfg: RunConfig,
                 compute: Optional[Compute]) -> Iterator[GradientSync]:
    """The gradient allreduce `backend` over `group` (collective over it), started for the profile
    and shut down after it: Horovod and torch.distributed start again for the run (1-2 ms)."""
    import torch

    sync = build_sync(backend, group, cfg.peer_timeout, compute.device if compute is not None else torch.device("cpu"))
    try:
        yield sync
    finally:
        sync.shutdown()


def timed_calls(fn: Callable[[], Any], reps: int) -> float:
    """Seconds of one call of `fn`: the median of `reps` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# How long the host ranks' profile steps run, at least. On a shared VM the machine's speed moves in
# episodes of 1-4 s (one fixed step here took 73-97 ms from one second to the next); five steps of
# shufflenet_v2 (0.5 s) fell inside a slow one in 2 of 3 jobs of one benchmark run, and every part
# of the profile read 30-50 % slow. Steps over 2 s and their median step past such an episode.
PROFILE_SECONDS = 2.0


def loop_costs(cfg: RunConfig, topo: Topology, model: Any, train: PerSampleSeeded, sync: GradientSync,
               min_steps: int = 5, seconds: float = PROFILE_SECONDS, max_steps: int = 200) -> dict[str, float]:
    """A CPU host rank's costs from steps of the trainer's own loop on a copy of the model, each
    part timed as `loop.Trainer` times its phases (collective over the host ranks: `sync`):

    - aug (per sample): the next batch from this rank's loader (`RankLoader`: the sampler's
      shuffled indices, load + augment, collate), the "data" phase of `--mode none`;
    - train (per sample): the gradients zeroed in place, forward, loss, backward, the loss and
      correct count read ("forward_backward");
    - allreduce (per step): the gradients through `sync`, the run's backend ("allreduce");
    - opt (per step): the SGD step and the learning-rate schedule's ("optimizer").

    The median of each over the steps after one warm-up step: as many steps as fill `seconds` at
    the warm-up step's pace (at least `min_steps`, at most `max_steps`; the slowest host rank's
    count, so every rank makes as many allreduce calls). Timed one by one in loops of their own,
    the parts missed 1-2 ms per step of the trainer's (a bare MPI allreduce of the gradient's
    size: 0.05 ms where Horovod's phase measures 1.4 ms for resnet20; the optimizer on warm
    parameters 30 % low; samples without the loader and collate 20 % low), all too fast.
    """
    import torch
    from mpi4py import MPI
    from torch import nn

    probe = copy.deepcopy(model).train()
    opt = build_optimizer(cfg, probe)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(cfg.lr_schedule, s, 1000))
    criterion = nn.CrossEntropyLoss()
    batches = endless_batches(RankLoader(cfg, train, len(topo.host_ranks), topo.side_rank))

    def step() -> dict[str, float]:
        t0 = time.perf_counter()
        x, y = next(batches)
        t1 = time.perf_counter()
        forward_backward(probe, criterion, x, y)
        t2 = time.perf_counter()
        sync.allreduce_gradients_([p.grad for p in probe.parameters()])
        t3 = time.perf_counter()
        opt.step()
        schedule.step()
        t4 = time.perf_counter()
        return {"aug": (t1 - t0) / len(y), "train": (t2 - t1) / len(y), "allreduce": t3 - t2, "opt": t4 - t3,
                "step": t4 - t0}

    warm = step()  # (the first step pays one-off costs: not counted)
    mine = min(max(min_steps, math.ceil(seconds / max(warm["step"], 1e-6))), max_steps)
    timed = [step() for _ in range(topo.side_comm.allreduce(mine, op=MPI.MAX))]
    costs = {part: statistics.median(t[part] for t in timed) for part in ("aug", "train", "allreduce", "opt")}
    return {**costs, "spread": quartile_spread([t["step"] for t in timed])}


def quartile_spread(seconds: list[float]) -> float:
    """The upper quartile of `seconds` over the lower: how far the profile's step times moved (1.0
    under 4 steps). The model takes medians, which a few slow steps do not move; a spread this wide
    says the steps' time moved as a whole while they were measured (a shared machine's speed, or
    steps that differ in work), and the predictions carry that uncertainty."""
    if len(seconds) < 4:
        return 1.0
    low, _, high = statistics.quantiles(seconds, n=4)
    return max(high / low, 1.0) if low > 0 else 1.0


def endless_batches(loader: RankLoader) -> Any:
    """The loader's batches, epoch after epoch (a small training set has fewer than a profile's steps)."""
    for epoch in itertools.count():
        loader.set_epoch(epoch)
        yield from loader


def gradients_like(model: Any, compute: Optional[Compute]) -> list[Any]:
    """Tensors shaped as the model's gradients, where the trainer's would be (this rank's own: the
    allreduce's timing needs them, the exchange of costs does not)."""
    import torch

    device = compute.device if compute is not None else torch.device("cpu")
    return [torch.full(p.shape, 1e-3, dtype=p.dtype, device=device) for p in model.parameters()]


def gpu_compute(cfg: RunConfig, topo: Topology) -> Optional[Compute]:
    """Where this rank will train if it is a host rank on a GPU (as `host.main.prepare` resolves
    it for the chosen mode); None on DPU ranks and CPU host ranks, whose profile is unchanged."""
    if topo.role is not Role.HOST:
        return None
    device = resolve_device(cfg.device, topo.local_rank)
    return Compute.of(device, cfg.amp, cfg.channels_last) if device.type == "cuda" else None


def gpu_costs(cfg: RunConfig, model: Any, compute: Compute, sample: Any, val: Any = None,
              wire_batch: Optional[tuple[Any, Any]] = None) -> dict[str, float]:
    """A GPU host rank's profile (`perfmodel.Profile`'s GPU fields), clocks read after a synchronize:

    - gpu_step: one training step on a batch already on the GPU (autocast, layout, optimizer, and
      the loss read the trainer does every step), the mean over a few steps after two warm-ups
      (cuDNN picks its algorithms, the caching allocator fills);
    - h2d: the copy of one batch from pinned memory to the GPU (under `--wire uint8`, `wire_batch`:
      the uint8 batch and the float steps run on it there, as the trainer's side stream does);
    - host_cpu: the host process's CPU work per batch, one copy of a batch into pinned memory (what
      receiving it costs; launches are asynchronous and overlap the GPU);
    - eval: validation seconds per sample on the GPU (with `val`).

    The batch repeats one real augmented sample: the timings depend on its shape, not its values.
    """
    import torch

    x = repeated(cfg, sample)
    y = torch.zeros(cfg.batch_size, dtype=torch.int64)
    probe = compute.place(copy.deepcopy(model))
    wx, finish = wire_batch if wire_batch is not None else (x, None)
    costs = {"gpu_step": train_step_seconds(cfg, probe, compute, x, y),
             "h2d": h2d_seconds(compute, wx, y, finish=finish), "host_cpu": pinned_copy_seconds(wx, y)}
    if val is not None:
        costs["eval"] = eval_seconds_per_sample(probe, val, cfg.val_batch_size)  # (reads sums: synchronizes)
    return costs


def train_step_seconds(cfg: RunConfig, model: Any, compute: Compute, x: Any, y: Any, steps: int = 5,
                       read_loss: bool = True) -> float:
    """Seconds of one training step of `model` (already placed) on the batch (x, y) on its device.

    Autocast, layout, optimizer and the loss read of the trainer (a step's loss read once the next
    step is queued, `loop.StepOutcome`); the mean of `steps` steps after two warm-ups, with the
    device synchronized before each clock read (on a GPU the launches return before the work is
    done). Also the GPU-bound ceiling of `benchmarks/gpu.py`, which also times `read_loss=False`
    (no read at all: what the trainer's read still costs)."""
    import torch
    from torch import nn

    model.train()
    opt, criterion = build_optimizer(cfg, model), nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cuda") if compute.scales_loss else None
    xd, yd = compute.inputs(x, y)
    last: list[Any] = []  # the step before, its loss not read yet

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        with compute.autocast():
            loss = criterion(model(xd), yd)
        (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        if read_loss and last:
            float(last.pop())  # as the trainer: the step before's loss, once this one is queued
        last[:] = [loss.detach()]

    def synchronize() -> None:
        if compute.device.type == "cuda":
            torch.cuda.synchronize(compute.device)

    for _ in range(2):
        step()
    synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    return (time.perf_counter() - t0) / steps


def h2d_seconds(compute: Compute, x: Any, y: Any, reps: int = 3, finish: Any = None) -> float:
    """Seconds to copy the batch (x, y) from pinned memory to the GPU (median of `reps`), and to
    run `finish` there on a uint8 batch (the float steps of `--wire uint8`, `device.finished`)."""
    import torch

    xp, yp = x.pin_memory(), y.pin_memory()

    def one() -> float:
        torch.cuda.synchronize(compute.device)
        t0 = time.perf_counter()
        finished(compute, compute.inputs(xp, yp), None if finish is None else finish.batch)
        torch.cuda.synchronize(compute.device)
        return time.perf_counter() - t0

    one()  # warm-up
    return statistics.median(one() for _ in range(reps))


def pinned_copy_seconds(x: Any, y: Any, reps: int = 3) -> float:
    """Seconds to copy the batch (x, y) into pinned memory (what receiving it costs the host)."""
    dst_x, dst_y = x.new_empty(x.shape).pin_memory(), y.new_empty(y.shape).pin_memory()

    def one() -> float:
        t0 = time.perf_counter()
        dst_x.copy_(x)
        dst_y.copy_(y)
        return time.perf_counter() - t0

    one()  # warm-up: the first touch faults the pages in
    return statistics.median(one() for _ in range(reps))


# How long a rank's load + augment is timed, at least. An emulated DPU rank is throttled by a CFS quota
# (`launch.throttle`: half of each 100 ms period at --dpu-speed 0.5); 32 tinyimagenet samples (20 ms of work)
# fit in one period's quota and read the core's full speed: 0.65 ms a sample in one job, 2.5-2.7 in the next
# two (the throttled speed the epochs see). Three periods and more average the quota out.
AUG_SECONDS = 0.3


def aug_seconds_per_sample(train: PerSampleSeeded, k: int, batch_size: Optional[int] = None,
                           min_seconds: float = 0.0) -> tuple[float, Any]:
    """Seconds to load, augment and collate one training sample here (over `k` samples at least, in
    batches of `batch_size`, default `k`, going round the data set for `min_seconds` at least), and
    a sample. Collated as a loader does (`default_collate` stacks each batch's samples: the DPU's
    send ring copies them as once), which the model missed while it timed the samples alone (the
    `none` epoch's data phase measured 1 ms per step more)."""
    train.__getitems__(list(range(len(train) - min(4, len(train)), len(train))))  # warm-up: the first decodes
    b = batch_size or k                                                           # pay one-off costs (7x on JPEG)
    done, t0 = 0, time.perf_counter()
    while done < k or time.perf_counter() - t0 < min_seconds:
        start = done % len(train)
        batch = default_collate(train.__getitems__(list(range(start, min(start + b, len(train))))))
        done += len(batch[1])
    return (time.perf_counter() - t0) / done, batch[0][0]


def rank_aug_seconds(train: PerSampleSeeded, cfg: RunConfig) -> tuple[float, Any]:
    """`aug_seconds_per_sample` as every rank's profile runs it: two of the run's batches, and
    `AUG_SECONDS` at least."""
    return aug_seconds_per_sample(train, min(2 * cfg.batch_size, len(train)), cfg.batch_size, AUG_SECONDS)


def timed_allreduce(comm, elems: int, reps: int = 3) -> float:
    """Seconds of one MPI allreduce of `elems` floats over `comm` (collective): the estimate of
    naive's allreduce over the whole job where naive is not a candidate (`backend_allreduce_seconds`)."""
    from mpi4py import MPI

    buf, out = np.ones(elems, dtype=np.float32), np.empty(elems, dtype=np.float32)
    comm.Allreduce(buf, out, op=MPI.SUM)  # warm-up
    t0 = time.perf_counter()
    for _ in range(reps):
        comm.Allreduce(buf, out, op=MPI.SUM)
    return (time.perf_counter() - t0) / reps


def timed_transfer(topo: Topology, nbytes: int, timeout: float, reps: int = 3) -> float:
    """One batch from DPU rank 0 to host rank 0 (0 on other ranks)."""
    host, dpu = topo.host_ranks[0], topo.dpu_ranks[0]
    buf = np.zeros(nbytes, dtype=np.uint8)
    t0 = time.perf_counter()
    for _ in range(reps):
        if topo.world_rank == dpu:
            wait(topo.world.Isend(buf, dest=host, tag=Tag.PROFILE), timeout, "host rank 0 (auto profile)")
        elif topo.world_rank == host:
            wait(topo.world.Irecv(buf, source=dpu, tag=Tag.PROFILE), timeout, "DPU rank 0 (auto profile)")
    return (time.perf_counter() - t0) / reps


def gather_profile(cfg: RunConfig, topo: Topology, label: str) -> Profile:
    """Collective over the world: measure, exchange, and build the same `Profile` everywhere."""
    with untouched_random_state():
        mine, measuring = collective_call(topo.world, lambda: local_costs(cfg, topo), label)
        mine.update(collective_call(topo.world, lambda: step_costs(cfg, topo, measuring), label))
        costs = topo.world.allgather(mine)
        beside = collective_call(topo.world, lambda: interference.measure(
            cfg, topo, measuring.model, measuring.train, costs), label)
    host, dpu = costs[topo.host_ranks[0]], costs[topo.dpu_ranks[0]] if topo.dpu_ranks else {}
    ar_all = collective_call(topo.world, lambda: job_allreduce_seconds(cfg, topo, measuring, costs), label)
    xfer = timed_transfer(topo, host["batch_bytes"], cfg.peer_timeout) if topo.dpu_ranks else 0.0
    timing = topo.world.bcast((ar_all, xfer, beside), root=topo.host_ranks[0])
    return Profile(n_train=host["n_train"], n_val=host["n_val"], host_ranks=len(topo.host_ranks),
                   dpu_ranks=len(topo.dpu_ranks), batch=cfg.batch_size, host_aug=host["aug"],
                   host_train=host.get("train", 0.0), host_eval=host["eval"],
                   dpu_aug=dpu.get("aug", 0.0), host_finish=host.get("finish", 0.0),
                   dpu_send_aug=dpu.get("aug_wire") if "finish" in host else None,
                   dpu_train=dpu.get("train", 0.0), dpu_eval=dpu.get("eval", 0.0), allreduce=host["allreduce"],
                   allreduce_all=timing[0], optimizer=host.get("opt", 0.0), transfer=timing[1],
                   grad_bytes=4 * host["grad_elems"], host_beside=timing[2] or 1.0,
                   host_step_spread=host.get("spread", 1.0),
                   dpu_batch=cfg.dpu_batch_size if isinstance(cfg.dpu_batch_size, int) else None,
                   mv_fraction=cfg.mv_dpu_fraction if isinstance(cfg.mv_dpu_fraction, float) else None,
                   **feeding_flags(cfg), **gpu_fields(host))


@contextlib.contextmanager
def untouched_random_state() -> Iterator[None]:
    """The global random states (torch's on the CPU and every GPU, Python's, numpy's) as they were
    before the profile: its loaders draw their base seeds from torch's, and a user model with
    dropout draws in its steps, so a run under `--mode auto` would otherwise train on other random
    numbers than the chosen mode run by hand."""
    import random

    import torch

    saved = random.getstate(), np.random.get_state()
    gpus = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=gpus):
        yield
    random.setstate(saved[0])
    np.random.set_state(saved[1])


def job_allreduce_seconds(cfg: RunConfig, topo: Topology, measuring: Measuring, costs: list[dict[str, Any]]) -> float:
    """naive's allreduce over every rank: through the backend naive would use where `--auto-allow
    naive` makes it a candidate (started and shut down as in `step_costs`); otherwise (naive only
    shown, never run) a plain MPI allreduce of the size, which spares a backend start-up on the
    DPU ranks."""
    if cfg.auto_allow != Mode.NAIVE.value:
        return timed_allreduce(topo.world, sum(p.numel() for p in measuring.model.parameters()))
    grads = gradients_like(measuring.model, None)  # (naive trains every replica on CPUs)
    with live_backend(naive_backend(cfg, costs), FixedGroup.of_world(topo), cfg, None) as sync:
        return timed_calls(lambda: sync.allreduce_gradients_(grads), 5)


def gpu_fields(costs: dict[str, Any]) -> dict[str, Any]:
    """The `Profile` fields of a GPU host rank's measured costs (none on CPUs: the defaults, 0)."""
    return {k: costs[k] for k in ("gpu_step", "h2d", "host_cpu") if k in costs}


def feeding_flags(cfg: RunConfig) -> dict[str, Any]:
    """The `Profile` fields of --da-host-share (None: auto), --da-host-workers and --dpu-workers."""
    share = None if cfg.da_host_share == "auto" else float(cfg.da_host_share)
    return {"host_share": share, "host_workers": cfg.da_host_workers, "dpu_workers": cfg.dpu_workers}


def resolve_auto(cfg: RunConfig, topo: Topology, label: str) -> tuple[RunConfig, dict[str, Any]]:
    """The config with `mode` resolved, and the record of the choice (host rank 0 prints it)."""
    profile = gather_profile(cfg, topo, label)
    preds = predict_all(profile)
    allow = (Mode(cfg.auto_allow),) if cfg.auto_allow else ()
    chosen = choose(profile, allow)
    if topo.world_rank == topo.host_ranks[0]:
        if profile.dpu_ranks and not profile.on_gpu:
            print(f"[dpuoffload] --mode auto profile: the host's forward/backward took {profile.host_beside:.2f}x "
                  "as long while the DPU ranks built batches (in da's and hybrid's predictions)", flush=True)
        print(f"[dpuoffload] {explain_choice(preds, chosen, allow)}", flush=True)
        if (note := unsteady_note(profile)) is not None:
            print(f"[dpuoffload] note: {note}", flush=True)
    record = {"event": "auto", "chosen": chosen, "profile": profile.to_dict(), "allowed": list(allow),
              "predicted": {m: p.epoch_s for m, p in preds.items()}, "table": format_table(preds, chosen)}
    return cfg.replace(mode=chosen, auto_allow=None, **mode_settings(cfg, chosen, preds[chosen])), record


# Steps whose middle half lies this far apart (upper over lower quartile) make `--mode auto` say so.
# Steady steps of one model on fixed-size batches lie within a few percent of each other (resnet56's,
# timed one by one in a quiet epoch on the 2-core VM: 1.04); there the machine's speed moved 1.2-1.6x
# within seconds (RESULTS.md), and the model's misses in issue 35's runs came in threes, every mode
# of one workload off together: the speed a profile ran at against the speed the epochs ran at.
UNSTEADY_SPREAD = 1.25


def unsteady_note(profile: Profile) -> Optional[str]:
    """What to tell the user when the profile's host steps moved (`quartile_spread`); None if steady."""
    if profile.host_step_spread < UNSTEADY_SPREAD:
        return None
    return (f"the host's profile steps were unsteady, their upper quartile {profile.host_step_spread:.2f}x their "
            "lower (the machine's speed moved while they were timed, or the steps differ in work): the predicted "
            "epochs may be off by as much, and a mode predicted close to the chosen one may run faster. The "
            "measured epoch is printed beside the prediction at the end; give --mode to skip the profile")


def mode_settings(cfg: RunConfig, chosen: Mode, pred: Prediction) -> dict[str, Any]:
    """The flags of the run the model predicted for `chosen`, with the other modes' flags cleared
    (in one replace: a flag of another mode left set would fail the chosen mode's checks)."""
    out: dict[str, Any] = {}
    if chosen is Mode.NAIVE and not isinstance(cfg.dpu_batch_size, int):
        out["dpu_batch_size"] = int(pred.detail["dpu_batch"])
    if chosen is not Mode.HYBRID:
        out.update(dpu_da_ranks=None, dpu_mv_ranks=None, da_fanout=None)
    if chosen is not Mode.NAIVE:
        out["dpu_batch_size"] = None
    if chosen not in (Mode.DA, Mode.HYBRID):  # nothing is augmented on DPU ranks
        out.update(dpu_workers=0, da_host_share=0.0)
    elif cfg.da_host_share == "auto":  # the share the prediction used
        out["da_host_share"] = pred.detail["host_share"]
    return out


def resolve_host_share(cfg: RunConfig, topo: Topology, label: str) -> RunConfig:
    """`--da-host-share auto` (da, hybrid): the config with the share host rank 0 picks for every rank.

    Collective over the world. The host ranks and the augmentation DPU ranks build training samples
    at the same time (ranks that share cores measure the speed they will share), host rank 0
    balances its workers' rate against the slowest-fed DPU rank's (`balanced_host_share`) and
    prints the choice. With --da-host-workers 0 the host builds in its training process, so its
    training step is measured too.
    """
    plan = plan_offload(topo.ranks, cfg)
    feeders = sorted(set(plan.feeder.values()))
    mine = collective_call(topo.world, lambda: _feeding_costs(cfg, topo, topo.world_rank in feeders), label)
    costs = topo.world.allgather(mine)
    share = None
    if topo.world_rank == topo.host_ranks[0]:
        host, dpu = costs[topo.world_rank], max(costs[d]["aug"] for d in feeders)
        fan_out = max(len(plan.fed_by(d)) for d in feeders)
        # the busiest augmentation rank, feeding fan_out host ranks (the share is one for the job)
        profile = Profile(n_train=1, n_val=0, host_ranks=fan_out, dpu_ranks=1, batch=cfg.batch_size,
                          host_aug=host["aug"], host_train=host.get("train", 0.0), host_eval=0.0, dpu_aug=dpu,
                          dpu_train=0.0, dpu_eval=0.0, allreduce=0.0, **feeding_flags(cfg), **gpu_fields(host))
        share = balanced_host_share(profile, n_da=1)
        where = (f"{cfg.da_host_workers} worker process(es)" if cfg.da_host_workers else "the training process")
        print(f"[dpuoffload] --da-host-share auto: {share:g} of every epoch's steps built on the host ranks "
              f"(host {host['aug'] * 1e3:.2f} ms/sample in {where}; DPU {dpu * 1e3:.2f} ms/sample x "
              f"{max(cfg.dpu_workers, 1)} process(es) per stream, feeding {fan_out} host rank(s))", flush=True)
    return cfg.replace(da_host_share=topo.world.bcast(share, root=topo.host_ranks[0]))


def _feeding_costs(cfg: RunConfig, topo: Topology, feeds: bool) -> dict[str, float]:
    """This rank's seconds per training sample (and per trained sample, for an in-process host share)."""
    if topo.role is not Role.HOST and not feeds:
        return {}
    init_torch()  # (a DPU rank's threads before it measures: prepare has not run yet)
    in_process = topo.role is Role.HOST and cfg.da_host_workers == 0
    data = build_datasets(cfg) if in_process else None
    train = PerSampleSeeded(data.train if data is not None else build_train_set(cfg), cfg.seed)
    aug, sample = rank_aug_seconds(train, cfg)
    costs = {"aug": aug}
    if data is not None:  # what the in-process share adds to: the CPU step, or on a GPU the host's CPU work
        model, compute = build_model(cfg, data.num_classes), gpu_compute(cfg, topo)
        if compute is not None:
            costs.update(gpu_costs(cfg, model, compute, sample))
        else:
            costs["train"] = train_seconds_per_sample(model, train, cfg.batch_size)
    return costs


def report_measured(record: dict[str, Any], epoch_times: list[float]) -> Optional[str]:
    """'predicted X s, measured Y s (+Z %)' for the chosen mode, from epochs 2.. (epoch 1 warms up)."""
    steady = epoch_times[1:] or epoch_times
    if not steady:
        return None
    measured = float(np.median(steady))
    predicted = record["predicted"][record["chosen"]]
    record.update(measured_epoch_s=measured, prediction_error=(predicted - measured) / measured)
    return (f"[dpuoffload] --mode auto chose {record['chosen']}: predicted {predicted:.2f} s/epoch, measured "
            f"{measured:.2f} s/epoch ({record['prediction_error']:+.0%})")


__all__ = ["resolve_auto", "resolve_host_share", "report_measured", "Prediction"]
