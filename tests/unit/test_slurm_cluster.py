"""dpurun under a real Slurm: `sbatch` jobs on emulated machines (scripts/slurm.sh: Debian's
slurmctld and one slurmd per machine, each machine a network namespace with its own hostname).

The cluster has 2 host machines (h0, h1) and their 2 DPU machines (h0-bf, h1-bf), for both kinds of
site: DPUs as Slurm nodes (partition `all`, `dpurun --dpu-nodes bf`: Open MPI starts its daemons
through `srun`) and DPUs outside Slurm (partition `hosts`, `dpurun --dpu-name '{host}-bf'`: the DPU
machines are never allocated, Open MPI reaches them through its ssh agent). Every job runs the
job script of `examples/slurm/` in miniature (the same dpurun flags, the same requeue line): `da`
trains to the bit as `none` does with each host rank fed by its own node's DPU, `scancel` ends every
rank at once and the output names the last committed checkpoint, and a requeued job resumes exactly.

Needs root (namespaces) and Slurm's packages (`bash scripts/slurm.sh install`, run by
scripts/test.sh; `up` installs them when missing); skipped with the reason otherwise, and with
DPUOFFLOAD_TEST_SLURM=0. One cluster for the module (its own prefix and subnet, taken down after).

(The tests of this feature that start processes: tests/cluster/test_slurm_cluster.py.)
"""

from __future__ import annotations

from tests.mpijobs import REPO

EXAMPLES = REPO / "examples" / "slurm"
# The dpurun flags of each kind of site, as examples/slurm/ writes them
AS_NODES = "--dpu-nodes bf"
OUTSIDE = "--dpu-name '{host}-bf'"
OUTSIDE_MPI = "--prtemca plm ssh --prtemca ras ^slurm"  # Open MPI 5: its daemons by ssh, hosts by --host only


def test_the_examples_use_the_flags_tested_here():
    """The job scripts of examples/slurm/ name their DPUs (and, outside Slurm, Open MPI's launcher) as
    the jobs below do, and resume when requeued as they do."""
    nodes, outside = ((EXAMPLES / f).read_text() for f in ("dpus-as-nodes.sbatch", "dpus-outside.sbatch"))
    assert f"dpurun {AS_NODES} " in nodes
    assert f"dpurun {OUTSIDE} " in outside and f"--mpirun-arg='{OUTSIDE_MPI}'" in outside
    for text in (nodes, outside):
        assert '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && RESUME=(--resume latest)' in text
        assert "#SBATCH --requeue" in text and "#SBATCH --open-mode=append" in text
