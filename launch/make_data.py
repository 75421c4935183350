"""`dpurun make-data OUT`: small real-image data sets in the exact on-disk formats torchvision reads.

No data set can be downloaded on machines without network, yet the real torchvision loaders
(CIFAR10's pickled batches, SVHN's .mat files, ImageFolder JPEGs) should be exercised. scikit-learn
ships real images: 1,797 handwritten 8x8 digits (`load_digits`) and two photographs
(`load_sample_images`). Each digit is upscaled and composited over a random, dimmed crop of a
photograph: learnable (the digit decides the label) but not trivial (the background varies).

Everything is deterministic from the seed (same seed, same file bytes) and written atomically: a
data set is built in a temporary directory next to its target, fsynced, then renamed into place, so
`OUT/<name>` is either complete (with `BUNDLED_MARKER`) or absent.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import pickle
import shutil
import struct
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
from PIL import Image

from dpuoffload.common.data.datasets import BUNDLED_MARKER
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.files import fsync_dir, write_atomic

GENERATOR_VERSION = 2  # 2: tinyimagenet/shards/ (WebDataset tar shards of the same JPEGs)
GENERATED: tuple[str, ...] = ("cifar10", "svhn", "tinyimagenet")
DIGIT_NAMES: tuple[str, ...] = ("zero", "one", "two", "three", "four",
                                "five", "six", "seven", "eight", "nine")
WNIDS: tuple[str, ...] = tuple(f"n{d:08d}" for d in range(10))  # sort like the digits in ImageFolder
NUM_VAL = 300                 # of the 1,797 digits; the rest (1,497) are training samples
CIFAR_TRAIN_BATCHES = 5
SHARD_SAMPLES = 256           # samples per tar shard of tinyimagenet/shards/ (1,497 train: 5 x 256 + 217)
IMAGE_SIZE = {"cifar10": 32, "svhn": 32, "tinyimagenet": 64}
BACKGROUND_DIM = 0.5          # the photograph is dimmed so the digit stays the strongest signal
MAT_HEADER = b"MATLAB 5.0 MAT-file, Platform: dpuoffload make-data"  # scipy would stamp the time


@dataclass(frozen=True)
class Sources:
    """The real images everything is made from."""

    digits: np.ndarray   # (N, 8, 8) float in [0, 1]
    labels: np.ndarray   # (N,) int64, 0..9
    photos: tuple[np.ndarray, ...]  # (H, W, 3) uint8


@dataclass(frozen=True)
class Split:
    """Rendered images (N, S, S, 3) uint8 in HWC, and labels 0..9, of one data set."""

    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray


@dataclass(frozen=True)
class Result:
    name: str
    path: Path
    written: bool        # False: an up-to-date copy was already there
    counts: dict[str, int]
    nbytes: int


# -------------------------------------------------------------------------------------- sources
def load_sources() -> Sources:
    """Load scikit-learn's bundled digits and photographs (both ship inside the wheel).

    Raises:
        ConfigError: scikit-learn is not installed.
    """
    try:
        from sklearn.datasets import load_digits, load_sample_images
    except ImportError:
        raise ConfigError("make-data builds its images from scikit-learn's bundled digits and "
                          "photographs, and writes SVHN with scipy; pip install scikit-learn scipy") from None
    digits = load_digits()
    photos = load_sample_images().images
    return Sources(digits=np.asarray(digits.images, dtype=np.float64) / 16.0,
                   labels=np.asarray(digits.target, dtype=np.int64),
                   photos=tuple(np.asarray(p, dtype=np.uint8) for p in photos))


def render(src: Sources, name: str, seed: int) -> Split:
    """Render the images of data set `name`; the train/val split depends on the seed only.

    All three data sets hold out the same digits, and each has its own backgrounds.
    """
    order = np.random.default_rng([seed]).permutation(len(src.labels))
    train_idx, val_idx = np.sort(order[NUM_VAL:]), np.sort(order[:NUM_VAL])
    rng = np.random.default_rng([seed, 1 + GENERATED.index(name)])
    size = IMAGE_SIZE[name]
    images = np.stack([_composite(src, i, size, rng) for i in range(len(src.labels))])
    return Split(images[train_idx], src.labels[train_idx], images[val_idx], src.labels[val_idx])


def _composite(src: Sources, i: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Digit `i`, upscaled to `size`, in a random bright colour over a dimmed random photo crop."""
    digit = Image.fromarray(np.round(src.digits[i] * 255).astype(np.uint8))
    a = np.asarray(digit.resize((size, size), Image.Resampling.BICUBIC), dtype=np.float64)[..., None] / 255.0
    photo = src.photos[rng.integers(len(src.photos))]
    side = int(rng.integers(size, min(4 * size, *photo.shape[:2]) + 1))
    y, x = (int(rng.integers(dim - side + 1)) for dim in photo.shape[:2])
    crop = Image.fromarray(photo[y:y + side, x:x + side]).resize((size, size), Image.Resampling.BILINEAR)
    background = np.asarray(crop, dtype=np.float64) * BACKGROUND_DIM
    colour = rng.uniform(160, 255, size=3)
    return np.round(a * colour + (1 - a) * background).clip(0, 255).astype(np.uint8)


