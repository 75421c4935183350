"""The public API without dpurun (pure, no MPI): the local fallback, argument errors, script mode parsing.

(The tests of this feature that start processes: tests/jobs/test_api.py.)
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.data.loaders import Sampling
from dpuoffload.common.data.streams import OpenLoader, decode, encode
from dpuoffload.common.errors import ConfigError
from dpuoffload.launch.cli import split_script
from dpuoffload.launch.command import LaunchSpec, build_command
from tests.mpijobs import REPO


class Noise(Dataset):
    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int):
        return torch.rand(2, 3) + i, i % 3


class Fixed(Noise):
    def __getitem__(self, i: int):
        return torch.full((2, 3), i / 7.0), i % 3


@pytest.fixture()
def local_job(monkeypatch):
    import dpuoffload.host.library as library

    for var in ("DPUOFFLOAD_ARGS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(library, "_job", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job = library.init()
    return job, caught


def test_without_dpurun_init_warns_once_and_loads_here(local_job):
    job, caught = local_job
    assert (job.rank, job.size, job.offloaded, job.comm) == (0, 1, False, None)
    assert len(caught) == 1 and "not started by dpurun" in str(caught[0].message)
    assert "dpurun -- --mode da SCRIPT" in str(caught[0].message)


@pytest.mark.parametrize("shuffle, drop_last", [(True, False), (False, True)])
def test_local_loader_equals_torch_dataloader_over_seeded(local_job, shuffle, drop_last):
    import dpuoffload as dpu

    job, _ = local_job
    loader = job.loader(Noise(), batch_size=4, seed=7, shuffle=shuffle, drop_last=drop_last)
    seeded = dpu.seeded(Noise(), 7)
    sampler = DistributedSampler(seeded, num_replicas=1, rank=0, shuffle=shuffle, seed=7)
    reference = DataLoader(seeded, batch_size=4, sampler=sampler, drop_last=drop_last)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        seeded.set_epoch(epoch)
        ours = list(loader.epoch(epoch))
        theirs = list(reference)
        assert len(ours) == len(theirs) == len(loader)
        for (x, y), (rx, ry) in zip(ours, theirs):
            assert torch.equal(x, rx) and torch.equal(y, ry)
    job.finish()


def test_loader_arguments_are_checked(local_job):
    job, _ = local_job
    with pytest.raises(ConfigError, match="batch_size must be an integer >= 1"):
        job.loader(Noise(), batch_size=0)
    with pytest.raises(ConfigError, match="map-style data set"):
        job.loader(iter([1, 2]), batch_size=2)
    loader = job.loader(Noise(), batch_size=5)
    with pytest.raises(ConfigError, match=r"need 0 <= start <= stop <= 5"):
        loader.epoch(0, start=6)
    job.finish()
    with pytest.raises(ConfigError, match="job.finish\\(\\) was called"):
        job.loader(Noise(), batch_size=2)


def test_local_validate_returns_every_epoch_and_needs_the_same_objects(local_job):
    from dpuoffload.common.train.evaluation import evaluate_sums, metrics_from_sums

    job, _ = local_job
    model, data = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 3)), Fixed()
    first = job.validate(model, data, 0, batch_size=5)
    assert list(first) == [0] and list(job.validate(model, data, 1, batch_size=5)) == [0, 1]
    loss, accuracy = metrics_from_sums(evaluate_sums(model, data, range(len(data)), 5))
    assert job.finish() == {e: {"loss": loss, "accuracy": accuracy, "count": 23} for e in (0, 1)}
    with pytest.raises(ConfigError, match="job.finish\\(\\) was called"):
        job.validate(model, data, 2)


def test_validate_refuses_another_model_after_the_first(local_job):
    job, _ = local_job
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 3))
    job.validate(model, Noise(), 0)
    with pytest.raises(ConfigError, match="pass the same model and validation set objects every epoch"):
        job.validate(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(6, 3)), Noise(), 1)
    job.finish()


def test_a_lambda_transform_is_named_as_what_cannot_be_sent():
    data = Noise()
    data.transform = lambda x: x
    with pytest.raises(ConfigError, match=r"cannot send the data set \(Noise\) to its DPU rank: .*instead of lambdas"):
        encode(OpenLoader(0, data, Sampling(4)))


def test_main_module_classes_are_found_in_the_users_script(tmp_path):
    """`__main__.Thing` pickled on the host is rebuilt on the DPU rank from the script, without running
    the script's `if __name__ == "__main__":` block."""
    script = tmp_path / "train.py"
    script.write_text("class Thing:\n    def __init__(self, v):\n        self.v = v\n"
                      "if __name__ == '__main__':\n    raise SystemExit('the main block must not run')\n")
    fake_main = type(sys)("__main__")
    exec(script.read_text().split("if __name__")[0], fake_main.__dict__)
    fake_main.Thing.__module__ = "__main__"
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = fake_main
    try:
        blob = encode(OpenLoader(0, fake_main.Thing(41), Sampling(2)))
    finally:
        sys.modules["__main__"] = saved
    message = decode(blob, str(script))
    assert type(message.dataset).__module__ == "__mp_main__" and message.dataset.v == 41


