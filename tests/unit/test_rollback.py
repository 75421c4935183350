"""`--recovery rollback`: a spare rank (`dpurun --spare-ranks S`) takes a dead host rank's seat.

Pure parts: the call-in message, the state message, the launch command and flag checks, which
deaths are survived. Real jobs (host ranks SIGKILLed by `--inject`): a death inside a step is
replayed by the spare and the run's weights equal an uninterrupted run's to the bit; a death in
an epoch's end work is filled at the next step, to the bit too; so is host rank 0's death (its
BatchNorm buffers and every rank's epoch progress ride in each step's allreduce, and the epoch's
totals are added up from every seat's progress), also in an epoch resumed mid-way from a
checkpoint (every rank's record of it comes from the checkpoint); in `--mode da` the
spare's batches come from the dead rank's DPU rank, or from itself when that one died too (a lost
node); a second death with no spare left ends the job in one line naming the fix. A collective that
failed with no rank dead (a revoke, as ULFM's false alarm) is redone to the bit and not reported, under
both recoveries.

(The tests of this feature that start processes: tests/jobs/test_rollback.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.runtime.roles import Role, role_from_appnum
from dpuoffload.common.state.trainstate import EpochProgress, Position
from dpuoffload.common.train.step import StepOutcome
from dpuoffload.common.train.training_state import TrainingState, build_optimizer, lr_factor
from dpuoffload.host.control import shutdown_sender
from dpuoffload.host.recovery.carried import SeatProgress
from dpuoffload.host.recovery.spares import CALL_IN, Command, pack_state, seat_progress, unpack_state
from dpuoffload.launch import checks, cli
from dpuoffload.launch.command import build_command
from tests.unit.test_dpu_failure import D, H
from tests.unit.test_launch_command import TRAIN, local_spec
from tests.unit.test_lossy_forward import judge


def test_call_in_message_round_trips():
    cmd = Command(CALL_IN, Position(1, 3, 11), True, ((2, 1), (3, 0)))
    buf = cmd.encode(pool_size=4)
    assert len(buf) == Command.length(4) and Command.decode(buf) == cmd


def test_state_message_restores_the_trainer_to_the_bit():
    cfg = parse_run_config(["--preset", "debug", "--lr-schedule", "cosine"])
    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = build_optimizer(cfg, src)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor("cosine", s, 10))
    for _ in range(3):  # momentum buffers, moved BatchNorm statistics, a scheduler past step 0
        src(torch.randn(8, 4)).sum().backward()
        opt.step()
        sched.step()
    blob = pack_state(src, opt, sched, Position(0, 3, 3))
    torch.manual_seed(1)
    dst = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt2 = build_optimizer(cfg, dst)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: lr_factor("cosine", s, 10))
    state = TrainingState(dst, opt2, sched2)
    assert unpack_state(blob, state) == Position(0, 3, 3) and state.pending == {}
    for a, b in zip(src.state_dict().values(), dst.state_dict().values()):
        assert torch.equal(a, b)
    for p, q in zip(src.parameters(), dst.parameters()):
        assert torch.equal(opt.state[p]["momentum_buffer"], opt2.state[q]["momentum_buffer"])
    assert sched2.last_epoch == 3 and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert seat_progress(blob) is None  # (no seats given: unknown)


def test_the_state_message_carries_seat_zero_s_buffers_and_every_seat_s_progress_exactly():
    """What a rollback spare gets beside the sender's parameters: the buffers it is given instead
    of the sender's own, and every seat's epoch progress (float64 sums and losses, to the bit)."""
    src = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = build_optimizer(parse_run_config(["--preset", "debug"]), src)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    seat0 = {name: b + 1 if b.is_floating_point() else b + 5 for name, b in src.named_buffers()}
    seats = [EpochProgress(np.array([1 / 3, 7.0, 16.0]), [1 / 3, 2.302585092994046]), EpochProgress()]
    blob = pack_state(src, opt, sched, Position(1, 2, 10), buffers=seat0, seats=seats)
    dst = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt2 = build_optimizer(parse_run_config(["--preset", "debug"]), dst)
    unpack_state(blob, TrainingState(dst, opt2, torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 1.0)))
    assert all(torch.equal(b, seat0[name]) for name, b in dst.named_buffers())
    got = seat_progress(blob)
    assert [p.sums.tolist() for p in got] == [p.sums.tolist() for p in seats]
    assert [p.losses for p in got] == [p.losses for p in seats]


def test_seat_progress_adds_each_seat_s_step_as_the_seat_itself_does():
    """Every rank adds each seat's step (loss, correct, count from its slot of the summed message) to
    that seat's progress with `Trainer.record_step`'s own arithmetic: the same float64 sums."""

    class Two:
        def __init__(self, rank):
            self.rank = rank

        def Get_rank(self):  # noqa: N802
            return self.rank

        def Get_size(self):  # noqa: N802
            return 2

    ranks = [SeatProgress(Two(r)) for r in range(2)]
    own = [EpochProgress(), EpochProgress()]
    rng = np.random.default_rng(0)
    for step in range(5):
        outcomes = [StepOutcome(torch.tensor(rng.random() * 3, dtype=torch.float32), torch.tensor(int(rng.integers(9))),
                                16 if step < 4 else 3) for _ in range(2)]
        for rank, sp in enumerate(ranks):
            sp.begin_step(0, step)
            sp.carry(outcomes[rank])
        summed = sum(sp.outgoing(torch.float32) for sp in ranks)
        for sp in ranks:
            sp.arrived(summed)
        for p, o in zip(own, outcomes):  # (as `Trainer.record_step` adds a step)
            loss, correct = o.read()
            p.losses.append(loss)
            p.sums += (loss * o.count, correct, o.count)
    for sp in ranks:
        for seat in range(2):
            assert sp.seats[seat].losses == own[seat].losses and sp.seats[seat].sums.tolist() == own[seat].sums.tolist()
    assert ranks[0].at(0) is ranks[0].seats and ranks[0].at(1) is None  # (what a spare called at (epoch, _) gets)
    ranks[0].begin_step(1, 0)
    assert ranks[0].seats[1].losses == []  # (a new epoch starts every seat empty)
    ranks[0].begin_step(2, 3)
    assert ranks[0].seats is None       # (begun mid-way with no seats given: unknown)
    spare = SeatProgress(Two(1))        # a spare called in at an epoch's start (no seats sent)...
    spare.begin_step(3, 0)
    assert spare.seats[0].losses == []  # ...starts the epoch's progress, known and empty
    spare.adopt(4, [EpochProgress(np.array([1.0, 2, 3]), [1.0]), EpochProgress()])  # one called mid-epoch...
    spare.begin_step(4, 5)
    assert spare.at(4)[0].losses == [1.0]  # ...goes on from the seats it was sent


def test_spare_ranks_are_app_context_two_told_by_environment():
    contexts = " ".join(build_command(local_spec(spare_ranks=1))).split(" : ")
    assert len(contexts) == 3 and "DPUOFFLOAD_STANDBY=spare" in contexts[2]
    assert "DPUOFFLOAD_STANDBY" not in " ".join(build_command(local_spec(clone_ranks=1)))
    assert role_from_appnum(2, Role.HOST, "spare") is Role.SPARE
    assert role_from_appnum(2, Role.HOST, None) is Role.CLONE


@pytest.mark.parametrize("launcher,training,message", [
    ([], ["--recovery", "rollback"], "add --spare-ranks S before '--'"),
    (["--spare-ranks", "1"], [], "without --recovery rollback or lossy-forward: the spares would only stand by"),
])
def test_launch_checks_name_the_missing_half(launcher, training, message):
    args = cli.parse_launcher_args(launcher)
    cfg = checks.parse_training([*TRAIN, *training], "dpurun")
    facts = checks.LaunchFacts(spare_ranks=args.spare_ranks, skip_slow=True, create_dirs=False)
    with pytest.raises(ConfigError, match=message):
        checks.check_ranks(cfg, facts)


def test_flag_errors():
    with pytest.raises(ConfigError, match="a run has one or the other"):
        cli.parse_launcher_args(["--spare-ranks", "1", "--clone-ranks", "1"])
    with pytest.raises(ConfigError, match="--recovery rollback cannot go with --mode naive"):
        parse_run_config(["--recovery", "rollback", "--mode", "naive"])
    with pytest.raises(ConfigError, match="--recovery rollback cannot go with clones"):
        parse_run_config(["--recovery", "rollback", "--clone-at", "3"])
    assert parse_run_config(["--recovery", "rollback", "--ckpt-dir", "/tmp/x", "--ckpt-every", "2",
                             "--ckpt-mem-keep", "1"]).checkpointing
    with pytest.raises(ConfigError, match="add --recovery lossy-forward"):
        parse_run_config(["--recovery", "rollback", "--reassign"])
    assert parse_run_config(["--recovery", "rollback"]).allreduce == "mpi"


def test_which_deaths_rollback_survives():
    layout = [(H, "n0"), (H, "n0"), (D, "n0"), (Role.SPARE, "n0")]
    rb = ["--recovery", "rollback", "--mode", "da"]
    host = judge(rb, layout, 1)
    assert host.survivable and host.what == "it trained; a spare rank takes its seat"
    assert judge(rb, layout, 3).survivable  # a spare
    # by the seats (what host and spare ranks know): no seated survivor left to hand the state on...
    last = judge(rb, layout, 1, gone=[0], seated=[0, 1])
    assert not last.survivable and last.what == "it was the last host rank in a seat (no rank is left to hand a " \
        "spare the state)"
    # ...or the spare seated in host rank 1's place is left, though both original host ranks died
    assert judge(rb, layout, 0, gone=[1], seated=[0, 3]).survivable
    seated_spare = judge(rb, layout, 3, gone=[1], seated=[0, 3])
    assert seated_spare.survivable and seated_spare.what == "it trained; a spare rank takes its seat"
    assert not judge(rb, layout, 3, gone=[0, 1], seated=[0, 3]).survivable
    # a DPU rank does not know the seats: only the loss of every host and spare rank is fatal there
    assert judge(rb, layout, 1, gone=[0]).survivable
    assert not judge(rb, layout, 3, gone=[0, 1]).survivable


def test_the_lowest_living_rank_in_a_seat_tells_the_dpu_ranks_to_stop():
    """Without seats (no --recovery rollback): the lowest living host rank; with them, the lowest
    living seated rank, a spare once every original host rank is dead."""
    assert shutdown_sender((0, 1), frozenset(), None) == 0
    assert shutdown_sender((0, 1), frozenset({0}), None) == 1
    assert shutdown_sender((0, 1), frozenset({0, 1}), None) is None
    assert shutdown_sender((0, 1), frozenset({1}), frozenset({0, 3})) == 0
    assert shutdown_sender((0, 1), frozenset({0, 1}), frozenset({4, 3})) == 3
