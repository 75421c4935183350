"""Data sets by name, and the bundled real data that `dpurun make-data` writes for torchvision.

(The tests of this feature that start processes: tests/jobs/test_datasets.py.)
"""

import hashlib
import importlib.util
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from torch.utils.data import Subset
from torchvision import datasets as tvd
from torchvision import transforms as T

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data import datasets as D
from dpuoffload.common.errors import ConfigError
from dpuoffload.launch import make_data as M

NUM_TRAIN, NUM_VAL = 1497, 300


@pytest.fixture(scope="module")
def rendered():
    """What the generator drew (before any file format), per data set, for seed 0."""
    src = M.load_sources()
    return {name: M.render(src, name, 0) for name in M.GENERATED}


def cfg_for(name, root=None, **kw):
    return RunConfig(dataset=name, data=None if root is None else str(root), **kw)


def sha256_tree(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def pil_pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


# ------------------------------------------------------------------------------------ generator
def test_layout_and_marker(bundled_data):
    assert sorted(p.name for p in bundled_data.iterdir()) == ["cifar10", "svhn", "tinyimagenet"]
    for name in M.GENERATED:
        root = bundled_data / name
        marker = json.loads((root / D.BUNDLED_MARKER).read_text())
        assert marker["generator_version"] == M.GENERATOR_VERSION and marker["seed"] == 0
        assert marker["counts"] == {"train": NUM_TRAIN, "val": NUM_VAL}
        on_disk = sha256_tree(root)
        on_disk.pop(D.BUNDLED_MARKER)
        assert {rel: info["sha256"] for rel, info in marker["files"].items()} == on_disk
    assert all((bundled_data / "cifar10" / f).is_file() for f in D.CIFAR10_FILES)
    assert all((bundled_data / "svhn" / f).is_file() for f in D.SVHN_FILES)


def test_same_seed_same_bytes_other_seed_other_bytes(bundled_data, tmp_path):
    again = M.make_data(tmp_path / "again", seed=0)
    for name in M.GENERATED:
        assert sha256_tree(again[name]) == sha256_tree(bundled_data / name)
    other = M.make_data(tmp_path / "other", datasets=["cifar10"], seed=1)
    assert sha256_tree(other["cifar10"]) != sha256_tree(bundled_data / "cifar10")


def test_cifar_pickles_read_like_the_official_files(bundled_data):
    """The CIFAR page's recipe (encoding="bytes") sees b"data"; torchvision (latin1) sees "data"."""
    base = bundled_data / "cifar10" / "cifar-10-batches-py"
    sizes = []
    for k in range(1, 6):
        with open(base / f"data_batch_{k}", "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape[1] == 3072
        assert len(batch[b"labels"]) == len(batch[b"data"])
        sizes.append(len(batch[b"labels"]))
    assert sum(sizes) == NUM_TRAIN and max(sizes) - min(sizes) <= 1
    with open(base / "batches.meta", "rb") as f:
        assert pickle.load(f, encoding="bytes")[b"label_names"] == [n.encode() for n in M.DIGIT_NAMES]
    with open(base / "batches.meta", "rb") as f:
        assert pickle.load(f, encoding="latin1")["label_names"] == list(M.DIGIT_NAMES)


def test_torchvision_cifar10_reads_the_files(bundled_data, rendered):
    root = bundled_data / "cifar10"
    train, val = D.BundledCIFAR10(root, train=True), D.BundledCIFAR10(root, train=False)
    assert (len(train), len(val)) == (NUM_TRAIN, NUM_VAL)
    assert train.classes == list(M.DIGIT_NAMES)
    assert train.data.shape == (NUM_TRAIN, 32, 32, 3)
    assert set(train.targets) == set(range(10))
    for i in (0, 777, NUM_TRAIN - 1):  # one sample from the first, a middle and the last batch
        image, label = train[i]
        assert label == rendered["cifar10"].train_y[i]
        assert np.array_equal(pil_pixels(image), rendered["cifar10"].train_x[i])
    image, label = val[5]
    assert np.array_equal(pil_pixels(image), rendered["cifar10"].val_x[5])
    assert label == rendered["cifar10"].val_y[5]


def test_plain_torchvision_cifar10_rejects_generated_files_by_md5(bundled_data):
    with pytest.raises(RuntimeError, match="not found or corrupted"):
        tvd.CIFAR10(bundled_data / "cifar10", train=True)


def test_torchvision_svhn_reads_the_files(bundled_data, rendered):
    root = bundled_data / "svhn"
    raw = scipy.io.loadmat(root / "train_32x32.mat")
    assert raw["X"].dtype == np.uint8 and raw["X"].shape == (32, 32, 3, NUM_TRAIN)
    assert raw["y"].shape == (NUM_TRAIN, 1) and 10 in raw["y"] and 0 not in raw["y"]  # 10 means 0
    train, test = D.BundledSVHN(root, split="train"), D.BundledSVHN(root, split="test")
    assert (len(train), len(test)) == (NUM_TRAIN, NUM_VAL)
    assert set(train.labels.tolist()) == set(range(10))
    for i in (0, 1000):
        image, label = train[i]
        assert label == rendered["svhn"].train_y[i]
        assert np.array_equal(pil_pixels(image), rendered["svhn"].train_x[i])
    image, label = test[3]
    assert np.array_equal(pil_pixels(image), rendered["svhn"].val_x[3])


def test_image_folder_reads_the_jpegs(bundled_data, rendered):
    train = tvd.ImageFolder(bundled_data / "tinyimagenet" / "train")
    val = tvd.ImageFolder(bundled_data / "tinyimagenet" / "val")
    assert (len(train), len(val)) == (NUM_TRAIN, NUM_VAL)
    assert train.classes == list(M.WNIDS) == val.classes  # n00000000.. sort like digits 0..9
    for j in (0, 500, NUM_TRAIN - 1):
        path, label = train.samples[j]
        k = int(Path(path).stem.rsplit("_", 1)[1])  # the generator's sample index
        assert label == rendered["tinyimagenet"].train_y[k]
        image = pil_pixels(train[j][0])
        assert image.shape == (64, 64, 3)
        diff = np.abs(image.astype(int) - rendered["tinyimagenet"].train_x[k]).mean()
        assert diff < 2.0  # JPEG quality 95, 4:4:4: close to, not equal to, what was drawn


def test_rerun_is_a_no_op_and_force_rewrites(tmp_path, monkeypatch):
    out = tmp_path / "d"
    first = M.make_data(out, datasets=["svhn"])
    inode = first["svhn"].stat().st_ino

    def no_sources():
        raise AssertionError("a complete output must not be regenerated")

    monkeypatch.setattr(M, "load_sources", no_sources)
    assert M.make_data(out, datasets=["svhn"]) == first
    assert first["svhn"].stat().st_ino == inode
    monkeypatch.undo()
    M.make_data(out, datasets=["svhn"], force=True)
    assert first["svhn"].stat().st_ino != inode  # a new directory was renamed into place
    assert sorted(p.name for p in out.iterdir()) == ["svhn"]  # no temp or old copies left


def test_incomplete_output_is_rewritten(tmp_path):
    out = M.make_data(tmp_path, datasets=["svhn"])["svhn"]
    reference = sha256_tree(out)
    (out / "test_32x32.mat").unlink()
    M.make_data(tmp_path, datasets=["svhn"])
    assert sha256_tree(out) == reference


def test_refuses_to_replace_a_directory_it_did_not_write(tmp_path):
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / "mine.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="was not written by make-data"):
        M.make_data(tmp_path, datasets=["cifar10"], force=True)
    assert (tmp_path / "cifar10" / "mine.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar10"]


def test_main_prints_one_line_per_data_set(tmp_path, capsys):
    assert M.main([str(tmp_path), "--datasets", "cifar10", "svhn", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"wrote {tmp_path / 'cifar10'}: 1497 train / 300 val")
    assert M.main([str(tmp_path), "--datasets", "cifar10", "--seed", "3"]) == 0
    assert capsys.readouterr().out.startswith("up to date")


def test_main_without_scikit_learn_says_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # makes the import fail
    assert M.main([str(tmp_path)]) == 2
    assert "pip install scikit-learn scipy" in capsys.readouterr().err


def test_svhn_without_scipy_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.io", None)
    with pytest.raises(ConfigError, match="pip install scikit-learn scipy"):
        M.make_data(tmp_path, datasets=["svhn"])
    assert list(tmp_path.iterdir()) == []  # nothing half-written


@pytest.mark.parametrize("kwargs, message", [
    (dict(datasets=["mnist"]), "--datasets mnist: choose from cifar10, svhn, tinyimagenet"),
    (dict(datasets=[]), "--datasets (none)"),
    (dict(seed=-1), "--seed must be >= 0"),
])
def test_make_data_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ConfigError) as e:
        M.make_data(tmp_path, **kwargs)
    assert message in str(e.value)


# ---------------------------------------------------------------------------------- by name
@pytest.mark.parametrize("name, cls, size", [
    ("cifar10", "BundledCIFAR10", 32), ("svhn", "BundledSVHN", 32), ("tinyimagenet", "ImageFolder", 64)])
def test_build_bundled(bundled_data, name, cls, size):
    pair = D.build_datasets(cfg_for(name, bundled_data / name))
    assert type(pair.train).__name__ == cls
    shape = (len(pair.train), len(pair.val), pair.num_classes, pair.input_size)
    assert shape == (NUM_TRAIN, NUM_VAL, 10, size)
    for ds in (pair.train, pair.val):
        image, label = ds[0]
        assert image.dtype == torch.float32 and image.shape == (3, size, size)
        assert isinstance(label, int) and 0 <= label < 10


def test_val_transform_is_plain_normalisation(bundled_data, rendered):
    pair = D.build_datasets(cfg_for("cifar10", bundled_data / "cifar10"))
    expected = T.Normalize(D.CIFAR10_MEAN, D.CIFAR10_STD)(T.ToTensor()(rendered["cifar10"].val_x[7]))
    assert torch.allclose(pair.val[7][0], expected)
    steps = [type(t).__name__ for t in pair.train.transform.transforms]
    assert steps == ["RandomCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"]


def test_bundled_datasets_pickle_for_dataloader_workers(bundled_data):
    """Spawned / forkserver DataLoader workers receive the data set by pickle."""
    for name in ("cifar10", "svhn"):
        val = D.build_datasets(cfg_for(name, bundled_data / name)).val  # val: no random transform
        clone = pickle.loads(pickle.dumps(val))
        assert type(clone) is type(val) and torch.equal(clone[3][0], val[3][0])


def test_real_data_without_marker_uses_plain_torchvision(bundled_data, tmp_path):
    """Files that are neither the official release nor make-data's: say so instead of guessing."""
    shutil.copytree(bundled_data / "cifar10" / "cifar-10-batches-py", tmp_path / "cifar-10-batches-py")
    with pytest.raises(ConfigError) as e:
        D.build_datasets(cfg_for("cifar10", tmp_path))
    assert "md5" in str(e.value) and "dpurun make-data" in str(e.value) and "--download" in str(e.value)


def test_fake():
    pair = D.build_datasets(cfg_for("fake"))
    assert (len(pair.train), len(pair.val), pair.num_classes, pair.input_size) == (1024, 256, 10, 32)
    assert pair.train[0][0].shape == (3, 32, 32)
    assert torch.equal(pair.train[5][0], pair.train[5][0])  # the same sample every time
    assert not torch.equal(pair.train[0][0], pair.val[0][0])
    small = D.build_datasets(cfg_for("fake", train_subset=64, val_subset=16))
    assert (len(small.train), len(small.val)) == (64, 16)


def test_user_factory(tmp_path):
    pair = D.build_datasets(cfg_for("tests.user_factories:tiny_dataset", tmp_path, download=True))
    assert (len(pair.train), len(pair.val), pair.num_classes, pair.input_size) == (24, 9, 3, 16)
    assert pair.train.factory_args == (str(tmp_path), True, True)
    assert pair.val.factory_args == (str(tmp_path), False, True)


def test_user_factory_without_classes_takes_num_classes():
    pair = D.build_datasets(cfg_for("tests.user_factories:tiny_dataset_no_classes", num_classes=4))
    assert (pair.num_classes, pair.input_size) == (4, 8)


def test_subsets_are_the_first_samples(bundled_data):
    full = D.build_datasets(cfg_for("cifar10", bundled_data / "cifar10"))
    pair = D.build_datasets(cfg_for("cifar10", bundled_data / "cifar10", train_subset=100, val_subset=50))
    assert isinstance(pair.train, Subset) and list(pair.train.indices) == list(range(100))
    assert (len(pair.train), len(pair.val)) == (100, 50)
    assert torch.equal(pair.val[49][0], full.val[49][0])


# ---------------------------------------------------------------------------- error messages
def _make_tiny_imagenet(root: Path, train_classes, val_classes):
    for split, classes in (("train", train_classes), ("val", val_classes)):
        for c in classes:
            (root / split / c).mkdir(parents=True)
    return root


@pytest.mark.parametrize("name, messages", [
    ("imagenet", ["--dataset 'imagenet' is not one of: cifar10, svhn, tinyimagenet, fake"]),
    ("nosuchmodule_xyz:make", ["cannot import module 'nosuchmodule_xyz'", "PYTHONPATH"]),
    ("tests.user_factories:missing", ["has no callable 'missing'"]),
    (":make", ["expected module:function"]),
])
def test_bad_names(name, messages):
    with pytest.raises(ConfigError) as e:
        D.check_dataset(cfg_for(name))
    assert all(m in str(e.value) for m in messages)


@pytest.mark.parametrize("name", ["cifar10", "svhn", "tinyimagenet"])
def test_missing_data_flag(name):
    with pytest.raises(ConfigError) as e:
        D.check_dataset(cfg_for(name))
    assert f"--dataset {name} needs --data DIR" in str(e.value)
    assert (f"run `dpurun make-data DIR` to write the bundled sample data and pass "
            f"--data DIR/{name}") in str(e.value)


def test_missing_directory(tmp_path):
    with pytest.raises(ConfigError) as e:
        D.check_dataset(cfg_for("svhn", tmp_path / "nope"))
    assert f"--data {tmp_path / 'nope'}: no such directory" in str(e.value)
    assert "--download" in str(e.value)


@pytest.mark.parametrize("name, missing", [
    ("cifar10", "cifar-10-batches-py/data_batch_1"), ("svhn", "train_32x32.mat"),
    ("tinyimagenet", "train/<class>/")])
def test_directory_without_the_files(tmp_path, name, missing):
    with pytest.raises(ConfigError) as e:
        D.check_dataset(cfg_for(name, tmp_path))
    text = str(e.value)
    assert f"has no {name} data set (missing: {missing}" in text and f"dpurun make-data {tmp_path}" in text
    assert ("--download" in text) == (name != "tinyimagenet")
    if name == "tinyimagenet":
        assert "torchvision cannot download Tiny ImageNet" in text


def test_parent_of_make_data_output_suggests_the_subdirectory(bundled_data):
    with pytest.raises(ConfigError) as e:
        D.check_dataset(cfg_for("cifar10", bundled_data))
    assert str(e.value) == (f"--data {bundled_data} has no cifar10 data set (missing: "
                            "cifar-10-batches-py/data_batch_1, cifar-10-batches-py/data_batch_2, "
                            "cifar-10-batches-py/data_batch_3 and 4 more); "
                            f"did you mean --data {bundled_data / 'cifar10'}?")


def test_download_needs_no_files_yet(tmp_path):
    D.check_dataset(cfg_for("cifar10", tmp_path / "later", download=True))  # torchvision fetches them


def test_raw_tiny_imagenet_val_layout(tmp_path):
    _make_tiny_imagenet(tmp_path, ["n01"], [])
    (tmp_path / "val" / "images").mkdir(parents=True)
    (tmp_path / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn01\n")
    with pytest.raises(ConfigError) as e:
        D.check_dataset(cfg_for("tinyimagenet", tmp_path))
    assert "val/ has the raw Tiny ImageNet layout" in str(e.value) and "val/<wnid>/" in str(e.value)


def test_tiny_imagenet_class_folders_must_match(tmp_path):
    _make_tiny_imagenet(tmp_path, ["n01", "n02"], ["n01", "n03"])
    with pytest.raises(ConfigError) as e:
        D.check_dataset(cfg_for("tinyimagenet", tmp_path))
    assert "different class folders (e.g. n02, n03)" in str(e.value)


def test_tiny_imagenet_empty_class_folder(tmp_path):
    _make_tiny_imagenet(tmp_path, ["n01"], ["n01"])
    with pytest.raises(ConfigError, match="every class folder needs at least one image"):
        D.build_datasets(cfg_for("tinyimagenet", tmp_path))


def test_svhn_without_scipy(bundled_data, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "scipy" else real_find_spec(name, *a))
    with pytest.raises(ConfigError, match="pip install scipy"):
        D.check_dataset(cfg_for("svhn", bundled_data / "svhn"))


@pytest.mark.parametrize("changes, message", [
    (dict(train_subset=NUM_TRAIN + 1), f"--train-subset {NUM_TRAIN + 1} is larger than the data set "
                                       f"({NUM_TRAIN} samples); pass --train-subset {NUM_TRAIN} or less"),
    (dict(val_subset=301), "--val-subset 301 is larger than the data set (300 samples)"),
    (dict(num_classes=5), "--num-classes 5 disagrees with the 10 classes of --dataset cifar10"),
])
def test_bad_subsets_and_class_counts(bundled_data, changes, message):
    with pytest.raises(ConfigError) as e:
        D.build_datasets(cfg_for("cifar10", bundled_data / "cifar10", **changes))
    assert message in str(e.value)


@pytest.mark.parametrize("factory, message", [
    ("tiny_dataset_no_classes", "has no .classes attribute, so the number of classes is unknown; "
                                "pass --num-classes N"),
    ("not_a_dataset", "returned int for the train split; the factory must return a "
                      "torch.utils.data.Dataset"),
    ("empty_dataset", "returned an empty train data set"),
])
def test_bad_user_factories(factory, message):
    with pytest.raises(ConfigError) as e:
        D.build_datasets(cfg_for(f"tests.user_factories:{factory}"))
    assert message in str(e.value)


def test_file_lists_match_torchvision():
    """The cheap checks look for exactly the files torchvision's readers open."""
    cifar = [n for n, _ in tvd.CIFAR10.train_list + tvd.CIFAR10.test_list] + [tvd.CIFAR10.meta["filename"]]
    assert D.CIFAR10_FILES == tuple(f"{tvd.CIFAR10.base_folder}/{n}" for n in cifar)
    assert D.SVHN_FILES == (tvd.SVHN.split_list["train"][1], tvd.SVHN.split_list["test"][1])
    assert os.path.basename(D.BUNDLED_MARKER) == "DPUOFFLOAD_BUNDLED.json"
