"""The examples/ scripts as real MPMD jobs: their losses equal the same script with torch's DataLoader.

Each pair runs the script once with `job.loader` offloaded (`da`: batches from a DPU rank; `hybrid`:
validation on a DPU rank too) and once with `--loader torch` (torch's DataLoader over `dpu.seeded`,
built on the host) under `--mode none`, where `job.validate` evaluates on the host ranks; the step
losses and every epoch's validation results must be equal to the bit, on every host rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mpijobs import dpurun

pytestmark = pytest.mark.mpi
QUICK = ["--epochs", "2", "--subset", "256"]


def records(tmp_path, launcher, mode, script, loader, extra=(), ranks=1, flags=(), tag="") -> list[dict]:
    """Run `script` under dpurun (`flags`: dpurun's, `extra`: the script's) and read every host rank's record."""
    out = tmp_path / f"{mode}-{loader}{tag}-{{rank}}.json"
    r = dpurun(launcher, ["--mode", mode, *flags, f"examples/{script}", *QUICK, "--loader", loader,
                          "--record", str(out), *extra], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    where = "DPU" if mode in ("mv", "hybrid") else "host"
    assert "[dpuoffload] validation of epoch 1: loss" in r.stdout and f"256 samples, on the {where} ranks" in r.stdout
    return [json.loads(Path(str(out).format(rank=rank)).read_text()) for rank in range(ranks)]


def test_plain_loop_with_accumulation_bf16_autocast_and_validation_on_a_dpu_rank(tmp_path):
    extra = ["--accum", "2", "--amp", "bf16"]
    hybrid = records(tmp_path, ["--dpu-ranks", "2", "--oversubscribe"], "hybrid", "plain_loop.py", "dpu", extra)
    ref = records(tmp_path, [], "none", "plain_loop.py", "torch", extra)
    assert len(hybrid[0]["losses"]) == 2 * 8 and hybrid == ref
    assert sorted(hybrid[0]["validation"]) == ["0", "1"] and hybrid[0]["validation"]["1"]["count"] == 256


def test_horovod_loop_fed_by_one_dpu_rank(tmp_path):
    """Two host ranks, one DPU rank feeding both (fan-out), Horovod's allreduce."""
    launcher = ["--host-ranks", "2", "--dpu-ranks", "1", "--oversubscribe"]
    offloaded = records(tmp_path, launcher, "da", "horovod_loop.py", "dpu", ranks=2)
    ref = records(tmp_path, launcher, "none", "horovod_loop.py", "torch", ranks=2)
    assert len(offloaded[0]["losses"]) == 2 * 4 and offloaded == ref
    assert offloaded[0]["losses"] != offloaded[1]["losses"]  # each rank its own shard of the data
    assert offloaded[1]["validation"] == {} and sorted(offloaded[0]["validation"]) == ["0", "1"]  # host rank 0


def test_ddp_loop_checkpointed_cloned_and_resumed_bit_exact(tmp_path):
    """DDP over two host ranks; in `hybrid` one DPU rank feeds both, the other validates the state
    assembled from both host ranks' slices, and the keepers write the script's checkpoints (AdamW,
    StepLR, mid-epoch and epoch ends). The reference (`none`, torch's DataLoader) forks two clone
    ranks at step 3, which go on with the same losses to the bit; a `none` run resumed from the
    mid-epoch checkpoint of step 3 trains only the remaining steps, with the same losses to the bit."""
    launcher = ["--host-ranks", "2", "--dpu-ranks", "2", "--oversubscribe"]
    ckpt = tmp_path / "ckpt"
    offloaded = records(tmp_path, launcher, "hybrid", "ddp_loop.py", "dpu", ["--ckpt-steps", "3"], ranks=2,
                        flags=["--ckpt-dir", str(ckpt), "--ckpt-keep", "4"])
    ref = records(tmp_path, ["--host-ranks", "2", "--dpu-ranks", "1", "--clone-ranks", "2", "--oversubscribe"],
                  "none", "ddp_loop.py", "torch", ["--ckpt-steps", "3"], ranks=2, flags=["--clone-at", "3"])
    clones = [json.loads((tmp_path / f"none-torch-clone{rank}.json").read_text()) for rank in (0, 1)]
    for rank in (0, 1):  # the clones got the state of step 3 through the keepers and trained steps 4-8
        assert clones[rank]["losses"] == ref[rank]["losses"][3:]
        assert clones[rank]["resumed"] == [0, 3, 3, {"last_loss": ref[0]["losses"][2]}]
    assert sorted(clones[0]["validation"]) == ["0", "1"] and clones[0]["validation"] == ref[0]["validation"]
    assert len(offloaded[0]["losses"]) == 2 * 4 and offloaded == ref  # checkpoints change nothing
    assert offloaded[0]["losses"] != offloaded[1]["losses"]  # each rank its own shard of the data
    assert offloaded[1]["validation"] == {} and sorted(offloaded[0]["validation"]) == ["0", "1"]  # host rank 0
    assert sorted(p.parent.name for p in ckpt.glob("step-*/COMMITTED")) == [
        f"step-{s:09d}" for s in (3, 4, 7, 8)]
    resumed = records(tmp_path, launcher, "none", "ddp_loop.py", "torch", ranks=2, tag="-resumed",
                      flags=["--ckpt-dir", str(tmp_path / "ckpt2"), "--resume", str(ckpt / "step-000000003")])
    for rank in (0, 1):
        assert resumed[rank]["losses"] == ref[rank]["losses"][3:]  # steps 4-8 only, the same to the bit
        assert resumed[rank]["resumed"] == [0, 3, 3, {"last_loss": ref[0]["losses"][2]}]
    assert resumed[0]["validation"] == ref[0]["validation"]


def test_lightning_datamodule_hands_out_the_dpu_loader(tmp_path):
    """Lightning's own loop over two host ranks (DDP through `job.lightning_environment()`): the
    DataModule's `job.loader` gives the losses of torch's DataLoader, to the bit, on both ranks."""
    pytest.importorskip("lightning")
    offloaded = records(tmp_path, ["--host-ranks", "2", "--dpu-ranks", "1", "--oversubscribe"], "da",
                        "lightning_loop.py", "dpu", ranks=2)
    ref = records(tmp_path, ["--host-ranks", "2", "--dpu-ranks", "0", "--oversubscribe"], "none",
                  "lightning_loop.py", "torch", ranks=2)
    assert len(offloaded[0]["losses"]) == 2 * 4 and offloaded == ref
    assert offloaded[0]["losses"] != offloaded[1]["losses"]
