"""The active verification's policy, result types and its `commands` step, on this machine's real processes (#31)."""

from __future__ import annotations

import pytest

from gpudoctor.errors import ConfigError
from gpudoctor.recovery.verify import (StepResult, Verification, VerifyPolicy, parse_verify_policy,
                                       run_verification)
from gpudoctor.target import open_target


@pytest.fixture
def local():
    t = open_target(None, search=False)
    yield t
    t.close()


def only_commands(*cmds, timeout_s=30.0) -> VerifyPolicy:
    return VerifyPolicy(deep="off", serving="off", commands=tuple(tuple(c) for c in cmds), timeout_s=timeout_s)


def test_defaults_and_a_full_section():
    assert parse_verify_policy(None) == VerifyPolicy()
    p = parse_verify_policy({"deep": "on", "serving": False, "commands": [["dcgmi", "diag", "-r", 2]],
                             "timeout_s": 120, "smoke_requests": 4, "smoke_max_tokens": 8, "smoke_ttft_ms_max": 900})
    assert p == VerifyPolicy(deep="on", serving="off", commands=(("dcgmi", "diag", "-r", "2"),), timeout_s=120.0,
                             smoke_requests=4, smoke_max_tokens=8, smoke_ttft_ms_max=900.0)
    assert isinstance(p.timeout_s, float) and isinstance(p.smoke_requests, int)


@pytest.mark.parametrize("spec, words", [
    ([1], "must be a mapping"),
    ({"deepp": "on"}, "unknown key 'deepp'"),
    ({"deep": "sometimes"}, "policy.verify.deep must be one of auto, on, off"),
    ({"commands": "dcgmi diag -r 2"}, "must be a list of commands"),
    ({"commands": ["dcgmi diag -r 2"]}, "item 1 is a string: give the argv as a list"),
    ({"commands": [[]]}, "item 1 must be a non-empty list"),
    ({"commands": [["x", {"a": 1}]]}, "item 1 must be a non-empty list"),
    ({"timeout_s": 0}, "policy.verify.timeout_s must be a number from 1"),
    ({"timeout_s": True}, "policy.verify.timeout_s must be a number"),
    ({"smoke_requests": 2.5}, "policy.verify.smoke_requests must be an integer"),
])
def test_bad_input_is_one_line_naming_file_and_line(spec, words):
    with pytest.raises(ConfigError) as e:
        parse_verify_policy(spec, path="inv.yaml", lines={"": 7, "deepp": 9, "deep": 8, "commands": 10,
                                                          "timeout_s": 11, "smoke_requests": 12})
    line = e.value.one_line()
    assert words in line and line.startswith("inv.yaml:") and "\n" not in line, line


def test_commands_pass_with_their_output_tail(local):
    v = run_verification(local, only_commands(["true"], ["sh", "-c", "echo diag ok"]))
    assert v.passed and v.reason == "", v
    assert [s.status for s in v.steps] == ["not-run", "not-run", "pass"]
    assert "diag ok" in v.steps[2].detail and "exit 0" in v.steps[2].detail
    assert v.seconds >= 0 and v.started_at > 0


def test_a_failing_command_fails_with_its_exit_and_tail_and_stops_the_rest(local, tmp_path):
    after = tmp_path / "after"
    v = run_verification(local, only_commands(["sh", "-c", "echo GPU 0 memory test FAILED >&2; exit 4"],
                                              ["touch", str(after)]))
    assert not v.passed
    assert v.reason.startswith("commands: sh -c ") and "exit 4" in v.reason and "memory test FAILED" in v.reason
    assert not after.exists()  # a later command does not run after a failure


def test_a_missing_program_fails(local):
    v = run_verification(local, only_commands(["/nonexistent/dcgmi", "diag"]))
    assert not v.passed and "exit 127" in v.reason and "/nonexistent/dcgmi" in v.reason


def test_the_whole_verification_is_bounded(local, tmp_path):
    after = tmp_path / "after"
    v = run_verification(local, only_commands(["sleep", "30"], ["touch", str(after)], timeout_s=1.5))
    assert not v.passed and "did not exit" in v.reason and v.seconds < 10
    assert not after.exists()


def test_nothing_applicable_is_not_a_pass_and_says_what_to_configure(local):
    v = run_verification(local, only_commands())
    assert not v.passed
    assert v.reason.startswith("nothing to verify:") and "policy.verify.commands" in v.reason
    assert all(s.status == "not-run" for s in v.steps)


def test_progress_reports_each_step(local):
    seen = []
    run_verification(local, only_commands(["true"]), progress=lambda step, what: seen.append((step, what)))
    assert seen[0] == ("commands", "start") and seen[-1] == ("commands", "pass")
    assert any(w.startswith("$ true") for _, w in seen)


def test_results_round_trip_through_json(local):
    v = run_verification(local, only_commands(["false"]))
    again = Verification.from_json(v.to_json())
    assert again.to_json() == v.to_json()
    assert isinstance(again.steps[2], StepResult) and again.steps[2].status == "fail"
    assert Verification.from_json({}).passed is False


def test_each_step_and_the_result_are_logged_under_stable_event_names(local):
    from structlog.testing import capture_logs

    from gpudoctor import log as glog

    glog.configure(verbosity=1)  # info events pass the level filter
    try:
        with capture_logs() as logs:
            run_verification(local, only_commands(["false"]))
    finally:
        glog.configure(**glog._settings)
    events = [(e["event"], e.get("step"), e.get("status"), e.get("passed")) for e in logs]
    assert events == [("verify.step", "commands", "fail", None), ("verify.finished", None, None, False)], logs
    assert all(e.get("host") == local.name for e in logs)


def test_an_unreachable_host_fails_the_steps_that_need_it():
    """192.0.2.1 (TEST-NET-1) answers nothing: looking for its GPUs fails closed, never 'not applicable'."""
    from gpudoctor.inventory import parse_inventory

    inv = parse_inventory("hosts:\n  gone:\n    address: 192.0.2.1\n    connect_timeout: 1\n", path="inv.yaml")
    t = open_target("gone", inv)
    try:
        v = run_verification(t, VerifyPolicy(serving="off", timeout_s=30))
    finally:
        t.close()
    assert not v.passed and v.steps[0].name == "deep" and v.steps[0].status == "fail", v
    assert v.reason.startswith("deep: ") and "192.0.2.1" in v.reason, v.reason
