"""What the trainer writes about a run: each epoch's record (kept until its validation completes it),
the epoch line, the metrics and phase logs, the reports (`--tensorboard`, `--plots`), the failure
reports under `--recovery`, and the progress bar.

The trainer decides when; this says what and where. Replica 0 of the group (the leader: host rank 0,
clone rank 0, or the lowest survivor after its death) prints and writes the metrics; every rank
writes its own phase log.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
from tqdm import tqdm

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.loaders import Sampling
from dpuoffload.common.runtime import env
from dpuoffload.common.runtime.metrics import JsonlLog, PhaseTimer
from dpuoffload.common.runtime.report import Reports, build_reports
from dpuoffload.common.runtime.roles import Topology
from dpuoffload.common.train.evaluation import metrics_from_sums

if TYPE_CHECKING:
    from dpuoffload.common.data.shards import ShardedSet


class EpochRecords:
    """The run's records on this rank (see the module)."""

    def __init__(self, cfg: RunConfig, topo: Topology, pending: dict[int, dict[str, Any]],
                 leader: Callable[[], bool], joining: bool, label: str = "") -> None:
        """`pending`: the records still waiting for validation (`TrainingState.pending`: a spare's
        state brings the ones it must complete); `leader`: whether this rank leads the group now;
        `joining`: a spare seated mid-run appends to the run's logs; `label`: before each line."""
        self.cfg, self.topo, self.pending, self.leader, self.label = cfg, topo, pending, leader, label
        self.phase_log = JsonlLog(cfg.log_dir, f"phases-rank{topo.world_rank}.jsonl")
        self.metrics_log = JsonlLog(cfg.log_dir if leader() else None, "metrics.jsonl", replace=not joining)
        self.reports = Reports([])  # --tensorboard / --plots, opened when training starts (`open`)

    def open(self) -> None:
        self.reports = build_reports(self.cfg, self.leader(), "clone" if self.label else "")

    def close(self, final: dict[str, Any]) -> None:
        """The run's end record (the leader; a rank that led for a while under --recovery keeps its log open)."""
        self.reports.close()
        if self.leader():
            self.metrics_log.write(final)

    def complete_all(self, results: list[tuple[int, np.ndarray]]) -> list[dict[str, Any]]:
        """`complete` each epoch of `results` this rank keeps a record of (a spare seated under
        --recovery rollback has none of the epochs before it joined, unless they came with its state)."""
        return [self.complete(e, sums) for e, sums in results if e in self.pending]

    def complete(self, epoch: int, val_sums: np.ndarray) -> dict[str, Any]:
        """Merge validation results into the epoch's record; the leader logs and prints it."""
        record = self.pending.pop(epoch)
        val_loss, val_acc = metrics_from_sums(val_sums)
        record.update(val_loss=val_loss, val_acc=val_acc, val_loss_sum=float(val_sums[0]),
                      val_correct=int(val_sums[1]), val_count=int(val_sums[2]))
        if self.leader():
            self.metrics_log.write(record)
            print(self.label + format_epoch_line(record, self.cfg.epochs), flush=True)
            self.reports.add_epoch(record)
        return record

    def epoch(self, epoch: int, sums: np.ndarray, losses: list[float], times: tuple[float, float],
              skip_counted: Any, stream: Optional["ShardedSet"], **fields: Any) -> dict[str, Any]:
        """The epoch's record before validation (`train_record`), with a stream's balance and, where
        `skip_counted` is the training set (`--skip-corrupt`), the samples no host rank trained on."""
        hosts = len(self.topo.host_ranks)
        skipped = left_out(self.cfg, hosts, skip_counted, sums) if skip_counted is not None else {}
        return train_record(epoch, sums, losses, times, **fields,
                            **stream_balance(stream, hosts, self.cfg.seed, epoch), **skipped)

    def phases(self, epoch: int, epoch_time: float, steps: int, timer: PhaseTimer, **fields: Any) -> None:
        """The epoch's line in this rank's phase log: where its time went, step by step."""
        self.phase_log.write({"epoch": epoch, "world_rank": self.topo.world_rank, "role": self.topo.role.name.lower(),
                              "epoch_time": epoch_time, "steps": steps, "phases": dict(timer.totals), **fields})

    def note(self, record: dict[str, Any]) -> None:
        """An event of the run (a simulated failure), in the metrics log (the leader)."""
        if self.leader():
            self.metrics_log.write(record)

    def failure(self, report: dict[str, Any]) -> None:
        """A recovery's report (`RecoveryHooks.report`), from the rank it names: its line, and its
        record in the metrics log (a rank that is not the leader appends to it)."""
        print(report["line"], flush=True)
        log = self.metrics_log if self.leader() else JsonlLog(self.cfg.log_dir, "metrics.jsonl", replace=False)
        log.write(report["record"])

    def lead(self) -> None:
        """Under --recovery, after a death: the new leader (host rank 0 was lost) takes the metrics log over."""
        if self.leader() and self.metrics_log.path is None:
            self.metrics_log = JsonlLog(self.cfg.log_dir, "metrics.jsonl", replace=False)


