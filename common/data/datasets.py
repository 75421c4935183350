"""Data sets by name, taken unchanged from torchvision, plus `module:function` user factories.

Host and DPU ranks build the same data set from the same `RunConfig`, so sample `i` means the same
image on every rank. `check_dataset` catches user mistakes (unknown name, missing files) cheaply
before any data is read; `build_datasets` then builds the train/val pair with the standard
transforms of each data set.

Files written by `dpurun make-data` (real scikit-learn digits in torchvision's exact on-disk
formats) carry a `BUNDLED_MARKER` file. torchvision checks CIFAR-10 and SVHN files against the md5
sums of the official archives, which generated files cannot match, so for such roots only the md5
entries are switched off (`BundledCIFAR10`, `BundledSVHN`); reading and `__getitem__` stay
torchvision's own code. Roots without the marker use the plain torchvision classes, so a real
downloaded data set and `--download` work as usual.

torch and torchvision are imported on first use, not with this module: the launcher and
`dpurun make-data` use `check_dataset` / `BUNDLED_MARKER` and should not pay seconds of import time.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sized, cast

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError, InternalError
from dpuoffload.common.factories import is_factory_spec, load_factory
from dpuoffload.common.modes import Mode

if TYPE_CHECKING:
    from torch.utils.data import Dataset
    from torchvision import transforms as T

DATASET_NAMES: tuple[str, ...] = ("cifar10", "svhn", "tinyimagenet", "fake")
DOWNLOADABLE: tuple[str, ...] = ("cifar10", "svhn")  # torchvision has no Tiny ImageNet downloader

#: Written by `dpurun make-data` into each data set root it generates (JSON: version, seed, sha256s).
BUNDLED_MARKER = "DPUOFFLOAD_BUNDLED.json"

FAKE_TRAIN_SIZE = 1024
FAKE_VAL_SIZE = 256
FAKE_NUM_CLASSES = 10
FAKE_VAL_OFFSET = 1_000_000  # FakeData seeds sample i with i + offset: keeps val images apart from train

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
SVHN_MEAN, SVHN_STD = (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

# The files torchvision's CIFAR10 (train_list, test_list, meta) and SVHN (split_list) open.
CIFAR10_FILES: tuple[str, ...] = tuple(
    f"cifar-10-batches-py/{name}"
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch", "batches.meta"])
SVHN_FILES: tuple[str, ...] = ("train_32x32.mat", "test_32x32.mat")


def _bundled_classes() -> dict[str, type]:
    """torchvision's CIFAR10 and SVHN with the md5 entries set to None, for make-data roots.

    `check_integrity(path, md5=None)` then only checks that the file exists; reading and
    `__getitem__` are inherited unchanged. Built on first use (torchvision is heavy to import) and
    published as module attributes through `__getattr__`, so instances pickle into DataLoader workers.
    """
    if not _BUNDLED:
        from torchvision import datasets as tvd

        class BundledCIFAR10(tvd.CIFAR10):
            __qualname__ = "BundledCIFAR10"
            train_list = [[name, None] for name, _ in tvd.CIFAR10.train_list]
            test_list = [[name, None] for name, _ in tvd.CIFAR10.test_list]
            meta = {**tvd.CIFAR10.meta, "md5": None}

        class BundledSVHN(tvd.SVHN):
            __qualname__ = "BundledSVHN"
            split_list = {s: [url, fn, None] for s, (url, fn, _) in tvd.SVHN.split_list.items()}

        _BUNDLED.update(BundledCIFAR10=BundledCIFAR10, BundledSVHN=BundledSVHN)
    return _BUNDLED


_BUNDLED: dict[str, type] = {}


def __getattr__(name: str) -> Any:  # PEP 562: `BundledCIFAR10` / `BundledSVHN`, built on first use
    if name in ("BundledCIFAR10", "BundledSVHN"):
        return _bundled_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class DatasetPair:
    """What the trainer needs: both splits, the classifier width and the image side (32 or 64 for
    the built-in data sets)."""

    train: "Dataset"
    val: "Dataset"
    num_classes: int
    input_size: int


# ------------------------------------------------------------------------------------- checking
def check_dataset(cfg: RunConfig, files: bool = True) -> None:
    """Fail fast, before any data is read, on a data set the run cannot load.

    Cheap enough for every rank and for the launcher: it only imports a user factory module and looks
    at file names. `files=False` skips the look at `--data`: on a cluster the launcher's machine
    may not mount the compute nodes' data directory, so only the ranks check it there.

    Raises:
        ConfigError: unknown name, bad `module:function`, missing `--data` directory or files,
            missing scipy for SVHN. The message names the problem and the fix.
    """
    name = cfg.dataset
    if is_webdataset(name):
        _check_webdataset(cfg, files)
        return
    if is_factory_spec(name):
        load_factory(name, "--dataset")
        return
    if name not in DATASET_NAMES:
        raise ConfigError(f"--dataset {name!r} is not one of: {', '.join(DATASET_NAMES)} "
                          "(or module:function, a factory taking root, train, download)")
    if name == "svhn" and importlib.util.find_spec("scipy") is None:
        raise ConfigError("--dataset svhn reads .mat files with scipy, which is not installed; "
                          "pip install scipy")
    if name != "fake" and (files or cfg.data is None):
        _check_root(cfg)


def _check_root(cfg: RunConfig) -> None:
    """A built-in data set needs `--data`, and the files there unless torchvision may download them."""
    name = cfg.dataset
    if cfg.data is None:
        raise ConfigError(f"--dataset {name} needs --data DIR (the data set root); {_fix_hint(name)}")
    if cfg.download and name in DOWNLOADABLE:
        return  # torchvision creates the directory and fetches what is missing
    root = Path(cfg.data)
    if not root.is_dir():
        raise ConfigError(f"--data {cfg.data}: no such directory; {_fix_hint(name, cfg.data)}")
    if name == "tinyimagenet" and (root / "val" / "val_annotations.txt").is_file():
        raise ConfigError(f"--data {cfg.data}: val/ has the raw Tiny ImageNet layout (images/ + "
                          "val_annotations.txt); move each val image into val/<wnid>/ as "
                          "ImageFolder expects, like train/")
    missing = _missing_files(name, root)
    if missing:
        listed = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        fix = _layout_hint(name, root) or _fix_hint(name, cfg.data)
        raise ConfigError(f"--data {cfg.data} has no {name} data set (missing: {listed}); {fix}")
    if name == "tinyimagenet":
        _check_same_classes(root)


def _missing_files(name: str, root: Path) -> list[str]:
    """Paths (relative to the root) that torchvision's reader for `name` needs and cannot find."""
    if name == "cifar10":
        return [f for f in CIFAR10_FILES if not (root / f).is_file()]
    if name == "svhn":
        return [f for f in SVHN_FILES if not (root / f).is_file()]
    return [f"{split}/<class>/" for split in ("train", "val") if not _class_dirs(root / split)]


