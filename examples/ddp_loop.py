"""A DistributedDataParallel training script whose batches are loaded and augmented on DPU ranks.

    dpurun --host-ranks 2 --dpu-ranks 2 --oversubscribe -- --mode da examples/ddp_loop.py
    dpurun --host-ranks 2 --dpu-ranks 2 --oversubscribe -- --mode da --ckpt-dir ckpt examples/ddp_loop.py \\
        --ckpt-steps 3                                      # checkpoints, written by the DPU ranks
    dpurun --host-ranks 2 --dpu-ranks 2 --oversubscribe -- --mode da --ckpt-dir ckpt --resume latest \\
        examples/ddp_loop.py                                # goes on from the newest one
    dpurun --host-ranks 2 --dpu-ranks 2 --clone-ranks 2 --oversubscribe -- --mode da --clone-at 3 \\
        examples/ddp_loop.py --ckpt-steps 3                 # clone ranks fork the training at step 3

Under torchrun the script would call `dist.init_process_group("gloo")` from torchrun's
environment; under dpurun, `job.init_process_group("gloo")` forms the same group over the host
ranks (the rendezvous port is agreed over MPI). Everything else is plain DDP. Checkpoints:
`job.checkpoint` hands the state to the DPU ranks (they write it while training goes on) every
`--ckpt-steps` steps and at every epoch end; `job.restore` loads the one `--resume` names, and the
loop starts where it was taken: the resumed run's losses equal the uninterrupted run's. With clone
ranks, the script runs on them too: their `job.restore` waits for the state of `--clone-at` (the
host ranks' `job.checkpoint` at that step hands it over) and they go on as a training of their own
(`job.is_clone`; `--clone-lr` gives them another learning rate from there).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from workload import SmallNet, batches, classes, parser, save_record, train_set, val_set

import dpuoffload as dpu  # dpu


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--ckpt-steps", type=int, metavar="N", help="also checkpoint every N steps within an epoch")
    p.add_argument("--clone-lr", type=float, help="the clone ranks' learning rate once they fork (default: the same)")
    args = p.parse_args()
    job = dpu.init()  # dpu
    job.init_process_group("gloo")  # dpu (was: dist.init_process_group("gloo"))
    torch.manual_seed(args.seed)
    data, held_out = train_set(args.data, args.subset), val_set(args.data, args.subset)
    net = SmallNet(classes(data))
    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr / 20)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    epoch_batches, steps = batches(job, data, args)  # dpu: job.loader(data, batch_size, seed)
    start = job.restore(net, opt, sched)  # dpu: None unless --resume; on clone ranks: the --clone-at state
    if job.is_clone and args.clone_lr:
        for group in opt.param_groups:
            group["lr"] = args.clone_lr
    first, skip = (start.epoch, start.step) if start else (0, 0)
    losses: list[float] = []
    for epoch in range(first, args.epochs):
        for i, (x, y) in enumerate(epoch_batches(epoch, skip if epoch == first else 0),
                                   start=skip if epoch == first else 0):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            if args.ckpt_steps and (i + 1) % args.ckpt_steps == 0 and i + 1 < steps:
                job.checkpoint(net, opt, sched, epoch=epoch, step=i + 1, global_step=epoch * steps + i + 1,
                               extra={"last_loss": losses[-1]})  # dpu: mid-epoch
        done = torch.tensor(losses[-steps:]).mean()
        dist.all_reduce(done)
        job.validate(net, held_out, epoch)  # dpu: the bare model, not the DDP wrapper
        job.checkpoint(net, opt, sched, epoch=epoch + 1, global_step=(epoch + 1) * steps)  # dpu: epoch end
        if dist.get_rank() == 0:
            who = "[clone] " if job.is_clone else ""
            print(f"{who}epoch {epoch}: mean loss {done.item() / dist.get_world_size():.4f} over "
                  f"{dist.get_world_size()} ranks ({steps} steps each)", flush=True)
    validation = job.finish()  # dpu: every epoch's validation results (host rank 0)
    save_record(args.record, f"clone{job.rank}" if job.is_clone else job.rank, losses, validation,
                resumed=None if start is None else [start.epoch, start.step, start.global_step, start.extra])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
