"""The dry import: `python -m dpuoffload.launch.probe [--host-ranks N] [--no-data] -- TRAINING FLAGS`.

`dpurun` runs this child before launch (`launch.checks.dry_import`) to exercise the user's
factories as the ranks will, in a few seconds instead of after ~15 s of MPI start-up: import the
model and data set factories, check they can be called the way dpuoffload calls them, build the
model with the number of classes, build both data sets, fetch one item of each and one collated
training batch, check the item types and the label range, and compare the batch size with each
host rank's share of the training set.

It runs as `python -m`, like the ranks, so the current directory is on `sys.path` here as there.
Each problem is printed to stdout as one line, `dpurun-probe: {"message": ..., "warning": ...}`;
anything else (a factory's own prints) is ignored by `dpurun`. Exit code 0 when it ran to the end.
"""

from __future__ import annotations

import argparse
import inspect
import json
import numbers
import sys
from typing import Any, Callable, Optional, Sequence

from dpuoffload.common.config import RunConfig, parse_run_config
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.factories import is_factory_spec, load_factory
from dpuoffload.common.faults.abort import short_path, user_frame
from dpuoffload.launch.checks import PROBE_MARK, batch_vs_size


class Found(Exception):
    """A problem the probe reports; the dry import stops there (later steps depend on it)."""


def emit(message: str, warning: bool = False) -> None:
    print(PROBE_MARK + json.dumps({"message": message, "warning": warning}), flush=True)


# ---------------------------------------------------------------------------------- locations
def where(filename: str, line: int, name: str = "") -> str:
    """`tests/bad_factories.py:12 in fn`, relative to the current directory when inside it."""
    return f"{short_path(filename)}:{line}" + (f" in {name}" if name else "")


def defined_at(fn: Callable[..., Any]) -> str:
    try:
        target = fn if inspect.isfunction(fn) else getattr(fn, "__init__", fn)
        return where(inspect.getsourcefile(target) or "?", inspect.getsourcelines(target)[1])
    except (TypeError, OSError):
        return getattr(fn, "__module__", "?")


def describe_exception(e: BaseException, doing: str) -> str:
    """`<doing> raised KeyError: 'x' (at file.py:3 in f)`: the exception and the user's line."""
    frame = user_frame(e.__traceback__, fallback=False)
    at = f" (at {where(frame.filename, frame.lineno or 0, frame.name)})" if frame else ""
    if isinstance(e, SyntaxError) and e.filename:  # the user's line is the error's, not a frame's
        at = f" (at {where(e.filename, e.lineno or 0)})"
    return f"{doing} raised {type(e).__name__}: {e}{at}"


# ------------------------------------------------------------------------------------- checks
def check_signature(spec: str, flag: str, args: tuple[Any, ...], call: str) -> None:
    """The factory accepts the arguments dpuoffload passes (checked before calling it)."""
    fn = load_factory(spec, flag)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C callable: calling it will tell
    try:
        signature.bind(*args)
    except TypeError:
        raise Found(f"{flag} {spec} ({defined_at(fn)}) takes {signature}, but dpuoffload calls it as "
                    f"{call}; give it exactly these parameters") from None


def run_step(doing: str, fn: Callable[[], Any], hint: str = "") -> Any:
    """Call user-facing code; its ConfigError is the message, any other exception names the user's line."""
    try:
        return fn()
    except ConfigError as e:
        raise Found(str(e)) from None
    except Exception as e:  # noqa: BLE001 - the user's code may raise anything; report it in one line
        raise Found(describe_exception(e, doing) + hint) from None


def check_item(cfg: RunConfig, item: Any, split: str) -> None:
    """An (image tensor, integer label) pair, as the collate and the loss expect."""
    import torch
    from PIL import Image

    kinds = type(item).__name__
    if isinstance(item, (tuple, list)):
        kinds = "(" + ", ".join(_type_name(x) for x in item) + ")"
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise Found(f"--dataset {cfg.dataset}: {split} item 0 is {kinds}; expected an (image tensor, int label) pair")
    image, label = item
    if isinstance(image, Image.Image):
        raise Found(f"--dataset {cfg.dataset}: {split} item 0 is {kinds}, a PIL image, not a tensor; add "
                    "transforms.ToTensor() to the data set's transform (e.g. Compose([..., ToTensor()]))")
    if not isinstance(image, torch.Tensor):
        raise Found(f"--dataset {cfg.dataset}: {split} item 0 is {kinds}; the image must be a torch.Tensor")
    if not _is_int_label(label):
        raise Found(f"--dataset {cfg.dataset}: {split} item 0 is {kinds}; the label must be an int "
                    "(a class index), not a one-hot vector or a name")


def _type_name(value: Any) -> str:
    """`int`, `torch.Tensor`, `PIL.Image.Image`: qualified unless built in."""
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _is_int_label(label: Any) -> bool:
    import torch

    if isinstance(label, torch.Tensor):
        return label.dim() == 0 and not label.is_floating_point() and not label.is_complex()
    return isinstance(label, numbers.Integral) and not isinstance(label, bool)


