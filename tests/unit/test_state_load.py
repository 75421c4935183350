"""One way to load state (`common.state.load.load_state`) and typed checkpoint metadata, in one process (no MPI).

- the meta's one writer emits the bytes the old dict-building code wrote (hand-off, script, spare
  and manifest forms), and its one reader reads them back to the same object;
- the one re-slicing rule keeps the epoch's samples done, caps the step only where the epoch
  length is known, and is the host-rank ratio a script's restore used;
- every origin (checkpoint files, DPU-memory / clone hand-offs, a spare's packed state) loads
  through the same path: to the bit, RNG last, each rank its own local state (and every rank's epoch
  record) under the same slicing, host rank 0's (and no epoch record) under another.
"""

import json
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dpuoffload.common.state import ckptfiles
from dpuoffload.common.state.ckptdirs import CheckpointError
from dpuoffload.common.state.load import Live, Reader, StateSource, load_state
from dpuoffload.common.state.meta import CheckpointMeta, Position, Slicing, reslice_position
from dpuoffload.common.state.resume import config_dict
from dpuoffload.common.state.sharding import pack_pieces, packed_nbytes, plan_shards
from dpuoffload.common.state.trainstate import (
    EpochProgress,
    capture_local,
    catalog_of,
    meta_of,
    scheduler_state,
    shared_tensors,
)
from dpuoffload.common.train.training_state import build_optimizer
from dpuoffload.host.clone import handoff_source, state_sha256
from dpuoffload.host.recovery.spares import pack_state, packed_source
from tests.unit.test_trainstate import trained as trainstate_trained

THRESHOLD = 64


def trained(seed: int = 0, steps: int = 2):
    """tests/unit/test_trainstate.py's model, optimizer and scheduler after real steps, 4 channels wide."""
    return trainstate_trained(seed, steps, width=4)