@pytest.mark.parametrize("args, expected", [
    (["--mode", "da", "train.py", "--epochs", "2"], (["--mode", "da"], "train.py", ["--epochs", "2"])),
    (["--data", "x.py", "--mode", "da"], (["--data", "x.py", "--mode", "da"], None, [])),
    (["--mode", "none", "--no-progress", "a/b.py"], (["--mode", "none", "--no-progress"], "a/b.py", [])),
    (["--mode", "da"], (["--mode", "da"], None, [])),
])
def test_split_script(args, expected):
    assert split_script(args) == expected


def test_script_mode_command_line():
    spec = LaunchSpec(mpirun="mpirun", host_python="py", dpu_python="py", host_cores=(0,), dpu_cores=(1,),
                      training_args=("--mode", "da", "--script", "t.py"), script="t.py", script_args=("--lr", "1"))
    cmd = build_command(spec)
    host = cmd[cmd.index("-np"): cmd.index(":")]
    assert host[-4:] == ["py", "t.py", "--lr", "1"]
    assert "DPUOFFLOAD_ARGS=--mode da --script t.py" in host
    assert cmd[-7:] == ["py", "-m", "dpuoffload.dpu", "--mode", "da", "--script", "t.py"]


@pytest.mark.parametrize("flags, message", [
    (["--mode", "naive"], "--mode naive with a training script: the public API offloads data loading and validation"),
    (["--mode", "mv", "--mv-dpu-fraction", "auto"], "--mv-dpu-fraction auto needs the built-in trainer"),
    (["--epochs", "5"], "--epochs configures dpurun's built-in trainer"),
    (["--preset", "debug"], "configures dpurun's built-in trainer"),
])
def test_script_mode_refuses_what_the_script_owns(flags, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_run_config([*flags, "--script", "t.py"])


def test_script_mode_keeps_the_offload_flags():
    cfg = parse_run_config(["--mode", "da", "--da-buffers", "8", "--peer-timeout", "30", "--script", "t.py"])
    assert (cfg.da_buffers, cfg.peer_timeout, cfg.script) == (8, 30.0, "t.py")


def test_the_examples_name_their_dpu_lines():
    """docs/own-script.md promise: each example marks the lines that make it a dpuoffload script."""
    for name in ("plain_loop.py", "horovod_loop.py", "ddp_loop.py", "lightning_loop.py"):
        text = (REPO / "examples" / name).read_text()
        assert "import dpuoffload as dpu  # dpu" in text and "job = dpu.init()  # dpu" in text
        assert "job.finish()  # dpu" in text


def test_hvd_init_default_keeps_a_comm_the_script_passes(monkeypatch):
    """Under dpurun a plain hvd.init() gets the host ranks; hvd.init(comm=...) / hvd.init(x) stay as given."""
    import types

    import dpuoffload.host.library as library

    calls = []
    fake = types.ModuleType("horovod.torch")
    fake.init = lambda comm=None, process_sets=None: calls.append((comm, process_sets))
    monkeypatch.setitem(sys.modules, "horovod.torch", fake)
    library._default_horovod_comm("HOSTS")
    library._default_horovod_comm("HOSTS")  # (twice: wrapped once)
    fake.init()
    fake.init(comm="MINE")
    fake.init("POS", process_sets="P")
    fake.init(process_sets="Q")
    assert calls == [("HOSTS", None), ("MINE", None), ("POS", "P"), ("HOSTS", "Q")]


def test_checkpoint_without_ckpt_dir_warns_once_and_checks_its_arguments(local_job):
    job, _ = local_job
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="pass global_step="):
        job.checkpoint(model, opt, epoch=1)  # no loader to count steps by
    with pytest.raises(ConfigError, match="epoch must be an integer >= 0, got -1"):
        job.checkpoint(model, opt, epoch=-1, global_step=3)
    with pytest.raises(ConfigError, match="extra must be JSON data"):
        job.checkpoint(model, opt, epoch=1, global_step=3, extra={"model": model})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job.checkpoint(model, opt, epoch=1, global_step=3)
        job.checkpoint(model, opt, epoch=2, global_step=4)
    assert len(caught) == 1 and "no checkpoint is written: start the script with dpurun -- --ckpt-dir" in str(
        caught[0].message)
    assert job.restore(model, opt) is None  # no --resume: start from scratch
    job.loader(Noise(), batch_size=4)
    job.state.last_global_step = 9
    with pytest.raises(ConfigError, match="global_step 8 is not after the last checkpoint's \\(9\\)"):
        job.checkpoint(model, opt, epoch=1, step=2)  # 1 * 6 steps + 2


