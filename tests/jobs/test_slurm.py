"""`dpurun` inside a Slurm allocation (`launch.slurm`): host nodes, slots and each host node's DPU from
Slurm's environment, for both kinds of site (DPUs as allocated nodes; DPUs outside Slurm under a name
derived from the host's), and the errors when the allocation cannot give them. Pure: the environment
is a dict, name lookups a function; `dpurun --dry-run` shows the derived command without a Slurm.

(Here the tests that start processes; those that run in one process: tests/unit/test_slurm.py.)
"""

from __future__ import annotations

import os
import subprocess

from dpuoffload.launch.slurm import Allocation, DpuNaming, derive
from tests.mpijobs import DPURUN, REPO
from tests.unit.test_slurm import DINE, THOR


def test_a_none_job_needs_no_dpu_node():
    hosts_only = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "h[0-1]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    got = derive(Allocation.from_env(hosts_only), DpuNaming(), dpu_ranks=0)
    assert (got.host_list, got.dpu_list, got.dpu_slots) == ("h0:2,h1:2", "", 0)
    res = dry_run(hosts_only, "--dpu-ranks", "0", training=("--mode", "none"))
    assert res.returncode == 0, res.stderr
    assert "-np 4 --host h0:2,h1:2" in res.stdout and "dpuoffload.dpu" not in res.stdout


def dry_run(env: dict, *launcher: str, training: tuple[str, ...] = ("--mode", "da")) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return subprocess.run([DPURUN, *launcher, "--dry-run", "--mpi-flavor", "openmpi", "--", "--dataset", "fake",
                           *training], capture_output=True, text=True, env={**clean, **env}, cwd=REPO, timeout=60)


def test_dry_run_in_an_allocation_says_what_it_derived_and_why():
    res = dry_run(THOR)
    assert res.returncode == 0, res.stderr
    assert "dpurun: note: Slurm job 4242: SLURM_JOB_NODELIST=thor[001-002],thor-bf[01-02] (4 node(s))" in res.stderr
    assert "dpurun: note: pairs by number (the last number in each name): thor001 -> thor-bf01, thor002 -> thor-bf02" \
        in res.stderr
    assert ("dpurun: note: from the allocation: --hosts thor001:8,thor002:8 --dpus thor-bf01:4,thor-bf02:4 "
            "--host-ranks 16 --dpu-ranks 8") in res.stderr
    assert "-np 16 --host thor001:8,thor002:8" in res.stdout and "-np 8 --host thor-bf01:4,thor-bf02:4" in res.stdout
    res = dry_run(DINE, "--dpu-name", "{host}-nosuchdpu.invalid")
    assert res.returncode == 2 and "dpurun: error: the DPU of b101, b101-nosuchdpu.invalid" in res.stderr
    res = dry_run(THOR, "--host-ranks", "64")
    assert res.returncode == 2 and res.stderr.strip().endswith(
        "dpurun: error: the Slurm allocation holds 16 host slot(s) (thor001:8,thor002:8; SLURM_TASKS_PER_NODE="
        "8(x2),4(x2)) and --host-ranks 64 asks for more; ask Slurm for more tasks (sbatch --ntasks-per-node), lower "
        "--host-ranks, or pass --oversubscribe"), res.stderr