def _class_dirs(folder: Path) -> list[str]:
    """ImageFolder's classes: the sorted subdirectories (an empty list if `folder` does not exist)."""
    if not folder.is_dir():
        return []
    return sorted(e.name for e in os.scandir(folder) if e.is_dir())


def _check_same_classes(root: Path) -> None:
    """ImageFolder numbers classes per folder, so differing class sets would silently shift labels."""
    train, val = _class_dirs(root / "train"), _class_dirs(root / "val")
    if train != val:
        only = sorted(set(train).symmetric_difference(val))[:5]
        raise ConfigError(f"--data {root}: train/ and val/ have different class folders (e.g. "
                          f"{', '.join(only)}); ImageFolder would give the same class different "
                          "labels. Use the same class subfolders in both")


def _layout_hint(name: str, root: Path) -> str:
    """`--data OUT` where `dpurun make-data OUT` wrote OUT/<name>: name the right directory."""
    if not _missing_files(name, root / name):
        return f"did you mean --data {root / name}?"
    return ""


def _fix_hint(name: str, data: Optional[str] = None) -> str:
    out = data or "DIR"
    hint = (f"run `dpurun make-data {out}` to write the bundled sample data and pass "
            f"--data {out}/{name}")
    if name in DOWNLOADABLE:
        return hint + ", or pass --download to let torchvision fetch the real data set"
    return hint + (" (torchvision cannot download Tiny ImageNet: unpack it yourself with "
                   "class subfolders in train/ and val/)")


