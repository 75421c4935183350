"""Data set factories of increasing augmentation weight, for `--dataset benchmarks.augfactories:NAME`.

All read the same Tiny-ImageNet-format JPEG ImageFolder (`--data .../tinyimagenet`, 64x64 images),
so every weight pays the JPEG decode; they differ only in the training transform:

- `light`:  RandomCrop(64, padding 4) + flip (CIFAR-style)
- `medium`: RandomResizedCrop(64) + flip (the built-in tinyimagenet transform)
- `randaug`: RandomResizedCrop(64) + flip + RandAugment(2 ops, magnitude 9)
- `heavy`:  `randaug` + ColorJitter + GaussianBlur (a SimCLR-style pipeline)

Validation is Resize + CenterCrop for all. The factory signature is `fn(root, train, download)`.

Also a model factory (`--model benchmarks.augfactories:vgg11`, `fn(num_classes)`): torchvision's VGG-11,
about 130M parameters (most in its classifier), the checkpoint benchmark's ~100M-parameter case: its
state is 5x resnet50's while a 64x64 step stays cheap on a CPU.
"""

from __future__ import annotations

from pathlib import Path

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
WEIGHTS = ("light", "medium", "randaug", "heavy")


def _train_steps(weight: str) -> list:
    from torchvision import transforms as T

    if weight == "light":
        return [T.RandomCrop(64, padding=4), T.RandomHorizontalFlip()]
    if weight == "medium":
        return [T.RandomResizedCrop(64), T.RandomHorizontalFlip()]
    steps = [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.RandAugment(num_ops=2, magnitude=9)]
    if weight == "randaug":
        return steps
    return steps + [T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.GaussianBlur(5, sigma=(0.1, 2.0))]


def _build(weight: str, root: str, train: bool):
    from torchvision import datasets
    from torchvision import transforms as T

    steps = _train_steps(weight) if train else [T.Resize(64), T.CenterCrop(64)]
    transform = T.Compose(steps + [T.ToTensor(), T.Normalize(MEAN, STD)])
    return datasets.ImageFolder(str(Path(root) / ("train" if train else "val")), transform=transform)


def light(root, train, download):
    return _build("light", root, train)


def medium(root, train, download):
    return _build("medium", root, train)


def randaug(root, train, download):
    return _build("randaug", root, train)


def heavy(root, train, download):
    return _build("heavy", root, train)


def vgg11(num_classes: int):
    import torchvision

    return torchvision.models.vgg11(weights=None, num_classes=num_classes)
