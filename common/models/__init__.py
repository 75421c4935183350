"""Models: by name (`zoo`: CIFAR ResNets, torchvision models) or a user `module:function` factory."""

from dpuoffload.common.models.zoo import build_model, check_model

__all__ = ["build_model", "check_model"]
