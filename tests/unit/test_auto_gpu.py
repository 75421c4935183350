"""--mode auto's profile on a GPU host rank (`autoselect.gpu_costs`): which ranks measure a GPU step,
and, on a GPU node (`-m gpu`), that the measured fields make a profile the model predicts from."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dpuoffload.common.config import RunConfig
from dpuoffload.common.plan.perfmodel import Profile, predict_all
from dpuoffload.common.runtime.roles import Role
from dpuoffload.common.train.autoselect import gpu_compute, gpu_costs, gpu_fields

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bash scripts/test.sh -m gpu "
                                                                     "on a GPU node)")


def test_only_a_host_rank_that_will_train_on_a_gpu_measures_a_gpu_step(monkeypatch):
    host, dpu = SimpleNamespace(role=Role.HOST, local_rank=0), SimpleNamespace(role=Role.DPU, local_rank=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_compute(RunConfig(), host) is None  # the CPU profile, as before
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    compute = gpu_compute(RunConfig(amp="bf16", channels_last=True), host)
    assert compute is not None and compute.device == torch.device("cuda", 0) and compute.channels_last
    assert gpu_compute(RunConfig(device="cpu"), host) is None
    assert gpu_compute(RunConfig(), dpu) is None  # DPU ranks never train on a GPU
    assert gpu_fields({"aug": 0.001, "train": 0.01}) == {}  # a CPU host's costs: the GPU fields stay 0


@needs_gpu
@pytest.mark.gpu
def test_gpu_costs_measure_a_step_a_copy_and_the_host_cpu_and_predict():
    from torchvision.models import resnet18

    cfg = RunConfig(batch_size=64, amp="bf16", channels_last=True)
    compute = gpu_compute(cfg, SimpleNamespace(role=Role.HOST, local_rank=0))
    sample = torch.randn(3, 64, 64)
    val = [(torch.randn(3, 64, 64), 0)] * 16
    costs = gpu_costs(cfg, resnet18(num_classes=10), compute, sample, val)
    assert all(costs[k] > 0 for k in ("gpu_step", "h2d", "host_cpu", "eval"))
    p = Profile(n_train=640, n_val=16, host_ranks=1, dpu_ranks=1, batch=64, host_aug=0.001, host_train=0.0,
                host_eval=costs["eval"], dpu_aug=0.002, dpu_train=0.0, dpu_eval=0.001, allreduce=0.0,
                **gpu_fields(costs))
    preds = predict_all(p)
    assert p.on_gpu and "naive" not in preds and preds["da"].train_s > 0
