"""`--inject` specs (pure): parsing, which rank each names, when it fires, and the errors."""

from __future__ import annotations

import signal

import pytest

from dpuoffload.common.config import parse_run_config
from dpuoffload.common.errors import ConfigError
from dpuoffload.common.faults import inject
from dpuoffload.common.faults.inject import InjectedFailure, Injection, Injector, parse, parse_all, targets_me


def test_specs_parse_to_who_when_and_how():
    assert parse("host:1@12") == Injection("host", 1, 12, None, "kill")
    assert parse("dpu:0@0.5:stop") == Injection("dpu", 0, None, 0.5, "stop")
    assert parse("node:2@3:raise") == Injection("node", 2, 3, None, "raise")
    assert parse_all(["host:0@1,dpu:1@2:term", "node:0@0.25"]) == (
        parse("host:0@1"), parse("dpu:1@2:term"), parse("node:0@0.25"))
    assert parse("host:0@0.5").at(10) == 5 and parse("host:0@0.01").at(10) == 1 and parse("host:0@7").at(10) == 7
    assert str(parse("dpu:3@0.5")) == "dpu:3@0.5:kill"


@pytest.mark.parametrize("spec, why", [
    ("gpu:0@3", "WHO must be one of host:N, dpu:N, node:N"),
    ("host@3", "WHO must be one of"),
    ("host:x@3", "'x' is not a rank number"),
    ("host:0@3:crash", "HOW 'crash' is not one of kill, term, stop, raise"),
    ("host:0@soon", "WHEN 'soon' is neither a step nor a fraction"),
    ("host:0@0", "WHEN '0' is neither a step >= 1 nor a fraction strictly between 0 and 1"),
    ("host:0@1.0", "WHEN '1.0' is neither a step >= 1 nor a fraction"),
])
def test_bad_specs_name_the_spec_and_the_form(spec, why):
    with pytest.raises(ConfigError, match=f"--inject '{spec}': {why}".replace("(", r"\(").replace(")", r"\)")):
        parse(spec)
    with pytest.raises(ConfigError, match="expected WHO@WHEN"):
        parse_run_config(["--inject", spec])


def test_which_rank_each_spec_names():
    host1, dpu0, node1 = parse("host:1@3"), parse("dpu:0@3"), parse("node:1@3")
    assert targets_me(host1, 1, None) and not targets_me(host1, 0, None) and not targets_me(host1, None, 1)
    assert targets_me(dpu0, None, 0) and not targets_me(dpu0, 0, None)
    assert targets_me(node1, 1, None) and not targets_me(node1, 0, None)
    assert targets_me(node1, None, 0, partners_of_host=(1,)) and not targets_me(node1, None, 1, (0,))


def test_the_injector_fires_at_its_step_only(monkeypatch):
    sent, notes = [], []
    monkeypatch.setattr(inject.os, "kill", lambda pid, sig: sent.append(sig))
    Injector([parse("host:0@0.5:term")], "host rank 0", notes.append).check(4, 10)
    assert sent == [] and notes == []
    Injector([parse("host:0@0.5:term")], "host rank 0", notes.append).check(5, 10)
    assert sent == [signal.SIGTERM]
    assert [(n["event"], n["spec"], n["global_step"]) for n in notes] == [("injected", "host:0@0.5:term", 5)]
    with pytest.raises(InjectedFailure, match="injected failure host:0@3:raise at global step 3"):
        Injector([parse("host:0@3:raise")], "host rank 0", notes.append).check(3, 10)


def test_injections_are_part_of_the_config_and_free_on_resume():
    from dpuoffload.common.state.resume import FREE

    cfg = parse_run_config(["--inject", "host:0@3", "--inject", "dpu:0@4:stop"])
    assert cfg.inject == ("host:0@3", "dpu:0@4:stop") and "inject" in FREE