# ------------------------------------------------------------------------------------- building
def build_datasets(cfg: RunConfig) -> DatasetPair:
    """Build the train/val pair named by `cfg.dataset`, with subsets applied.

    Returns:
        The pair, with `num_classes` from the data set (checked against `--num-classes` if given).

    Raises:
        ConfigError: everything `check_dataset` raises, unreadable files, or a subset larger than
            the data set.
    """
    check_dataset(cfg)
    if is_webdataset(cfg.dataset):
        return _build_webdataset(cfg)
    if is_factory_spec(cfg.dataset):
        pair = _build_user(cfg)
    else:
        pair = _BUILDERS[cfg.dataset](cfg)
    return DatasetPair(train=_subset(pair.train, cfg.train_subset, "--train-subset"),
                       val=_subset(pair.val, cfg.val_subset, "--val-subset"),
                       num_classes=pair.num_classes, input_size=pair.input_size)


def build_train_set(cfg: RunConfig) -> "Dataset":
    """The training set alone: what a DPU augmentation rank builds for itself (`job.loader`'s
    `build_on_dpu`) instead of receiving the host's copy pickled."""
    return build_datasets(cfg).train


def _subset(ds: "Dataset", n: Optional[int], flag: str) -> "Dataset":
    """The first `n` samples: the same ones on every rank, whatever the sampler does later."""
    from torch.utils.data import Subset

    size = len(cast(Sized, ds))
    if n is None or n == size:
        return ds
    if n > size:
        raise ConfigError(f"{flag} {n} is larger than the data set ({size} samples); "
                          f"pass {flag} {size} or less")
    return Subset(ds, range(n))


def _is_bundled(root: str) -> bool:
    return (Path(root) / BUNDLED_MARKER).is_file()


def _torchvision_error(cfg: RunConfig, err: Exception) -> ConfigError:
    """torchvision says 'not found or corrupted'; say which, and what to do."""
    return ConfigError(
        f"--data {cfg.data}: torchvision's {cfg.dataset} reader rejected the files ({err}). They do "
        "not match the official release's md5 sums and there is no "
        f"{BUNDLED_MARKER} from `dpurun make-data` beside them; re-create them with "
        f"`dpurun make-data`, or delete them and pass --download")


def _build_cifar10(cfg: RunConfig) -> DatasetPair:
    from torchvision import datasets as tvd

    if cfg.data is None:
        raise InternalError("a built-in data set without --data (`check_dataset` refuses it first)")
    cls = _bundled_classes()["BundledCIFAR10"] if _is_bundled(cfg.data) else tvd.CIFAR10
    try:
        train = cls(cfg.data, train=True, transform=_transform("cifar10", True), download=cfg.download)
        val = cls(cfg.data, train=False, transform=_transform("cifar10", False))
    except RuntimeError as e:
        raise _torchvision_error(cfg, e) from None
    return DatasetPair(train, val, _num_classes(cfg, len(train.classes)), 32)


def _build_svhn(cfg: RunConfig) -> DatasetPair:
    from torchvision import datasets as tvd

    if cfg.data is None:
        raise InternalError("a built-in data set without --data (`check_dataset` refuses it first)")
    cls = _bundled_classes()["BundledSVHN"] if _is_bundled(cfg.data) else tvd.SVHN
    try:
        train = cls(cfg.data, split="train", transform=_transform("svhn", True), download=cfg.download)
        val = cls(cfg.data, split="test", transform=_transform("svhn", False), download=cfg.download)
    except RuntimeError as e:
        raise _torchvision_error(cfg, e) from None
    return DatasetPair(train, val, _num_classes(cfg, 10), 32)  # SVHN has no .classes attribute


