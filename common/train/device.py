"""Where a host rank computes: `--device cpu|cuda|auto`, `--amp off|bf16|fp16`, `--channels-last`.

On a BlueField node the host ranks train on GPUs (one per host rank: its local rank among the
host ranks of its node picks `cuda:i`) while batches, validation state and checkpoints travel
through host memory: every tensor that crosses to MPI or to disk is staged to the CPU first
(`to_host`). On the CPU the same code runs with `device` cpu, where bf16 autocast and the
channels-last layout are supported too, so the logic is exercised without a GPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Protocol, cast

import torch
from torch import nn

from dpuoffload.common.errors import ConfigError
from dpuoffload.common.modes import Amp, Device

Batch = tuple[torch.Tensor, torch.Tensor]
Finish = Callable[[torch.Tensor], torch.Tensor]  # the uint8 wire's float steps on a device batch
AMP_DTYPES = {Amp.OFF: None, Amp.BF16: torch.bfloat16, Amp.FP16: torch.float16}


def resolve_device(requested: Device, local_rank: int) -> torch.device:
    """`auto`: this host rank's GPU when torch sees one, else the CPU. `cuda` without a GPU, or
    more host ranks on a node than GPUs, is a ConfigError naming the fix."""
    if requested == Device.CPU or (requested == Device.AUTO and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"--device cuda, but torch {torch.__version__} sees no GPU here (torch.cuda.is_available() "
                          "is False); use --device cpu, or install a CUDA build of torch")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ConfigError(f"host rank {local_rank} of its node has no GPU of its own ({count} GPU(s) here): one GPU "
                          "per host rank; lower --host-ranks per node or use --device cpu")
    return torch.device("cuda", local_rank)


@dataclass(frozen=True)
class Compute:
    """How a host rank runs the model: its device, autocast dtype and memory format."""

    device: torch.device = torch.device("cpu")
    amp: Optional[torch.dtype] = None
    channels_last: bool = False

    @classmethod
    def of(cls, device: torch.device, amp: Amp, channels_last: bool) -> "Compute":
        return cls(device, AMP_DTYPES[amp], channels_last)

    @property
    def scales_loss(self) -> bool:
        """fp16 needs loss scaling (`torch.amp.GradScaler`); bf16 has float32's range."""
        return self.amp is torch.float16

    def place(self, model: nn.Module) -> nn.Module:
        """The model on this device, in this memory format (in place, as `Module.to`)."""
        if self.channels_last:  # (torch's stubs lack the device-and-format call `Module.to` takes)
            return cast(Callable[..., nn.Module], model.to)(self.device, memory_format=torch.channels_last)
        return model.to(self.device)

    def inputs(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch on this device (asynchronously from pinned memory), images channels-last if asked."""
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return self.layout(x), y

    def layout(self, x: torch.Tensor) -> torch.Tensor:
        """Images in the memory format the model was placed in (no copy when they already are)."""
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last and x.dim() == 4 else x

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.amp is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.amp):
            yield

    def staging(self, batches: Iterator[Batch], finish: Optional[Finish] = None) -> Optional["Staging"]:
        """Batches to this GPU a step ahead on a side stream (`Staging`); None on the CPU, where
        `inputs` has nothing to copy. `finish`: the uint8 wire's float steps, run on the GPU after
        the copy of each batch that arrives as uint8 (`DpuLoader.defer_float_steps`)."""
        if self.device.type != "cuda":
            return None
        return Staging(batches, CudaCopier(self, finish))

    def describe(self) -> str:
        amp = {None: "", torch.bfloat16: ", bf16 autocast", torch.float16: ", fp16 autocast"}[self.amp]
        return f"{self.device}{amp}{', channels-last' if self.channels_last else ''}"


def to_host(t: torch.Tensor) -> torch.Tensor:
    """`t` in CPU memory (a copy from a GPU, `t` itself on the CPU): what numpy, MPI and files see."""
    return t.detach() if t.device.type == "cpu" else t.detach().to("cpu")


def numpy_dtype(dtype: torch.dtype) -> Any:
    """The numpy dtype of a torch dtype, without a CPU tensor of the caller's (it may be on a GPU)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


def model_device(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


class InFlight(Protocol):
    """One batch on its way to the device."""

    def wait_host(self) -> None:
        """Block until the copy has read the host batch (its buffer may then be reused)."""

    def ready(self) -> Batch:
        """The device batch, ordered after its copy for the work queued from now on."""


class Copier(Protocol):
    def start(self, host: Batch) -> InFlight: ...


class CudaInFlight:
    def __init__(self, device: Batch, copied: "torch.cuda.Event") -> None:
        self.device, self.copied = device, copied

    def wait_host(self) -> None:
        self.copied.synchronize()

    def ready(self) -> Batch:
        stream = torch.cuda.current_stream(self.device[0].device)
        stream.wait_event(self.copied)
        for t in self.device:  # made on the side stream, used on this one: not to be reused before it is done
            t.record_stream(stream)
        return self.device


class CudaCopier:
    """Copies on a side stream of the compute's GPU, from pinned memory when the batch is pinned;
    a uint8 batch is finished there too (`finish`, the float steps), beside the step's compute."""

    def __init__(self, compute: Compute, finish: Optional[Finish] = None) -> None:
        self.compute, self.finish = compute, finish
        self.stream = torch.cuda.Stream(compute.device)

    def start(self, host: Batch) -> InFlight:
        with torch.cuda.stream(self.stream):
            device = finished(self.compute, self.compute.inputs(*host), self.finish)
            copied = torch.cuda.Event()
            copied.record(self.stream)
        return CudaInFlight(device, copied)


def finished(compute: Compute, batch: Batch, finish: Optional[Finish]) -> Batch:
    """`batch` with the float steps run on it where it is, if it came as uint8 and there are steps
    (a host rank's own steps under `--da-host-share`, or after a fallback, come float: as they are)."""
    x, y = batch
    if finish is None or x.dtype != torch.uint8:
        return batch
    return compute.layout(finish(x)), y


class Staging:
    """A host rank's batches onto its GPU one step ahead, on a side stream.

    Why: copied on the compute stream right before the forward pass, every batch's copy is time
    the GPU does not train. Here the trainer calls `prefetch()` once a step's forward and backward
    are queued: the next batch is taken from the feed and its copy queued on a side stream, where it
    runs beside the step's compute. The feed's batch may be a view of a receive buffer that the
    feed's next `next()` hands back to MPI (`copy=False`), so the copy out of it must have finished
    first (`wait_host`, a step after it was queued: normally long done).

    Iterating yields each batch as the feed gave it, in host memory (for `--digest-batches`);
    `on_device()` is the same batch on the GPU.
    """

    def __init__(self, batches: Iterator[Batch], copier: Copier) -> None:
        self.batches, self.copier = iter(batches), copier
        self.ahead: Optional[tuple[Batch, InFlight]] = None  # fetched, copy queued, not yet handed out
        self.current: Optional[tuple[Batch, InFlight]] = None
        self.ended = False

    def __iter__(self) -> "Staging":
        return self

    def __next__(self) -> Batch:
        """The next batch (its copy queued a step ago, or now). An iterator, not only an iterable:
        the trainer's `timed` calls `next()` on it (the first GPU run failed on exactly that)."""
        self.prefetch()
        if self.ahead is None:
            raise StopIteration
        self.current, self.ahead = self.ahead, None
        return self.current[0]

    def prefetch(self) -> None:
        """Take the next batch from the feed and queue its copy (no-op if already done or at the end)."""
        if self.ahead is not None or self.ended:
            return
        if self.current is not None:
            self.current[1].wait_host()  # the feed may reuse the current batch's memory now
        host = next(self.batches, None)
        if host is None:
            self.ended = True
            return
        self.ahead = (host, self.copier.start(host))

    def on_device(self) -> Batch:
        """The batch last yielded, on the device."""
        if self.current is None:
            raise RuntimeError("Staging.on_device() before the first batch (a bug: please report it)")
        return self.current[1].ready()
