"""DPU side of checkpoints and clones: receive state slices, write them, commit, forward to clones.

A keeper is a DPU rank paired with host ranks (`common.plan.assign`). It runs in a thread
next to the rank's offloaded work (augmentation, validation or none), so checkpoint I/O never
stops batches or validation for long: receiving and file writes release the GIL. Per hand-off:

- CHECKPOINT: write every paired host rank's shard and local file (`common.ckptfiles`, temp +
  fsync + rename), then report the files to keeper 0 over the keepers' own communicator. Keeper 0
  waits for every report and writes the manifest and the COMMITTED marker last, then prunes to
  `--ckpt-keep`. A failed write (disk full, permissions, a name in the way) is reported by keeper
  0, that checkpoint is dropped, the previous one stays intact, and training continues.
- CLONE: forward the messages as received to the clone ranks (host rank k's slice goes to clone
  rank k mod M), never touching disk (DeepClone's forwarding).

Which host ranks send to which keeper, and how reports reach the committer, depends on what the
run survives: one route per recovery (`routes.Route`), chosen once from the run's recovery policy.
A dead keeper (`--dpu-failure fallback`) or dead host ranks (`--recovery`) tear the checkpoint they
were part of; the committer says so by name and commits the next ones.

The latest state received stays in memory; with `--ckpt-mem-keep K` the K newest checkpoints are
also kept in DPU memory that outlives the job (`memory.DpuMemory`).

Modules, in the order a hand-off goes through them:
- `keeper.py`: the thread (`Keeper`): receive, write, then commit or report; `route_for`.
- `routes.py`: the routes interface (`Route`: call order, which rank calls what).
- `direct.py`, `recovery.py`: the four routes (fixed, rerouted; surviving host ranks, spares in seats).
- `inbox.py`: receiving a hand-off into warm buffers; header receives posted ahead.
- `commit.py`: the commit decision, pure, over typed reports (`decide_commit`).
- `committer.py`: acting on it: manifest, delete, print, prune; the run's summary.
- `clone.py`, `memory.py`: forwarding to clone ranks; checkpoints kept in DPU memory.
"""

from dpuoffload.dpu.keeper.clone import StandbyBeat
from dpuoffload.dpu.keeper.inbox import header_only
from dpuoffload.dpu.keeper.keeper import Keeper, route_for

__all__ = ["Keeper", "StandbyBeat", "header_only", "route_for"]
