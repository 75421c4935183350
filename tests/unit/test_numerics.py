"""The numerics contract's pure parts (`common.data.numerics`): tracing a Compose step by step, the
bisection to the first differing step, the magnitude of a difference, the verdict's line and the policy.
No processes: the two "sides" are two data sets built here, one of them changed on purpose."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, Subset
from torchvision import transforms as T
from torchvision.transforms import v2

from dpuoffload.common.config import RunConfig
from dpuoffload.common.data.numerics import (
    Difference,
    Fingerprint,
    Magnitude,
    Numerics,
    Platform,
    Verdict,
    compare,
    digest,
    fingerprint,
    fixes_for,
    step_output,
    transform_steps,
)
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.errors import ConfigError

MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


class Pictures(Dataset):
    """Eight 40x40 RGB PIL images and labels, with a `transform` as torchvision's data sets have."""

    def __init__(self, transform=None, labels_offset: int = 0) -> None:
        from PIL import Image

        gen = np.random.default_rng(3)
        self.images = [Image.fromarray(gen.integers(0, 256, (40, 40, 3), dtype=np.uint8)) for _ in range(8)]
        self.transform, self.labels_offset = transform, labels_offset

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        x = self.images[i]
        return (x if self.transform is None else self.transform(x)), i % 3 + self.labels_offset


def pipeline(mean=MEAN) -> T.Compose:
    return T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, STD)])


def test_same_pipeline_same_fingerprint_and_tracing_changes_nothing():
    ds = Pictures(pipeline())
    a, b = fingerprint(ds, seed=7, count=8), fingerprint(Pictures(pipeline()), seed=7, count=8)
    assert compare(a, b) is None
    assert len(a.samples) == 8 and all(len(s.digests) == 4 for s in a.samples)
    assert a.steps[0].startswith("RandomCrop(") and a.steps[3].startswith("Normalize(")
    # the traced build is the loader's build: same draws, same bytes (the transform is put back after)
    plain = PerSampleSeeded(ds, 7)
    assert [s.sample for s in a.samples] == [digest(plain[i]) for i in range(8)]
    assert isinstance(ds.transform, T.Compose)


def test_first_differing_step_is_found_and_counted():
    host = fingerprint(Pictures(pipeline()), 0, 8)
    dpu = fingerprint(Pictures(pipeline(mean=(0.49, 0.48, 0.4500001))), 0, 8)
    d = compare(host, dpu)
    assert d is not None and d.step == 3 and d.step_name.startswith("Normalize(")
    assert (d.index, d.differing, d.compared) == (0, 8, 8)


def test_draws_that_differ_show_at_the_random_step():
    """Another seed is another crop: the first step already differs (what a different RNG would do)."""
    d = compare(fingerprint(Pictures(pipeline()), 0, 8), fingerprint(Pictures(pipeline()), 1, 8))
    assert d is not None and d.step in (0, 1)


def test_nested_and_v2_composes_are_flattened_through_subsets():
    inner = v2.Compose([v2.RandomHorizontalFlip(), v2.ToImage()])
    ds = Subset(Pictures(v2.Compose([v2.RandomResizedCrop(24, antialias=True), inner,
                                     v2.ToDtype(torch.float32, scale=True)])), range(5))
    names = [type(s).__name__ for s in transform_steps(ds)]
    assert names == ["RandomResizedCrop", "RandomHorizontalFlip", "ToImage", "ToDtype"]
    fp = fingerprint(ds, 0, 16)
    assert len(fp.samples) == 5 and compare(fp, fingerprint(ds, 0, 16)) is None


def test_without_a_compose_the_whole_sample_is_one_step():
    class Own(Dataset):
        def __init__(self, scale: float) -> None:
            self.scale = scale

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i):
            return torch.rand(3, 4, 4) * self.scale, i

    a, b = fingerprint(Own(1.0), 0, 4), fingerprint(Own(1.0 + 1e-6), 0, 4)
    assert a.steps == () and compare(a, fingerprint(Own(1.0), 0, 4)) is None
    d = compare(a, b)
    assert d is not None and d.step is None and "__getitem__" in d.step_name


def test_equal_images_but_different_labels_are_a_difference():
    d = compare(fingerprint(Pictures(pipeline()), 0, 4), fingerprint(Pictures(pipeline(), labels_offset=1), 0, 4))
    assert d is not None and d.step is None and "label" in d.step_name


