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
from typing import Any, Iterator, Optional

import torch
from torch import nn

from dpuoffload.common.errors import ConfigError

AMP_DTYPES = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(requested: str, local_rank: int) -> torch.device:
    """`auto`: this host rank's GPU when torch sees one, else the CPU. `cuda` without a GPU, or
    more host ranks on a node than GPUs, is a ConfigError naming the fix."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
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
    def of(cls, device: torch.device, amp: str, channels_last: bool) -> "Compute":
        return cls(device, AMP_DTYPES[amp], channels_last)

    @property
    def scales_loss(self) -> bool:
        """fp16 needs loss scaling (`torch.amp.GradScaler`); bf16 has float32's range."""
        return self.amp is torch.float16

    def place(self, model: nn.Module) -> nn.Module:
        """The model on this device, in this memory format (in place, as `Module.to`)."""
        if self.channels_last:
            return model.to(self.device, memory_format=torch.channels_last)
        return model.to(self.device)

    def inputs(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch on this device (asynchronously from pinned memory), images channels-last if asked."""
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.amp is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.amp):
            yield

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
