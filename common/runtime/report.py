"""What host rank 0 reports besides the epoch line: TensorBoard events (`--tensorboard DIR`) and a
loss/accuracy PNG (`--plots`), both fed the finished epoch records of `metrics.jsonl`.

Both packages are optional and slow to import (~1 s each on a small core), so they are imported
here, only when the flag is given; `RunConfig` has already checked (without importing) that they
are installed, so a missing package stops the job before launch, not after start-up.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from dpuoffload.common.config import RunConfig
from dpuoffload.common.files import write_atomic


class EpochReport(Protocol):
    """Called by the leader of a training group: `add_epoch` once per finished epoch, in epoch order
    (a record carries train and val metrics), `close` once at the end of training."""

    def add_epoch(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class TensorBoardReport:
    """Epoch metrics (per epoch) and step losses (per global step) as TensorBoard scalars."""

    def __init__(self, log_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)

    def add_epoch(self, record: Mapping[str, Any]) -> None:
        epoch = record["epoch"] + 1
        for key in ("train_loss", "train_acc", "val_loss", "val_acc", "samples_per_s", "epoch_time", "lr"):
            if key in record:
                section, _, name = key.partition("_") if key.startswith(("train", "val")) else ("run", "", key)
                self.writer.add_scalar(f"{section}/{name}", record[key], epoch)
        losses = record.get("step_losses", [])
        first = record.get("global_step", len(losses)) - len(losses) + 1
        for i, loss in enumerate(losses):
            self.writer.add_scalar("train/step_loss", loss, first + i)
        self.writer.flush()  # a crashed or killed run keeps every finished epoch

    def close(self) -> None:
        self.writer.close()


class TrainingPlot:
    """`<log_dir>/training.png`: loss and accuracy per epoch, train and val, redrawn every epoch.

    Written to a temp file and renamed, so a viewer that reloads the file never sees half a PNG.
    """

    def __init__(self, log_dir: str, name: str = "training.png") -> None:
        self.path = Path(log_dir) / name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: list[Mapping[str, Any]] = []

    def add_epoch(self, record: Mapping[str, Any]) -> None:
        self.records.append(record)
        figure = draw_training(self.records)
        write_atomic(self.path, lambda f: figure.savefig(f, format="png", dpi=100), sync_dir=False)

    def close(self) -> None:
        pass


def draw_training(records: Sequence[Mapping[str, Any]]) -> Any:
    """A matplotlib `Figure` (no pyplot: no global state, no display needed) of loss and accuracy."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(9, 3.6), layout="constrained")
    epochs = [r["epoch"] + 1 for r in records]
    for ax, metric, scale in zip(fig.subplots(1, 2), ("loss", "acc"), (1, 100)):
        for split, style in (("train", "o-"), ("val", "s--")):
            ax.plot(epochs, [r[f"{split}_{metric}"] * scale for r in records], style, label=split)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("loss" if metric == "loss" else "accuracy (%)")
        ax.legend(loc="best")
        ax.grid(alpha=0.3)
    fig.suptitle(f"training: {len(records)} epoch(s)")
    return fig


class Reports:
    """All reports of a run; the empty set on every rank that does not lead its training group."""

    def __init__(self, reports: list[EpochReport]) -> None:
        self.reports = reports

    def add_epoch(self, record: Mapping[str, Any]) -> None:
        for report in self.reports:
            report.add_epoch(record)

    def close(self) -> None:
        for report in self.reports:
            report.close()


def build_reports(cfg: RunConfig, leader: bool, group: str = "") -> Reports:
    """The reports `cfg` asks for, on the group leader only. `group` names a second training group
    of the same job (clones: "clone"), which reports to a sub-directory / its own PNG instead."""
    if not leader:
        return Reports([])
    reports: list[EpochReport] = []
    if cfg.tensorboard:
        reports.append(TensorBoardReport(os.path.join(cfg.tensorboard, group) if group else cfg.tensorboard))
    if cfg.plots and cfg.log_dir:
        reports.append(TrainingPlot(cfg.log_dir, f"training-{group}.png" if group else "training.png"))
    return Reports(reports)
