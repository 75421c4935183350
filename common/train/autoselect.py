"""`--mode auto`: profile a few steps, predict every mode's epoch with `perfmodel`, run the best.

Run by every rank at start-up, right after the handshake, before any mode-specific set-up: every
rank measures its per-sample costs (load + augment, forward + backward, evaluation) on the real
data and model at the same time, so ranks that share cores measure the shared speed they will
train at, and host rank 0's and DPU rank 0's numbers stand for their sides; the host ranks time an
allreduce of the gradient size, all ranks one of the whole job (naive), and host rank 0 / DPU rank
0 one batch transfer. Everyone gathers the numbers, builds the same `Profile`, and so resolves
`auto` to the same mode.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import build_datasets
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.models.zoo import build_model
from dpuoffload.common.modes import Mode
from dpuoffload.common.plan.perfmodel import Prediction, Profile, choose, explain_choice, format_table, predict_all
from dpuoffload.common.runtime.failure import collective_call
from dpuoffload.common.runtime.messages import Tag
from dpuoffload.common.runtime.roles import Role, Topology
from dpuoffload.common.runtime.waits import wait
from dpuoffload.common.train.evaluation import eval_seconds_per_sample
from dpuoffload.common.train.loop import optimizer_seconds_per_step
from dpuoffload.common.train.naive import train_seconds_per_sample


def local_costs(cfg: RunConfig, topo: Topology) -> dict[str, Any]:
    """Per-sample costs on this rank, measured while every other rank measures too."""
    data = build_datasets(cfg)
    train = PerSampleSeeded(data.train, cfg.seed)
    model = build_model(cfg, data.num_classes)
    k = min(2 * cfg.batch_size, len(train))
    train.__getitems__(list(range(len(train) - min(4, len(train)), len(train))))  # warm-up: the first decodes
    t0 = time.perf_counter()                                                      # pay one-off costs (7x on JPEG)
    batch = train.__getitems__(list(range(k)))
    aug = (time.perf_counter() - t0) / k
    sample = batch[0][0]
    return {"aug": aug, "train": train_seconds_per_sample(model, train, cfg.batch_size),
            "eval": eval_seconds_per_sample(model, data.val, cfg.val_batch_size),
            "opt": optimizer_seconds_per_step(cfg, model),
            "n_train": len(train), "n_val": len(data.val),
            "grad_elems": sum(p.numel() for p in model.parameters()),
            "batch_bytes": cfg.batch_size * sample.numel() * sample.element_size()}


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
                   host_train=host["train"], host_eval=host["eval"], dpu_aug=dpu.get("aug", 0.0),
                   dpu_train=dpu.get("train", 0.0), dpu_eval=dpu.get("eval", 0.0), allreduce=timing[0],
                   allreduce_all=timing[1], optimizer=host["opt"], transfer=timing[2], grad_bytes=4 * elems,
                   dpu_batch=cfg.dpu_batch_size if isinstance(cfg.dpu_batch_size, int) else None,
                   mv_fraction=cfg.mv_dpu_fraction if isinstance(cfg.mv_dpu_fraction, float) else None)


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
    resolved = cfg.replace(mode=chosen, auto_allow=None)
    if chosen is Mode.NAIVE and not isinstance(cfg.dpu_batch_size, int):
        # the run the model predicted
        resolved = resolved.replace(dpu_batch_size=int(preds[Mode.NAIVE].detail["dpu_batch"]))
    if chosen is not Mode.HYBRID:
        resolved = resolved.replace(dpu_da_ranks=None, dpu_mv_ranks=None, da_fanout=None)
    if chosen is not Mode.NAIVE:
        resolved = resolved.replace(dpu_batch_size=None)
    return resolved, record


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


__all__ = ["resolve_auto", "report_measured", "Prediction"]
