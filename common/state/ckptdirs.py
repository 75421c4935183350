"""Checkpoint directories without torch: which ones exist, which are complete, which one to resume.

Split from `ckptfiles` (which reads and writes the shards and needs torch and safetensors) so that
`dpurun` can check `--resume` and name the last committed checkpoint before launch and after a
failure in well under a second: importing torch alone costs seconds on a loaded machine.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any, Mapping, Optional

from dpuoffload.common.errors import ConfigError

# `--resume` keywords: the newest state kept (DPU memory or the checkpoint directory), and the same or, when
# nothing was kept yet, the beginning (a relaunch, a requeued batch job: `RunConfig.resumes_if_any`)
RESUME_LATEST, RESUME_AUTO = "latest", "auto"

MANIFEST = "manifest.json"
COMMITTED = "COMMITTED"
_STEP_DIR = re.compile(r"^step-(\d{9})$")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: missing, incomplete, corrupt. The message names the file."""


def step_dir(root: str | Path, global_step: int) -> Path:
    return Path(root) / f"step-{global_step:09d}"


def committed(root: str | Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / COMMITTED).is_file()]
    return sorted(found, key=lambda p: p.name)


def prune(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints, and incomplete ones older than the
    newest complete one (left by a failed write). Returns what was deleted."""
    done = committed(root)
    if not done:
        return []
    newest = done[-1].name
    doomed = done[:-keep] + [p for p in Path(root).iterdir()
                             if _STEP_DIR.match(p.name) and p.is_dir() and p.name < newest and p not in done]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed



def damage(directory: Path, verified: Optional[dict[str, bytes]] = None) -> Optional[str]:
    """Why a committed checkpoint cannot be restored (its manifest or a file it lists is missing,
    has another size, or another sha256), or None when it is intact. Reads every file once;
    `verified` gets the bytes of those that checked out, so a restore need not read them again."""
    try:
        files = read_manifest(directory)["files"]
    except (CheckpointError, KeyError, TypeError) as e:
        return str(e) if isinstance(e, CheckpointError) else f"{MANIFEST} lists no files"
    for name, expected in files.items():
        data, why = read_checked(directory / name, expected)
        if why is not None:
            if verified is not None:
                verified.clear()
            return f"{name} {why}"
        if verified is not None:
            verified[name] = data
    return None


def read_checked(path: Path, expected: Mapping[str, Any]) -> tuple[bytes, Optional[str]]:
    """A checkpoint file's bytes and what is wrong with them against its manifest entry
    (`{"bytes", "sha256"}`): None when intact, else "is missing", "... (torn)" or "is corrupt ..."."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return b"", "is missing"
    if len(data) != expected["bytes"]:
        return data, f"has {len(data)} bytes, {MANIFEST} says {expected['bytes']} (torn)"
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
        return data, f"is corrupt (its sha256 differs from {MANIFEST})"
    return data, None


def resolve(resume: str, ckpt_dir: Optional[str], skipped: Optional[list[str]] = None,
            verified: Optional[dict[str, bytes]] = None) -> Path:
    """`--resume DIR|latest|auto` to one checkpoint directory, or a CheckpointError saying what is wrong.

    `latest` (and `auto`, whose caller checked that something was committed) takes the newest *intact*
    committed checkpoint: a newer one that is damaged (a file lost or corrupted after its commit) is
    skipped, and `skipped` gets one line per skipped checkpoint for the caller to warn with, so a
    relaunch after a crash needs no hand. An explicit DIR is used as given (its damage is reported
    when it is read)."""
    if resume in (RESUME_LATEST, RESUME_AUTO):
        if ckpt_dir is None:
            raise CheckpointError(f"--resume {resume} needs --ckpt-dir")
        done = committed(ckpt_dir)
        if not done:
            raise CheckpointError(f"--resume {resume}: no complete checkpoint (step-<N>/ with {COMMITTED}) in "
                                  f"{ckpt_dir}; start without --resume (or with --resume auto, which starts from "
                                  "the beginning when nothing was kept), or pass the directory of one checkpoint")
        notes: list[str] = []
        for candidate in reversed(done):
            why = damage(candidate, verified)
            if why is None:
                if skipped is not None:
                    skipped.extend(notes)
                return candidate
            notes.append(f"skipped damaged checkpoint {candidate}: {why}")
        raise CheckpointError(f"--resume {resume}: every checkpoint in {ckpt_dir} is damaged ({'; '.join(notes)}); "
                              "start without --resume")
    path = Path(resume)
    if not path.is_dir():
        raise CheckpointError(f"--resume {resume}: no such checkpoint directory")
    if not (path / COMMITTED).is_file():
        done = committed(path)
        if done:  # the checkpoint root was given: take its newest
            return done[-1]
        raise CheckpointError(f"--resume {resume}: no {COMMITTED} marker, the checkpoint is incomplete (its "
                              "write failed or was interrupted); use an older one or --resume latest")
    return path


def read_manifest(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {directory}: {MANIFEST} is missing") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {directory}: {MANIFEST} is corrupt ({e})") from None
