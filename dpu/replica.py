"""`--mode naive`: this DPU rank trains as one more data-parallel replica, with a smaller batch.

It runs the same replica loop as the host ranks (`common.training.Trainer`) on its own share of
each epoch (`common.naive`), in one gradient group with the host ranks; it does not validate.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import DatasetPair
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.plan.offload import plan_offload
from dpuoffload.common.runtime.hostgroup import FixedGroup
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.train.allreduce import GradientSync, build_sync
from dpuoffload.common.train.device import Compute
from dpuoffload.common.train.evaluation import NoValidation
from dpuoffload.common.train.loop import Trainer, TrainJob
from dpuoffload.common.train.naive import build_naive_feed, naive_backend


class Replica:
    inbox = None  # (it returns after the last epoch; the rank then idles until the end)

    def __init__(self, cfg: RunConfig, topo: Topology, data: DatasetPair, train: PerSampleSeeded,
                 model: nn.Module, faults: Faults) -> None:
        self.cfg, self.topo, self.data, self.train, self.model = cfg, topo, data, train, model
        self.faults = faults
        self.job: Optional[TrainJob] = None
        self.sync: Optional[GradientSync] = None

    def start(self, profiles: Sequence[dict[str, Any]]) -> None:
        """Agree on the DPU batch size and join the gradient group (collective with the host ranks)."""
        feed = build_naive_feed(self.cfg, self.topo, self.train, profiles)
        compute = Compute.of(torch.device("cpu"), self.cfg.amp, self.cfg.channels_last)  # as the host replicas
        self.job = TrainJob(data=self.data, train=self.train, model=compute.place(self.model), feed=feed,
                            plan=plan_offload(self.topo.ranks, self.cfg), compute=compute)
        self.sync = build_sync(naive_backend(self.cfg, profiles), FixedGroup.of_world(self.topo), self.cfg.peer_timeout)

    def run(self) -> list[dict[str, Any]]:
        """Train every epoch; per-epoch phase records are written by the trainer itself."""
        if self.job is None or self.sync is None:
            raise RuntimeError("Replica.start() must run before run()")
        Trainer(self.cfg, self.topo, self.job, self.sync, NoValidation(), group=FixedGroup.of_world(self.topo),
                faults=self.faults).fit()
        return []

    def close(self) -> None:
        if self.sync is not None:
            self.sync.shutdown()
