"""`--mode auto`: profile a few steps, predict every mode's epoch with `perfmodel`, run the best.

Run by every rank at start-up, right after the handshake, before any mode-specific set-up: every
rank measures its per-sample costs (load + augment, forward + backward, evaluation) on the real
data and model at the same time, so ranks that share cores measure the shared speed they will
train at, and host rank 0's and DPU rank 0's numbers stand for their sides; the host ranks time an
allreduce of the gradient size, all ranks one of the whole job (naive), and host rank 0 / DPU rank
0 one batch transfer. Everyone gathers the numbers, builds the same `Profile`, and so resolves
`auto` to the same mode. A host rank that will train on a GPU (`--device auto` finding one) times
its GPU step, the copy of a batch to the GPU and its own CPU work per batch instead of a CPU
training step (`gpu_costs`); on CPUs the profile is what it always was.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any, Optional

import numpy as np

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import build_datasets, build_train_set
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.faults.abort import collective_call
from dpuoffload.common.models.zoo import build_model
from dpuoffload.common.modes import Mode
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
from dpuoffload.common.runtime.messages import Tag
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.runtime.startup import init_torch
from dpuoffload.common.runtime.waits import wait
from dpuoffload.common.train.device import Compute, resolve_device
from dpuoffload.common.train.evaluation import eval_seconds_per_sample
from dpuoffload.common.train.loop import build_optimizer, optimizer_seconds_per_step
from dpuoffload.common.train.naive import train_seconds_per_sample


def local_costs(cfg: RunConfig, topo: Topology) -> dict[str, Any]:
    """Per-sample costs on this rank, measured while every other rank measures too. A host rank
    that will train on a GPU measures its GPU step instead of a CPU training step (`gpu_costs`)."""
    data = build_datasets(cfg)
    train = PerSampleSeeded(data.train, cfg.seed)
    model = build_model(cfg, data.num_classes)
    aug, sample = aug_seconds_per_sample(train, min(2 * cfg.batch_size, len(train)))
    common = {"aug": aug, "n_train": len(train), "n_val": len(data.val),
              "grad_elems": sum(p.numel() for p in model.parameters()),
              "batch_bytes": cfg.batch_size * sample.numel() * sample.element_size()}
    compute = gpu_compute(cfg, topo)
    if compute is not None:
        return {**common, **gpu_costs(cfg, model, compute, sample, data.val)}
    return {**common, "train": train_seconds_per_sample(model, train, cfg.batch_size),
            "eval": eval_seconds_per_sample(model, data.val, cfg.val_batch_size),
            "opt": optimizer_seconds_per_step(cfg, model)}


def gpu_compute(cfg: RunConfig, topo: Topology) -> Optional[Compute]:
    """Where this rank will train if it is a host rank on a GPU (as `host.main.prepare` resolves
    it for the chosen mode); None on DPU ranks and CPU host ranks, whose profile is unchanged."""
    if topo.role is not Role.HOST:
        return None
    device = resolve_device(cfg.device, topo.local_rank)
    return Compute.of(device, cfg.amp, cfg.channels_last) if device.type == "cuda" else None


def gpu_costs(cfg: RunConfig, model: Any, compute: Compute, sample: Any, val: Any = None) -> dict[str, float]:
    """A GPU host rank's profile (`perfmodel.Profile`'s GPU fields), clocks read after a synchronize:

    - gpu_step: one training step on a batch already on the GPU (autocast, layout, optimizer, and
      the loss read the trainer does every step), the mean over a few steps after two warm-ups
      (cuDNN picks its algorithms, the caching allocator fills);
    - h2d: the copy of one batch from pinned memory to the GPU;
    - host_cpu: the host process's CPU work per batch, one copy of a batch into pinned memory (what
      receiving it costs; launches are asynchronous and overlap the GPU);
    - eval: validation seconds per sample on the GPU (with `val`).

    The batch repeats one real augmented sample: the timings depend on its shape, not its values.
    """
    import torch

    x = sample.unsqueeze(0).expand(cfg.batch_size, *sample.shape).contiguous()
    y = torch.zeros(cfg.batch_size, dtype=torch.int64)
    probe = compute.place(copy.deepcopy(model))
    costs = {"gpu_step": train_step_seconds(cfg, probe, compute, x, y), "h2d": h2d_seconds(compute, x, y),
             "host_cpu": pinned_copy_seconds(x, y)}
    if val is not None:
        costs["eval"] = eval_seconds_per_sample(probe, val, cfg.val_batch_size)  # (reads sums: synchronizes)
    return costs


def train_step_seconds(cfg: RunConfig, model: Any, compute: Compute, x: Any, y: Any, steps: int = 5) -> float:
    """Seconds of one training step of `model` (already placed) on the batch (x, y) on its device.

    Autocast, layout, optimizer and the loss read of the trainer; the mean of `steps` steps after
    two warm-ups, with the device synchronized before each clock read (on a GPU the launches
    return before the work is done). Also the GPU-bound ceiling of `benchmarks/gpu.py`."""
    import torch
    from torch import nn

    model.train()
    opt, criterion = build_optimizer(cfg, model), nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cuda") if compute.scales_loss else None
    xd, yd = compute.inputs(x, y)

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        with compute.autocast():
            loss = criterion(model(xd), yd)
        (loss if scaler is None else scaler.scale(loss)).backward()
        float(loss.detach())  # the trainer reads every step's loss: a synchronize per step, as there
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()

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


def h2d_seconds(compute: Compute, x: Any, y: Any, reps: int = 3) -> float:
    """Seconds to copy the batch (x, y) from pinned memory to the GPU (median of `reps`)."""
    import torch

    xp, yp = x.pin_memory(), y.pin_memory()

    def one() -> float:
        torch.cuda.synchronize(compute.device)
        t0 = time.perf_counter()
        compute.inputs(xp, yp)
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


def aug_seconds_per_sample(train: PerSampleSeeded, k: int) -> tuple[float, Any]:
    """Seconds to load and augment one training sample here (over `k` samples), and a sample."""
    train.__getitems__(list(range(len(train) - min(4, len(train)), len(train))))  # warm-up: the first decodes
    t0 = time.perf_counter()                                                      # pay one-off costs (7x on JPEG)
    batch = train.__getitems__(list(range(k)))
    return (time.perf_counter() - t0) / k, batch[0][0]


def timed_allreduce(comm, elems: int, reps: int = 3) -> float:
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
    mine = collective_call(topo.world, lambda: local_costs(cfg, topo), label)
    costs = topo.world.allgather(mine)
    host, dpu = costs[topo.host_ranks[0]], costs[topo.dpu_ranks[0]] if topo.dpu_ranks else {}
    elems = host["grad_elems"]
    ar_host = timed_allreduce(topo.side_comm, elems) if topo.role is Role.HOST else 0.0
    ar_all = timed_allreduce(topo.world, elems)
    xfer = timed_transfer(topo, host["batch_bytes"], cfg.peer_timeout) if topo.dpu_ranks else 0.0
    timing = topo.world.bcast((ar_host, ar_all, xfer), root=topo.host_ranks[0])
    return Profile(n_train=host["n_train"], n_val=host["n_val"], host_ranks=len(topo.host_ranks),
                   dpu_ranks=len(topo.dpu_ranks), batch=cfg.batch_size, host_aug=host["aug"],
                   host_train=host.get("train", 0.0), host_eval=host["eval"], dpu_aug=dpu.get("aug", 0.0),
                   dpu_train=dpu.get("train", 0.0), dpu_eval=dpu.get("eval", 0.0), allreduce=timing[0],
                   allreduce_all=timing[1], optimizer=host.get("opt", 0.0), transfer=timing[2], grad_bytes=4 * elems,
                   dpu_batch=cfg.dpu_batch_size if isinstance(cfg.dpu_batch_size, int) else None,
                   mv_fraction=cfg.mv_dpu_fraction if isinstance(cfg.mv_dpu_fraction, float) else None,
                   **feeding_flags(cfg), **gpu_fields(host))


def gpu_fields(costs: dict[str, Any]) -> dict[str, float]:
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
        print(f"[dpuoffload] {explain_choice(preds, chosen, allow)}", flush=True)
    record = {"event": "auto", "chosen": chosen, "profile": profile.to_dict(), "allowed": list(allow),
              "predicted": {m: p.epoch_s for m, p in preds.items()}, "table": format_table(preds, chosen)}
    return cfg.replace(mode=chosen, auto_allow=None, **mode_settings(cfg, chosen, preds[chosen])), record


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
    aug, sample = aug_seconds_per_sample(train, min(2 * cfg.batch_size, len(train)))
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