def test_script_mode_takes_the_checkpoint_flags_and_keeps_the_trainers():
    cfg = parse_run_config(["--ckpt-dir", "c", "--resume", "latest", "--ckpt-keep", "3", "--script", "t.py"])
    assert cfg.checkpointing and (cfg.resume, cfg.ckpt_keep) == ("latest", 3)
    assert not parse_run_config(["--script", "t.py"]).checkpointing
    with pytest.raises(ConfigError, match="--ckpt-every configures dpurun's built-in trainer"):
        parse_run_config(["--ckpt-dir", "c", "--ckpt-every", "5", "--script", "t.py"])


@pytest.mark.parametrize("make", [
    lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (s + 1)),
    lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=10),
])
def test_any_scheduler_round_trips_through_the_json_meta(make):
    """A script's scheduler goes into the checkpoint's JSON meta and comes back in the same state."""
    import json

    from dpuoffload.common.state.trainstate import load_scheduler, scheduler_state

    def fresh():
        opt = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        return opt, make(opt)

    opt, sched = fresh()
    for _ in range(3):
        opt.step()
        sched.step()
    state = json.loads(json.dumps(scheduler_state(sched)))
    opt2, sched2 = fresh()
    opt2.load_state_dict(opt.state_dict())  # (restore() loads the optimizer first: its lr is state too)
    load_scheduler(sched2, state, len(opt2.param_groups))
    for _ in range(2):
        sched.step()
        sched2.step()
    assert sched2.get_last_lr() == sched.get_last_lr() and sched2.last_epoch == sched.last_epoch == 5
    assert scheduler_state(None) is None


def test_an_iterator_made_and_dropped_uses_no_epoch(local_job):
    """Lightning calls iter(loader) once to check it is iterable; a DataLoader's epochs do not move."""
    job, _ = local_job
    loader = job.loader(Noise(), batch_size=4, seed=1)
    iter(loader)
    first = [x for x, _ in loader]
    assert all(torch.equal(a, b) for a, b in zip(first, (x for x, _ in loader.epoch(0))))
    assert not torch.equal(next(iter(loader))[0], first[0])  # then epoch 1


def test_a_skipped_clone_step_and_an_unserved_clone_are_named():
    """--clone-at N: the host ranks must hand the state off at step N, the clone ranks must take it."""
    from types import SimpleNamespace

    from dpuoffload.common.modes import Mode
    from dpuoffload.common.runtime.roles import Role
    from dpuoffload.host.library import Job

    cfg = parse_run_config(["--clone-at", "3", "--script", "t.py"])
    host = Job(0, 1, Mode.NONE, None, SimpleNamespace(role=Role.HOST, clone_ranks=(2,)), cfg)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host.checkpoint(model, opt, epoch=0, step=2, global_step=2)
        with pytest.raises(ConfigError, match="--clone-at 3: job.checkpoint was called at global step 5 without "
                                              "passing step 3 \\(the last was 2\\)"):
            host.checkpoint(model, opt, epoch=0, step=5, global_step=5)
    with pytest.raises(ConfigError, match="the script never called job.checkpoint at global step 3"):
        host.finish()
    clone = Job(0, 1, Mode.NONE, None, SimpleNamespace(role=Role.CLONE, clone_ranks=(2,)), cfg)
    assert clone.is_clone and not clone.offloaded
    with pytest.raises(ConfigError, match="a clone rank starts from the host ranks' state: call job.restore"):
        clone.finish()
