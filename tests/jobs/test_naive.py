"""--mode naive: DPU ranks as extra replicas with a smaller batch, sample-weighted gradients.

(Here the tests that start processes; those that run in one process: tests/unit/test_naive.py.)
"""


import pytest
import torch
from torch.utils.data import default_collate

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.datasets import build_datasets
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.models.zoo import build_model
from dpuoffload.common.train.naive import naive_plan
from tests.mpijobs import dpurun, read_jsonl


# ------------------------------------------------------------------------------- real MPI jobs
def _run(tmp_path, bundled_data, hosts, dpus, *extra):
    res = dpurun(["--host-ranks", str(hosts), "--dpu-ranks", str(dpus), "--oversubscribe"],
                 ["--mode", "naive", "--data", str(bundled_data / "cifar10"), "--log-dir", str(tmp_path),
                  "--no-progress", *extra], timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


@pytest.mark.mpi
@pytest.mark.parametrize("allreduce", ["horovod", "torch"])
def test_one_weighted_step_equals_one_step_on_the_concatenated_batch(tmp_path, bundled_data, allreduce):
    """1 host rank (batch 16) + 1 DPU rank (batch 4), 20 samples: one step. The result must equal a
    single-process SGD step on all 20 samples (BatchNorm-free model: its batch statistics would
    differ per replica by design)."""
    weights = tmp_path / "w.pt"
    opts = ["--model", "tests.user_factories:tiny_model", "--train-subset", "20", "--batch-size", "16",
            "--dpu-batch-size", "4", "--epochs", "1", "--val-subset", "16", "--allreduce", allreduce,
            "--save-weights", str(weights)]
    _run(tmp_path, bundled_data, 1, 1, *opts)
    got = torch.load(weights, weights_only=True)

    cfg = RunConfig(mode="naive", model="tests.user_factories:tiny_model", data=str(bundled_data / "cifar10"),
                    train_subset=20, batch_size=16, dpu_batch_size=4, epochs=1)
    model = build_model(cfg, 10)
    train = PerSampleSeeded(build_datasets(cfg).train, cfg.seed)
    host, dpu = (r[0] for r in naive_plan(20, cfg.seed, 0, [16, 4], False))
    x, y = default_collate(train.__getitems__(host + dpu))
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    for name, ref in model.state_dict().items():
        torch.testing.assert_close(got[name], ref, rtol=1e-5, atol=1e-7)


@pytest.mark.mpi
def test_epoch_covers_the_data_set_once_across_host_and_dpu_replicas(tmp_path, bundled_data):
    """Uneven: 50 samples, replicas of 16, 16, 3, 3: the second step leaves three replicas empty."""
    _run(tmp_path, bundled_data, 2, 2, "--train-subset", "50", "--batch-size", "16", "--dpu-batch-size", "3",
         "--epochs", "2", "--val-subset", "64")
    per_rank = {r: read_jsonl(tmp_path / f"phases-rank{r}.jsonl") for r in range(4)}
    for epoch in range(2):
        counts = [next(e for e in per_rank[r] if e.get("epoch") == epoch)["samples"] for r in range(4)]
        assert counts == [16 + 12, 16, 3, 3]
    assert {e["role"] for r in (2, 3) for e in per_rank[r] if "epoch" in e} == {"dpu"}


@pytest.mark.mpi
def test_naive_trains_on_bundled_data_with_auto_dpu_batch(tmp_path, bundled_data):
    res = _run(tmp_path, bundled_data, 1, 1, "--preset", "debug", "--epochs", "2")
    assert "[dpuoffload] naive: host batch 16, DPU batch" in res.stdout
    epochs = [m for m in read_jsonl(tmp_path / "metrics.jsonl") if m["event"] == "epoch"]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert epochs[-1]["val_count"] == 256
