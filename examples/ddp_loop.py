"""A DistributedDataParallel training script whose batches are loaded and augmented on DPU ranks.

    dpurun --host-ranks 2 --dpu-ranks 2 --oversubscribe -- --mode da examples/ddp_loop.py

Under torchrun the script would call `dist.init_process_group("gloo")` from torchrun's
environment; under dpurun, `job.init_process_group("gloo")` forms the same group over the host
ranks (the rendezvous port is agreed over MPI). Everything else is plain DDP.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from workload import SmallNet, batches, classes, parser, save_record, train_set, val_set

import dpuoffload as dpu  # dpu


def main() -> None:
    args = parser(__doc__).parse_args()
    job = dpu.init()  # dpu
    job.init_process_group("gloo")  # dpu (was: dist.init_process_group("gloo"))
    torch.manual_seed(args.seed)
    data, held_out = train_set(args.data, args.subset), val_set(args.data, args.subset)
    model = DDP(SmallNet(classes(data)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    epoch_batches, steps = batches(job, data, args)  # dpu: job.loader(data, batch_size, seed)
    losses: list[float] = []
    for epoch in range(args.epochs):
        for x, y in epoch_batches(epoch):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        mean = torch.tensor(sum(losses[-steps:]) / steps)
        dist.all_reduce(mean)
        job.validate(model.module, held_out, epoch)  # dpu: the bare model, not the DDP wrapper
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: mean loss {mean.item() / dist.get_world_size():.4f} over "
                  f"{dist.get_world_size()} ranks ({steps} steps each)", flush=True)
    validation = job.finish()  # dpu: every epoch's validation results (host rank 0)
    save_record(args.record, job.rank, losses, validation)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
