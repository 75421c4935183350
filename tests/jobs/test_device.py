"""`--device`, `--amp`, `--channels-last` (pure, on the CPU; the GPU runs are marked `gpu`).

(Here the tests that start processes; those that run in one process: tests/unit/test_device.py.)
"""

from __future__ import annotations

import pytest

from tests.unit.test_device import needs_gpu


@needs_gpu
@pytest.mark.gpu
@pytest.mark.mpi
def test_gpu_da_on_the_uint8_wire_trains_on_nones_batches(bundled_data, tmp_path):
    """The built-in trainer on a GPU with `--wire uint8`: uint8 batches from the DPU rank, float steps
    on the GPU. Its batches (digested as the model gets them, back from the GPU) and losses equal
    `--mode none`'s on the same GPU (the ranks' deterministic setting), and it says where the float
    steps ran."""
    import json

    from tests.mpijobs import dpurun

    def run(mode, *extra):
        log = tmp_path / mode
        r = dpurun(["--dpu-ranks", "1"], ["--preset", "debug", "--data", str(bundled_data / "cifar10"), "--epochs",
                                          "2", "--train-subset", "128", "--device", "cuda", "--mode", mode,
                                          "--digest-batches", "--log-dir", str(log), "--no-progress", *extra])
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        epochs = [json.loads(x) for x in (log / "metrics.jsonl").read_text().splitlines()]
        phases = [json.loads(x) for x in (log / "phases-rank0.jsonl").read_text().splitlines()]
        return r.stdout, [e["step_losses"] for e in epochs if e.get("event") == "epoch"], \
            [p["batch_digest"] for p in phases if "batch_digest" in p]

    out, losses, digests = run("da", "--wire", "uint8")
    _, ref_losses, ref_digests = run("none")
    assert "uint8 (then ToTensor, Normalize on the GPU, after the copy)" in out
    assert len(digests) == 2 and digests == ref_digests and losses == ref_losses
