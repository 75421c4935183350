"""`host.validation.assemble_validation`: the one place that picks where epoch-end validation runs,
for the built-in trainer (`build_validation`) and scripts (`JobValidation`). Pure: fake communicators."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from torch.utils.data import TensorDataset

from dpuoffload.common.faults.watch import Faults
from dpuoffload.common.plan.offload import MV, OffloadPlan
from dpuoffload.common.runtime.roles import Role
from dpuoffload.common.train.evaluation import LocalValidation
from dpuoffload.host.validation import (
    FallbackValidation,
    OffloadedValidation,
    SurvivingValidation,
    ValidationSpec,
    assemble_validation,
)


class OneRank:
    """A one-rank communicator (what `OffloadedValidation` asks of it while it is built)."""

    def Get_rank(self) -> int:  # noqa: N802
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return 1


MODEL = nn.Linear(4, 3)
VAL = TensorDataset(torch.zeros(8, 4), torch.zeros(8, dtype=torch.long))
TOPO = SimpleNamespace(side_comm=OneRank(), world=OneRank(), world_rank=0, host_ranks=(0,), role=Role.HOST,
                       side_ranks=lambda role: (0,))
PLAN = OffloadPlan(work={1: MV}, feeder={}, mv_target={0: 1})


def spec(**changes) -> ValidationSpec:
    return ValidationSpec(**{"model": MODEL, "val_set": VAL, "batch_size": 4, "timeout": 5.0, "faults": Faults.inert(),
                             **changes})


def test_without_validation_ranks_the_host_ranks_validate():
    for s in (spec(), spec(topo=TOPO), spec(topo=TOPO, plan=OffloadPlan(work={}, feeder={}, mv_target={})),
              spec(plan=PLAN)):  # (a plan but no DPU ranks: a script started without dpurun)
        assert not s.offloaded and isinstance(assemble_validation(s), LocalValidation)


def test_the_host_ranks_validate_over_the_surviving_group_when_there_is_one():
    group = OneRank()
    validation = assemble_validation(spec(comm=OneRank(), group=group))
    assert isinstance(validation, LocalValidation) and validation.comm is group


def test_validation_ranks_take_it_plain_with_fallback_or_with_a_surviving_group():
    plain = assemble_validation(spec(topo=TOPO, plan=PLAN))
    assert isinstance(plain, OffloadedValidation) and not plain.keep and plain.dpu == 1
    fallback = assemble_validation(spec(topo=TOPO, plan=PLAN, fallback=True))
    assert isinstance(fallback, FallbackValidation) and fallback.off.keep and fallback.mv == {1}
    surviving = assemble_validation(spec(topo=TOPO, plan=PLAN, group=OneRank(), epochs=3))
    assert isinstance(surviving, SurvivingValidation) and surviving.off.surviving and surviving.epochs == 3
