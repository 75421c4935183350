"""A Horovod training script whose batches are loaded and augmented on DPU ranks.

    dpurun --host-ranks 2 --dpu-ranks 2 --oversubscribe -- --mode da examples/horovod_loop.py

The three Horovod lines every such script has (`hvd.init`, `DistributedOptimizer`, the
broadcasts) stay; `hvd.init` gets the host ranks' communicator, `job.comm`, because under dpurun
COMM_WORLD also holds the DPU ranks, which must not become training replicas.
"""

from __future__ import annotations

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from workload import SmallNet, batches, classes, parser, save_record, train_set, val_set

import dpuoffload as dpu  # dpu


def main() -> None:
    args = parser(__doc__).parse_args()
    job = dpu.init()  # dpu
    hvd.init(comm=job.comm)  # dpu: the host ranks only (was: hvd.init())
    torch.manual_seed(args.seed)
    data, held_out = train_set(args.data, args.subset), val_set(args.data, args.subset)
    model = SmallNet(classes(data))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    epoch_batches, steps = batches(job, data, args)  # dpu: job.loader(data, batch_size, seed)
    losses: list[float] = []
    for epoch in range(args.epochs):
        for x, y in epoch_batches(epoch):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        mean = hvd.allreduce(torch.tensor(sum(losses[-steps:]) / steps), name="loss").item()
        job.validate(model, held_out, epoch)  # dpu
        if hvd.rank() == 0:
            print(f"epoch {epoch}: mean loss {mean:.4f} over {hvd.size()} ranks ({steps} steps each)", flush=True)
    validation = job.finish()  # dpu: every epoch's validation results (host rank 0)
    save_record(args.record, job.rank, losses, validation)
    hvd.shutdown()


if __name__ == "__main__":
    main()
