"""uint8 on the wire (`common.data.wire`): where a transform can be split, and that the split keeps every
batch bit-identical: the DPU's part per sample, then the host's float steps on the whole uint8 batch,
give the bytes the whole transform gives sample by sample, for v1 and v2 pipelines.

(The tests of this feature that start processes: tests/jobs/test_wire.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset, Subset
from torchvision import transforms as T
from torchvision.transforms import v2

from dpuoffload.common.data.loaders import Sampling
from dpuoffload.common.data.sampling import PerSampleSeeded
from dpuoffload.common.data.wire import Wire, choose, dpu_view, float_tail, plan_split, to_wire
from dpuoffload.common.errors import ConfigError

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Images(Dataset):
    """Twelve random images as PIL (mode RGB, L or F), uint8 HWC arrays or uint8 CHW tensors."""

    def __init__(self, transform, kind: str = "RGB", side: int = 48) -> None:
        gen = np.random.default_rng(5)
        shape = (side, side + 8) if kind in ("L", "F") else (side, side + 8, 3)
        self.raw = [gen.integers(0, 256, shape, dtype=np.uint8) for _ in range(12)]
        self.kind, self.transform = kind, transform

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, i: int):
        a = self.raw[i]
        if self.kind == "array":
            x = a
        elif self.kind == "tensor":
            x = torch.from_numpy(a).permute(2, 0, 1).contiguous()
        elif self.kind == "F":
            x = Image.fromarray(a.astype(np.float32), mode="F")
        else:
            x = Image.fromarray(a, mode=self.kind)
        return self.transform(x), i % 5


PIPELINES = {
    "cifar": lambda: Images(T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                                       T.Normalize(MEAN, STD)])),
    "imagenet": lambda: Images(T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor(),
                                          T.Normalize(MEAN, STD)]), side=64),
    "resize-center": lambda: Images(T.Compose([T.Resize(36), T.CenterCrop(32), T.ToTensor(), T.Normalize(MEAN, STD)])),
    "grayscale": lambda: Images(T.Compose([T.RandomCrop(24), T.ToTensor(), T.Normalize((0.5,), (0.2,))]), kind="L"),
    "array": lambda: Images(T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)]), kind="array"),
    "convert-dtype": lambda: Images(T.Compose([T.RandomCrop(32), T.PILToTensor(), T.ConvertImageDtype(torch.float32),
                                               T.Normalize(MEAN, STD)])),
    "v2": lambda: Images(v2.Compose([v2.RandomResizedCrop(40, antialias=True), v2.RandomHorizontalFlip(),
                                     v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD),
                                     v2.ToPureTensor()]), kind="tensor", side=64),
}


def whole(ds: Dataset, seed: int = 3) -> torch.Tensor:
    seeded = PerSampleSeeded(ds, seed)
    return torch.stack([seeded[i][0] for i in range(len(ds))])


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_split_batches_are_the_whole_transforms_bytes(name):
    ds = PIPELINES[name]()
    split = plan_split(ds, Wire.AUTO)
    assert split is not None and split.host_steps >= 2
    view = dpu_view(ds, split)
    wire = whole(view)
    assert wire.dtype == torch.uint8 and wire.shape[1] in (1, 3)
    got, want = split.host(wire), whole(ds)
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    assert got.numpy().tobytes() == want.numpy().tobytes()  # bit for bit (not just ==: -0.0, NaN)
    assert wire.numel() * 4 == want.numel() * want.element_size()  # 4x fewer bytes


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_the_float_steps_on_a_whole_batch_give_the_same_bytes(name):
    """`HostSteps.batch`: the steps over the batch at once (a GPU host rank's side stream runs them so,
    after the uint8 copy) equal the per-sample path and the whole transform, on the CPU. The same on
    a GPU is `tests/unit/test_device.py`'s gpu-marked test."""
    from dpuoffload.common.train.device import Compute, finished

    ds = PIPELINES[name]()
    split = plan_split(ds, Wire.AUTO)
    wire = whole(dpu_view(ds, split))
    want = whole(ds)
    assert split.host.batch(wire).numpy().tobytes() == want.numpy().tobytes()
    x, y = finished(Compute.of(torch.device("cpu"), "off", True), (wire, torch.arange(len(wire))), split.host.batch)
    assert x.is_contiguous(memory_format=torch.channels_last) and x.contiguous().numpy().tobytes() == \
        want.numpy().tobytes()
    assert finished(Compute(), (want, y), split.host.batch)[0] is want  # float batches (host-built) pass as they are
    assert finished(Compute(), (wire, y), None)[0] is wire