def test_step_output_is_that_steps_value_and_the_magnitude_says_how_much():
    host, dpu = Pictures(pipeline()), Pictures(pipeline(mean=(0.49, 0.48, 0.46)))
    a, b = step_output(host, 0, 2, 3), step_output(dpu, 0, 2, 3)
    assert a.shape == (3, 32, 32) and a.dtype == np.float32
    m = Magnitude.of(a, b)
    assert m.differing == 32 * 32 and m.total == 3 * 32 * 32  # only the third channel's mean moved
    assert m.max_abs == pytest.approx(0.01 / 0.26, rel=1e-4)  # (float32 arithmetic)
    assert "1,024 of 3,072 elements" in m.describe()
    pil = step_output(host, 0, 2, 0)  # a PIL step: its pixels
    assert pil.shape == (32, 32, 3) and pil.dtype == np.uint8
    assert Magnitude.of(pil, pil).differing == 0
    assert Magnitude.of(np.zeros((2, 2)), np.zeros((3, 2))).describe() == "shape (2, 2) here, (3, 2) on the DPU"


def test_digest_names_dtype_and_shape_not_only_bytes():
    x = torch.zeros(4, dtype=torch.float32)
    assert digest(x) != digest(x.view(2, 2)) and digest(x) != digest(x.view(torch.int32))
    assert digest(x) == digest(torch.zeros(4)) and digest(np.zeros(3, ">f4")) == digest(np.zeros(3, "<f4"))


X86 = Platform("x86_64", "little", "AVX2", (("torch", "2.14.1"), ("torchvision", "0.29.1"), ("pillow", "12.0.0"),
                                             ("numpy", "2.3.0")))
ARM = Platform("aarch64", "little", "DEFAULT", (("torch", "2.9.1"), ("torchvision", "0.24.1"), ("pillow", "12.0.0"),
                                                ("numpy", "2.3.0")))


def verdict(policy: Numerics, difference=None, magnitude=None) -> Verdict:
    fixes = () if difference is None else fixes_for(X86, ARM, difference.step_name)
    return Verdict("host rank 0", "DPU rank 0", policy, X86, ARM, 16, 0.25, difference, magnitude, fixes)


def test_the_line_says_where_how_much_and_what_to_do():
    d = Difference(2, 4, "ColorJitter(brightness=(0.6, 1.4))", 10, 16)
    m = Magnitude(1204, 12288, 8.9e-7)
    warn = verdict(Numerics.WARN, d, m).line()
    assert "differ in 10 of 16 compared, first at step 5, ColorJitter(brightness=(0.6, 1.4))" in warn
    assert "(sample 2: 1,204 of 12,288 elements, max |diff| 8.9e-07)" in warn
    assert "training goes on" in warn and "torch 2.14.1 here vs 2.9.1" in warn and "\n" not in warn
    assert "apply ColorJitter(brightness=(0.6, 1.4)) and the steps after it on the host" in warn
    assert "--numerics warn (such" not in warn
    strict = verdict(Numerics.STRICT, d, m).line()
    assert "stopped before training (--numerics strict)" in strict and "accept it with --numerics warn" in strict
    same = verdict(Numerics.WARN).line()
    assert "identical on all 16 compared" in same and "samples outside the check may still differ" in same
    record = verdict(Numerics.WARN, d, m).record()
    assert (record["identical"], record["step"], record["elements"], record["dpu_platform"]["torch"]) == \
        (False, 5, 1204, "2.9.1")


def test_a_kernel_level_difference_on_one_architecture_suggests_aten_cpu_capability():
    other = dataclasses.replace(X86, cpu_capability="DEFAULT")
    fixes = fixes_for(X86, other, "Normalize()")
    assert fixes[0].startswith("run both sides at one kernel level (ATEN_CPU_CAPABILITY=default")
    assert verdict(Numerics.WARN).identical and not X86.differences(X86)


def test_platform_here_names_this_side():
    import platform
    import sys

    here = Platform.here()
    assert (here.machine, here.byteorder) == (platform.machine(), sys.byteorder)
    assert torch.__version__.startswith(dict(here.versions)["torch"]) and "missing" not in dict(here.versions).values()


def test_policy_flag():
    assert RunConfig().numerics == "warn" and Numerics(RunConfig().numerics) is Numerics.WARN
    assert Numerics.STRICT.stops and Numerics.WARN.checks and not Numerics.OFF.checks
    with pytest.raises(ConfigError, match="--numerics 'loose' is not one of: strict, warn, off"):
        RunConfig(numerics="loose")
    with pytest.raises(ConfigError, match="--numerics-samples must be >= 1, got 0 .*--numerics off"):
        RunConfig(numerics_samples=0)
    with pytest.raises(ConfigError, match="--numerics only applies where DPU ranks augment .*not --mode mv"):
        RunConfig(mode="mv", numerics="strict")
    with pytest.raises(ConfigError, match="--wire only applies where DPU ranks augment .*not --mode none"):
        RunConfig(wire="uint8")
    assert RunConfig(mode="hybrid", numerics="off", wire="float").numerics is Numerics.OFF


def test_fingerprints_pickle_across_processes():
    import pickle

    fp = fingerprint(Pictures(pipeline()), 0, 2)
    back = pickle.loads(pickle.dumps(fp))
    assert isinstance(back, Fingerprint) and compare(fp, back) is None
