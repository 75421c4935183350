"""Models by name and by module:function."""

import pytest
import torch

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.models.zoo import build_model, check_model


def n_params(m):
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("name, params", [("resnet20", 269_722), ("resnet56", 853_018)])
def test_cifar_resnets_have_published_sizes(name, params):
    model = build_model(RunConfig(model=name), 10)
    assert n_params(model) == params  # He et al. 2016, Table 6: 0.27M and 0.85M (option-A shortcuts)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("name", ["shufflenet_v2", "resnet50"])
def test_torchvision_models(name):
    model = build_model(RunConfig(model=name), 10)
    model.eval()
    assert model(torch.zeros(1, 3, 64, 64)).shape == (1, 10)


def test_same_seed_same_weights():
    a = build_model(RunConfig(seed=1), 10).state_dict()
    b = build_model(RunConfig(seed=1), 10).state_dict()
    c = build_model(RunConfig(seed=2), 10).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_user_factory():
    model = build_model(RunConfig(model="tests.user_factories:tiny_model"), 7)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 7)


@pytest.mark.parametrize("name, message", [
    ("resnet21", "--model 'resnet21' is unknown"),
    ("nosuchmodule:f", "cannot import module 'nosuchmodule'"),
    ("tests.user_factories:missing", "has no callable 'missing'"),
    ("tests.user_factories:", "expected module:function"),
])
def test_bad_model_names(name, message):
    with pytest.raises(ConfigError) as e:
        check_model(RunConfig(model=name))
    assert message in str(e.value)
