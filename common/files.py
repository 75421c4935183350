"""Durable file writes, in one place: a crash leaves the old file or the complete new one, never half.

The recipe (the one torch.distributed.checkpoint and DeepFreeze rely on): write to a temporary
name in the same directory (so the rename cannot cross file systems), flush and fsync the file,
`os.replace` it over the target (atomic on POSIX), then fsync the directory so the rename itself
survives a power loss. Checkpoint shards, the manifest, exported checkpoints, final weights, the
trace file, generated data sets and the benchmarks' baselines all write this way.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import BinaryIO, Callable, Union

Writer = Callable[[BinaryIO], None]
Data = Union[bytes, bytearray, memoryview]


def fsync_dir(path: Union[str, os.PathLike]) -> None:
    """Make the entries of directory `path` (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Union[str, os.PathLike], content: Union[Data, Writer], *, sync_dir: bool = True,
                 parents: bool = False, mode: int = 0o666) -> Path:
    """Write `content` to `path` durably and atomically; return the path.

    Args:
        path: the file to create or replace.
        content: the bytes, or a function that writes them to the open binary file (`torch.save`
            streams into it without first building the whole file in memory).
        sync_dir: fsync the directory after the rename. Off when many files go into one directory
            that the caller fsyncs once after the last (a checkpoint's shards before its commit).
        parents: create missing parent directories first.
        mode: the new file's permissions (less the umask); 0o600 for what only its owner may read.

    Raises:
        OSError: the write, fsync or rename failed; the temporary file is removed, the target untouched.
    """
    target = Path(path)
    if parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    # unique per process and thread: two writers of one target never share a temporary file
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb", opener=lambda name, flags: os.open(name, flags, mode)) as f:
            if callable(content):
                content(f)
            else:
                f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(target.parent)
    return target