# -------------------------------------------------------------------------------------- writing
class _FileSink:
    """Writes files under a root, fsyncs each one and records its size and sha256 for the marker."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, dict[str, object]] = {}

    def write(self, relpath: str, data: bytes) -> None:
        # the directories are fsynced once, all together, before the data set is published (`_fsync_tree`)
        write_atomic(self.root / relpath, data, sync_dir=False, parents=True)
        self.files[relpath] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class _Py2Pickler(pickle._Pickler):  # the pure-Python pickler: its dispatch table can be extended
    """Pickles `bytes` as Python 2 `str` (BINSTRING), like the CIFAR-10 release files.

    Loaded with `encoding="latin1"` (torchvision) they come back as `str` keys ("data"); with
    `encoding="bytes"` (the CIFAR web page's recipe) as `bytes` keys (b"data"). A Python 3 pickle of
    b"data" would load as bytes either way, and torchvision's `entry["data"]` would fail.
    """

    dispatch = dict(pickle._Pickler.dispatch)
    # (pickle._Pickler's undocumented parts, which typeshed leaves out: set in its __init__, and its method)
    write: Callable[[bytes], object]
    memoize: Callable[[object], None]

    def save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str  # type: ignore[assignment]  # (typeshed says the entries take an Unpickler)


def _py2_pickle(obj: object) -> bytes:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _write_cifar10(sink: _FileSink, split: Split) -> None:
    """cifar-10-batches-py/: data_batch_1..5, test_batch, batches.meta, as in the official tarball."""
    base = "cifar-10-batches-py"
    parts = np.array_split(np.arange(len(split.train_y)), CIFAR_TRAIN_BATCHES)
    for k, part in enumerate(parts, start=1):
        sink.write(f"{base}/data_batch_{k}", _cifar_batch(
            f"training batch {k} of {CIFAR_TRAIN_BATCHES}", split.train_x[part], split.train_y[part], part))
    sink.write(f"{base}/test_batch", _cifar_batch(
        "testing batch 1 of 1", split.val_x, split.val_y, np.arange(len(split.val_y))))
    sink.write(f"{base}/batches.meta", _py2_pickle({
        b"label_names": [n.encode() for n in DIGIT_NAMES],
        b"num_cases_per_batch": len(parts[0]), b"num_vis": 32 * 32 * 3}))


def _cifar_batch(label: str, images: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> bytes:
    """Rows of 3072 bytes: the 1024 red, then green, then blue values, each plane row-major."""
    data = np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), -1))
    return _py2_pickle({b"batch_label": label.encode(), b"labels": [int(y) for y in labels],
                        b"data": data, b"filenames": [f"digit_{i:05d}.png".encode() for i in ids]})


def _write_svhn(sink: _FileSink, split: Split) -> None:
    """train_32x32.mat / test_32x32.mat: X (32, 32, 3, N) uint8, y (N, 1) with 10 for digit 0."""
    for filename, x, y in (("train_32x32.mat", split.train_x, split.train_y),
                           ("test_32x32.mat", split.val_x, split.val_y)):
        sink.write(filename, _savemat({"X": np.ascontiguousarray(x.transpose(1, 2, 3, 0)),
                                       "y": np.where(y == 0, 10, y).astype(np.uint8)[:, None]}))


def _savemat(arrays: dict[str, np.ndarray]) -> bytes:
    """scipy's MAT 5 bytes, with the free-text header made deterministic (scipy puts the time in)."""
    try:
        import scipy.io
    except ImportError:
        raise ConfigError("make-data writes SVHN's .mat files with scipy; "
                          "pip install scikit-learn scipy") from None
    buf = io.BytesIO()
    scipy.io.savemat(buf, arrays)
    data = bytearray(buf.getvalue())
    data[:116] = MAT_HEADER.ljust(116, b" ")  # the 116-byte description field of the 128-byte header
    return bytes(data)


def _write_tinyimagenet(sink: _FileSink, split: Split) -> None:
    """ImageFolder layout: train/<wnid>/*.JPEG, val/<wnid>/*.JPEG, plus wnids.txt/words.txt; and the
    same JPEGs as WebDataset tar shards, shards/train-{000000..000005}.tar and shards/val-{000000..000001}.tar
    (SHARD_SAMPLES each, the last one shorter: uneven on purpose, as real shard sets end)."""
    for folder, xs, ys in (("train", split.train_x, split.train_y), ("val", split.val_x, split.val_y)):
        jpegs = [_jpeg(x) for x in xs]
        for k, (data, y) in enumerate(zip(jpegs, ys)):
            sink.write(f"{folder}/{WNIDS[y]}/{WNIDS[y]}_{k}.JPEG", data)
        for s, at in enumerate(range(0, len(jpegs), SHARD_SAMPLES)):
            members = [(f"{k:06d}", jpegs[k], int(ys[k])) for k in range(at, min(at + SHARD_SAMPLES, len(jpegs)))]
            sink.write(f"shards/{folder}-{s:06d}.tar", _tar(members))
    sink.write("wnids.txt", "".join(f"{w}\n" for w in WNIDS).encode())
    sink.write("words.txt", "".join(f"{w}\t{n}\n" for w, n in zip(WNIDS, DIGIT_NAMES)).encode())


def _tar(members: Sequence[tuple[str, bytes, int]]) -> bytes:
    """A WebDataset shard: KEY.jpg and KEY.cls per sample, in order; no timestamps or owners (deterministic)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, jpeg, label in members:
            for ext, data in (("jpg", jpeg), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _jpeg(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=95, subsampling=0)  # 4:4:4, near-lossless
    return buf.getvalue()


_WRITERS: dict[str, Callable[[_FileSink, Split], None]] = {
    "cifar10": _write_cifar10, "svhn": _write_svhn, "tinyimagenet": _write_tinyimagenet,
}


def _marker(name: str, seed: int, split: Split, files: dict[str, dict[str, object]]) -> dict:
    """No timestamps: the marker is as deterministic as the data it describes."""
    return {"generator": "dpuoffload.launch.make_data", "generator_version": GENERATOR_VERSION,
            "dataset": name, "seed": seed, "source": "scikit-learn load_digits over crops of load_sample_images",
            "classes": list(DIGIT_NAMES), "image_size": IMAGE_SIZE[name],
            "counts": {"train": len(split.train_y), "val": len(split.val_y)},
            "files": dict(sorted(files.items()))}


# ------------------------------------------------------------------------------ atomic replacing
def _read_marker(root: Path) -> Optional[dict]:
    try:
        return json.loads((root / BUNDLED_MARKER).read_text())
    except (OSError, ValueError):
        return None


def _is_complete(root: Path, seed: int) -> bool:
    """Cheap check (no hashing): same generator and seed, and every listed file has its size."""
    marker = _read_marker(root)
    if not marker or marker.get("generator_version") != GENERATOR_VERSION or marker.get("seed") != seed:
        return False
    try:
        return all((root / rel).stat().st_size == info["bytes"] for rel, info in marker["files"].items())
    except (OSError, KeyError, TypeError, AttributeError):
        return False


def _fsync_tree(root: Path) -> None:
    """Directory entries must be durable too before the rename publishes them."""
    for dirpath, _, _ in os.walk(root):
        fsync_dir(dirpath)


def _publish(tmp: Path, target: Path) -> None:
    """Rename `tmp` to `target`; an older copy is moved aside first (rename cannot replace a
    non-empty directory) and deleted afterwards."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, old / target.name)
    os.rename(tmp, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old)


def _make_one(out: Path, name: str, seed: int, force: bool,
              sources: Callable[[], Sources]) -> Result:
    target = out / name
    if not force and _is_complete(target, seed):
        marker = _read_marker(target) or {}
        return Result(name, target, False, marker["counts"], _total_bytes(marker))
    if target.exists() and not (target / BUNDLED_MARKER).is_file():
        raise ConfigError(f"{target} exists and was not written by make-data (no {BUNDLED_MARKER}); "
                          "choose another OUT directory or move it away")
    split = render(sources(), name, seed)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=out))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the published data set is for every user
    try:
        sink = _FileSink(tmp)
        _WRITERS[name](sink, split)
        marker = _marker(name, seed, split, sink.files)
        sink.write(BUNDLED_MARKER, (json.dumps(marker, indent=1) + "\n").encode())
        _fsync_tree(tmp)
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # only left over if something failed
    return Result(name, target, True, marker["counts"], _total_bytes(marker))


