"""User factories that tests name as `--dataset tests.user_factories:...` (and `--model ...`)."""

import torch
from torch.utils.data import Dataset, TensorDataset


class TinyDataset(Dataset):
    """Three classes of 16x16 images: 24 train / 9 val samples, with a `.classes` attribute."""

    classes = ["circle", "square", "triangle"]

    def __init__(self, train: bool) -> None:
        n = 24 if train else 9
        gen = torch.Generator().manual_seed(0 if train else 1)
        self.images = torch.randn(n, 3, 16, 16, generator=gen)
        self.labels = [i % 3 for i in range(n)]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]


def tiny_dataset(root, train, download):
    ds = TinyDataset(train)
    ds.factory_args = (root, train, download)  # lets tests check what the factory was given
    return ds


def tiny_dataset_no_classes(root, train, download):
    """No `.classes`: the run must say --num-classes."""
    n = 12 if train else 4
    return TensorDataset(torch.zeros(n, 3, 8, 8), torch.arange(n) % 4)


def not_a_dataset(root, train, download):
    return 42


def empty_dataset(root, train, download):
    return TensorDataset(torch.zeros(0, 3, 8, 8), torch.zeros(0, dtype=torch.long))


def tiny_model(num_classes):
    """A small user model factory: `--model tests.user_factories:tiny_model`."""
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(4, num_classes))


def dropout_model(num_classes):
    """A model that draws from the global RNG while training (dropout): trains to the bit only if every
    rank seeds it alike and nothing else draws from it in one mode and not in another."""
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(),
                               torch.nn.Dropout(0.5), torch.nn.Linear(128, num_classes))


def wide_model(num_classes):
    """A model whose state spans several staged chunks (`STAGED_CHUNK_BYTES`): a 2.6M-parameter
    linear layer (10 MB, wider than one chunk) on a small convolution; ~21 MB with momentum."""
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.AdaptiveAvgPool2d(8), torch.nn.Flatten(),
                               torch.nn.Linear(512, 5000), torch.nn.ReLU(), torch.nn.Linear(5000, num_classes))


class _FailsOnHostRank1(torch.nn.Module):
    """Raises in forward on world rank 1 at its 3rd training step: a user bug mid-training."""

    def __init__(self, num_classes):
        super().__init__()
        self.body = tiny_model(num_classes)
        self.calls = 0

    def forward(self, x):
        import os

        self.calls += self.training
        if self.training and self.calls == 3 and os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
            raise RuntimeError("boom in user model on purpose")
        return self.body(x)


def failing_model(num_classes):
    return _FailsOnHostRank1(num_classes)


class RandomSizeCrop:
    """A transform whose output size varies from sample to sample (not batchable in --mode da)."""

    def __call__(self, img):
        size = int(torch.randint(8, 16, (1,)))
        return img[:, :size, :size]

    def __repr__(self):
        return "RandomSizeCrop(8..16)"


class _Varying(Dataset):
    classes = ["a", "b"]
    transform = RandomSizeCrop()

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.transform(torch.zeros(3, 16, 16)), i % 2


def varying_shapes(root, train, download):
    return _Varying()


class Photos(Dataset):
    """Thirty-two 20x20 RGB images with a torchvision transform (for the numerics check's jobs)."""

    classes = ["a", "b", "c", "d"]

    def __init__(self, train: bool, transform) -> None:
        import numpy as np
        from PIL import Image

        gen = np.random.default_rng(0 if train else 1)
        n = 32 if train else 8
        self.images = [Image.fromarray(gen.integers(0, 256, (20, 20, 3), dtype=np.uint8)) for _ in range(n)]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), i % 4


def photos_pil(root, train, download):
    """PIL crop and flip, then ToTensor + Normalize: steps that round the same on every CPU."""
    from torchvision import transforms as T

    steps = [T.RandomCrop(16, padding=2), T.RandomHorizontalFlip()] if train else [T.CenterCrop(16)]
    return Photos(train, T.Compose(steps + [T.ToTensor(), T.Normalize((0.5,) * 3, (0.25,) * 3)]))


def photos_jitter(root, train, download):
    """ColorJitter on float tensors: its factors are float32 draws and its contrast a float32 mean, both of
    which round differently with another CPU kernel level (ATEN_CPU_CAPABILITY) or architecture."""
    from torchvision import transforms as T

    steps = [T.RandomCrop(16, padding=2), T.ToTensor(), T.ColorJitter(0.4, 0.4, 0.4, 0.1)] if train else \
        [T.CenterCrop(16), T.ToTensor()]
    return Photos(train, T.Compose(steps + [T.Normalize((0.5,) * 3, (0.25,) * 3)]))
