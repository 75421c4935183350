"""uint8 on the wire: the DPU rank runs the integer part of a transform, the host rank the float part.

Why: a DPU built on Arm cores rounds float arithmetic differently from the host (and another torch
rounds differently again: `common.data.numerics`), while JPEG decoding, crops, flips and PIL resizes
gave the same bytes on every side measured (`benchmarks/crossarch.py`: x86 AVX2 and scalar kernels,
aarch64 Neoverse-N1 and Cortex-A72). A float32 sample is also 4x the bytes of its uint8 image. Not
every integer step is portable: torchvision v2's antialiased uint8 resizes differed by one level on
every other side, so the DPU's part is checked all the same (`--numerics`). So when a
torchvision `Compose` ends in deterministic float steps (`ToTensor`, `ConvertImageDtype`,
`v2.ToDtype`, `Normalize`, `v2.ToPureTensor`), the DPU rank runs the steps before them, converts the
result to a uint8 CHW tensor, and sends uint8 batches; the host rank applies the float steps to each
whole batch (`HostSteps`), as DALI and FFCV feed GPUs.

Bit-identical by construction: the float steps are element-wise (a cast, a division or multiplication
by the integer range, a per-channel subtraction and division), so a batch gives each element exactly
what one sample gives, on the host's own CPU, as in `--mode none`; and the random steps all run on
the DPU rank under the same per-sample seeds, so the draws do not depend on the split. Steps that draw
random numbers or are unknown are never moved (a `ColorJitter` on tensors keeps the float wire: the
numerics check then tells whether the DPU rounds as the host does).

`--wire auto` (default) splits where this is possible, `float` never, `uint8` insists (an error
names why it is impossible); `job.loader(..., host_steps=k)` chooses the split of one loader.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from dpuoffload.common.data.numerics import transform_holder, transform_steps
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.modes import Wire

if TYPE_CHECKING:
    from dpuoffload.common.data.batches import BatchLayout
    from dpuoffload.common.data.loaders import Sampling

# Element-wise steps the host may apply to a batch; and those that only change a tensor's type.
FLOAT_STEPS = ("ToTensor", "ConvertImageDtype", "ToDtype", "Normalize")
PASSIVE_STEPS = ("ToPureTensor",)
PIL_MODES = ("L", "RGB")  # images ToTensor turns into uint8 CHW then float exactly as `to_wire` does


@dataclass(frozen=True)
class Split:
    """A transform cut in two: the DPU rank runs `steps[:len(steps) - host_steps]` and `to_wire`, the
    host rank the last `host_steps` steps on each batch."""

    steps: tuple[Callable[[Any], Any], ...]
    host_steps: int

    @property
    def dpu(self) -> tuple[Callable[[Any], Any], ...]:
        return self.steps[:len(self.steps) - self.host_steps]

    @property
    def host(self) -> "HostSteps":
        return HostSteps(self.steps[len(self.steps) - self.host_steps:])


def float_tail(steps: Sequence[Any]) -> int:
    """How many trailing steps the host may run on batches: from the first float step on, when every
    step from there is a known element-wise one (0: none)."""
    names = [_name(s) for s in steps]
    first = next((i for i, n in enumerate(names) if n in FLOAT_STEPS), None)
    if first is None or any(n not in FLOAT_STEPS + PASSIVE_STEPS for n in names[first:]):
        return 0
    if any(not _scales_to_float(s) for s in steps[first:]):
        return 0
    return len(steps) - first


def policy(wire: Wire, on_gpu: bool) -> Wire:
    """`--wire` for a host rank: `auto` on a GPU host rank means float. A user's own loop gets its
    batches in host memory, so its float steps would run on its CPU (0.3-0.7 ms per 224 px sample
    here, `benchmarks/wire.py`), slower than the GPU takes the batches. `--wire uint8` on a GPU host
    rank: the built-in trainer copies the uint8 batch (a quarter of the bytes) and runs the float
    steps on the GPU (`DpuLoader.defer_float_steps`, `Compute.staging`); `auto` stays float there
    until a GPU run has checked that path bit for bit (issue 32). One rule for the loaders
    (`host.library.Job.wire_policy`) and for `--mode auto`'s profile of them."""
    return Wire.FLOAT if wire is Wire.AUTO and on_gpu else wire


def plan_split(dataset: Any, wire: Wire, host_steps: Optional[int] = None) -> Optional[Split]:
    """The split for one loader's data set, or None for the float wire.

    Raises:
        ConfigError: `--wire uint8` or `host_steps` ask for a split that cannot keep the batches
            bit-identical; the message says which step stands in the way.
    """
    steps = transform_steps(dataset)
    movable = float_tail(steps)
    if host_steps is not None:
        return _explicit(steps, movable, host_steps)
    if wire is Wire.FLOAT or movable == 0:
        if wire is Wire.UINT8:
            raise ConfigError(f"--wire uint8: {_why_not(dataset, steps)}; use --wire auto or float")
        return None
    return Split(tuple(steps), movable)


