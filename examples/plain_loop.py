"""A plain PyTorch training loop whose batches are loaded and augmented on a DPU rank.

    dpurun -- --mode da examples/plain_loop.py --epochs 2        # augmentation on the DPU rank
    dpurun --dpu-ranks 2 -- --mode hybrid examples/plain_loop.py  # augmentation and validation on DPU ranks
    dpurun -- --mode none examples/plain_loop.py --epochs 2      # loading on the host rank
    python examples/plain_loop.py --epochs 2                     # no dpurun: loads here, with a warning

The lines that make it a dpuoffload script are marked `# dpu` (see `workload.batches` for the
loader: `job.loader(data, batch_size, seed)`; `job.validate` evaluates each epoch, on the DPU
validation ranks in `--mode mv`/`hybrid`, on the host otherwise). The loop is the script's own: `--accum N`
accumulates gradients over N batches, `--amp bf16` trains under autocast, the schedule is
torch's. `--loader torch` runs it with torch's DataLoader instead: the same losses, to the bit.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from workload import SmallNet, batches, classes, parser, save_record, train_set, val_set

import dpuoffload as dpu  # dpu


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--accum", type=int, default=1, help="accumulate gradients over this many batches")
    p.add_argument("--amp", choices=("off", "bf16"), default="off")
    args = p.parse_args()
    job = dpu.init()  # dpu
    torch.manual_seed(args.seed)
    data, held_out = train_set(args.data, args.subset), val_set(args.data, args.subset)
    model = SmallNet(classes(data))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    epoch_batches, steps = batches(job, data, args)  # dpu: job.loader(data, batch_size, seed)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * math.ceil(steps / args.accum))
    losses: list[float] = []
    for epoch in range(args.epochs):
        for i, (x, y) in enumerate(epoch_batches(epoch)):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
                loss = F.cross_entropy(model(x), y)
            (loss / args.accum).backward()
            if (i + 1) % args.accum == 0 or i + 1 == steps:
                opt.step()
                opt.zero_grad()
                sched.step()
            losses.append(loss.item())
        print(f"epoch {epoch}: mean loss {sum(losses[-steps:]) / steps:.4f} ({steps} steps)", flush=True)
        job.validate(model, held_out, epoch)  # dpu: on DPU ranks in --mode mv/hybrid, while the next epoch trains
    validation = job.finish()  # dpu: every epoch's validation results
    save_record(args.record, job.rank, losses, validation)


if __name__ == "__main__":
    main()
