"""A PyTorch Lightning run whose DataModule hands out the DPU loader.

    dpurun --host-ranks 2 --dpu-ranks 2 --oversubscribe -- --mode hybrid examples/lightning_loop.py

The LightningModule and the Trainer are plain Lightning; three things make it a dpuoffload run:
the DataModule's `train_dataloader` returns `job.loader(...)` (Lightning iterates it once per
epoch, as it would a DataLoader), the strategy's cluster environment is `job.lightning_environment()`
(the host ranks; Lightning would otherwise take the DPU ranks for replicas too), and a callback
hands each epoch's model to `job.validate` (on the DPU validation ranks in `--mode mv`/`hybrid`).
`--loader torch` runs the same with torch's DataLoader over the same per-sample seeds.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, DistributedSampler
from workload import SmallNet, classes, parser, save_record, train_set, val_set

import dpuoffload as dpu  # dpu


class Classifier(L.LightningModule):
    def __init__(self, n_classes: int, lr: float) -> None:
        super().__init__()
        self.net, self.lr, self.losses = SmallNet(n_classes), lr, []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Images(L.LightningDataModule):
    """The training images, from `job.loader` (`--loader dpu`) or torch's DataLoader (`torch`)."""

    def __init__(self, job: dpu.Job, args) -> None:
        super().__init__()
        self.job, self.args, self.data = job, args, train_set(args.data, args.subset)
        self.seeded = dpu.seeded(self.data, args.seed)

    def train_dataloader(self):
        if self.args.loader == "dpu":  # dpu: batches augmented on the DPU rank, re-iterated per epoch
            return self.job.loader(self.data, batch_size=self.args.batch_size, seed=self.args.seed)
        sampler = DistributedSampler(self.data, self.job.size, self.job.rank, shuffle=True, seed=self.args.seed)
        return DataLoader(self.seeded, batch_size=self.args.batch_size, sampler=sampler)


class Validate(L.Callback):
    """Each epoch's model to `job.validate`; the torch reference also moves its seeded set's epoch."""

    def __init__(self, job: dpu.Job, images: Images, held_out) -> None:
        self.job, self.images, self.held_out = job, images, held_out

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.images.seeded.set_epoch(trainer.current_epoch)  # (Lightning sets the sampler's)

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.job.validate(module.net, self.held_out, trainer.current_epoch)  # dpu


def main() -> None:
    args = parser(__doc__).parse_args()
    job = dpu.init()  # dpu
    torch.manual_seed(args.seed)
    images = Images(job, args)
    module = Classifier(classes(images.data), args.lr)
    host_ranks = job.lightning_environment("gloo")  # dpu: the host ranks, process group formed over them
    trainer = L.Trainer(
        accelerator="cpu", devices=host_ranks.devices, max_epochs=args.epochs, use_distributed_sampler=False,
        strategy=DDPStrategy(cluster_environment=host_ranks), logger=False,  # dpu
        callbacks=[Validate(job, images, val_set(args.data, args.subset))],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=images)
    validation = job.finish()  # dpu: every epoch's validation results (host rank 0)
    save_record(args.record, job.rank, module.losses, validation)


if __name__ == "__main__":
    main()