def train_record(epoch: int, train_sums: np.ndarray, losses: list[float], times: tuple[float, float],
                 **fields: Any) -> dict[str, Any]:
    """The epoch's record before validation; `times`: (epoch, training) seconds. samples_per_s is the
    whole job's: every replica's training samples of the epoch over its training time. `fields`:
    the rest (lr, shares, digests, the stream's and the skipped samples' counts)."""
    train_loss, train_acc = metrics_from_sums(train_sums)
    epoch_time, train_time = times
    return {"event": "epoch", "epoch": epoch, "train_loss": train_loss, "train_acc": train_acc,
            "epoch_time": epoch_time, "train_time": train_time,
            "samples_per_s": float(train_sums[2]) / train_time if train_time > 0 else 0.0, **fields}


def left_out(cfg: RunConfig, host_ranks: int, train_set: Any, train_sums: np.ndarray) -> dict[str, Any]:
    """`--skip-corrupt`: the epoch's samples no host rank trained on, over all of them (the epoch's
    full count minus the trained one); each rank's own count is in its phase log."""
    full = sum(Sampling.of(cfg, host_ranks, 0).batch_sizes(train_set)) * host_ranks
    return {"skipped_corrupt": full - int(train_sums[2])}


def stream_balance(stream: Optional["ShardedSet"], host_ranks: int, seed: int, epoch: int) -> dict[str, Any]:
    """A stream's epoch: the samples its host ranks repeated to train equal epochs (padded) and left
    for another epoch (dropped), over all host ranks (`ShardPlan.balance`); {} for a map-style set."""
    if stream is None:
        return {}
    plan = stream.plan(host_ranks, seed)
    return {"stream": {"shards": len(stream.shards), "samples": len(stream), **plan.balance(epoch)}}


class EpochBar:
    """The epoch's progress bar (the leader, with --progress, on a terminal): the last loss read and
    the job's samples per second so far this epoch."""

    def __init__(self, start: int, stop: int, desc: str, shown: bool, replicas: int) -> None:
        self.bar = tqdm(total=stop, initial=start, desc=desc, unit="step", leave=False, file=sys.stdout,
                        mininterval=1.0, ncols=100, nrows=100,  # mpirun hides the terminal size from ranks,
                        disable=not (shown and env.progress_wanted()))  # and tqdm would hide a bar it thinks off-screen
        self.rate = SampleRate(replicas) if not self.bar.disable else None

    def update(self, batch: int, global_samples: Optional[int], loss: Optional[float]) -> None:
        if self.rate is not None:
            speed = self.rate.add(batch, global_samples)
            shown = f"loss {loss:.3f}, " if loss is not None else ""
            self.bar.set_postfix_str(f"{shown}{speed:.0f} samples/s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class SampleRate:
    """The job's training samples per second since the epoch (or its resumed part) began, from one
    replica's view: its batch times the replica count, or the step's global count (naive mode)."""

    def __init__(self, replicas: int) -> None:
        self.replicas, self.samples, self.t0 = replicas, 0, time.perf_counter()

    def add(self, batch: int, global_samples: Optional[int]) -> float:
        self.samples += global_samples if global_samples is not None else batch * self.replicas
        return self.samples / max(time.perf_counter() - self.t0, 1e-9)


_SHORT = {"data": "data", "forward_backward": "fwd/bwd", "allreduce": "allreduce",
          "optimizer": "opt", "validation": "val", "handoff": "ckpt"}


def format_epoch_line(rec: dict[str, Any], epochs: int) -> str:
    shares = " ".join(f"{_SHORT.get(k, k)} {v:.0%}" for k, v in rec["phase_shares"].items())
    stream = rec.get("stream") or {}
    evened = (f" | stream: {stream['padded']} repeated, {stream['dropped']} left for later (uneven shards)"
              if stream.get("padded") or stream.get("dropped") else "")
    return (f"epoch {rec['epoch'] + 1}/{epochs} | train loss {rec['train_loss']:.4f} acc "
            f"{rec['train_acc']:.1%} | val loss {rec['val_loss']:.4f} acc {rec['val_acc']:.1%} | "
            f"{rec['epoch_time']:.1f} s, {rec['samples_per_s']:.0f} samples/s | {shares}{evened}")
