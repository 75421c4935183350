"""Models by name: CIFAR-style ResNets (He et al. 2016, Sec. 4.2), torchvision models, user factories.

`resnet20` / `resnet56` are the 6n+2 CIFAR ResNets (16/32/64 channels, option-A shortcuts:
stride-2 subsampling plus zero-padded channels, so no extra parameters) the published DPU
evaluation trains; `shufflenet_v2` and `resnet50` come unchanged from torchvision.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.factories import is_factory_spec, load_factory


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.stride = stride
        self.pad = planes - in_planes

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1 and self.pad == 0:
            return x
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32x32 inputs; works for larger inputs thanks to global average pooling."""

    def __init__(self, depth: int, num_classes: int) -> None:
        super().__init__()
        if (depth - 2) % 6:
            raise ConfigError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers, in_planes = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


def _torchvision(name: str) -> Callable[[int], nn.Module]:
    def build(num_classes: int) -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)

    return build


MODELS: dict[str, Callable[[int], nn.Module]] = {
    "resnet20": lambda num_classes: CifarResNet(20, num_classes),
    "resnet56": lambda num_classes: CifarResNet(56, num_classes),
    "shufflenet_v2": _torchvision("shufflenet_v2_x1_0"),
    "resnet50": _torchvision("resnet50"),
}
MODEL_NAMES = tuple(MODELS)


def check_model(cfg: RunConfig) -> None:
    """Cheap check (no model is built) that `cfg.model` names a model or an importable factory."""
    if is_factory_spec(cfg.model):
        load_factory(cfg.model, "--model")
    elif cfg.model not in MODELS:
        raise ConfigError(f"--model {cfg.model!r} is unknown; choose one of {', '.join(MODEL_NAMES)} "
                          "or give module:function for your own factory")


def build_model(cfg: RunConfig, num_classes: int) -> nn.Module:
    """Build the model with weights drawn from `cfg.seed`, so every rank starts identical."""
    check_model(cfg)
    factory = load_factory(cfg.model, "--model") if is_factory_spec(cfg.model) else MODELS[cfg.model]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = factory(num_classes)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"--model {cfg.model!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model
