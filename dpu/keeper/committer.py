"""What the committing keeper does with a commit decision (`commit.decide_commit`), and the run's outcome.

Only the lowest living keeper commits. It writes the manifest and the COMMITTED marker last (so a
checkpoint is either complete or absent), prunes to `--ckpt-keep`, and says in one line what became
of each checkpoint. A failed write (disk full, permissions, a name in the way) drops that checkpoint,
keeps the previous one intact and training goes on (or, with `--ckpt-errors fail`, the job stops).
After the last hand-off it sends host rank 0 the run's summary, which host rank 0 reports last and
turns into the exit code (`host.checkpoint.StateHandoff.finish`).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from dpuoffload.common.errors import InternalError
from dpuoffload.common.faults.abort import EXIT_CHECKPOINT_FAILED, PREFIX, abort_job
from dpuoffload.common.runtime.messages import Tag
from dpuoffload.common.runtime.waits import wait_object
from dpuoffload.common.state import ckptfiles
from dpuoffload.dpu.keeper.commit import CommitDecision, CommitRules, Death, KeeperReport, Outcome, decide_commit

if TYPE_CHECKING:
    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.runtime.roles import Topology

_AFTER_TORN = {Death.HOST: "the next ones come from the surviving host ranks (--recovery)",
               Death.KEEPER: "the next ones go to the living keepers (--dpu-failure fallback)"}


class Committer:
    """Acts on commit decisions: manifest, delete, print, prune, record; keeps each checkpoint's fate.

    Args:
        note: keeps a record (the keeper's records and its JSON-lines log).
    """

    def __init__(self, cfg: "RunConfig", topo: "Topology", note: Callable[[dict[str, Any]], None]) -> None:
        self.cfg, self.topo, self.note = cfg, topo, note
        self.rules = CommitRules.of(cfg)
        self.outcomes: dict[int, bool] = {}   # checkpoint step -> committed (torn ones are not counted)
        self.torn: list[int] = []             # checkpoint steps lost to a death the run survived

    @property
    def root(self) -> str:
        """--ckpt-dir: set whenever there is a checkpoint to commit or summarise (`RunConfig.checkpointing`)."""
        if self.cfg.ckpt_dir is None:
            raise InternalError("a checkpoint to commit without --ckpt-dir")
        return self.cfg.ckpt_dir

    def commit(self, meta: Mapping[str, Any], reports: Sequence[KeeperReport]) -> None:
        """Decide, write the manifest when the decision is to commit, then act on the outcome."""
        decision = decide_commit(meta, reports, self.rules)
        directory = ckptfiles.step_dir(self.root, decision.step)
        t0 = time.perf_counter()
        if decision.committed:
            try:
                ckptfiles.write_manifest(directory, meta, decision.files, ckptfiles.plan_for(meta))
            except OSError as e:
                decision = decide_commit(meta, reports, self.rules, manifest_error=(
                    f"{self.topo.describe()}: writing the manifest: {type(e).__name__}: {e}"))
        record = {"global_step": decision.step, "epoch": meta["position"]["epoch"], "step": meta["position"]["step"],
                  "committed": decision.committed, "errors": list(decision.errors), "write_s": decision.write_s,
                  "commit_s": time.perf_counter() - t0, "bytes": decision.nbytes}
        if decision.remove and directory.is_dir():
            shutil.rmtree(directory, ignore_errors=True)
        {Outcome.COMMITTED: self._committed, Outcome.TORN: self._torn,
         Outcome.FAILED: self._failed}[decision.outcome](decision, directory, record)
        self.note(record)

    def _committed(self, decision: CommitDecision, directory: Path, record: dict[str, Any]) -> None:
        self.outcomes[decision.step] = True
        if decision.prune_keep is None:
            raise InternalError("a committed checkpoint without its pruning decision (`decide_commit`)")
        record["pruned"] = [p.name for p in ckptfiles.prune(self.root, decision.prune_keep)]
        print(f"{PREFIX} checkpoint step {decision.step} committed: {directory} ({record['bytes'] / 1e6:.1f} MB, "
              f"written in {record['write_s']:.2f} s)", flush=True)

    def _torn(self, decision: CommitDecision, directory: Path, record: dict[str, Any]) -> None:
        """A death the run survives tore it: said once, not counted as a failure."""
        self.torn.append(decision.step)
        record["torn"] = True
        if decision.torn_by is None:
            raise InternalError("a torn checkpoint without the death that tore it (`decide_commit`)")
        print(f"{PREFIX} checkpoint at step {decision.step} NOT saved ({'; '.join(decision.errors)}); "
              f"{_AFTER_TORN[decision.torn_by]}, {self.kept()}", file=sys.stderr, flush=True)

    def _failed(self, decision: CommitDecision, directory: Path, record: dict[str, Any]) -> None:
        self.outcomes[decision.step] = False
        if decision.stop_job:
            self.stop_job(decision.step, decision.errors)
        print(f"{PREFIX} checkpoint at step {decision.step} NOT saved ({'; '.join(decision.errors)}); training "
              f"continues, {self.kept()}", file=sys.stderr, flush=True)

    def settle_orphan(self, step: int, dead: int) -> None:
        """`--dpu-failure fallback`, on becoming the committer: the checkpoint `step` this keeper last
        reported to keeper `dead`, which died before committing it, is torn. Say so by name (nobody
        else saw it whole) and remove it, instead of leaving it to `--ckpt-keep`'s pruning."""
        directory = ckptfiles.step_dir(self.root, step)
        if directory in ckptfiles.committed(self.root):
            return
        shutil.rmtree(directory, ignore_errors=True)
        self.torn.append(step)
        print(f"{PREFIX} checkpoint at step {step} NOT saved ({self.topo.describe(dead)} died before committing it); "
              f"this keeper commits from here on (--dpu-failure fallback), {self.kept()}", file=sys.stderr, flush=True)
        self.note({"global_step": step, "committed": False, "torn": True,
                   "errors": [f"{self.topo.describe(dead)} died before committing it"]})

    def kept(self) -> str:
        previous = ckptfiles.committed(self.root)
        return f"the last complete checkpoint is {previous[-1]}" if previous else "there is no complete checkpoint yet"

    def newest_intact(self) -> str:
        done = ckptfiles.committed(self.root)
        return f"the newest intact one is {done[-1]}" if done else "there is no intact checkpoint"

    def stop_job(self, step: int, errors: Sequence[str]) -> None:
        """--ckpt-errors fail: one line, then end the whole job (host ranks may be mid-step)."""
        abort_job(f"checkpoints: step {step} NOT saved ({'; '.join(errors)}); stopping the job "
                  f"(--ckpt-errors fail); {self.newest_intact()}", EXIT_CHECKPOINT_FAILED)

    def summary(self) -> dict[str, Any]:
        """How many checkpoints were taken and failed, and the newest intact one, in one line."""
        failed = sorted(s for s, ok in self.outcomes.items() if not ok)
        line = None
        if failed:
            which = ", ".join(map(str, failed[:5])) + (", ..." if len(failed) > 5 else "")
            line = (f"checkpoints: {len(failed)} of {len(self.outcomes)} NOT saved (step {which}); "
                    f"{self.newest_intact()}")
        done = ckptfiles.committed(self.root)
        return {"taken": len(self.outcomes), "failed": failed, "newest": str(done[-1]) if done else None,
                "line": line, "torn": self.torn}

    def send_summary(self, committer: int, leader: int) -> None:
        """The committer -> world rank `leader` (host rank 0, or the senders' rank 0 once it died
        under --recovery), after the last hand-off: the run's checkpoint outcome."""
        if not self.cfg.checkpointing or self.topo.world_rank != committer:
            return
        req = self.topo.world.isend(self.summary(), dest=leader, tag=Tag.CKPT_SUMMARY)
        wait_object(req, self.cfg.peer_timeout, "host rank 0 to take the checkpoint summary")
