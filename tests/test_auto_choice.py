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
    assert chosen is min(keeping, key=keeping.get)


def test_naive_chosen_when_allowed():
    assert choose(naive_wins(), allow=(Mode.NAIVE,)) is Mode.NAIVE


def test_the_one_line_names_choice_times_and_how_to_allow_naive():
    p = naive_wins()
    preds = predict_all(p)
    line = explain_choice(preds, choose(p))
    assert "\n" not in line
    assert line.startswith(f"--mode auto chose {choose(p)}: the shortest predicted epoch (")
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