def _explicit(steps: Sequence[Any], movable: int, host_steps: int) -> Optional[Split]:
    if isinstance(host_steps, bool) or not isinstance(host_steps, int) or host_steps < 0:
        raise ConfigError(f"job.loader: host_steps must be an integer >= 0, got {host_steps!r}")
    if host_steps == 0:
        return None
    if host_steps > movable:
        asked = steps[len(steps) - host_steps:] if host_steps <= len(steps) else []
        stuck = next((s for s in asked if _name(s) not in FLOAT_STEPS + PASSIVE_STEPS or
                      not _scales_to_float(s)), asked[0] if asked else None)
        why = (f"the transform has {len(steps)} step(s)" if stuck is None else
               f"{type(stuck).__name__} is not an element-wise float step the host can apply to a batch bit for "
               f"bit ({', '.join(FLOAT_STEPS + PASSIVE_STEPS)})")
        raise ConfigError(f"job.loader: host_steps={host_steps} cannot be split off: {why}; "
                          f"at most {movable} here")
    return Split(tuple(steps), host_steps)


def _why_not(dataset: Any, steps: Sequence[Any]) -> str:
    if transform_holder(dataset) is None:
        return "the data set has no `transform` attribute to split"
    if not steps:
        return "its transform is not a torchvision Compose"
    names = [_name(s) or type(s).__name__ for s in steps]
    if not any(n in FLOAT_STEPS for n in names):
        return f"its transform ({', '.join(names)}) has no float step to move to the host"
    first = next(i for i, n in enumerate(names) if n in FLOAT_STEPS)
    blocking = next(n for n in names[first:] if n not in FLOAT_STEPS + PASSIVE_STEPS)
    return (f"{blocking} comes after the float step {names[first]}, and only element-wise steps "
            f"({', '.join(FLOAT_STEPS + PASSIVE_STEPS)}) can run on batches bit for bit")


def _name(step: Any) -> str:
    """The class name of a torchvision step ("" for another library's: a Normalize of its own may differ)."""
    return type(step).__name__ if type(step).__module__.startswith("torchvision.transforms") else ""


def _scales_to_float(step: Any) -> bool:
    """ToDtype / ConvertImageDtype to a float type (a cast to another integer type stays on the DPU)."""
    import torch

    dtype = getattr(step, "dtype", None)
    if type(step).__name__ == "ToDtype":
        return isinstance(dtype, torch.dtype) and dtype.is_floating_point and bool(getattr(step, "scale", False))
    if type(step).__name__ == "ConvertImageDtype":
        return isinstance(dtype, torch.dtype) and dtype.is_floating_point
    return True


@dataclass(frozen=True)
class Chosen:
    """A host rank's loader on the wire: the split (None: float), the data set as the DPU rank builds
    it, and the layout of the batch messages."""

    split: Optional[Split]
    view: Any
    layout: "BatchLayout"

    @property
    def host_steps(self) -> int:
        return 0 if self.split is None else self.split.host_steps


def choose(dataset: Any, wire: Wire, host_steps: Optional[int], sampling: "Sampling") -> Chosen:
    """Plan the split and probe sample 0 through the DPU's part. Under `--wire auto` a first step
    whose output cannot go as uint8 (a PIL image of mode F, say) keeps the float wire; asked for
    explicitly, it is an error that says so."""
    from dpuoffload.common.data.loaders import probe_layout
    from dpuoffload.common.data.sampling import PerSampleSeeded

    split = plan_split(dataset, wire, host_steps)
    if split is not None:
        view = dpu_view(dataset, split)
        try:
            return Chosen(split, view, probe_layout(PerSampleSeeded(view, sampling.seed), sampling))
        except ValueError as e:  # (ToWire's refusal, or a ConfigError of the probe)
            if wire is Wire.UINT8 or host_steps is not None:
                raise ConfigError(f"--wire uint8 (or job.loader's host_steps): {e}") from None
    return Chosen(None, dataset, probe_layout(PerSampleSeeded(dataset, sampling.seed), sampling))


# ------------------------------------------------------------------------------- the DPU's side
def dpu_view(dataset: Any, split: Split) -> Any:
    """`dataset` with its transform cut to the DPU's part and `to_wire` (shallow copies down to the
    object holding the transform: the user's data set is left as it is)."""
    from torchvision import transforms as T

    return _with_transform(dataset, T.Compose([*split.dpu, ToWire()]))


