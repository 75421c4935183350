"""`--resume`: which checkpoint, and where this run starts from it.

Every rank calls `find_resume` while it prepares (DPU ranks too: an augmentation rank must start
producing at the resumed batch, a validation rank at the resumed epoch), so all agree on the
start position without a message. Host ranks then `load` the full state (`common.ckptfiles`).

With `--resume latest --ckpt-mem-keep K` the start-up first asks the keepers what they hold in DPU
memory (`agree_restart`, collective): when every keeper holds a step at least as new as the disk's
newest, the run resumes from there, the keepers send each host rank its hand-off back
(`dpu.keeper`, `host.checkpoint.resume_trainer`) and the disk is not read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dpuoffload.common.config import OnResume, RunConfig, field_names
from dpuoffload.common.runtime import metrics
from dpuoffload.common.state import ckptfiles
from dpuoffload.common.state.memstore import MemoryPoint
from dpuoffload.common.state.meta import CheckpointMeta, Position, Slicing, reslice_position

# Fields that may differ between the run that wrote a checkpoint and the run that resumes it, and fields
# that make the state unusable (another model or another label space): declared on each field (`OnResume`).
FREE = frozenset(field_names(lambda m: m.resume is OnResume.FREE))
FATAL = field_names(lambda m: m.resume is OnResume.FATAL)


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    position: Position        # in this run's terms (re-sliced if the samples per step changed)
    meta: CheckpointMeta
    changed: tuple[str, ...]  # config fields that differ from the checkpoint's run (besides FREE ones)
    skipped: tuple[str, ...] = ()  # `--resume latest`: newer checkpoints found damaged and passed over
    memory: Optional[MemoryPoint] = None  # restarting from DPU memory (then `path` names that memory)
    verified: dict[str, bytes] = field(default_factory=dict, repr=False)  # `--resume latest`: the files,
    # read and checked while choosing the checkpoint (the restore takes them from here: one read)


def config_dict(cfg: RunConfig) -> dict[str, Any]:
    """The config as the manifest stores it (JSON types: tuples become lists)."""
    return json.loads(json.dumps(cfg.to_dict()))


def find_resume(cfg: RunConfig, n_hosts: int, steps_per_epoch: int,
                memory: Optional[MemoryPoint]) -> Optional[ResumePoint]:
    """Where this run starts from `--resume`: the checkpoint it names, or `memory` (the DPU-memory
    point start-up agreed on, `Started.run.memory`) under `--resume latest`; None without `--resume`."""
    if cfg.resume is None or nothing_kept(cfg, memory):
        return None
    skipped: list[str] = []
    verified: dict[str, bytes] = {}
    memory = memory if cfg.resumes_newest else None
    if memory is not None:
        path, meta = memory.root / f"step-{memory.step:09d}", memory.meta
    else:
        path = ckptfiles.resolve(cfg.resume, cfg.ckpt_dir, skipped, verified)
        meta = CheckpointMeta.from_json(ckptfiles.read_manifest(path))
    changed = tuple(ckptfiles.check_compatible(meta, config_dict(cfg), FREE))
    fatal = [k for k in FATAL if k in changed]
    if fatal:
        old = meta.config or {}
        raise ckptfiles.CheckpointError(
            f"checkpoint {path} was written by a run with "
            + ", ".join(f"--{k.replace('_', '-')} {old.get(k)}" for k in fatal)
            + "; this run has " + ", ".join(f"--{k.replace('_', '-')} {getattr(cfg, k)}" for k in fatal)
            + ": resume with the same model and data set")
    here = Slicing(n_hosts, cfg.batch_size)
    _check_stream_slicing(cfg, meta.slicing, here, path)
    position = reslice_position(meta.position, meta.slicing.per_step, here.per_step, steps_per_epoch)
    metrics.set_resumed_from(position.global_step)  # stamped on this run's log lines (they append)
    return ResumePoint(path, position, meta, changed, tuple(skipped), memory, verified)


def nothing_kept(cfg: RunConfig, memory: Optional[MemoryPoint]) -> bool:
    """`--resume auto` with no step in DPU memory and no committed checkpoint in --ckpt-dir: the run
    starts from the beginning (`starting_line` says so). Every rank decides alike: the memory point
    was agreed collectively, and the checkpoint directory is the one every rank resumes from."""
    return cfg.resumes_if_any and memory is None and not ckptfiles.committed(str(cfg.ckpt_dir))


def starting_line(cfg: RunConfig) -> str:
    return (f"[dpuoffload] --resume auto: nothing was kept to resume from (no step in DPU memory, no complete "
            f"checkpoint in {cfg.ckpt_dir}): starting from the beginning")


def _check_stream_slicing(cfg: RunConfig, old: Slicing, here: Slicing, path: object) -> None:
    """A stream of shards is dealt by host rank (each reads whole shards), so its sample sequence
    holds only for the host rank count and batch size that wrote the checkpoint."""
    from dpuoffload.common.data.datasets import is_webdataset

    if is_webdataset(cfg.dataset) and (old.host_ranks, old.batch_size) != (here.host_ranks, here.batch_size):
        raise ckptfiles.CheckpointError(
            f"checkpoint {path} was written by {old.host_ranks} host rank(s) x batch {old.batch_size} training from a "
            f"stream of shards, whose sample order depends on the host rank count (each host rank reads whole "
            f"shards); resume with --host-ranks {old.host_ranks} --batch-size {old.batch_size}, or start a new run")


def start_position(point: Optional[ResumePoint]) -> Position:
    return Position() if point is None else point.position
