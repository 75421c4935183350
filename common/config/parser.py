"""The training flags (`build_parser`, shared by the host program, the DPU program and `dpurun` after
`--`), the presets, `--config FILE.toml`, and `parse_run_config`, which resolves them to a `RunConfig`:
the preset, then the file, then the flags given.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import typing
from typing import Any, Callable, Optional, Sequence

from dpuoffload.common.config.runconfig import TUPLE_FIELDS, RunConfig
from dpuoffload.common.config.sections import (
    ALLREDUCE_BACKENDS,
    AMPS,
    AUTO_ALLOWS,
    CKPT_COPIES,
    CKPT_ERRORS,
    DEVICES,
    DPU_FAILURES,
    LR_SCHEDULES,
    MODES,
    NUMERICS,
    RECOVERY,
    WIRES,
)
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults.policy import SIMULATED_SPELLINGS
from dpuoffload.common.modes import FlagValue


# --------------------------------------------------------------------------------------- presets
def debug_preset() -> dict[str, Any]:
    """A tiny run (seconds per epoch on one core) that the demo and the tests reuse."""
    return dict(model="resnet20", dataset="cifar10", epochs=3, batch_size=16, val_batch_size=128,
                train_subset=512, val_subset=256, lr=0.05)


def default_preset() -> dict[str, Any]:
    """No overrides: the dataclass defaults."""
    return {}


PRESETS: dict[str, Callable[[], dict[str, Any]]] = {"default": default_preset, "debug": debug_preset}


# ---------------------------------------------------------------------------------------- parser
def build_parser(prog: str = "dpuoffload") -> argparse.ArgumentParser:
    """The training flags, shared by the host program, the DPU program and `dpurun` (after `--`)."""
    p = argparse.ArgumentParser(prog=prog, add_help=True,
                                description="Training flags (identical for host and DPU programs).")
    S = argparse.SUPPRESS  # unset flags fall back to the preset, then to the dataclass default
    p.add_argument("--preset", choices=sorted(PRESETS), default="default",
                   help="start from a named preset; explicit flags override it. debug = resnet20 on "
                        "cifar10, 3 epochs, batch 16, first 512 train / 256 val samples (default: default)")
    p.add_argument("--config", default=S, metavar="FILE.toml",
                   help="read training settings from a TOML file (keys: these flags' names, e.g. batch_size "
                        "or batch-size); order: --preset, then the file, then flags given here")
    p.add_argument("--mode", choices=MODES, default=S,
                   help="none: host ranks do everything; da: DPU ranks load and augment batches; mv: DPU "
                        "ranks validate epoch i during epoch i+1; hybrid: both; naive: DPU ranks train "
                        "as extra replicas; auto: profile a few steps, predict every mode's epoch time, "
                        "run the fastest")
    p.add_argument("--model", default=S, help="resnet20 | resnet56 | shufflenet_v2 | resnet50 | "
                   "module:function (a factory taking num_classes)")
    p.add_argument("--dataset", default=S, help="cifar10 | svhn | tinyimagenet | fake | "
                   "webdataset:PATTERN (tar shards, e.g. DIR/train-{000000..000005}.tar; val: the same with val) | "
                   "module:function (a factory taking root, train, download)")
    p.add_argument("--data", default=S, metavar="DIR", help="dataset root directory")
    p.add_argument("--download", action="store_true", default=S,
                   help="let torchvision download the dataset where it supports it")
    p.add_argument("--skip-corrupt", type=int, default=S, metavar="N",
                   help="leave out of its batch a training sample that fails to load (a corrupt file), each named in "
                        "a line, at most N per epoch and host rank; 0 (default): the first one stops the job")
    p.add_argument("--num-classes", type=int, default=S,
                   help="number of classes for a user dataset without a .classes attribute")
    p.add_argument("--epochs", type=int, default=S, help="training epochs")
    p.add_argument("--batch-size", type=int, default=S, help="per host rank batch size")
    p.add_argument("--val-batch-size", type=int, default=S, help="validation batch size")
    p.add_argument("--drop-last", action="store_true", default=S,
                   help="drop each rank's last partial batch of an epoch")
    p.add_argument("--train-subset", type=int, default=S, metavar="N",
                   help="train on the first N samples only (quick runs)")
    p.add_argument("--val-subset", type=int, default=S, metavar="N",
                   help="validate on the first N samples only")
    p.add_argument("--lr", type=float, default=S, help="peak SGD learning rate")
    p.add_argument("--momentum", type=float, default=S, help="SGD momentum")
    p.add_argument("--weight-decay", type=float, default=S, help="SGD weight decay")
    p.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=S,
                   help="per-step learning-rate schedule")
    p.add_argument("--seed", type=int, default=S, help="seed for weights, sampler, augmentation and dropout")
    p.add_argument("--allreduce", choices=ALLREDUCE_BACKENDS, default=S,
                   help="gradient allreduce: horovod, torch (torch.distributed gloo), mpi (one MPI allreduce "
                        "through host memory) or auto = horovod when it imports (mpi under --recovery)")
    p.add_argument("--device", choices=DEVICES, default=S,
                   help="where host ranks train: cuda (one GPU per host rank, by its rank on its node), cpu, or "
                        "auto (cuda when torch sees a GPU) (default: auto); with a script, job.device says which")
    p.add_argument("--amp", choices=AMPS, default=S,
                   help="autocast the forward pass to bf16 or fp16 (fp16 with loss scaling) (default: off)")
    p.add_argument("--channels-last", action="store_true", default=S,
                   help="model and image batches in the channels-last memory layout (faster convolutions on GPUs)")
    p.add_argument("--log-dir", default=S, metavar="DIR",
                   help="write metrics.jsonl and per-rank phase timers (phases-rank<R>.jsonl) here")
    p.add_argument("--digest-batches", action="store_true", default=S,
                   help="log a sha256 of every epoch's training batches per host rank (to check that "
                        "offloaded batches equal locally built ones)")
    p.add_argument("--save-weights", default=S, metavar="PATH",
                   help="host rank 0 writes the final model state_dict here (torch.save; load with "
                        "torch.load(PATH, weights_only=True))")
    p.add_argument("--trace", default=S, metavar="PATH",
                   help="write one Chrome trace-event JSON of all ranks (steps, batches, validation "
                        "phases) to PATH; open it in https://ui.perfetto.dev")
    p.add_argument("--tensorboard", default=S, metavar="DIR",
                   help="host rank 0 writes the epoch metrics and step losses as TensorBoard events to DIR "
                        "(needs pip install tensorboard)")
    p.add_argument("--plots", action="store_true", default=S,
                   help="host rank 0 redraws <log-dir>/training.png (loss and accuracy per epoch, train and "
                        "val) after every epoch (needs --log-dir and matplotlib)")
    p.add_argument("--da-buffers", type=int, default=S, metavar="K",
                   help="--mode da: batch buffers per DPU rank, used as a circular send queue; "
                        "memory stays bounded by K batches")
    p.add_argument("--da-host-share", type=_fraction_or_auto, default=S, metavar="F|auto",
                   help="--mode da/hybrid: share of every epoch's steps each host rank builds itself (spread evenly: "
                        "0.25 is every 4th step), the DPU ranks the rest, so host and DPU cores feed together; "
                        "batches stay identical to --mode none; 'auto' picks it at start-up from measured "
                        "augmentation speeds on both sides so that neither waits for the other")
    p.add_argument("--da-host-workers", type=int, default=S, metavar="H",
                   help="--mode da/hybrid with --da-host-share: worker processes each host rank uses for its "
                        "share (0: in the training process itself)")
    p.add_argument("--numerics", choices=NUMERICS, default=S,
                   help="--mode da/hybrid: before training, every host rank builds the first --numerics-samples "
                        "samples of each loader itself and compares them, byte for byte, with its DPU rank's "
                        "(another CPU architecture or library version can round differently); on a difference "
                        "strict stops the job, warn prints the first differing transform step and trains on, "
                        "off skips the check")
    p.add_argument("--numerics-samples", type=int, default=S, metavar="N",
                   help="--numerics: samples of the training set compared per loader")
    p.add_argument("--wire", choices=WIRES, default=S,
                   help="--mode da/hybrid: what DPU ranks send. uint8: when the transform ends in element-wise float "
                        "steps (ToTensor, ConvertImageDtype, ToDtype, Normalize), the DPU ranks run the steps before "
                        "them and send uint8 images, and the host ranks run the float steps on each batch: 4x fewer "
                        "bytes, and no DPU float arithmetic to round differently; auto: uint8 where possible (float on "
                        "a GPU host rank, whose CPU would be slower than its GPU); float: the transform's output")
    p.add_argument("--dpu-workers", type=int, default=S, metavar="K",
                   help="--mode da/hybrid: worker processes each augmentation DPU rank forks per host rank it "
                        "feeds, to build that host's batches on K cores (0: in the DPU rank itself; a GPU host "
                        "needs several cores); batches stay identical to --mode none")
    p.add_argument("--mv-dpu-fraction", type=_fraction_or_auto, default=S, metavar="F|auto",
                   help="--mode mv/hybrid: fraction of the validation set the DPU ranks evaluate; the "
                        "host ranks evaluate the rest at epoch end; 'auto' picks it from measured "
                        "evaluation speeds")
    p.add_argument("--dpu-da-ranks", type=int, default=S, metavar="A",
                   help="--mode hybrid: DPU ranks doing data augmentation (default: host ranks / "
                        "--da-fanout, else half the DPU ranks)")
    p.add_argument("--dpu-mv-ranks", type=int, default=S, metavar="B",
                   help="--mode hybrid: DPU ranks doing validation (default: the other DPU ranks)")
    p.add_argument("--da-fanout", type=int, default=S, metavar="F",
                   help="--mode hybrid: host ranks fed by each augmentation rank (published layout: 2)")
    p.add_argument("--dpu-batch-size", type=_int_or_auto, default=S, metavar="b|auto",
                   help="--mode naive: batch size of each DPU replica; 'auto' measures a few steps on "
                        "both sides and balances step times (the published balance was 2 vs 16) "
                        "(default: auto)")
    p.add_argument("--auto-allow", choices=AUTO_ALLOWS, default=S, metavar="naive",
                   help="--mode auto: also consider naive, which trains a different model (other batch sizes "
                        "and step counts); without it auto picks only modes that keep the math of none")
    p.add_argument("--no-progress", dest="progress", action="store_false", default=S,
                   help="no progress bar on host rank 0")
    p.add_argument("--peer-timeout", type=float, default=S, metavar="SECONDS",
                   help="abort the job when a peer does not answer within this time")
    p.add_argument("--script", default=S, metavar="PATH",
                   help="the user's training script the host ranks run (dpurun sets it from `dpurun -- [flags] "
                        "train.py [args]`; the DPU ranks import its module-level classes)")
    add_checkpoint_flags(p)
    _append_defaults(p)
    return p


def _append_defaults(p: argparse.ArgumentParser) -> None:
    """Write every flag's default into its help from `RunConfig` itself, so the two never disagree.

    Flags are parsed with `default=SUPPRESS` (unset flags fall back to the preset, then to the
    dataclass default), so argparse cannot show the default; this does. Flags whose help already
    explains a computed default (`(default: ...)`) and flags off by default are left alone.
    """
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for action in p._actions:
        value = defaults.get(action.dest)
        if action.help is None or "(default" in action.help or value in (None, False, True, ()):
            continue
        action.help += f" (default: {value})"


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'512M', '4G', '1.5G', '2048' (bytes) -> bytes; binary units (K = 1024), an optional trailing B."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write e.g. 512M, 4G or a number of bytes") from None
    return int(value * _UNITS[unit])


def add_checkpoint_flags(p: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS
    g = p.add_argument_group("checkpoints and clones (state goes host -> DPU in slices; DPU ranks write it)")
    g.add_argument("--ckpt-dir", default=S, metavar="DIR",
                   help="directory for checkpoints (step-<N>/ with shards, manifest.json, COMMITTED); must be "
                        "visible to every rank (a shared file system on a cluster)")
    g.add_argument("--ckpt-every", type=int, default=S, metavar="N",
                   help="checkpoint after every N optimizer steps (global step count)")
    g.add_argument("--ckpt-every-epoch", action="store_true", default=S,
                   help="checkpoint at the end of every epoch (after validation hand-off)")
    g.add_argument("--ckpt-keep", type=int, default=S, metavar="K",
                   help="keep the K newest complete checkpoints, delete older ones")
    g.add_argument("--ckpt-mem-keep", type=int, default=S, metavar="K",
                   help="DPU ranks also keep the K newest checkpoints in their memory (/dev/shm, it outlives "
                        "the job), so `--resume latest` after a failure restarts from DPU memory without "
                        "reading the disk; 0 = off (dpurun --restarts sets 2)")
    g.add_argument("--ckpt-mem-replicas", type=int, default=S, metavar="R",
                   help="with --ckpt-mem-keep: each DPU also keeps a copy of the hand-offs of the DPUs of R "
                        "other nodes (a ring by node), so a restart after a whole node is lost still finds "
                        "every shard in DPU memory; default 1 with DPU ranks on >= 2 nodes, else 0")
    g.add_argument("--ckpt-mem-budget", type=parse_size, default=S, metavar="SIZE",
                   help="with --ckpt-mem-keep: the most this run keeps in one DPU's memory (its own "
                        "hand-offs and the copies it holds), e.g. 512M or 4G; a step over it is kept on "
                        "disk only (said once); default a quarter of the DPU's RAM")
    g.add_argument("--ckpt-copy", choices=CKPT_COPIES, default=S,
                   help="staged: host ranks copy their slice into a send buffer and go on (blocks for the "
                        "copy); overlap: the copy runs in the background beside the next step's forward and "
                        "backward (a GPU's on a side stream into pinned memory), the next optimizer step waits "
                        "for what is left of it (a script's job.checkpoint waits at once); zero: send straight "
                        "from the weights and wait for the send before the next optimizer step (CPU only)")
    g.add_argument("--ckpt-errors", choices=CKPT_ERRORS, default=S,
                   help="a checkpoint that cannot be written (disk full, permissions): continue = train on, "
                        "try again at the next one and exit non-zero at the end naming the newest intact "
                        "checkpoint; fail = stop the job at the first failure")
    g.add_argument("--resume", default=S, metavar="DIR|latest|auto",
                   help="continue from a checkpoint directory (step-<N>) or the newest state kept (DPU "
                        "memory or --ckpt-dir; auto: start from the beginning if none is, as a relaunch "
                        "or a requeued job does); same host rank count resumes to the bit, another "
                        "count re-slices")
    g.add_argument("--stop-at-step", type=int, default=S, metavar="N",
                   help="stop after global step N (e.g. before a job time limit); with --ckpt-dir a "
                        "checkpoint is taken there. The LR schedule still spans --epochs")
    g.add_argument("--clone-at", type=int, default=S, metavar="STEP",
                   help="hand the state after global step STEP to the clone ranks (dpurun --clone-ranks M), "
                        "which continue as their own data-parallel group")
    g.add_argument("--clone-override", action="append", default=S, metavar="KEY=VALUE",
                   help="a training flag the clone group uses instead of the original's (repeatable), e.g. "
                        "lr=0.01, seed=1, weight_decay=0, epochs=5, train_subset=256")
    g.add_argument("--inject", action="append", default=S, metavar="WHO@WHEN[:HOW]",
                   help="fail a rank on purpose (repeatable, or comma-separated): WHO host:R, dpu:R or node:N; "
                        "WHEN a global step or a fraction of the run's steps; HOW kill (default), term, stop "
                        "(a hang) or raise, e.g. host:1@12 or dpu:0@0.5:stop")
    g.add_argument("--dpu-failure", choices=DPU_FAILURES, default=S,
                   help="a DPU rank that dies: stop = the job ends (Open MPI's way); fallback = training goes on "
                        "under MPI fault tolerance (dpurun adds mpirun --with-ft ulfm): the host ranks a dead "
                        "augmentation rank fed build their own batches from that step, the same ones; after a dead "
                        "validation rank the host ranks validate (what it had not reported again, from state "
                        "they kept); a dead checkpoint keeper's host ranks hand their state to the living keepers "
                        "from the next checkpoint (the one it died in is never committed; not with clones). A host "
                        "rank's death still ends the job, naming it")
    g.add_argument("--recovery", choices=RECOVERY, default=S,
                   help="a host rank that dies: stop = the job ends, naming it (dpurun --restarts N relaunches "
                        "it); lossy-forward = the survivors finish the failed step with their own gradients and "
                        "go on under MPI fault tolerance (dpurun adds mpirun --with-ft ulfm; --allreduce mpi), "
                        "its samples of that step and of the rest of its epoch lost, then taken over by the "
                        "survivors, and with dpurun --spare-ranks S a spare takes its seat at the next epoch; "
                        "rollback = a spare rank (dpurun --spare-ranks S) takes its place with a "
                        "survivor's state and replays the failed step, bit-exact with a run without the failure; "
                        "--mode none, da, mv or hybrid (the DPU validation ranks take each epoch's state from the "
                        "host ranks alive then); with checkpoints, both: lossy-forward slices them among the "
                        "survivors (one torn by the death is never committed), rollback's spare sends the dead "
                        "rank's part, so none is torn")
    g.add_argument("--reassign", action="store_true", default=S,
                   help="with --recovery lossy-forward: the survivors take a dead host rank's batches over from "
                        "the very next step, so only the failed step's samples are lost")
    g.add_argument("--inject-simulate", action="append", default=S, metavar="WHO@WHEN[:P]",
                   help="simulate a failure as the recovery study does, no process lost (repeatable, or "
                        "comma-separated): host rank R (host:R, node:N) loses the gradients after share P of the "
                        "backward pass of global step WHEN (default 50%%), e.g. host:1@12:25%%")
    g.add_argument("--simulate-recovery", choices=SIMULATED_SPELLINGS, default=S, metavar="{lossy-forward,rollback}",
                   help="--inject-simulate's recovery, named as --recovery names them: lossy-forward (the survivors "
                        "average the lost gradients and go on) or rollback (immediate rollback: replay the "
                        "mini-batch) (default: lossy-forward; the old lf / ir still work, with a deprecation message)")


def _or_auto(cast: Callable[[str], Any], expected: str) -> Callable[[str], Any]:
    """An argparse type accepting 'auto' or a value `cast` can parse."""
    def parse(text: str) -> Any:
        if text == "auto":
            return "auto"
        try:
            return cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected} or 'auto', got {text!r}") from None
    return parse


_int_or_auto = _or_auto(int, "an integer")
_fraction_or_auto = _or_auto(float, "a number in [0, 1]")


def parse_run_config(argv: Optional[Sequence[str]] = None, prog: str = "dpuoffload") -> RunConfig:
    """Parse training flags into a `RunConfig`: the preset, then `--config FILE`, then explicit flags.

    Raises:
        ConfigError: a value is out of range or an unknown choice.
        SystemExit: argparse's own usage errors (unknown flag, wrong type).
    """
    flags = vars(build_parser(prog).parse_args(argv))
    preset, path = flags.pop("preset"), flags.pop("config", None)
    values = PRESETS[preset]()
    if path is not None:
        values.update(read_config_file(path))
    values.update(flags)
    for name in TUPLE_FIELDS:
        if name in values:
            values[name] = tuple(values[name])
    return RunConfig(**values)


# ----------------------------------------------------------------------------------- config files
def read_config_file(path: str) -> dict[str, Any]:
    """The settings of a TOML config file (`--config`), checked against `RunConfig`'s fields.

    Keys are field names (`batch_size`) or flag spellings (`batch-size`). Every rank reads the same
    file (dpurun passes the same argv to all), so they resolve the same config and the same hash.

    Raises:
        ConfigError: the file is missing or not TOML, or has unknown keys or values of the wrong
            type (all problems in one message, each with its fix).
    """
    try:
        with open(path, "rb") as f:
            table = _toml().load(f)
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read it ({e.strerror or e}); give an existing TOML file") from None
    except ValueError as e:  # tomllib.TOMLDecodeError
        raise ConfigError(f"--config {path}: not valid TOML ({e}); see examples/debug.toml") from None
    values, problems = {}, []
    for key, value in table.items():
        name = key.replace("-", "_")
        try:
            values[name] = _config_value(name, value)
        except ValueError as e:
            problems.append(f"{key!r} {e}")
    if problems:
        raise ConfigError(f"--config {path}: " + "; ".join(problems))
    return values


def _toml() -> Any:
    """tomllib (Python 3.11+) or its backport tomli (3.10, a dependency there)."""
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    import tomli
    return tomli


def _config_value(name: str, value: Any) -> Any:
    """`value` as field `name` takes it; ValueError (worded to follow the key) when it cannot."""
    hints = typing.get_type_hints(RunConfig)
    if name not in hints:
        close = difflib.get_close_matches(name, hints, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"is not a setting: {hint}keys are training flag names without the dashes "
                         f"(e.g. batch_size), see {PROG_HELP}")
    if name in TUPLE_FIELDS and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    allowed = _toml_types(hints[name])
    if isinstance(value, bool) != (bool in allowed) or not isinstance(value, allowed):
        wanted = " or ".join(t.__name__ for t in allowed)
        raise ValueError(f"must be {wanted}, got {type(value).__name__} {value!r}: write it as "
                         f"{name} = {_example(allowed)}")
    if float in allowed and isinstance(value, int):  # so `lr = 1` hashes like `--lr 1`
        return float(value)
    return value


def _toml_types(hint: Any) -> tuple[type, ...]:
    """The TOML value types a field accepts (a float field takes an integer too, an enum field its value's
    string; TOML has no null)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    types: list[type] = []
    for a in args:
        a = str if isinstance(a, type) and issubclass(a, FlagValue) else typing.get_origin(a) or a  # Mode, Amp: str
        types += [float, int] if a is float else [list] if a is tuple else [a]
    return tuple(dict.fromkeys(types))


def _example(types: tuple[type, ...]) -> str:
    return {bool: "true", int: "16", float: "0.05", str: '"text"', list: '["lr=0.01"]'}[types[0]]


PROG_HELP = "dpurun -- --help"
