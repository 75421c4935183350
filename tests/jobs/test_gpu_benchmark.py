"""benchmarks/gpu.py (issue 12's table): the arithmetic behind its rates and targets (pure), and the
whole benchmark on a CPU with --quick, as CI runs it (its numbers say nothing about a GPU).

(Here the tests that start processes; those that run in one process: tests/unit/test_gpu_benchmark.py.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.mpijobs import REPO, job_env


@pytest.mark.mpi
@pytest.mark.timeout(600)
def test_gpu_benchmark_quick_on_a_cpu(tmp_path):
    """Every row of the table, measured by real jobs, and ours trained on the peer's batches with the
    peer's losses (the benchmark exits otherwise; the report says which runs it compared)."""
    out = tmp_path / "gpu.json"
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--device", "cpu", "--quick",
                          "--out", str(out)], capture_output=True, text=True, env=job_env(), cwd=REPO, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    r = json.loads(out.read_text())["report"]["resnet50"]
    assert not (tmp_path / "gpu.partial.json").exists()  # (the jobs so far, written during the run: gone at its end)
    assert set(r["img_s"]) == {"peer", "da", "share auto", "share 1.0"}  # (--quick: no fixed share, no auto)
    assert set(r["short_img_s"]) == {"peer short", "ours short"}
    assert all(x["median"] > 0 for x in [*r["img_s"].values(), *r["short_img_s"].values()])
    assert r["ceiling_img_s"] > 0 and r["per_core_img_s"] > 0
    assert r["identity"] == {"da vs peer": True, "share auto vs peer": True, "share 1.0 vs peer": True,
                             "ours short vs peer short": True}
    assert 0 <= r["auto_share"] <= 1 and 0 <= r["auto_share_short"] <= 1
    assert all(v > 0 for v in r["predicted"]["img_s"].values())
    assert [t["target"] for t in r["targets"]] == [
        "share auto / min(GPU-bound, peer + s·d·core)", "share 1.0 / peer (same cores)",
        "ours short / ours long (share auto)", "model prediction error, da", "model prediction error, share auto"]
    for row in ("| GPU-bound (synthetic batches on the device, deterministic) |",
                "| peer: DataLoader(num_workers=1, prefetch 4) | 1 |",
                "| ours da, 1 DPU cores (--dpu-workers 1) | 0 + 1 |",
                "| ours host + DPU, --da-host-share auto (picked ", "| ours share 1.0 (1 host workers, no DPU) | 1 |",
                "--quick on a CPU: a smoke run", "DPU cores at speed 1 to keep the device ≥ 90 % busy on resnet50"):
        assert row in res.stdout, row
    # each job's line as it ends (a run cut short by a GPU lease still says what it measured)
    line = re.search(r"rep 1/1 resnet50 da: \d+ img/s steady \(\d\.\d\d of GPU-bound\); job (\d+) s: start-up "
                     r"([\d.]+) s \((.+?)\), training ([\d.]+) s \(its first step ([\d.]+) s\), validation ([\d.]+) s, "
                     r"launch and teardown (-?[\d.]+) s", res.stderr)
    assert line, res.stderr[-2000:]
    wall, startup, train, first = (float(line.group(k)) for k in (1, 2, 4, 5))
    assert 1 < startup < wall and 0 < first < train < wall  # (a rank's start-up is seconds: torch's import alone)
    assert "interpreter and imports" in line.group(3)  # (the 3 largest parts of host rank 0's start-up)
    parts = r["jobs"]["da"][0]["startup_parts_s"]
    assert sum(parts.values()) == pytest.approx(r["jobs"]["da"][0]["startup_s"], abs=0.05)


@pytest.mark.parametrize("args, env, said", [
    (["--device", "tpu"], {}, "gpu-check.sh: --device tpu: give cpu (a rehearsal without a GPU) or cuda (the default)"),
    (["--device", "cpu"], {"DPUOFFLOAD_GPU_CHECK_BUDGET_S": "8m"},
     "gpu-check.sh: DPUOFFLOAD_GPU_CHECK_BUDGET_S=8m: give whole seconds (default 480)"),
])
def test_gpu_check_refuses_a_bad_device_or_budget_before_it_sets_anything_up(tmp_path, args, env, said):
    """scripts/gpu-check.sh: a wrong --device or budget is one line and exit 2, before any set-up or test
    (a GPU lease is short: nothing of it is spent on a typo), and no output folder is made."""
    out = tmp_path / "out"
    res = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), *args, str(out)], capture_output=True,
                         text=True, env={**job_env(), **env}, cwd=REPO, timeout=60)
    assert res.returncode == 2 and res.stderr.strip() == said, res.stdout + res.stderr
    assert not out.exists()
