"""The numerics contract: a DPU rank's samples are compared with the host's own before training.

Why: `--mode da` promises that every batch equals, bit for bit, the one the host rank would have built
itself, so training equals `--mode none` to the bit. That holds by construction only where both sides
run the same code on the same numerics. A BlueField DPU is an aarch64 computer beside an x86-64 host,
often with other library versions, and measured there: torchvision-v2 uint8 resizes differ by one level
between torchvision versions, a float32 ColorJitter on tensors differs in its last bits between
architectures (a mean's reduction order), and on x86 alone the CPU kernel level torch picks
(`ATEN_CPU_CAPABILITY`) changes float draws and antialiased resizes. PIL-based pipelines matched.

So before the first batch of every loader, both ends fingerprint the same first K samples of the data
set (epoch 0, the loader's seed, through `PerSampleSeeded` as the loader itself does), digesting the
output of every step of the transform (a torchvision `Compose`, v1 or v2, is traced step by step,
nested ones flattened), and the host compares (`compare`). On a difference it asks the DPU rank for the
first differing step's output of the first differing sample and says, in one line, which step first
differs, in how many elements and by how much, and what to do (`Verdict.line`). What then happens is
the policy (`Numerics`): stop, warn and train on, or skip the check. The wire part lives in
`common.data.streams` (messages) and the two ends (`host.numerics`, `dpu.serve`).

Importing this module does not import torch (the launcher parses `--numerics`); the functions that
build samples do.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dpuoffload.common.modes import Numerics

LIBRARIES = ("torch", "torchvision", "pillow", "numpy")  # distributions whose versions the contract names


# ------------------------------------------------------------------------------------- platform
@dataclass(frozen=True)
class Platform:
    """What decides how a side rounds: its CPU architecture, the kernel level torch dispatches to
    and the versions of the libraries that build samples."""

    machine: str
    byteorder: str
    cpu_capability: str
    versions: tuple[tuple[str, str], ...]

    @classmethod
    def here(cls) -> "Platform":
        import torch

        return cls(platform.machine(), sys.byteorder, _cpu_capability(torch),
                   tuple((name, _version(name)) for name in LIBRARIES))

    def describe(self) -> str:
        libs = ", ".join(f"{name} {v}" for name, v in self.versions if name in ("torch", "torchvision"))
        return f"{self.machine}, {libs}, cpu {self.cpu_capability}"

    def differences(self, other: "Platform") -> list[str]:
        """What differs, as 'torch 2.14.1 vs 2.9.1' phrases (this side first)."""
        out = [f"{name} {v} vs {dict(other.versions).get(name)}" for name, v in self.versions
               if dict(other.versions).get(name) != v]
        if self.cpu_capability != other.cpu_capability:
            out.append(f"cpu capability {self.cpu_capability} vs {other.cpu_capability}")
        if self.machine != other.machine:
            out.append(f"architecture {self.machine} vs {other.machine}")
        return out


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def _cpu_capability(torch: Any) -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # (torch < 2.1)
        return "unknown"


# -------------------------------------------------------------------------------------- tracing
@dataclass(frozen=True)
class SampleTrace:
    """One sample's fingerprint: the digest of every transform step's output, then of the whole
    sample as `__getitem__` returned it (image and label)."""

    index: int
    digests: tuple[str, ...]   # per step of `steps`, in order
    sample: str                # the returned (image, label), whatever the steps did


@dataclass(frozen=True)
class Fingerprint:
    """A side's fingerprint of one loader's data set."""

    platform: Platform
    steps: tuple[str, ...]     # the traced steps' names (empty: the transform is not a Compose)
    samples: tuple[SampleTrace, ...]
    seconds: float             # what building and digesting the samples took on that side


def fingerprint(dataset: Any, seed: int, count: int) -> Fingerprint:
    """Build samples 0..count-1 of epoch 0 as the loader does (per-sample seeds) and digest every
    transform step's output. Costs `count` samples' augmentation plus hashing their bytes."""
    t0 = time.perf_counter()
    steps = transform_steps(dataset)
    traces = []
    from dpuoffload.common.errors import SampleError

    for index in range(min(count, len(dataset))):
        outputs: list[Any] = []
        try:
            sample = digest(_build(dataset, seed, index, outputs.append))
        except SampleError as e:  # (a corrupt file: the same on both sides; training names it, or --skip-corrupt)
            sample = f"failed to load: {type(e.__cause__ or e).__name__}"
        traces.append(SampleTrace(index, tuple(digest(x) for x in outputs), sample))
    return Fingerprint(Platform.here(), tuple(_name(t) for t in steps), tuple(traces), time.perf_counter() - t0)


def step_output(dataset: Any, seed: int, index: int, step: Optional[int]) -> np.ndarray:
    """Sample `index`'s output of transform step `step` (None: the image `__getitem__` returns), as
    an array: what the host compares element by element once the digests differ."""
    outputs: list[Any] = []
    sample = _build(dataset, seed, index, outputs.append)
    if step is None or step >= len(outputs):
        return as_array(sample[0] if isinstance(sample, (tuple, list)) else sample)
    return as_array(outputs[step])


def transform_steps(dataset: Any) -> list[Callable[[Any], Any]]:
    """The steps of the data set's transform when it is a Compose (nested ones flattened), else []."""
    holder = transform_holder(dataset)
    return [] if holder is None else _flatten(holder.transform)