def _with_transform(dataset: Any, transform: Any) -> Any:
    out = copy.copy(dataset)
    if getattr(dataset, "transform", None) is not None:
        out.transform = transform
    else:
        out.dataset = _with_transform(dataset.dataset, transform)
    return out


class ToWire:
    """The DPU's last step: its image as a uint8 CHW tensor, the bytes ToTensor would divide by 255."""

    def __call__(self, image: Any) -> Any:
        return to_wire(image)

    def __repr__(self) -> str:
        return "ToWire()"


def to_wire(image: Any) -> Any:
    import numpy as np
    import torch
    from PIL import Image

    if isinstance(image, Image.Image):
        if image.mode not in PIL_MODES:
            raise ValueError(f"a PIL image of mode {image.mode}: the uint8 wire takes {', '.join(PIL_MODES)} "
                             "(convert it in the transform, or use --wire float)")
        from torchvision.transforms.functional import pil_to_tensor

        return pil_to_tensor(image).contiguous()  # (CHW order here, in cache: the collate is then one copy)
    if isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim in (2, 3):
        hwc = image[:, :, None] if image.ndim == 2 else image
        return torch.from_numpy(np.ascontiguousarray(hwc.transpose(2, 0, 1)))
    if isinstance(image, torch.Tensor) and image.dtype == torch.uint8:
        return image.as_subclass(torch.Tensor).contiguous()
    raise ValueError(f"the step before the float part returns {type(image).__name__}"
                     f"{'' if not hasattr(image, 'dtype') else ' ' + str(image.dtype)}; the uint8 wire takes "
                     "PIL images, uint8 arrays or uint8 tensors (use --wire float)")


# ------------------------------------------------------------------------------ the host's side
class HostSteps:
    """The float steps, applied to a whole uint8 batch [N, C, H, W] on the host rank.

    Sample by sample into one output batch: each sample's float tensors stay in the CPU's cache, where
    a whole-batch pass made three batch-sized float tensors and went to memory five times (1.6 ms per
    224 px sample against 0.16 here, `benchmarks/wire.py`). And each step is the user's own object run
    on one image, as in `--mode none`, so v1 and v2 steps keep their own arithmetic (v2's ToDtype
    multiplies by 1/255 where ToTensor divides by 255)."""

    def __init__(self, steps: Sequence[Any]) -> None:
        self.steps = tuple(steps)
        self.names = tuple(type(s).__name__ for s in self.steps)
        self.ring: list[Any] = []   # `reuse`: two output batches used in turn
        self.turn = 0

    def __call__(self, batch: Any, reuse: bool = False, pinned: bool = False) -> Any:
        """The float batch. `reuse`: into one of two buffers kept here, used in turn (the caller's
        batch is valid until the next call but one: a loader's `copy=False`); a new batch otherwise.
        `pinned`: page-locked output (a GPU host rank's asynchronous copies)."""
        first = self.one(batch[0])
        out = self._out(batch.shape[0], first, reuse, pinned)
        out[0] = first
        for i in range(1, batch.shape[0]):
            out[i] = self.one(batch[i])
        return out

    def _out(self, count: int, first: Any, reuse: bool, pinned: bool) -> Any:
        import torch

        if not reuse:
            return torch.empty((count, *first.shape), dtype=first.dtype, pin_memory=pinned)
        if not self.ring or self.ring[0].shape[1:] != first.shape or self.ring[0].shape[0] < count:
            self.ring = [torch.empty((count, *first.shape), dtype=first.dtype, pin_memory=pinned) for _ in range(2)]
        self.turn = 1 - self.turn
        return self.ring[self.turn][:count]

    def batch(self, batch: Any) -> Any:
        """The float steps on a whole uint8 batch at once, wherever it is: on a GPU host rank, after
        the uint8 batch's copy (a few element-wise kernels over the batch, where `__call__` would
        launch some per sample). The same arithmetic per element as `one`: every step is element-wise
        over [..., C, H, W] (`float_tail` admits no other)."""
        x = batch
        for step, name in zip(self.steps, self.names):
            x = _to_tensor(x) if name == "ToTensor" else step(x)
        return x

    def one(self, image: Any) -> Any:
        """The float steps on one uint8 CHW image."""
        x = image
        for step, name in zip(self.steps, self.names):
            x = _to_tensor(x) if name == "ToTensor" else step(x)
        return x

    def __repr__(self) -> str:
        return f"HostSteps({', '.join(self.names)})"


def _to_tensor(image: Any) -> Any:
    """ToTensor's arithmetic on a uint8 CHW image: what `to_tensor` does to a PIL image's bytes once
    it has them in that order (a cast to the default float type, then a division by 255)."""
    import torch

    return image.to(dtype=torch.get_default_dtype()).div(255)
