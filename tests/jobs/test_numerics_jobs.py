"""The numerics check in real jobs: a DPU rank whose kernels round differently from its host's.

On one x86 box the DPU rank is made to differ the way an Arm DPU or another library version would: its
Python runs with `ATEN_CPU_CAPABILITY=default` (torch's scalar kernels instead of AVX2), which changes
float32 random draws and ColorJitter's float arithmetic, and leaves PIL steps, ToTensor and Normalize alone.
With a float ColorJitter pipeline `warn` names the differing step and trains on; `strict` stops before the
first step with that line; a script's loader is checked too. A pipeline whose steps round alike is found
identical in every `da` run (tests/jobs/test_offload_modes.py; tests/test_aarch64.py with an aarch64 DPU).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.mpijobs import PY, dpurun, read_jsonl

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def scalar_python(tmp_path_factory) -> str:
    """A `--dpu-python` that runs this venv's Python with torch's default (scalar) CPU kernels."""
    path = tmp_path_factory.mktemp("dpupy") / "python-scalar"
    path.write_text(f'#!/bin/sh\nATEN_CPU_CAPABILITY=default exec "{PY}" "$@"\n')
    os.chmod(path, 0o755)
    return str(path)


def job(scalar_python: str, log: Path, factory: str, *extra: str):
    return dpurun(["--host-ranks", "1", "--dpu-ranks", "1", "--dpu-python", scalar_python],
                  ["--dataset", f"tests.user_factories:{factory}", "--model", "tests.user_factories:tiny_model",
                   "--epochs", "1", "--batch-size", "8", "--mode", "da", "--no-progress", "--log-dir", str(log),
                   *extra])


def test_warn_names_the_first_differing_step_and_trains_on(scalar_python, tmp_path):
    res = job(scalar_python, tmp_path, "photos_jitter", "--numerics", "warn")
    assert res.returncode == 0, res.stdout + res.stderr
    (record,) = read_jsonl(tmp_path / "numerics-rank0.jsonl")
    assert not record["identical"] and record["step"] == 3 and record["step_name"].startswith("ColorJitter(")
    assert record["dpu_platform"]["cpu_capability"] == "DEFAULT" != record["host_platform"]["cpu_capability"]
    assert 0 < record["differing"] <= record["compared"] == 16 and record["elements"] > 0
    assert record["line"] in res.stdout and "training goes on" in record["line"]
    assert "ATEN_CPU_CAPABILITY=default" in record["line"]  # the fix for a kernel-level difference
    epochs = [m for m in read_jsonl(tmp_path / "metrics.jsonl") if m["event"] == "epoch"]
    assert len(epochs) == 1  # trained on


def test_strict_stops_before_the_first_step(scalar_python, tmp_path):
    res = job(scalar_python, tmp_path, "photos_jitter", "--numerics", "strict")
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "NumericsError: numerics: samples built by DPU rank 0" in out and "first at step 3, ColorJitter(" in out
    assert "stopped before training (--numerics strict)" in out
    (record,) = read_jsonl(tmp_path / "numerics-rank0.jsonl")
    assert record["policy"] == "strict" and not record["identical"]
    steps = [m for m in read_jsonl(tmp_path / "metrics.jsonl") if m["event"] in ("step", "epoch")] \
        if (tmp_path / "metrics.jsonl").exists() else []
    assert steps == []


def test_a_scripts_loader_is_checked_too(scalar_python, tmp_path):
    res = dpurun(["--host-ranks", "1", "--dpu-ranks", "1", "--dpu-python", scalar_python],
                 ["--mode", "da", "--log-dir", str(tmp_path), "tests/api_scripts/jitter_loop.py"])
    assert res.returncode == 0, res.stdout + res.stderr
    (record,) = read_jsonl(tmp_path / "numerics-rank0.jsonl")
    assert not record["identical"] and record["step_name"].startswith("ColorJitter(") and record["policy"] == "warn"
    assert record["line"] in res.stdout and "script: 4 batches" in res.stdout
