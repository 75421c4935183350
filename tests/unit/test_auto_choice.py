"""`--mode auto` keeps the math: naive (other batch sizes and steps) only with `--auto-allow naive`.

Pure tests of `perfmodel.choose` / `explain_choice` on a profile where naive is clearly fastest.
"""

import pytest

from dpuoffload.common.config import RunConfig
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.modes import Mode
from dpuoffload.common.plan.perfmodel import Profile, choose, explain_choice, predict_all


def naive_wins() -> Profile:
    """Two DPU replicas almost as fast as the host: naive triples throughput and has the shortest epoch."""
    return Profile(n_train=512, n_val=256, host_ranks=1, dpu_ranks=2, batch=16, host_aug=0.02,
                   host_train=0.004, host_eval=0.001, dpu_aug=0.02, dpu_train=0.008, dpu_eval=0.002,
                   allreduce=0.002, optimizer=0.001, transfer=0.0001)


def test_naive_is_fastest_but_excluded_by_default():
    p = naive_wins()
    preds = predict_all(p)
    assert min(preds, key=lambda m: preds[m].epoch_s) is Mode.NAIVE
    chosen = choose(p)
    assert chosen.keeps_math and chosen is not Mode.NAIVE
    keeping = {m: pr.epoch_s for m, pr in preds.items() if m.keeps_math}
    fastest = min(keeping.values())
    assert keeping[chosen] <= fastest * 1.03  # the fastest, or a simpler mode tied with it (see below)


def test_naive_chosen_when_allowed():
    assert choose(naive_wins(), allow=(Mode.NAIVE,)) is Mode.NAIVE


def test_the_one_line_names_choice_times_and_how_to_allow_naive():
    p = naive_wins()
    preds = predict_all(p)
    line = explain_choice(preds, choose(p))
    assert "\n" not in line
    assert line.startswith(f"--mode auto chose {choose(p)}: da and hybrid are predicted within 3% of each other")
    for m in (Mode.NONE, Mode.DA, Mode.MV, Mode.HYBRID):
        assert f"{m} {preds[m].epoch_s:.2f} s" in line
    assert f"excluded naive ({preds[Mode.NAIVE].epoch_s:.2f} s)" in line and "--auto-allow naive" in line
    allowed = explain_choice(preds, Mode.NAIVE, (Mode.NAIVE,))
    assert allowed.startswith("--mode auto chose naive") and "excluded" not in allowed


def test_auto_allow_flag_only_with_mode_auto():
    assert RunConfig(mode="auto", auto_allow="naive").auto_allow == "naive"
    with pytest.raises(ConfigError, match="--auto-allow only applies to --mode auto"):
        RunConfig(mode="none", auto_allow="naive")
    with pytest.raises(ConfigError, match="--auto-allow 'da' is not one of: naive"):
        RunConfig(mode="auto", auto_allow="da")


def test_the_chosen_mode_gets_the_flags_its_prediction_used_and_the_others_are_cleared():
    """--mode auto --da-host-share auto --dpu-workers 2: da gets the balanced share it was predicted
    with; a mode without DPU augmentation gets neither flag (each would fail that mode's checks)."""
    from dpuoffload.common.train.autoselect import mode_settings

    cfg = RunConfig(mode="auto", da_host_share="auto", dpu_workers=2)
    preds = predict_all(Profile(n_train=512, n_val=256, host_ranks=1, dpu_ranks=2, batch=16, host_aug=0.02,
                                host_train=0.004, host_eval=0.001, dpu_aug=0.02, dpu_train=0.008, dpu_eval=0.002,
                                allreduce=0.002, host_share=None, dpu_workers=2))
    da = cfg.replace(mode=Mode.DA, auto_allow=None, **mode_settings(cfg, Mode.DA, preds[Mode.DA]))
    assert da.da_host_share == preds[Mode.DA].detail["host_share"] and 0 < da.da_host_share < 1
    assert da.dpu_workers == 2
    for mode in (Mode.NONE, Mode.MV):
        other = cfg.replace(mode=mode, auto_allow=None, **mode_settings(cfg, mode, preds[mode]))
        assert (other.da_host_share, other.dpu_workers) == (0.0, 0)


def test_modes_predicted_within_the_margin_are_a_tie_for_the_mode_that_changes_least():
    """Two modes 0.2 % apart (shufflenet_v2's da and mv in one benchmark run): the choice must not
    follow the profile's noise from run to run, so the tie goes by TIE_ORDER (mv before da: the
    training batches stay the host's own) and the line says so."""
    from dataclasses import replace

    from dpuoffload.common.plan.perfmodel import TIE_MARGIN, Prediction, tied_modes

    preds = {m: Prediction(m, 10.0, 10.0, 0.0, "host") for m in (Mode.NONE, Mode.DA, Mode.MV, Mode.HYBRID)}
    preds[Mode.NONE] = replace(preds[Mode.NONE], epoch_s=12.0)
    preds[Mode.MV] = replace(preds[Mode.MV], epoch_s=9.98)  # the fastest, by 0.2 %
    preds[Mode.HYBRID] = replace(preds[Mode.HYBRID], epoch_s=9.98 * (1 + TIE_MARGIN) + 0.01)  # just outside
    assert tied_modes(preds) == [Mode.MV, Mode.DA]
    line = explain_choice(preds, Mode.MV)
    assert line.startswith("--mode auto chose mv: mv and da are predicted within 3% of each other, a tie at the "
                           "model's resolution, which goes to the mode that changes least of the training's own "
                           "path (mv 9.98 s, da 10.00 s, ")
    preds[Mode.MV] = replace(preds[Mode.MV], epoch_s=10.0 * (1 + TIE_MARGIN) + 0.01)
    preds[Mode.HYBRID] = replace(preds[Mode.HYBRID], epoch_s=11.0)
    assert tied_modes(preds) == [Mode.DA]  # a clear winner is still chosen, however it ranks in a tie
    assert explain_choice(preds, Mode.DA).startswith("--mode auto chose da: the shortest predicted epoch (")


def test_a_profile_whose_steps_moved_is_said_to_be_unsteady():
    """The upper over the lower quartile of the profile's host steps: a few slow steps leave it (the
    model's medians too), a machine whose speed moved under the profile does not."""
    from dataclasses import replace

    from dpuoffload.common.train.autoselect import UNSTEADY_SPREAD, quartile_spread, unsteady_note

    assert quartile_spread([0.2] * 8 + [0.9]) == 1.0  # one slow step (a collection, a page fault)
    assert quartile_spread([0.2, 0.2, 0.2]) == 1.0  # too few steps to say
    moved = [0.2, 0.21, 0.2, 0.22, 0.3, 0.31, 0.33, 0.3]  # the last half on a slower machine
    assert quartile_spread(moved) == pytest.approx(0.3075 / 0.2025, rel=1e-6)
    steady = naive_wins()
    assert steady.host_step_spread == 1.0 and unsteady_note(steady) is None
    assert unsteady_note(replace(steady, host_step_spread=UNSTEADY_SPREAD - 0.01)) is None
    note = unsteady_note(replace(steady, host_step_spread=1.52))
    assert note.startswith("the host's profile steps were unsteady, their upper quartile 1.52x their lower")
    assert "give --mode to skip the profile" in note
    with pytest.raises(ValueError, match="host_step_spread must be >= 1"):
        replace(steady, host_step_spread=0.9)
