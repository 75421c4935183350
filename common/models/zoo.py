"""Models by name: CIFAR-style ResNets, torchvision models, user `module:function` factories.

`resnet20` / `resnet56` are the 6n+2 CIFAR ResNets the published DPU evaluation trains
(`resnet_cifar`); `shufflenet_v2` and `resnet50` come unchanged from torchvision. torch is imported
only when a model is built, so `check_model` (run by `dpurun` before launching) stays instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.factories import is_factory_spec, load_factory

if TYPE_CHECKING:
    from torch import nn


def _cifar_resnet(depth: int) -> Callable[[int], "nn.Module"]:
    def build(num_classes: int) -> "nn.Module":
        from dpuoffload.common.models.resnet_cifar import CifarResNet

        return CifarResNet(depth, num_classes)

    return build


def _torchvision(name: str) -> Callable[[int], "nn.Module"]:
    def build(num_classes: int) -> "nn.Module":
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)

    return build


MODELS: dict[str, Callable[[int], "nn.Module"]] = {
    "resnet20": _cifar_resnet(20),
    "resnet56": _cifar_resnet(56),
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


def build_model(cfg: RunConfig, num_classes: int) -> "nn.Module":
    """Build the model with weights drawn from `cfg.seed`, so every rank starts identical."""
    import torch
    from torch import nn

    check_model(cfg)
    factory = load_factory(cfg.model, "--model") if is_factory_spec(cfg.model) else MODELS[cfg.model]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = factory(num_classes)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"--model {cfg.model!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model