def _total_bytes(marker: dict) -> int:
    return sum(int(info["bytes"]) for info in marker.get("files", {}).values())


def _check_names(datasets: Sequence[str]) -> list[str]:
    unknown = [d for d in datasets if d not in GENERATED]
    if unknown or not datasets:
        raise ConfigError(f"--datasets {' '.join(unknown) or '(none)'}: "
                          f"choose from {', '.join(GENERATED)}")
    return list(dict.fromkeys(datasets))  # keep order, drop repeats


def generate(out: str | os.PathLike, datasets: Sequence[str] = GENERATED, seed: int = 0,
             force: bool = False) -> list[Result]:
    """Like `make_data`, but says per data set whether it was written and how big it is."""
    names = _check_names(datasets)
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache: list[Sources] = []

    def sources() -> Sources:  # loaded once, and only if something needs writing
        if not cache:
            cache.append(load_sources())
        return cache[0]

    return [_make_one(out_dir, name, seed, force, sources) for name in names]


def make_data(out: str | os.PathLike, datasets: Sequence[str] = GENERATED, seed: int = 0,
              force: bool = False) -> dict[str, Path]:
    """Write the bundled sample data sets under `out` (`out/cifar10`, `out/svhn`, ...).

    A data set that is already complete for this seed is kept as is (a fast no-op) unless `force`.

    Args:
        out: parent directory; created if missing.
        datasets: which of `GENERATED` to write.
        seed: decides the train/val split, backgrounds and colours.
        force: rewrite even complete outputs.

    Returns:
        Data set name -> its root, i.e. what to pass as `--data`.

    Raises:
        ConfigError: unknown data set name, negative seed, scikit-learn/scipy missing, or a target
            directory that make-data did not write.
    """
    return {r.name: r.path for r in generate(out, datasets, seed, force)}


# ------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dpurun make-data",
        description="Write small CIFAR-10 / SVHN / Tiny-ImageNet-layout data sets made of real "
                    "scikit-learn digit images, in the exact formats torchvision reads.")
    p.add_argument("out", metavar="OUT", help="parent directory; data sets go to OUT/<name>")
    p.add_argument("--datasets", nargs="+", choices=GENERATED, default=list(GENERATED),
                   help=f"which data sets to write (default: {' '.join(GENERATED)})")
    p.add_argument("--seed", type=int, default=0, help="seed of split, backgrounds, colours (default: 0)")
    p.add_argument("--force", action="store_true", help="rewrite data sets that are already complete")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry of `dpurun make-data`; prints one line per data set, returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        results = generate(args.out, args.datasets, args.seed, args.force)
    except ConfigError as e:
        print(f"dpurun make-data: error: {e}", file=sys.stderr)
        return 2
    for r in results:
        state = "wrote" if r.written else "up to date"
        print(f"{state} {r.path}: {r.counts['train']} train / {r.counts['val']} val samples, "
              f"{r.nbytes} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
