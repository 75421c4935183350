"""Data set factories of `benchmarks/gpu.py`, for `--dataset benchmarks.gpufactories:NAME`.

The issue's augmentation, the one every ImageNet training runs: JPEG decode + RandomResizedCrop
+ horizontal flip + ToTensor + Normalize, at a crop of 224 px (resnet50 on 500x375 JPEGs), 64 px
(shufflenet_v2 on 64x64 JPEGs) or 32 px (`--quick` on a CPU), over the ImageFolder that
`benchmarks/gpu.py` writes (`train/<class>/`, `val/<class>/`). Validation resizes to 8/7 of the
crop and center-crops, as torchvision's ImageNet recipe. The signature is `fn(root, train, download)`;
the DPU ranks, the host's workers and the DataLoader peer all build the same one.
"""

from __future__ import annotations

from pathlib import Path

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def build(root: str, train: bool, crop: int):
    """torchvision's ImageFolder of `root/train` or `root/val` with the issue's transform at `crop` px."""
    from torchvision import datasets
    from torchvision import transforms as T

    if train:
        steps = [T.RandomResizedCrop(crop), T.RandomHorizontalFlip()]
    else:
        steps = [T.Resize(round(crop * 8 / 7)), T.CenterCrop(crop)]
    transform = T.Compose(steps + [T.ToTensor(), T.Normalize(MEAN, STD)])
    return datasets.ImageFolder(str(Path(root) / ("train" if train else "val")), transform=transform)


def crop224(root, train, download):
    return build(root, train, 224)


def crop64(root, train, download):
    return build(root, train, 64)


def crop32(root, train, download):
    return build(root, train, 32)