def _build(dataset: Any, seed: int, index: int, record: Callable[[Any], None]) -> Any:
    """Sample `index` of epoch 0 under its per-sample seeds, with every step's output recorded. The
    transform is swapped for a tracer of the same steps only for this call: the draws stay the same."""
    from dpuoffload.common.data.sampling import PerSampleSeeded

    holder = transform_holder(dataset)
    steps = [] if holder is None else _flatten(holder.transform)
    if not steps:
        return PerSampleSeeded(dataset, seed)[index]
    original = holder.transform
    holder.transform = _Tracer(steps, record)
    try:
        return PerSampleSeeded(dataset, seed)[index]
    finally:
        holder.transform = original


class _Tracer:
    """Runs the steps as Compose does (one input), handing each output to `record`."""

    def __init__(self, steps: Sequence[Callable[[Any], Any]], record: Callable[[Any], None]) -> None:
        self.steps, self.record = steps, record

    def __call__(self, x: Any) -> Any:
        for step in self.steps:
            x = step(x)
            self.record(x)
        return x


def transform_holder(dataset: Any) -> Any:
    """The object whose `transform` attribute `__getitem__` applies (through Subset-like wrappers)."""
    seen = 0
    while dataset is not None and seen < 16:
        if getattr(dataset, "transform", None) is not None:
            return dataset
        dataset, seen = getattr(dataset, "dataset", None), seen + 1
    return None


def _flatten(transform: Any) -> list[Callable[[Any], Any]]:
    if not _is_compose(transform):
        return []
    out: list[Callable[[Any], Any]] = []
    for step in transform.transforms:
        out.extend(_flatten(step) if _is_compose(step) else [step])
    return out


def _is_compose(transform: Any) -> bool:
    """torchvision's Compose (v1 or v2): a class named Compose holding a list of steps."""
    return type(transform).__name__ == "Compose" and isinstance(getattr(transform, "transforms", None), (list, tuple))


def _name(step: Any) -> str:
    return " ".join(repr(step).split())


# ------------------------------------------------------------------------------------- digesting
def digest(x: Any) -> str:
    """A digest of a step's output that two sides agree on exactly when the values are the same:
    type, dtype, shape and bytes for tensors and arrays, mode, size and pixels for PIL images."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, x)
    return h.hexdigest()


def _feed(h: Any, x: Any) -> None:
    import torch
    from PIL import Image

    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        h.update(f"tensor {t.dtype} {tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(x, Image.Image):
        h.update(f"PIL {x.mode} {x.size};".encode())
        h.update(x.tobytes())
    elif isinstance(x, np.ndarray):
        a = np.ascontiguousarray(x)
        h.update(f"ndarray {a.dtype.newbyteorder('<').str} {a.shape};".encode())
        h.update(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())  # (byte order named, not assumed)
    elif isinstance(x, (tuple, list)):
        h.update(f"{type(x).__name__} {len(x)};".encode())
        for item in x:
            _feed(h, item)
    else:
        h.update(f"{type(x).__name__} {x!r};".encode())


def as_array(x: Any) -> np.ndarray:
    """A step's output as a numpy array (tensors, PIL images, arrays), for element-wise comparison."""
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()
    return np.asarray(x).copy()


# ------------------------------------------------------------------------------------- comparing
@dataclass(frozen=True)
class Difference:
    """Where the DPU's samples first part from the host's: sample, step (None: the whole sample,
    with no Compose to bisect or equal steps but a different label), and how many samples differ."""

    index: int
    step: Optional[int]
    step_name: str
    differing: int
    compared: int


def compare(host: Fingerprint, dpu: Fingerprint) -> Optional[Difference]:
    """The first difference between the two sides' fingerprints, or None when they agree."""
    bad = [(h, d) for h, d in zip(host.samples, dpu.samples) if h != d]
    if not bad and len(host.samples) == len(dpu.samples):
        return None
    if not bad:  # (sides that built different sample counts: data sets of different lengths)
        n = min(len(host.samples), len(dpu.samples))
        return Difference(n, None, f"the data set's length ({len(host.samples)} vs {len(dpu.samples)} samples "
                                   "compared)", 1, n)
    h, d = bad[0]
    step = next((i for i, (a, b) in enumerate(zip(h.digests, d.digests)) if a != b), None)
    if step is None and host.steps != dpu.steps:
        name = f"the transform itself ({len(host.steps)} steps here, {len(dpu.steps)} on the DPU)"
    elif step is None:
        name = "the sample as __getitem__ returns it (image and label)"
    else:
        name = host.steps[step]
    return Difference(h.index, step, name, len(bad), min(len(host.samples), len(dpu.samples)))


