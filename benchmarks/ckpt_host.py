"""The baselines of the checkpoint benchmark: host ranks write checkpoints themselves (no DPU).

    mpirun -np N python benchmarks/ckpt_host.py --how rank0|slices|dcp --every K --dir DIR -- <training flags>

It is the project's host program (`dpuoffload.host.main`) with its state hooks (the
`hooks_factory` extension point) doing, after the optimizer step of every K-th step, what a user
does without DPUs (DeepFreeze's baselines):

- rank0: host rank 0 `torch.save`s the full state (model + optimizer state_dict); the others go on;
- slices: every host rank `torch.save`s its 1/N slice (the same slicing as ours, `common.sharding`);
- dcp: `torch.distributed.checkpoint.async_save` of the model and optimizer state dicts (PyTorch's own
  asynchronous checkpoint: it stages the state in host memory while the caller waits, then writes it in
  a thread; its planner spreads the replicated tensors over the ranks). The previous save is waited for
  before the next (DCP allows one in flight), and that wait counts as blocking. Pinned-memory staging
  (`DefaultStager(StagingOptions(use_pinned_memory=True))`) needs CUDA: on a GPU host it is used.
  It needs a torch.distributed process group: run with `--allreduce torch`.

rank0 and slices write durably like ours (`common.files.write_atomic`); DCP writes its own files
(`.distcp` and `.metadata`, fsynced by its file writer). The blocking time of each checkpoint goes to
`handoff-rank<R>.jsonl`, as for ours.
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

        self.pending: Any = None   # dcp: the save in flight (its future)
        self.group: Any = None     # dcp: a process group of its own (as torchtitan keeps for async saves): the
        #                            save's thread runs collectives while training's allreduce runs on the default one
        if opts.how == "dcp":
            import torch.distributed as dist

            self.group = dist.new_group(backend="gloo")

    def after_step(self, pos: Any, progress: Any) -> None:
        if pos.global_step % self.opts.every == 0:
            self.save(pos)

    def finish(self, *args: Any, **kwargs: Any) -> Any:
        if self.pending is not None:  # (the last DCP save must land before the run ends)
            self.pending.result()
        return super().finish(*args, **kwargs)

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
        if self.opts.how == "dcp":
            self.save_dcp(pos)
        elif self.opts.how == "slices" or self.rank == 0:
            state = self.state()
            write_atomic(Path(self.opts.dir) / f"step-{pos.global_step:09d}-rank{self.rank}.pt",
                         lambda f: torch.save(state, f))
        self.log.write({"kind": self.opts.how, "global_step": pos.global_step, "blocked_s": time.perf_counter() - t0})


    def save_dcp(self, pos: Any) -> None:
        import torch.distributed.checkpoint as dcp

        if self.pending is not None:
            self.pending.result()
        state = {"model": self.trainer.model.state_dict(), "optimizer": self.trainer.optimizer.state_dict()}
        stager = None
        if torch.cuda.is_available():
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            stager = DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                                  use_async_staging=True, use_non_blocking_copy=True))
        out = dcp.async_save(state, checkpoint_id=str(Path(self.opts.dir) / f"step-{pos.global_step:09d}"),
                             process_group=self.group, **({"async_stager": stager} if stager is not None else {}))
        self.pending = getattr(out, "upload_completion", out)  # (AsyncSaveResponse with a stager, else a Future)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--how", choices=("rank0", "slices", "dcp"), required=True)
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
