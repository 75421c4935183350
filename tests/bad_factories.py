"""User factories with the mistakes a new user makes; tests/jobs/test_prelaunch.py names them as
`--model tests.bad_factories:...` / `--dataset tests.bad_factories:...` and expects dpurun to refuse
them before launch, in one line."""

import os

import torch
from torch.utils.data import Dataset, TensorDataset


def model_without_num_classes():
    """Wrong signature: dpuoffload calls `factory(num_classes)`."""
    return torch.nn.Linear(4, 2)


def dataset_without_download(root, train):
    """Wrong signature: dpuoffload calls `factory(root, train, download)`."""
    return TensorDataset(torch.zeros(8, 3, 8, 8), torch.zeros(8, dtype=torch.long))


class _PilImages(Dataset):
    """Items are (PIL image, label): the user forgot `transforms.ToTensor()`."""

    classes = ["a", "b"]

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        from PIL import Image

        return Image.new("RGB", (8, 8)), i % 2


def pil_images(root, train, download):
    return _PilImages()


def four_labels(root, train, download):
    """Labels 0..3 and no `.classes`: `--num-classes` decides the classifier width."""
    n = 12 if train else 4
    return TensorDataset(torch.zeros(n, 3, 8, 8), torch.arange(n) % 4)


def image_folder(root, train, download):
    """An ImageFolder under `root/train` or `root/val`, as many user factories are written."""
    from torchvision import datasets, transforms

    split = os.path.join(root, "train" if train else "val")
    return datasets.ImageFolder(split, transform=transforms.ToTensor())