def _build_tinyimagenet(cfg: RunConfig) -> DatasetPair:
    from torchvision import datasets as tvd

    if cfg.data is None:
        raise InternalError("a built-in data set without --data (`check_dataset` refuses it first)")
    root = Path(cfg.data)
    try:
        train = tvd.ImageFolder(str(root / "train"), transform=_transform("tinyimagenet", True))
        val = tvd.ImageFolder(str(root / "val"), transform=_transform("tinyimagenet", False))
    except FileNotFoundError as e:  # a class folder without images
        raise ConfigError(f"--data {cfg.data}: {e}; every class folder needs at least one image") from None
    return DatasetPair(train, val, _num_classes(cfg, len(train.classes)), 64)


def _build_fake(cfg: RunConfig) -> DatasetPair:
    """FakeData at CIFAR shape: the subsets *are* the sizes, so no Subset wrapper is needed."""
    from torchvision import datasets as tvd

    num_classes = cfg.num_classes or FAKE_NUM_CLASSES
    tf = _transform("fake", False)
    train = tvd.FakeData(size=cfg.train_subset or FAKE_TRAIN_SIZE, image_size=(3, 32, 32),
                         num_classes=num_classes, transform=tf, random_offset=0)
    val = tvd.FakeData(size=cfg.val_subset or FAKE_VAL_SIZE, image_size=(3, 32, 32),
                       num_classes=num_classes, transform=tf, random_offset=FAKE_VAL_OFFSET)
    return DatasetPair(train, val, num_classes, 32)


def _build_user(cfg: RunConfig) -> DatasetPair:
    """Call `fn(root, train, download)` twice; the factory owns its transforms."""
    fn = load_factory(cfg.dataset, "--dataset")
    train = _checked_user_dataset(cfg, fn(cfg.data, True, cfg.download), "train")
    val = _checked_user_dataset(cfg, fn(cfg.data, False, cfg.download), "val")
    classes = getattr(train, "classes", None)
    return DatasetPair(train, val, _num_classes(cfg, None if classes is None else len(classes)),
                       _input_size(cfg, train))


def _checked_user_dataset(cfg: RunConfig, ds: object, split: str) -> "Dataset":
    if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")):
        raise ConfigError(f"--dataset {cfg.dataset} returned {type(ds).__name__} for the {split} "
                          "split; the factory must return a torch.utils.data.Dataset "
                          "(with __len__ and __getitem__)")
    if len(ds) == 0:
        raise ConfigError(f"--dataset {cfg.dataset} returned an empty {split} data set")
    return cast("Dataset", ds)  # (a map-style set by its methods, checked above)


def _input_size(cfg: RunConfig, ds: "Dataset") -> int:
    """Image side of a user data set, from sample 0 (the model and the DPU buffers need it)."""
    import torch
    from PIL import Image

    sample = ds[0]
    image = sample[0] if isinstance(sample, (tuple, list)) and len(sample) == 2 else None
    if isinstance(image, torch.Tensor) and image.dim() >= 2:
        return int(image.shape[-1])
    if isinstance(image, Image.Image):
        return image.width
    raise ConfigError(f"--dataset {cfg.dataset}: sample 0 is a {type(sample).__name__}, expected an "
                      "(image tensor, label) pair")


def _num_classes(cfg: RunConfig, found: Optional[int]) -> int:
    """The data set's own class count wins; `--num-classes` fills in where it has none."""
    if found is None:
        if cfg.num_classes is None:
            raise ConfigError(f"--dataset {cfg.dataset} has no .classes attribute, so the number of "
                              "classes is unknown; pass --num-classes N")
        return cfg.num_classes
    if cfg.num_classes is not None and cfg.num_classes != found:
        raise ConfigError(f"--num-classes {cfg.num_classes} disagrees with the {found} classes of "
                          f"--dataset {cfg.dataset}; drop --num-classes or pass --num-classes {found}")
    return found


# ---------------------------------------------------------------------------- WebDataset shards
WEBDATASET = "webdataset:"


def is_webdataset(name: str) -> bool:
    return name.startswith(WEBDATASET)


