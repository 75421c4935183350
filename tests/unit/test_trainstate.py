"""Training state capture / restore and the checkpoint files, in one process (no MPI).

The keeper's write path is driven directly (`shard_blob`, `write_atomic`, `write_manifest`) from
real slices of a real model + SGD state, so reading back proves the format round-trips to the bit.
"""

import json
import random

import numpy as np
import pytest
import torch

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.state import ckptfiles
from dpuoffload.common.state.resume import config_dict
from dpuoffload.common.state.sharding import pack_pieces, packed_nbytes, plan_shards
from dpuoffload.common.state.trainstate import (
    EpochProgress,
    EpochSpan,
    Position,
    capture_local,
    capture_meta,
    catalog_of,
    describe_position,
    epoch_spans,
    parse_local,
    reslice_position,
    restore,
    set_rng,
    shared_tensors,
)
from dpuoffload.common.train.training_state import build_optimizer, lr_factor
from dpuoffload.host.clone import clone_config, state_sha256
from dpuoffload.launch import export as export_cli


# ----------------------------------------------------------------------------------- positions
def test_epoch_spans_full_run():
    assert epoch_spans(4, 2, Position(), None) == [EpochSpan(0, 0, 4, True), EpochSpan(1, 0, 4, True)]


def test_epoch_spans_resume_mid_epoch_and_stop_mid_epoch():
    spans = epoch_spans(4, 3, Position(epoch=0, step=3, global_step=3), stop_at=9)
    assert spans == [EpochSpan(0, 3, 4, True), EpochSpan(1, 0, 4, True), EpochSpan(2, 0, 1, False)]


def test_epoch_spans_stop_on_epoch_boundary_completes_it():
    assert epoch_spans(4, 3, Position(), stop_at=4) == [EpochSpan(0, 0, 4, True)]
    assert epoch_spans(4, 3, Position(1, 0, 4), stop_at=4) == []


def test_reslice_keeps_the_samples_done():
    pos = Position(epoch=1, step=6, global_step=22)
    assert reslice_position(pos, 32, 32, 8) == pos
    assert reslice_position(pos, 32, 16, 16) == Position(1, 12, 22)   # 2 hosts -> 1 host
    assert reslice_position(pos, 16, 64, 4) == Position(1, 1, 22)     # rounds down: never skips samples
    assert reslice_position(Position(2, 0, 30), 32, 16, 16) == Position(2, 0, 30)


def test_describe_position():
    assert describe_position(Position(2, 0, 64)) == "end of epoch 2 (global step 64)"
    assert describe_position(Position(2, 5, 69)) == "epoch 3, step 5 done (global step 69)"