def test_the_users_data_set_is_left_alone_and_subsets_are_seen_through():
    ds = PIPELINES["cifar"]()
    before = ds.transform
    sub = Subset(ds, range(6))
    view = dpu_view(sub, plan_split(sub, Wire.AUTO))
    assert ds.transform is before and isinstance(view, Subset) and view.dataset is not ds
    assert [type(t).__name__ for t in view.dataset.transform.transforms] == ["RandomCrop", "RandomHorizontalFlip",
                                                                             "ToWire"]
    assert view[0][0].dtype == torch.uint8 and sub[0][0].dtype == torch.float32


def test_where_a_split_is_possible():
    steps = PIPELINES["cifar"]().transform.transforms
    assert float_tail(steps) == 2
    jitter = [T.RandomCrop(32), T.ToTensor(), T.ColorJitter(0.4), T.Normalize(MEAN, STD)]
    assert float_tail(jitter) == 0  # random float step after the first float one: stays on the DPU, float wire
    assert float_tail([T.RandomCrop(32), T.PILToTensor()]) == 0  # no float step
    assert float_tail([v2.ToImage(), v2.ToDtype(torch.float32)]) == 0  # no scale: not what ToTensor does
    assert float_tail([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]) == 1
    assert float_tail([T.ToTensor(), T.Lambda(lambda x: x * 2)]) == 0

    class Normalize:  # another library's step of the same name: its arithmetic is unknown, so it stays
        def __call__(self, x):
            return x

    assert float_tail([T.ToTensor(), Normalize()]) == 0


def test_refusals_name_the_step_in_the_way():
    jitter = Images(T.Compose([T.RandomCrop(32), T.ToTensor(), T.ColorJitter(0.4), T.Normalize(MEAN, STD)]))
    assert plan_split(jitter, Wire.AUTO) is None and plan_split(PIPELINES["cifar"](), Wire.FLOAT) is None
    with pytest.raises(ConfigError, match="--wire uint8: ColorJitter comes after the float step ToTensor, and only "
                                          "element-wise steps .* can run on batches bit for bit; use --wire auto"):
        plan_split(jitter, Wire.UINT8)
    with pytest.raises(ConfigError, match="host_steps=3 cannot be split off: ColorJitter is not an element-wise"):
        plan_split(jitter, Wire.AUTO, host_steps=3)
    with pytest.raises(ConfigError, match="has no `transform` attribute"):
        plan_split(torch.utils.data.TensorDataset(torch.zeros(2, 3)), Wire.UINT8)
    with pytest.raises(ConfigError, match="host_steps must be an integer >= 0, got -1"):
        plan_split(jitter, Wire.AUTO, host_steps=-1)
    assert plan_split(PIPELINES["cifar"](), Wire.UINT8, host_steps=0) is None
    assert plan_split(PIPELINES["cifar"](), Wire.FLOAT, host_steps=1).host_steps == 1  # (explicit wins)


def test_choose_keeps_the_float_wire_under_auto_when_an_image_cannot_go_as_uint8():
    floaty = Images(T.Compose([T.CenterCrop(24), T.ToTensor()]), kind="F")
    sampling = Sampling(4)
    chosen = choose(floaty, Wire.AUTO, None, sampling)
    assert chosen.split is None and chosen.layout.dtype == np.float32 and chosen.view is floaty
    with pytest.raises(ConfigError, match="a PIL image of mode F: the uint8 wire takes L, RGB"):
        choose(floaty, Wire.UINT8, None, sampling)
    rgb = choose(PIPELINES["cifar"](), Wire.AUTO, None, sampling)
    assert rgb.host_steps == 2 and rgb.layout.dtype == np.uint8 and rgb.layout.sample_shape == (3, 32, 32)


def test_to_wire_takes_uint8_images_only():
    assert to_wire(np.zeros((4, 5), np.uint8)).shape == (1, 4, 5)
    with pytest.raises(ValueError, match="returns Tensor torch.float32; the uint8 wire takes"):
        to_wire(torch.zeros(3, 4, 4))


def test_auto_keeps_the_float_wire_on_a_gpu_host_rank(monkeypatch):
    """A user's loop on a GPU host rank would run the float steps on its CPU (slower than its GPU takes
    batches): auto means float there; an explicit uint8 is obeyed (the built-in trainer then runs the
    float steps on the GPU, `DpuLoader.defer_float_steps`)."""
    from dpuoffload.common.config import RunConfig
    from dpuoffload.common.modes import Mode
    from dpuoffload.host.library import Job

    on = {"device": "cpu"}
    monkeypatch.setattr(Job, "device", property(lambda self: torch.device(on["device"])))
    auto = Job(0, 1, Mode.DA, cfg=RunConfig(mode="da"))
    uint8 = Job(0, 1, Mode.DA, cfg=RunConfig(mode="da", wire="uint8"))
    assert auto.wire_policy is Wire.AUTO and uint8.wire_policy is Wire.UINT8
    on["device"] = "cuda"
    assert auto.wire_policy is Wire.FLOAT and uint8.wire_policy is Wire.UINT8
