"""The commit decision, pure: from what every keeper reports of one checkpoint, what becomes of it.

The committing keeper (the lowest living one) holds one `KeeperReport` per keeper (its own, the
others' as received, and one it writes itself for a part that never came: a keeper or a host rank
died first), asks `decide_commit`, and only then acts on the answer (`committer.Committer`: write
the manifest, delete, print, prune). Judging apart from acting puts every rule in one place and
makes them testable without MPI (`tests/test_keeper_commit.py`):

- a checkpoint is *committed* only when no keeper reported an error and every host rank's shard
  and local file were written, whichever keepers wrote them (routes change when keepers die);
- one lost to a death the run survives (a keeper under `--dpu-failure fallback`, a host rank under
  `--recovery`) is *torn*: said once, its directory removed, never counted as a failure;
- any other (disk full, permissions, a name in the way) has *failed*: counted in the run's
  summary, its directory removed, and with `--ckpt-errors fail` the job stops.

Reports travel between keepers as pickled dicts (`Tag.CKPT_REPORT`); `KeeperReport.to_wire` and
`from_wire` keep that layout, so the dataclass is what the code reads and the dict what MPI carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from dpuoffload.common.state.ckptfiles import missing_senders

if TYPE_CHECKING:
    from dpuoffload.common.config import RunConfig

FileInfo = Mapping[str, Any]   # one written file: its size and checksum (`ckptfiles.write_atomic`)


class Death(Enum):
    """Whose death a report stands for; the value is the report's wire key."""

    KEEPER = "died"        # the keeper died before writing its part (--dpu-failure fallback)
    HOST = "host_died"     # host ranks died before handing their state over (--recovery)


class Outcome(Enum):
    COMMITTED = "committed"   # manifest and COMMITTED marker written
    TORN = "torn"             # lost to a death the run survives: not a failure
    FAILED = "failed"         # a write failed: counted, may stop the job (--ckpt-errors fail)


@dataclass(frozen=True)
class KeeperReport:
    """One keeper's report of one checkpoint: the files it wrote, or why it has none.

    Attributes:
        step: the checkpoint's global step (-1 in the end-of-run report).
        files: file name -> `FileInfo` of every file this keeper wrote for it.
        error: why its part is incomplete (None: complete).
        write_s: seconds it took to write its part.
        keeper: the reporting keeper's rank among the keepers (None in a report the committer writes).
        meta: the checkpoint's run-level meta, on routes where the committer may have none of its own
            (`--recovery`: its host ranks may all be dead).
        death: set when the part is missing because of a death (the report the committer writes).
        end: the end-of-run report (`--recovery`): this keeper has no more checkpoints to report.
    """

    step: int
    files: Mapping[str, FileInfo] = field(default_factory=dict)
    error: Optional[str] = None
    write_s: float = 0.0
    keeper: Optional[int] = None
    meta: Optional[Mapping[str, Any]] = None
    death: Optional[Death] = None
    end: bool = False

    @classmethod
    def lost(cls, step: int, death: Death, error: str) -> "KeeperReport":
        """The report the committer writes for a part that never came, because of `death`."""
        return cls(step, error=error, death=death)

    @classmethod
    def end_of_run(cls) -> "KeeperReport":
        return cls(-1, end=True)

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> "KeeperReport":
        if message.get("end"):
            return cls.end_of_run()
        death = next((d for d in Death if message.get(d.value)), None)
        return cls(message["step"], message.get("files", {}), message.get("error"), message.get("write_s", 0.0),
                   message.get("keeper"), message.get("meta"), death)

    def to_wire(self) -> dict[str, Any]:
        """The pickled dict keepers send each other (its layout is part of the wire protocol)."""
        if self.end:
            return {"end": True, "step": -1}
        message: dict[str, Any] = {"keeper": self.keeper, "step": self.step, "files": self.files,
                                   "error": self.error, "meta": self.meta}
        if self.death is not None:
            message[self.death.value] = True
        message["write_s"] = self.write_s
        return message


@dataclass(frozen=True)
class ReportSet:
    """Every keeper's report of one checkpoint, with its meta: what a commit decision is made from."""

    meta: Mapping[str, Any]
    reports: Sequence[KeeperReport]