# ------------------------------------------------------------------------------- state round trip
def trained(seed: int = 0, steps: int = 2, width: int = 8):
    """A small BN model, SGD(momentum) and a LambdaLR after a few real steps (momentum buffers exist)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, width, 3), torch.nn.BatchNorm2d(width), torch.nn.Flatten(),
                                torch.nn.Linear(width * 6 * 6, 10))
    cfg = RunConfig(lr=0.1)
    opt = build_optimizer(cfg, model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor("cosine", s, 10))
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), torch.tensor([1, 2, 3, 4])).backward()
        opt.step()
        sched.step()
    return cfg, model, opt, sched


def test_local_state_round_trips_rng_buffers_and_progress():
    _, model, _, _ = trained()
    random.seed(5), np.random.seed(6), torch.manual_seed(7)
    progress = EpochProgress(np.array([1.5, 3.0, 8.0]), [0.25, 0.5])
    blob = capture_local(model, progress)
    expect = (torch.rand(3), np.random.rand(3), random.random())
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    local = parse_local(blob)
    set_rng(local.rng)
    assert torch.equal(torch.rand(3), expect[0]) and np.array_equal(np.random.rand(3), expect[1])
    assert random.random() == expect[2]
    assert local.progress.losses == [0.25, 0.5] and local.progress.sums.tolist() == [1.5, 3.0, 8.0]
    assert set(local.buffers) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}


def test_a_cpu_runs_local_state_carries_no_gpu_rng_and_restores_without_one():
    _, model, _, _ = trained()
    local = parse_local(capture_local(model, EpochProgress()))
    assert local.rng["cuda"] is None or torch.cuda.is_initialized()
    set_rng(local.rng)  # (no GPU state to restore: the CPU's alone)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bash scripts/test.sh -m gpu on a GPU "
                                                          "node)")
@pytest.mark.gpu
def test_a_gpu_runs_local_state_carries_every_gpus_rng_so_dropout_resumes_alike():
    _, model, _, _ = trained()
    torch.cuda.manual_seed_all(11)
    blob = capture_local(model, EpochProgress())
    expect = torch.nn.functional.dropout(torch.ones(64, device="cuda"), 0.5)
    torch.cuda.manual_seed_all(0)
    set_rng(parse_local(blob).rng)
    assert torch.equal(torch.nn.functional.dropout(torch.ones(64, device="cuda"), 0.5), expect)


def write_checkpoint(root, cfg, model, opt, sched, hosts: int, pos: Position):
    """What host ranks send and keepers write, done in-process: `hosts` slices of the live state."""
    tensors = shared_tensors(model, opt)
    plan = plan_shards([t.numel() for t in tensors.values()], hosts, 64)
    meta = json.loads(json.dumps(capture_meta(pos, catalog_of(tensors), opt, sched, model, {
        "host_ranks": hosts, "threshold": 64, "steps_per_epoch": 4, "config": config_dict(cfg)})))
    directory = ckptfiles.step_dir(root, pos.global_step)
    directory.mkdir(parents=True)
    files = {}
    for k in range(hosts):
        buf = np.empty(packed_nbytes(list(tensors.values()), plan.rank_pieces(k)), dtype=np.uint8)
        pack_pieces(list(tensors.values()), plan.rank_pieces(k), buf)
        blob = ckptfiles.shard_blob(meta["catalog"], plan, k, buf, {})
        files[ckptfiles.shard_name(k)] = ckptfiles.write_atomic(directory / ckptfiles.shard_name(k), blob)
        files[ckptfiles.local_name(k)] = ckptfiles.write_atomic(directory / ckptfiles.local_name(k),
                                                                capture_local(model, EpochProgress()))
    ckptfiles.write_manifest(directory, meta, files, plan)
    return directory


@pytest.mark.parametrize("hosts", [1, 3])
def test_checkpoint_files_restore_state_to_the_bit(tmp_path, hosts):
    cfg, model, opt, sched = trained()
    directory = write_checkpoint(tmp_path, cfg, model, opt, sched, hosts, Position(0, 2, 2))
    assert ckptfiles.committed(tmp_path) == [directory]
    ckpt = ckptfiles.load(directory)
    _, model2, opt2, sched2 = trained(seed=1, steps=1)
    restore(model2, opt2, sched2, ckpt.meta, ckpt.shared, ckpt.locals[0])
    assert state_sha256(model2, opt2) == state_sha256(model, opt)
    assert sched2.last_epoch == sched.last_epoch and sched2.get_last_lr() == sched.get_last_lr()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_export_writes_a_plain_loadable_state_dict(tmp_path):
    cfg, model, opt, sched = trained()
    write_checkpoint(tmp_path / "ck", cfg, model, opt, sched, 2, Position(1, 0, 2))
    assert export_cli.main([str(tmp_path / "ck"), str(tmp_path / "out.pt")]) == 0
    plain = torch.load(tmp_path / "out.pt", weights_only=True)
    _, model2, opt2, _ = trained(seed=1, steps=1)
    model2.load_state_dict(plain["model"])
    opt2.load_state_dict(plain["optimizer"])
    assert state_sha256(model2, opt2) == state_sha256(model, opt)
    assert (plain["epoch"], plain["step"], plain["global_step"]) == (1, 0, 2)


def test_corrupt_and_missing_shards_are_named(tmp_path, capsys):
    cfg, model, opt, sched = trained()
    directory = write_checkpoint(tmp_path, cfg, model, opt, sched, 2, Position(0, 2, 2))
    shard = directory / ckptfiles.shard_name(1)
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ckptfiles.CheckpointError, match=r"shard-00001.safetensors is corrupt"):
        ckptfiles.load(directory)
    assert export_cli.main([str(directory), str(tmp_path / "x.pt")]) == 2
    assert "shard-00001.safetensors is corrupt" in capsys.readouterr().err
    assert not (tmp_path / "x.pt").exists()
    (directory / ckptfiles.local_name(0)).unlink()
    shard.write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(ckptfiles.CheckpointError, match=r"local-00000.safetensors is missing"):
        ckptfiles.load(directory)


def test_only_committed_directories_count_and_prune_keeps_newest(tmp_path):
    cfg, model, opt, sched = trained()
    for step in (2, 4, 6):
        write_checkpoint(tmp_path, cfg, model, opt, sched, 1, Position(0, step, step))
    (ckptfiles.step_dir(tmp_path, 8)).mkdir()          # a write that never committed
    (ckptfiles.step_dir(tmp_path, 5)).mkdir()          # an older failed one
    assert ckptfiles.resolve("latest", str(tmp_path)).name == "step-000000006"
    with pytest.raises(ckptfiles.CheckpointError, match="no COMMITTED marker"):
        ckptfiles.resolve(str(ckptfiles.step_dir(tmp_path, 8)), None)
    removed = {p.name for p in ckptfiles.prune(tmp_path, keep=2)}
    assert removed == {"step-000000002", "step-000000005"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000004", "step-000000006", "step-000000008"]


def test_resume_latest_without_checkpoints_says_what_to_do(tmp_path):
    with pytest.raises(ckptfiles.CheckpointError, match="no complete checkpoint .* start without --resume"):
        ckptfiles.resolve("latest", str(tmp_path))


# ------------------------------------------------------------------------------------ config
def test_checkpoint_flags_are_checked():
    with pytest.raises(ConfigError, match="need --ckpt-dir"):
        RunConfig(ckpt_every=5)
    with pytest.raises(ConfigError, match="not naive"):
        RunConfig(mode="naive", ckpt_dir="/tmp/x", ckpt_every=5)
    with pytest.raises(ConfigError, match="--ckpt-keep must be >= 1"):
        RunConfig(ckpt_keep=0)
    with pytest.raises(ConfigError, match="only applies with --clone-at"):
        RunConfig(clone_override=("lr=0.1",))
    assert RunConfig(ckpt_dir="/x", stop_at_step=3).checkpointing
    assert not RunConfig(ckpt_dir="/x").checkpointing


def test_clone_overrides_parse_and_reject_unknown_keys():
    cfg = RunConfig(clone_at=5, clone_override=("lr=0.01", "seed=3", "weight-decay=0"), log_dir="/l")
    clone = clone_config(cfg)
    assert (clone.lr, clone.seed, clone.weight_decay, clone.log_dir, clone.clone_at) == (0.01, 3, 0.0, "/l/clone", None)
    with pytest.raises(ConfigError, match="KEY one of"):
        clone_config(RunConfig(clone_at=5, clone_override=("model=resnet56",)))
    with pytest.raises(ConfigError, match="is not a valid lr"):
        clone_config(RunConfig(clone_at=5, clone_override=("lr=fast",)))


def test_a_checkpoint_commits_only_with_every_host_ranks_files():
    files = {ckptfiles.shard_name(0): {}, ckptfiles.local_name(0): {}, ckptfiles.local_name(1): {}}
    assert ckptfiles.missing_senders(files, 2) == [1] and ckptfiles.missing_senders(files, 1) == []