def old_meta_dict(pos, catalog, opt, sched, model, extra) -> dict:
    """The meta exactly as the code before `CheckpointMeta` built it (a dict, keys in this order)."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[id(p)] for p in g["params"]]}
              for g in opt.param_groups]
    return {"format": "dpuoffload-train-state", "version": 1,
            "position": {"epoch": pos.epoch, "step": pos.step, "global_step": pos.global_step},
            "catalog": [[n, d, list(s)] for n, d, s in catalog], "param_groups": groups,
            "scheduler": scheduler_state(sched), **extra}


# ------------------------------------------------------------------------------------ typed meta
@pytest.mark.parametrize("facts", [
    {"host_ranks": 2, "threshold": THRESHOLD, "steps_per_epoch": 8, "config": {"batch_size": 16, "model": "m"},
     "config_hash": "abc"},                                                           # the built-in trainer's
    {"host_ranks": 3, "threshold": THRESHOLD, "steps_per_epoch": None, "config": {"batch_size": 4},
     "config_hash": "abc", "user": {"best": 0.5}},                                    # a script's
    {"pending_records": {"1": {"epoch": 1}}},                                          # a spare's packed state
])
def test_the_meta_writer_writes_the_old_bytes_and_the_reader_reads_them(facts):
    _, model, opt, sched = trained()
    pos, catalog = Position(1, 3, 11), catalog_of(shared_tensors(model, opt))
    old = json.dumps(old_meta_dict(pos, catalog, opt, sched, model, facts)).encode()
    meta = meta_of(pos, catalog, opt, sched, model, **facts)
    assert meta.encode() == old
    back = CheckpointMeta.decode(old)
    assert back == meta and back.encode() == old and back.position == pos


def test_an_old_manifest_round_trips_through_the_typed_meta_to_the_byte(tmp_path):
    """`write_manifest` from the typed meta writes what it wrote from the JSON dict (and reads it back)."""
    cfg, model, opt, sched = trained()
    directory = write_checkpoint(tmp_path, cfg, model, opt, sched, 2, Position(0, 2, 2))
    raw = (directory / ckptfiles.MANIFEST).read_bytes()
    manifest = json.loads(raw)
    assert list(manifest)[:11] == ["format", "version", "position", "catalog", "param_groups", "scheduler",
                                   "host_ranks", "threshold", "steps_per_epoch", "config", "config_hash"]
    again = {**CheckpointMeta.from_json(manifest).to_json(), "tensors": manifest["tensors"], "files": manifest["files"]}
    assert json.dumps(again, indent=1).encode() == raw


def test_the_reader_refuses_another_format_or_a_newer_version():
    _, model, opt, sched = trained()
    good = meta_of(Position(), catalog_of(shared_tensors(model, opt)), opt, sched, model).to_json()
    with pytest.raises(CheckpointError, match="version 2"):
        CheckpointMeta.from_json({**good, "version": 2})
    with pytest.raises(CheckpointError, match="'other'"):
        CheckpointMeta.from_json({**good, "format": "other"})
    with pytest.raises(CheckpointError, match="not a host rank's hand-off"):
        CheckpointMeta.from_json(good).slicing  # noqa: B018 (a spare's state has no run facts)


# ----------------------------------------------------------------------------- re-slicing rule
def test_the_one_reslicing_rule_keeps_the_samples_done():
    pos = Position(epoch=1, step=6, global_step=22)
    assert reslice_position(pos, 32, 32, 8) == pos
    assert reslice_position(pos, 32, 16, 16) == Position(1, 12, 22)    # 2 hosts -> 1 host
    assert reslice_position(pos, 16, 64, 4) == Position(1, 1, 22)      # rounds down: never skips samples
    assert reslice_position(pos, 64, 16, 8) == Position(1, 7, 22)      # capped inside the epoch
    assert reslice_position(pos, 64, 16, None) == Position(1, 24, 22)  # a script's epoch: not capped
    assert reslice_position(Position(2, 0, 30), 32, 16, 16) == Position(2, 0, 30)


@pytest.mark.parametrize("writers,readers,step", [(2, 1, 7), (3, 2, 5), (1, 4, 9), (4, 4, 3)])
def test_a_scripts_host_rank_ratio_is_the_same_rule(writers, readers, step):
    """`job.restore` scaled a step by writers // readers; the rule with the script's batch on both sides."""
    for batch in (1, 16, 33):
        got = reslice_position(Position(0, step, step), Slicing(writers, batch).per_step,
                               Slicing(readers, batch).per_step, None)
        assert got.step == (step if writers == readers else step * writers // readers)


# --------------------------------------------------------------------------------- one load path
def write_checkpoint(root, cfg, model, opt, sched, hosts: int, pos: Position, progress=None):
    """What host ranks send and keepers write, in-process: `hosts` slices, each rank a local state
    with its own RNG draw and epoch record (so a test can tell whose state a rank adopted)."""
    tensors = shared_tensors(model, opt)
    plan = plan_shards([t.numel() for t in tensors.values()], hosts, THRESHOLD)
    meta = meta_of(pos, catalog_of(tensors), opt, sched, model, host_ranks=hosts, threshold=THRESHOLD,
                   steps_per_epoch=8, config=config_dict(cfg), config_hash="h")
    directory = ckptfiles.step_dir(root, pos.global_step)
    directory.mkdir(parents=True)
    files = {}
    for k in range(hosts):
        buf = np.empty(packed_nbytes(list(tensors.values()), plan.rank_pieces(k)), dtype=np.uint8)
        pack_pieces(list(tensors.values()), plan.rank_pieces(k), buf)
        files[ckptfiles.shard_name(k)] = ckptfiles.write_atomic(
            directory / ckptfiles.shard_name(k), ckptfiles.shard_blob(meta.catalog, plan, k, buf, {}))
        files[ckptfiles.local_name(k)] = ckptfiles.write_atomic(
            directory / ckptfiles.local_name(k), local_blob(model, k))
    ckptfiles.write_manifest(directory, meta, files, plan)
    return directory


def local_blob(model, k: int) -> bytes:
    """Host rank k's local state: RNG seeded k, an epoch record of k + 1 step losses."""
    random.seed(k), np.random.seed(k), torch.manual_seed(k)
    return capture_local(model, EpochProgress(np.array([k, k, k], dtype=np.float64), [float(k)] * (k + 1)))


def next_draws():
    return torch.rand(2).tolist(), np.random.rand(2).tolist(), random.random()


def draws_after_seed(k: int):
    random.seed(k), np.random.seed(k), torch.manual_seed(k)
    return next_draws()


def fresh():
    _, model, opt, sched = trained(seed=7, steps=1)
    return model, opt, sched


def test_same_slicing_loads_each_ranks_own_state_to_the_bit(tmp_path):
    cfg, model, opt, sched = trained()
    source = StateSource.of_checkpoint(ckptfiles.load(write_checkpoint(tmp_path, cfg, model, opt, sched, 2,
                                                                       Position(0, 3, 3))))
    model2, opt2, sched2 = fresh()
    loaded = load_state(source, Live(model2, opt2, sched2), Reader(1, Slicing(2, cfg.batch_size), 8))
    assert loaded.exact and loaded.start == Position(0, 3, 3) and loaded.progress.losses == [1.0, 1.0]
    assert next_draws() == draws_after_seed(1)  # host rank 1's RNG, set last
    # every rank's record too (`--recovery rollback`'s seats), copies: the trainer adds to its own record
    assert [(p.sums.tolist(), p.losses) for p in loaded.seats] == [([0.0] * 3, [0.0]), ([1.0] * 3, [1.0, 1.0])]
    assert loaded.seats[1] is not loaded.progress and loaded.seats[1].sums is not loaded.progress.sums
    assert state_sha256(model2, opt2) == state_sha256(model, opt)
    assert sched2.last_epoch == sched.last_epoch and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_another_slicing_takes_host_rank_0s_state_and_drops_the_epoch_record(tmp_path):
    cfg, model, opt, sched = trained()
    source = StateSource.of_checkpoint(ckptfiles.load(write_checkpoint(tmp_path, cfg, model, opt, sched, 2,
                                                                       Position(0, 3, 3))))
    model2, opt2, sched2 = fresh()
    loaded = load_state(source, Live(model2, opt2, sched2), Reader(0, Slicing(1, cfg.batch_size), 16))
    assert not loaded.exact and loaded.start == Position(0, 6, 3) and loaded.progress is None and loaded.seats is None
    assert next_draws() == draws_after_seed(0)
    assert state_sha256(model2, opt2) == state_sha256(model, opt)


def test_the_same_host_count_with_another_batch_is_not_exact(tmp_path):
    cfg, model, opt, sched = trained()
    source = StateSource.of_checkpoint(ckptfiles.load(write_checkpoint(tmp_path, cfg, model, opt, sched, 2,
                                                                       Position(0, 3, 3))))
    loaded = load_state(source, Live(*fresh()), Reader(1, Slicing(2, cfg.batch_size * 3), 8))
    assert not loaded.exact and loaded.start == Position(0, 1, 3)
    assert next_draws() == draws_after_seed(0)


def test_an_epoch_boundary_under_another_host_count_keeps_the_position(tmp_path):
    cfg, model, opt, sched = trained()
    source = StateSource.of_checkpoint(ckptfiles.load(write_checkpoint(tmp_path, cfg, model, opt, sched, 2,
                                                                       Position(1, 0, 8))))
    loaded = load_state(source, Live(*fresh()), Reader(2, Slicing(3, cfg.batch_size), 6))
    assert loaded.start == Position(1, 0, 8) and not loaded.exact


def handoffs(cfg, model, opt, sched, hosts: int, pos: Position):
    """The hand-offs `hosts` host ranks send (header fields, meta + local, packed slice), as received."""
    tensors = shared_tensors(model, opt)
    plan = plan_shards([t.numel() for t in tensors.values()], hosts, THRESHOLD)
    meta = meta_of(pos, catalog_of(tensors), opt, sched, model, host_ranks=hosts, threshold=THRESHOLD,
                   steps_per_epoch=8, config=config_dict(cfg), config_hash="h").encode()
    out = []
    for k in range(hosts):
        shared = np.empty(packed_nbytes(list(tensors.values()), plan.rank_pieces(k)), dtype=np.uint8)
        pack_pieces(list(tensors.values()), plan.rank_pieces(k), shared)
        small = np.frombuffer(meta + local_blob(model, k), dtype=np.uint8)
        head = {"sender": k, "meta_nbytes": len(meta), "small_nbytes": small.nbytes, "shared_nbytes": shared.nbytes}
        out.append(ckptfiles.Received(head, small, shared))
    return out


ONE_RANK = SimpleNamespace(Get_size=lambda: 1)  # gathering over one rank: what it received is everything


def test_dpu_memory_handoffs_load_like_the_checkpoint_files(tmp_path):
    cfg, model, opt, sched = trained()
    memory = handoff_source(ONE_RANK, handoffs(cfg, model, opt, sched, 3, Position(0, 2, 2)))
    disk = StateSource.of_checkpoint(ckptfiles.load(write_checkpoint(tmp_path, cfg, model, opt, sched, 3,
                                                                     Position(0, 2, 2))))
    assert memory.meta == disk.meta and memory.slicing == disk.slicing == Slicing(3, cfg.batch_size)
    assert len(memory.locals) == 3
    for source in (memory, disk):
        model2, opt2, sched2 = fresh()
        loaded = load_state(source, Live(model2, opt2, sched2), Reader(2, Slicing(3, cfg.batch_size), 8))
        assert loaded.exact and loaded.progress.losses == [2.0] * 3 and next_draws() == draws_after_seed(2)
        assert state_sha256(model2, opt2) == state_sha256(model, opt)
        assert [p.losses for p in loaded.seats] == [[0.0], [1.0] * 2, [2.0] * 3]  # (DPU memory's too)


def test_a_clone_rank_loads_the_local_state_assigned_to_it_under_any_slicing():
    cfg, model, opt, sched = trained()
    source = handoff_source(ONE_RANK, handoffs(cfg, model, opt, sched, 2, Position(0, 4, 4)),
                            adopt=lambda senders: 3 % senders)   # clone rank 3 of 4 adopts host rank 1's
    assert len(source.locals) == 1
    model2, opt2, sched2 = fresh()
    loaded = load_state(source, Live(model2, opt2, sched2), Reader(3, Slicing(4, cfg.batch_size), 16))
    assert loaded.start == Position(0, 2, 4) and not loaded.exact and loaded.progress is None and loaded.seats is None
    assert next_draws() == draws_after_seed(1)
    assert state_sha256(model2, opt2) == state_sha256(model, opt)


def test_a_spares_packed_state_loads_through_the_same_path():
    _, model, opt, sched = trained()
    random.seed(4), np.random.seed(4), torch.manual_seed(4)
    blob = pack_state(model, opt, sched, Position(1, 5, 13), {2: {"epoch": 2}})
    expect = next_draws()
    source = packed_source(blob)
    assert source.meta.pending_records == {"2": {"epoch": 2}} and source.meta.host_ranks is None
    model2, opt2, sched2 = fresh()
    loaded = load_state(source, Live(model2, opt2, sched2), Reader(0, source.slicing, 8))
    assert loaded.start == Position(1, 5, 13) and loaded.exact and next_draws() == expect
    assert state_sha256(model2, opt2) == state_sha256(model, opt) and sched2.last_epoch == sched.last_epoch


def test_a_state_for_another_model_is_refused(tmp_path):
    cfg, model, opt, sched = trained()
    source = StateSource.of_checkpoint(ckptfiles.load(write_checkpoint(tmp_path, cfg, model, opt, sched, 1,
                                                                       Position(0, 2, 2))))
    other = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5))
    with pytest.raises(ValueError, match="written for another model"):
        load_state(source, Live(other, build_optimizer(cfg, other)), Reader(0, source.slicing, 8))
