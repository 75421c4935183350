"""The baselines of the checkpoint benchmark: host ranks write checkpoints themselves (no DPU).

    mpirun -np N python benchmarks/ckpt_host.py --how rank0|slices --every K --dir DIR -- <training flags>

It is the project's host program (`dpuoffload.host.main`) with its state hooks (the
`hooks_factory` extension point) doing, after the optimizer step of every K-th step, what a user
does without DPUs (DeepFreeze's baselines):

- rank0: host rank 0 `torch.save`s the full state (model + optimizer state_dict); the others go on;
- slices: every host rank `torch.save`s its 1/N slice (the same slicing as ours, `common.sharding`).

Both write durably like ours (`common.files.write_atomic`), so all three are equally durable. The
blocking time of each checkpoint goes to `handoff-rank<R>.jsonl`, as for ours.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dpuoffload.common.files import write_atomic  # noqa: E402
from dpuoffload.common.train.loop import NoHooks  # noqa: E402


class TorchSaveHooks(NoHooks):
    """`common.training.StateHooks` that save with `torch.save` on the host ranks (after a step only)."""

    def __init__(self, trainer: Any, opts: argparse.Namespace) -> None:
        from dpuoffload.common.runtime.metrics import JsonlLog

        self.trainer, self.opts = trainer, opts
        self.rank, self.size = trainer.comm.Get_rank(), trainer.comm.Get_size()
        self.log = JsonlLog(trainer.cfg.log_dir, f"handoff-rank{trainer.topo.world_rank}.jsonl")

    def after_step(self, pos: Any, progress: Any) -> None:
        if pos.global_step % self.opts.every == 0:
            self.save(pos)

    def state(self) -> dict[str, Any]:
        model, opt = self.trainer.model, self.trainer.optimizer
        if self.opts.how == "rank0":
            return {"model": model.state_dict(), "optimizer": opt.state_dict()}
        from dpuoffload.common.state.sharding import plan_shards
        from dpuoffload.common.state.trainstate import shared_tensors

        tensors = shared_tensors(model, opt)
        names, values = list(tensors), list(tensors.values())
        plan = plan_shards([t.numel() for t in values], self.size)
        return {f"{names[p.tensor]}[{p.start}:{p.stop}]": values[p.tensor].reshape(-1)[p.start:p.stop]
                for p in plan.rank_pieces(self.rank)} | {"buffers": dict(model.named_buffers())}

    def save(self, pos: Any) -> None:
        t0 = time.perf_counter()
        if self.opts.how == "slices" or self.rank == 0:
            state = self.state()
            write_atomic(Path(self.opts.dir) / f"step-{pos.global_step:09d}-rank{self.rank}.pt",
                         lambda f: torch.save(state, f))
        self.log.write({"kind": self.opts.how, "global_step": pos.global_step, "blocked_s": time.perf_counter() - t0})


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--how", choices=("rank0", "slices"), required=True)
    p.add_argument("--every", type=int, required=True, help="checkpoint after every K-th step")
    p.add_argument("--dir", required=True, help="directory for the checkpoint files")
    opts = p.parse_args(argv[:split])
    Path(opts.dir).mkdir(parents=True, exist_ok=True)
    return opts, argv[split + 1:]


def main() -> None:
    from dpuoffload.host import main as host
    from dpuoffload.host.extensions import HostExtensions

    opts, training = parse(sys.argv[1:])
    host.run(training, HostExtensions(hooks_factory=lambda cfg, topo, trainer: TorchSaveHooks(trainer, opts)))


if __name__ == "__main__":
    main()
