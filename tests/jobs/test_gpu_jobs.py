"""The job paths of a GPU host rank as real jobs on a GPU (`gpu`-marked: `bash scripts/gpu-check.sh`
on a GPU node; skipped elsewhere). The same paths run on the CPU in test_offload_modes.py and
test_checkpoint.py; here the host rank trains on `cuda:0`, where batches arrive in pinned memory, go
to the GPU on a side stream a step ahead, and state crosses to host memory for the DPU ranks.

Every run trains on `--mode none`'s batches (digests of what the model gets) with `none`'s step
losses: the ranks run torch's deterministic algorithms, so on one GPU the same batches give the
same losses to the bit.
"""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from tests.mpijobs import dpurun, read_jsonl

pytestmark = [pytest.mark.gpu, pytest.mark.mpi,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU (bash scripts/test.sh -m gpu on a GPU node)")]

GPU = ["--preset", "debug", "--device", "cuda", "--train-subset", "128", "--epochs", "2", "--digest-batches",
       "--no-progress"]


@pytest.fixture(scope="module")
def job(bundled_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-jobs")

    @lru_cache(maxsize=None)
    def _job(name: str, dpus: int, *training: str) -> dict:
        log = root / name
        r = dpurun(["--dpu-ranks", str(dpus), "--oversubscribe"],
                   [*GPU, "--data", str(bundled_data / "cifar10"), "--log-dir", str(log), *training], timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        metrics = read_jsonl(log / "metrics.jsonl")
        return {"out": r.stdout, "end": next(m for m in metrics if m["event"] == "end"),
                "losses": [m["step_losses"] for m in metrics if m["event"] == "epoch"],
                "digests": [p["batch_digest"] for p in read_jsonl(log / "phases-rank0.jsonl") if "batch_digest" in p]}
    return _job


@pytest.mark.parametrize("name, dpus, flags", [
    ("da", 1, ("--mode", "da")),                                              # the float wire (auto on a GPU host)
    ("share", 1, ("--mode", "da", "--da-host-share", "0.5", "--da-host-workers", "1")),  # host + DPU builders
    ("hybrid", 2, ("--mode", "hybrid")),                                      # the state to a DPU validation rank
])
def test_gpu_modes_train_on_nones_batches(job, name, dpus, flags):
    none = job("none", 1, "--mode", "none")
    run = job(name, dpus, *flags)
    assert "on cuda:0" in run["out"] and len(run["digests"]) == 2
    assert run["digests"] == none["digests"] and run["losses"] == none["losses"]
    assert run["end"]["weights_sha256"] == none["end"]["weights_sha256"]


def test_gpu_checkpoint_and_resume_mid_epoch_are_bit_exact(job, tmp_path):
    """The state leaves the GPU for the DPU keeper mid-epoch and comes back to it on resume."""
    ck = str(tmp_path / "ck")
    straight = job("da", 1, "--mode", "da")
    stopped = job("stopped", 1, "--mode", "da", "--ckpt-dir", ck, "--ckpt-every", "2", "--stop-at-step", "10")
    assert "checkpoint step 10 committed" in stopped["out"]
    resumed = job("resumed", 1, "--mode", "da", "--ckpt-dir", ck, "--resume", "latest")
    assert "(exactly): epoch 2, step 2 done (global step 10)" in resumed["out"]
    assert resumed["end"]["weights_sha256"] == straight["end"]["weights_sha256"]
    assert resumed["losses"][-1] == straight["losses"][-1]
