"""The peer a user with spare cores picks: the host program with a multi-worker PyTorch DataLoader.

    mpirun -np 1 taskset -c 0 python benchmarks/peer_host.py --workers 1 --cores 1 \
        [--cgroup /sys/fs/cgroup/cpu/X] [--prefetch 4] [--pin-memory] -- <training flags of --mode none>

It is the project's own host program (`dpuoffload.host.main`: same start-up, model, Trainer,
allreduce, validation and logs) with one change, made through its `feed_factory` extension point
(`host.extensions`): its feed is a
`DataLoader(num_workers=W, persistent_workers=True, prefetch_factor=P)` whose workers pin
themselves to the DPU ranks' cores (`os.sched_setaffinity`) and enter the same kind of throttling
cgroup `dpurun --dpu-speed` puts the DPU ranks in (`launch.throttle`; created by the caller), so
they get exactly the CPU the DPU ranks get in `--mode da`. Workers load, augment and collate
whole batches; the batches are the same as `--mode none`'s (same sampler, per-sample seeds and
collate; each batch carries its epoch, since persistent workers keep their own copy of the data set).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpuoffload.common.data.workers import EpochTagged  # noqa: E402  (the DPU workers' view of the data set)


class TaggedBatches:
    """The host rank's `DistributedSampler` batches as lists of (epoch, index)."""

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool) -> None:
        from torch.utils.data import BatchSampler

        self.sampler, self.batches = sampler, BatchSampler(sampler, batch_size, drop_last)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for batch in self.batches:
            yield [(self.epoch, i) for i in batch]


class WorkerPlacement:
    """`worker_init_fn`: pin the worker to the DPU cores and enter the throttling cgroup."""

    def __init__(self, cores: set[int], cgroup: Optional[str]) -> None:
        self.cores, self.cgroup = cores, cgroup

    def __call__(self, worker_id: int) -> None:
        os.sched_setaffinity(0, self.cores)
        if self.cgroup:
            Path(self.cgroup, "cgroup.procs").write_text(str(os.getpid()))


class PeerFeed:
    """A `Feed` (see `dpuoffload.common.data.feeds`) over a multi-worker DataLoader."""

    def __init__(self, cfg: Any, topo: Any, train: Any, opts: argparse.Namespace) -> None:
        from torch.utils.data import DataLoader, DistributedSampler

        sampler = DistributedSampler(train, num_replicas=len(topo.host_ranks), rank=topo.side_rank, shuffle=True,
                                     seed=cfg.seed)
        self.batches = TaggedBatches(sampler, cfg.batch_size, cfg.drop_last)
        self.loader = DataLoader(EpochTagged(train), batch_sampler=self.batches, num_workers=opts.workers,
                                 persistent_workers=True, prefetch_factor=opts.prefetch, pin_memory=opts.pin_memory,
                                 worker_init_fn=WorkerPlacement(opts.cores, opts.cgroup))

    def steps(self) -> int:
        return len(self.batches)

    def skipped(self, epoch: int) -> int:
        return 0

    def global_samples(self, step: int) -> Optional[int]:
        return None

    def epoch(self, epoch: int, start: int = 0, stop: Optional[int] = None) -> Iterator[Any]:
        """Whole epochs only (`start`/`stop` are for resumed runs, which the peer never does)."""
        self.batches.set_epoch(epoch)
        yield from itertools.islice(self.loader, start, stop)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, required=True, help="DataLoader workers (= number of DPU cores)")
    p.add_argument("--cores", required=True, help="cores the workers pin themselves to, e.g. 1 or 1,2")
    p.add_argument("--cgroup", help="throttling cgroup directory the workers enter (default: none)")
    p.add_argument("--prefetch", type=int, default=4, help="batches prefetched per worker (default: 4)")
    p.add_argument("--pin-memory", action="store_true",
                   help="pin_memory=True: batches in page-locked memory (a GPU host rank's asynchronous copy)")
    opts = p.parse_args(argv[:split])
    opts.cores = {int(c) for c in opts.cores.split(",")}
    return opts, argv[split + 1:]


def main() -> None:
    from dpuoffload.host import main as host
    from dpuoffload.host.extensions import HostExtensions

    opts, training = parse(sys.argv[1:])
    host.run(training, HostExtensions(feed_factory=lambda cfg, topo, train, plan: PeerFeed(cfg, topo, train, opts)))


if __name__ == "__main__":
    main()
