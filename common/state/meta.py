"""Checkpoint metadata: the run-level facts every hand-off and checkpoint carries as JSON, typed.

One dataclass (`CheckpointMeta`), one writer (`CheckpointMeta.to_json`, and `encode` for the
bytes a hand-off carries) and one reader (`CheckpointMeta.from_json`). The JSON is the on-disk
format of `manifest.json` (plus the manifest's own `tensors` and `files`) and of the meta part of
every hand-off a keeper receives and keeps in DPU memory, so the writer emits the keys in the
order and with the presence they always had: checkpoints written before this module existed load
unchanged, and what is written now is byte-for-byte what was written then.

Also here, because both sides of a resume agree on it without a message: `Position` (where
training stands), `Slicing` (how a run deals samples to its host ranks) and the one rule that
re-slices a position written under one slicing for a run with another (`reslice_position`).

Torch-free: DPU ranks read the meta at start-up (`memstore.agree_restart`, `resume.find_resume`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from dpuoffload.common.state.ckptdirs import CheckpointError

FORMAT = "dpuoffload-train-state"
FORMAT_VERSION = 1

Catalog = list[tuple[str, str, tuple[int, ...]]]  # (name, dtype, shape) in send order


@dataclass(frozen=True)
class Position:
    """Where training stands: `step` steps of `epoch` are done, `global_step` optimizer steps in all.

    A checkpoint that falls on an epoch's last step is taken after the epoch-end work (BatchNorm
    sync, validation hand-off), so its position is (epoch + 1, 0), never (epoch, steps_per_epoch).
    """

    epoch: int = 0
    step: int = 0
    global_step: int = 0


def describe_position(pos: Position) -> str:
    """'end of epoch 2 (global step 64)' or 'epoch 3, step 5 done (global step 69)': 1-based epochs."""
    where = f"end of epoch {pos.epoch}" if pos.step == 0 else f"epoch {pos.epoch + 1}, step {pos.step} done"
    return f"{where} (global step {pos.global_step})"


@dataclass(frozen=True)
class Slicing:
    """How a run deals an epoch's samples: `host_ranks` replicas of `batch_size` samples per step."""

    host_ranks: int
    batch_size: int

    @property
    def per_step(self) -> int:
        return self.host_ranks * self.batch_size


def reslice_position(pos: Position, old_per_step: int, new_per_step: int, steps_per_epoch: Optional[int]) -> Position:
    """The position in a run that consumes another number of samples per step (another host rank
    count, or a clone's batch size): the same number of the epoch's samples is done. The one
    re-slicing rule: resume, DPU-memory restarts, clones and scripts' `job.restore` all use it.

    Rounds down (never skips a sample) and stays inside the epoch (`steps_per_epoch` None: a
    script's loop, whose epoch length the library does not know: not capped). Samples are dealt to
    ranks differently then, so a mid-epoch resume is no longer bit-exact (some samples of that
    epoch are seen twice or not at all); epoch boundaries stay exact."""
    if old_per_step == new_per_step or pos.step == 0:
        return pos
    step = pos.step * old_per_step // new_per_step
    return Position(pos.epoch, step if steps_per_epoch is None else min(step, steps_per_epoch - 1), pos.global_step)


@dataclass(frozen=True)
class CheckpointMeta:
    """The run-level facts of one hand-off or checkpoint (identical on every host rank).

    Always present: the position, the tensor catalog (the shared tensors in send order), the
    optimizer's param groups (hyper-parameters, parameters by name) and the scheduler's state.
    A host rank's hand-off (checkpoint, clone, DPU memory) adds the facts of its run: `host_ranks`
    and `threshold` (how the shared tensors were sliced), `steps_per_epoch` (None: a script's),
    `config` and `config_hash`, and a script's `user` data (`job.checkpoint(extra=)`). A spare's
    packed state (`--recovery rollback`) adds `pending_records` instead: the epoch records still
    waiting for their DPU validation results.
    """

    position: Position
    catalog: Catalog
    param_groups: list[dict[str, Any]]
    scheduler: Optional[dict[str, Any]] = None
    host_ranks: Optional[int] = None
    threshold: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    config: Optional[dict[str, Any]] = None
    config_hash: Optional[str] = None
    user: Optional[dict[str, Any]] = None
    pending_records: Optional[dict[str, Any]] = None
    format: str = FORMAT
    version: int = FORMAT_VERSION

    @property
    def writers(self) -> int:
        """The host ranks that handed it over (each wrote one slice and one local state)."""
        if self.host_ranks is None:
            raise CheckpointError("this state names no host ranks that wrote it: it is not a host rank's hand-off")
        return int(self.host_ranks)

    @property
    def slicing(self) -> Slicing:
        """How the run that wrote it dealt samples (its host ranks x its --batch-size)."""
        if self.config is None:
            raise CheckpointError("this state carries no run config: it is not a host rank's hand-off")
        return Slicing(self.writers, int(self.config["batch_size"]))

    # ------------------------------------------------------------------------------- the writer
    def to_json(self) -> dict[str, Any]:
        """The JSON object, keys in the order (and with the presence) of the on-disk format."""
        p = self.position
        out: dict[str, Any] = {"format": self.format, "version": self.version,
                               "position": {"epoch": p.epoch, "step": p.step, "global_step": p.global_step},
                               "catalog": [[n, d, list(s)] for n, d, s in self.catalog],
                               "param_groups": self.param_groups, "scheduler": self.scheduler}
        if self.host_ranks is not None:  # (a hand-off's run facts come together; steps_per_epoch may be null)
            out.update(host_ranks=self.host_ranks, threshold=self.threshold, steps_per_epoch=self.steps_per_epoch)
        for key in ("config", "config_hash", "user", "pending_records"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def encode(self) -> bytes:
        """The bytes a hand-off carries (compact JSON, as keepers store and forward them)."""
        return json.dumps(self.to_json()).encode()

    # ------------------------------------------------------------------------------- the reader
    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "CheckpointMeta":
        """Read a meta object (or a whole manifest: its `tensors` and `files` are not meta).

        Raises:
            CheckpointError: another format, or a version newer than this program reads.
        """
        fmt, version = raw.get("format", FORMAT), int(raw.get("version", FORMAT_VERSION))
        if fmt != FORMAT or version > FORMAT_VERSION:
            raise CheckpointError(f"the state's metadata is {fmt!r} version {version}; this program reads {FORMAT!r} "
                            f"up to version {FORMAT_VERSION}")
        return cls(position=Position(**raw["position"]), catalog=_catalog(raw["catalog"]),
                   param_groups=list(raw["param_groups"]), scheduler=raw.get("scheduler"),
                   host_ranks=raw.get("host_ranks"), threshold=raw.get("threshold"),
                   steps_per_epoch=raw.get("steps_per_epoch"), config=raw.get("config"),
                   config_hash=raw.get("config_hash"), user=raw.get("user"),
                   pending_records=raw.get("pending_records"), format=fmt, version=version)

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> "CheckpointMeta":
        return cls.from_json(json.loads(bytes(data)))

    @classmethod
    def of(cls, meta: "CheckpointMeta | Mapping[str, Any]") -> "CheckpointMeta":
        """`meta` typed: as is, or read from its JSON (the keeper passes on what it received as JSON)."""
        return meta if isinstance(meta, CheckpointMeta) else cls.from_json(meta)


def _catalog(raw: Sequence[Sequence[Any]]) -> Catalog:
    return [(str(name), str(dtype), tuple(int(n) for n in shape)) for name, dtype, shape in raw]