@dataclass(frozen=True)
class CommitRules:
    """What the run's flags say about commits: `--ckpt-keep` and `--ckpt-errors`."""

    keep: int                 # complete checkpoints kept on disk (older ones pruned)
    stop_on_failure: bool     # --ckpt-errors fail: a failed checkpoint ends the job

    @classmethod
    def of(cls, cfg: "RunConfig") -> "CommitRules":
        return cls(keep=cfg.ckpt_keep, stop_on_failure=cfg.ckpt_errors.stops_job)


@dataclass(frozen=True)
class CommitDecision:
    """What becomes of one checkpoint. The committer acts on it: manifest, delete, print, prune.

    Attributes:
        step: the checkpoint's global step.
        outcome: committed, torn (a death survived) or failed.
        errors: why it is not committed, in report order (empty when committed).
        files: every file the keepers wrote (what the manifest lists).
        complete: the host ranks (numbers) whose shard and local file are both written.
        missing: the host ranks whose shard or local file is not.
        torn_by: for a torn one, whose death tore it (a host rank's, if any report says so).
        prune_keep: for a committed one, how many complete checkpoints to keep (None: prune nothing).
        stop_job: end the job (a failure under --ckpt-errors fail).
        write_s: the slowest keeper's write time.
        nbytes: bytes written, over every keeper.
    """

    step: int
    outcome: Outcome
    errors: tuple[str, ...]
    files: Mapping[str, FileInfo]
    complete: tuple[int, ...]
    missing: tuple[int, ...]
    torn_by: Optional[Death]
    prune_keep: Optional[int]
    stop_job: bool
    write_s: float
    nbytes: int

    @property
    def committed(self) -> bool:
        return self.outcome is Outcome.COMMITTED

    @property
    def remove(self) -> bool:
        """Whether its directory goes: whatever is there of an uncommitted checkpoint is useless."""
        return not self.committed


def decide_commit(meta: Mapping[str, Any], reports: Sequence[KeeperReport], rules: CommitRules,
                  manifest_error: Optional[str] = None) -> CommitDecision:
    """What becomes of the checkpoint `meta` describes, given every keeper's report of it.

    Args:
        meta: the checkpoint's run-level meta (its `position.global_step`, its `host_ranks`).
        reports: one per keeper, in the committer's order (its own first); never empty.
        rules: `--ckpt-keep` and `--ckpt-errors`.
        manifest_error: asked again after a decision to commit, when writing the manifest failed.

    Returns:
        The decision. Torn means every report with an error stands for a death; a checkpoint whose
        errors are not the reports' own (missing files, the manifest) counts as torn too, as it
        always has (no report says otherwise).

    Raises:
        ValueError: a report of another checkpoint (collecting sorts reports by step first).
    """
    step = meta["position"]["global_step"]
    stray = [r for r in reports if r.step != step]
    if stray:
        raise ValueError(f"a report of checkpoint step {stray[0].step} (keeper {stray[0].keeper}) among those of "
                         f"step {step}")
    errors = [r.error for r in reports if r.error]
    files = {name: info for r in reports for name, info in r.files.items()}
    senders = int(meta["host_ranks"])
    missing = missing_senders(files, senders)
    if missing and not errors:  # (never a manifest without every host rank's files, whatever the routes)
        errors.append(f"no files of host rank(s) {missing} were written")
    if manifest_error is not None:
        errors.append(manifest_error)
    outcome = _outcome(errors, reports)
    torn_by = (Death.HOST if any(r.death is Death.HOST for r in reports) else Death.KEEPER) \
        if outcome is Outcome.TORN else None
    return CommitDecision(step=step, outcome=outcome, errors=tuple(errors), files=files,
                          complete=tuple(k for k in range(senders) if k not in missing), missing=tuple(missing),
                          torn_by=torn_by, prune_keep=rules.keep if outcome is Outcome.COMMITTED else None,
                          stop_job=outcome is Outcome.FAILED and rules.stop_on_failure,
                          write_s=max(r.write_s for r in reports),
                          nbytes=sum(info["bytes"] for info in files.values()))  # (a file reported twice: once)


def _outcome(errors: Sequence[str], reports: Sequence[KeeperReport]) -> Outcome:
    if not errors:
        return Outcome.COMMITTED
    if all(r.death is not None for r in reports if r.error):  # (a death survived)
        return Outcome.TORN
    return Outcome.FAILED