def known_labels(ds: Any) -> Optional[list[int]]:
    """All labels without loading images, where the data set keeps them (targets, labels, a
    TensorDataset's last tensor; through Subset); None otherwise."""
    from torch.utils.data import Subset, TensorDataset

    if isinstance(ds, Subset):
        inner = known_labels(ds.dataset)
        return None if inner is None else [inner[i] for i in ds.indices]
    if isinstance(ds, TensorDataset):
        return [int(v) for v in ds.tensors[-1].reshape(len(ds), -1)[:, 0]]
    for attr in ("targets", "labels"):
        values = getattr(ds, attr, None)
        if values is not None and len(values) == len(ds):
            try:
                return [int(v) for v in values]
            except (TypeError, ValueError):
                return None
    return None


def check_labels(cfg: RunConfig, labels: Sequence[int], num_classes: int, what: str) -> None:
    bad = [v for v in labels if not 0 <= v < num_classes]
    if bad:
        raise Found(f"--dataset {cfg.dataset}: {what} has label {max(bad, key=abs)}, outside 0..{num_classes - 1} "
                    f"for {num_classes} classes; pass --num-classes {max(labels) + 1} (labels are class "
                    "indices from 0)")


# ---------------------------------------------------------------------------------- the probe
def probe(cfg: RunConfig, host_ranks: int, with_data: bool) -> None:
    """The dry import, step by step; raises Found at the first problem, emits warnings as it goes."""
    from dpuoffload.common.data.datasets import build_datasets
    from dpuoffload.common.models.zoo import build_model

    if is_factory_spec(cfg.model):
        check_signature(cfg.model, "--model", (10,), "factory(num_classes)")
    if is_factory_spec(cfg.dataset):
        check_signature(cfg.dataset, "--dataset", (cfg.data, True, cfg.download), "factory(root, train, download)")
    if not with_data:
        run_step(f"--model {cfg.model}", lambda: build_model(cfg, cfg.num_classes or 10))
        return
    hint = f" (with --data {cfg.data}: is that the right directory?)" if is_factory_spec(cfg.dataset) else ""
    pair = run_step(f"--dataset {cfg.dataset}", lambda: build_datasets(cfg), hint)
    run_step(f"--model {cfg.model}", lambda: build_model(cfg, pair.num_classes))
    for split, ds in (("train", pair.train), ("val", pair.val)):  # (each lambda is called at once: no late binding)
        check_item(cfg, run_step(f"--dataset {cfg.dataset}: reading {split} item 0", lambda: ds[0]), split)
    check_batch(cfg, pair, host_ranks)


def check_batch(cfg: RunConfig, pair: Any, host_ranks: int) -> None:
    """One collated training batch of --batch-size items, its labels, and the batch vs the share."""
    from torch.utils.data import default_collate

    n = min(cfg.batch_size, len(pair.train))
    items = run_step(f"--dataset {cfg.dataset}: reading train items 0..{n - 1}",
                     lambda: [pair.train[i] for i in range(n)])
    batch = run_step(f"--dataset {cfg.dataset}: collating {n} train items into a batch",
                     lambda: default_collate(items),
                     " (every image of a batch must have the same shape: resize or crop them to one size)")
    for split, ds in (("the train set", pair.train), ("the val set", pair.val)):
        labels = known_labels(ds)
        if labels is not None:
            check_labels(cfg, labels, pair.num_classes, split)
    check_labels(cfg, [int(v) for v in batch[1].reshape(-1)], pair.num_classes, "the first batch")
    size_problem = batch_vs_size(cfg, len(pair.train), host_ranks)
    if size_problem is not None:
        if not size_problem.warning:
            raise Found(size_problem.message)
        emit(size_problem.message, warning=True)


def lean_imports() -> None:
    """torch and torchvision without torch's compiler, which `import torchvision` loads (1.2 s of CPU
    and 150 MB here, `import_torchvision_without_compiler`): the dry import builds data sets and a model,
    never an optimizer, and a user's `dpurun` waits for it before anything starts. A factory that imports
    the compiler itself still gets the real one. A failed import is left to the factories' own import,
    whose error the probe reports with its line."""
    from dpuoffload.common.runtime.torchsetup import import_torchvision_without_compiler

    try:
        import_torchvision_without_compiler()
    except Exception:  # noqa: BLE001 (see above)
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="python -m dpuoffload.launch.probe")
    p.add_argument("--host-ranks", type=int, default=1)
    p.add_argument("--no-data", action="store_true", help="cluster mode: the data set lives on the nodes")
    args = p.parse_args(argv[:split])
    lean_imports()
    try:
        probe(parse_run_config(argv[split + 1:]), args.host_ranks, not args.no_data)
    except (Found, ConfigError) as e:
        emit(str(e))
    except Exception as e:  # noqa: BLE001 - e.g. the user's module fails at import: one line, with its line
        emit(describe_exception(e, "the dry import of your factories") + "; fix it (or pass dpurun --skip-checks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
