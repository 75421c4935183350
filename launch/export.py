"""`dpurun export-checkpoint DIR OUT.pt`: a sharded checkpoint as one plain, portable file.

Reads the manifest, verifies every shard's sha256, reassembles the sliced tensors and writes
`{"model": state_dict, "optimizer": state_dict, "epoch", "step", "global_step", "model_name"}` with
`torch.save` (temp file, fsync, rename), loadable anywhere with `torch.load(OUT, weights_only=True)`
and `model.load_state_dict(ckpt["model"])` — no dpuoffload, MPI or DPU needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from dpuoffload.common import files
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.state import ckptdirs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dpurun export-checkpoint",
        description="Verify and reassemble a dpuoffload checkpoint into one torch.save file "
                    "({'model', 'optimizer', 'epoch', 'step', 'global_step', 'model_name'}).")
    p.add_argument("checkpoint", metavar="DIR",
                   help="a checkpoint directory (step-<N>/) or a --ckpt-dir (its newest complete checkpoint)")
    p.add_argument("out", metavar="OUT.pt", help="file to write (parent directories are created)")
    return p


def find_checkpoint(checkpoint: str) -> Path:
    """DIR as one complete checkpoint (step-<N>/ with COMMITTED) or the newest one under a --ckpt-dir.

    Raises:
        ConfigError: DIR is missing, a file, or holds no complete checkpoint; says what to pass.
    """
    path = Path(checkpoint)
    wanted = f"pass a checkpoint directory (step-<N>/ with {ckptdirs.COMMITTED}) or the --ckpt-dir that holds them"
    if not path.exists():
        raise ConfigError(f"{checkpoint}: no such directory; {wanted}")
    if not path.is_dir():
        raise ConfigError(f"{checkpoint} is a file, not a checkpoint directory; {wanted}")
    if (path / ckptdirs.COMMITTED).is_file():
        return path
    done = ckptdirs.committed(path)
    if not done:
        raise ConfigError(f"{checkpoint}: no complete checkpoint there (no {ckptdirs.COMMITTED} marker in it or "
                          f"in a step-<N>/ below it: an interrupted write, or the wrong directory); {wanted}")
    return done[-1]


def export(checkpoint: str, out: str) -> str:
    """Write the plain state dicts; return a one-line summary."""
    path = find_checkpoint(checkpoint)  # before importing torch (seconds): a wrong path fails at once
    import torch

    from dpuoffload.common.state import ckptfiles
    from dpuoffload.common.state.trainstate import Position, describe_position

    ckpt = ckptfiles.load(path)
    plain = ckptfiles.plain_state_dicts(ckpt)
    target = files.write_atomic(out, lambda f: torch.save(plain, f), parents=True)  # never half a file
    n_params = sum(t.numel() for t in plain["model"].values())
    pos = describe_position(Position(plain["epoch"], plain["step"], plain["global_step"]))
    return (f"exported {path} (model {plain['model_name']}, {pos}, {len(plain['model'])} tensors / "
            f"{n_params:,} values, {len(plain['optimizer']['state'])} optimizer states) to {target} "
            f"({target.stat().st_size / 1e6:.1f} MB)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        print(export(args.checkpoint, args.out))
    except ConfigError as e:
        print(f"dpurun export-checkpoint: error: {e}", file=sys.stderr)
        return 2
    return 0