@dataclass(frozen=True)
class Magnitude:
    """How two outputs of the same step differ."""

    differing: int
    total: int
    max_abs: float
    shapes: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())

    @classmethod
    def of(cls, host: np.ndarray, dpu: np.ndarray) -> "Magnitude":
        if host.shape != dpu.shape:
            return cls(-1, host.size, float("nan"), (host.shape, dpu.shape))
        a, b = host.astype(np.float64), dpu.astype(np.float64)
        diff = np.abs(a - b)
        differing = int(np.count_nonzero((diff > 0) | (np.isnan(a) != np.isnan(b))))
        return cls(differing, int(host.size), float(np.nanmax(diff)) if diff.size else 0.0)

    def describe(self) -> str:
        if self.differing < 0:
            return f"shape {self.shapes[0]} here, {self.shapes[1]} on the DPU"
        return f"{self.differing:,} of {self.total:,} elements, max |diff| {self.max_abs:.3g}"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one loader's check on one host rank, as printed and recorded."""

    host: str                  # "host rank 0"
    dpu: str                   # "DPU rank 1"
    policy: Numerics
    host_platform: Platform
    dpu_platform: Platform
    compared: int
    seconds: float             # the check's wall time on the host rank (both sides' building, the exchange)
    difference: Optional[Difference] = None
    magnitude: Optional[Magnitude] = None
    fixes: tuple[str, ...] = field(default=())
    wire: str = ""             # what was compared when the host runs the float steps: "uint8 (...)"

    @property
    def identical(self) -> bool:
        return self.difference is None

    def line(self) -> str:
        """One line: the verdict, where and how much, what to do."""
        sides = f"{self.dpu} ({self.dpu_platform.describe()}) vs {self.host}'s own ({self.host_platform.describe()})"
        if self.wire:
            sides += f", sent as {self.wire}"
        if self.difference is None:
            caveat = self.host_platform.differences(self.dpu_platform)
            tail = (f"; they differ in {', '.join(caveat)}, so samples outside the check may still differ "
                    "(--numerics-samples N checks more)") if caveat else ""
            return (f"numerics: samples built by {sides}: identical on all {self.compared} compared "
                    f"(check: {self.seconds:.2f} s){tail}")
        d = self.difference
        where = "" if d.step is None else f"step {d.step + 1}, "
        how = "" if self.magnitude is None else f" (sample {d.index}: {self.magnitude.describe()})"
        if self.policy.stops:
            outcome = "stopped before training (--numerics strict)"
            fixes = (*self.fixes, "accept it with --numerics warn (such batches still train correctly)")
        else:
            outcome = "training goes on, correct but not bit-identical to --mode none (--numerics warn; strict stops)"
            fixes = self.fixes
        return (f"numerics: samples built by {sides} differ in {d.differing} of {d.compared} compared, first at "
                f"{where}{d.step_name}{how}; {outcome}; to fix: {'; or '.join(fixes)} (check: {self.seconds:.2f} s)")

    def record(self) -> dict[str, Any]:
        """The JSON record of `<log-dir>/numerics-rank<N>.jsonl`."""
        d, m = self.difference, self.magnitude
        return {"host": self.host, "dpu": self.dpu, "policy": self.policy.value, "identical": self.identical,
                "compared": self.compared, "seconds": round(self.seconds, 4),
                "differing": 0 if d is None else d.differing, "index": None if d is None else d.index,
                "step": None if d is None or d.step is None else d.step + 1,
                "step_name": None if d is None else d.step_name,
                "elements": None if m is None else m.differing, "max_abs": None if m is None else m.max_abs,
                "host_platform": _platform_record(self.host_platform),
                "dpu_platform": _platform_record(self.dpu_platform), "wire": self.wire or "float", "line": self.line()}


def _platform_record(p: Platform) -> dict[str, Any]:
    return {"machine": p.machine, "byteorder": p.byteorder, "cpu_capability": p.cpu_capability, **dict(p.versions)}


def fixes_for(host: Platform, dpu: Platform, step_name: str) -> tuple[str, ...]:
    """What would make the two sides agree, most effective first."""
    out = []
    libs = [f"{name} {v} here vs {dict(dpu.versions).get(name)}" for name, v in host.versions
            if dict(dpu.versions).get(name) != v]
    if libs:
        out.append(f"install the same versions on both sides ({', '.join(libs)})")
    if host.cpu_capability != dpu.cpu_capability and host.machine == dpu.machine:
        out.append(f"run both sides at one kernel level (ATEN_CPU_CAPABILITY={dpu.cpu_capability.lower()} "
                   "on the host ranks, or the host's level on the DPU ranks)")
    out.append(f"apply {_short(step_name)} and the steps after it on the host ranks (take them out of the data "
               "set's transform and run them on the batches)")
    return tuple(out)


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[:limit - 3] + "..."