def webdataset_patterns(name: str) -> tuple[str, str]:
    """`--dataset webdataset:PATTERN`: the training shards' pattern, and the validation shards: the
    files that match the pattern with its last `train` in the file name read as `val` and each brace
    range as `*` (`DIR/train-{000000..000146}.tar` -> `DIR/val-*.tar`), as ImageNet's shards are named."""
    import re

    train = name[len(WEBDATASET):]
    folder, base = os.path.split(train)
    if not train or "train" not in base:
        raise ConfigError(f"--dataset {name}: give the training shards' pattern, with `train` in the file name "
                          "(e.g. webdataset:DIR/train-{000000..000005}.tar); the validation shards are the files "
                          "named alike with `val` (DIR/val-*.tar)")
    head, _, tail = base.rpartition("train")
    return train, os.path.join(folder, re.sub(r"\{[^}]*\}", "*", f"{head}val{tail}"))


def _val_shards(name: str, val_glob: str) -> list[str]:
    import glob

    val = sorted(glob.glob(val_glob))
    if not val:
        raise ConfigError(f"--dataset {name}: no validation shards match {val_glob}; write them beside the "
                          "training shards (dpurun make-data writes tinyimagenet/shards/val-*.tar)")
    return val


def _check_webdataset(cfg: RunConfig, files: bool) -> None:
    from dpuoffload.common.data.tarshards import expand

    if cfg.mode is Mode.NAIVE:
        raise ConfigError(f"--dataset {cfg.dataset}: --mode naive deals every epoch's samples by index over host and "
                          "DPU replicas, which a stream of shards cannot be read by; use --mode da or hybrid (or none)")
    train, val = webdataset_patterns(cfg.dataset)
    if files:
        expand(train)
        _val_shards(cfg.dataset, val)


def _build_webdataset(cfg: RunConfig) -> DatasetPair:
    """The training shards as a stream (`dpuoffload.webdataset`), the validation shards indexed by
    offset (map-style); Tiny ImageNet's augmentation at the images' own side."""
    from PIL import Image

    from dpuoffload.common.data.tarshards import Decode, TarIndexed, webdataset

    train_pattern, val_glob = webdataset_patterns(cfg.dataset)
    val = TarIndexed(_val_shards(cfg.dataset, val_glob))
    image, _ = Decode()(val.record(0))
    size = image.width if isinstance(image, Image.Image) else 64
    val.transform = _transform("tinyimagenet", False, size)
    train = webdataset(train_pattern, _transform("tinyimagenet", True, size))
    if cfg.train_subset is not None:  # (the first samples in shard order: whole shards, the last one cut)
        if cfg.train_subset > len(train):
            raise ConfigError(f"--train-subset {cfg.train_subset} is larger than the data set ({len(train)} samples "
                              f"in {len(train.shards)} shards); pass --train-subset {len(train)} or less")
        train = train.head(cfg.train_subset)
    labels = val.labels()
    found = max(labels) + 1 if labels and cfg.num_classes is None else None
    val_set = cast("Dataset", val)  # (a map-style set by its methods, not a torch Dataset subclass)
    return DatasetPair(train, _subset(val_set, cfg.val_subset, "--val-subset"), _num_classes(cfg, found), size)


_BUILDERS: dict[str, Callable[[RunConfig], DatasetPair]] = {
    "cifar10": _build_cifar10, "svhn": _build_svhn,
    "tinyimagenet": _build_tinyimagenet, "fake": _build_fake,
}


# ----------------------------------------------------------------------------------- transforms
def _transform(name: str, train: bool, size: int = 64) -> "T.Compose":
    """The standard augmentation of each data set (train) or its plain normalisation (val)."""
    from torchvision import transforms as T

    if name == "fake":
        return T.Compose([T.ToTensor(), T.Normalize((0.5,) * 3, (0.5,) * 3)])
    if name == "tinyimagenet":
        if train:
            steps: list = [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]
        else:
            steps = [T.Resize(size), T.CenterCrop(size)]
        return T.Compose(steps + [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    if name == "cifar10":
        steps = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()] if train else []
        return T.Compose(steps + [T.ToTensor(), T.Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    steps = [T.RandomCrop(32, padding=4)] if train else []  # no flips for SVHN: mirrored digits
    return T.Compose(steps + [T.ToTensor(), T.Normalize(SVHN_MEAN, SVHN_STD)])
