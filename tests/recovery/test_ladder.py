"""The recovery ladder (gpudoctor/recovery/ladder.py), transition by transition: every rule and its boundary."""

from __future__ import annotations

import pytest

from gpudoctor.recovery import ladder as L
from gpudoctor.recovery.ladder import HostLadder, RecoveryPolicy

T = 1000.0
P = RecoveryPolicy()  # clean_cycles 1, clean_seconds 0, retry 300 s x2 up to 3600 s, recurrences 2, window 1 day


def ok(h, now, policy=P, boot="b1", driver="570"):
    return L.observe_check(h, policy, now, passed=True, boot_id=boot, driver=driver)


def bad(h, now, roots=("cuda.init",), summary="CUDA init failed", policy=P, boot="b1", driver="570"):
    return L.observe_check(h, policy, now, passed=False, roots=list(roots), summary=summary, boot_id=boot,
                           driver=driver)


def verified(h, now, policy=P, passed=True, reason=""):
    return L.observe_verification(h, policy, now, passed=passed, reason=reason, record={"passed": passed})


def ready_host(now=T):
    h = HostLadder(since=now)
    ok(h, now)
    verified(h, now)
    assert h.state == L.READY
    return h


# --- the policy ---------------------------------------------------------------------------------------------
def test_policy_defaults_and_retry_backoff():
    assert (P.clean_cycles, P.clean_seconds, P.recurrences, P.window_s) == (1, 0.0, 2, 86400.0)
    assert [P.retry_after(n) for n in (1, 2, 3, 4, 5, 6)] == [300, 600, 1200, 2400, 3600, 3600]
    assert RecoveryPolicy(retry_s=10, retry_factor=3, retry_max_s=100).retry_after(3) == 90


# --- a new host ------------------------------------------------------------------------------------------------
def test_a_new_host_is_not_ready_until_verified():
    h = HostLadder()
    assert (h.state, h.reason) == (L.FAILING, "never verified: waiting for a passing check")
    assert L.view(h, "b1") == (L.FAILING, h.reason, False)
    step = ok(h, T)
    assert (step.before, step.after, step.moved, step.since) == (L.FAILING, L.VERIFYING, True, T)
    assert h.reason == "verifying: verification due"
    assert L.verification_due(h, P, T)
    assert L.view(h, "b1")[2] is False
    step = verified(h, T + 5)
    assert (step.before, step.after, h.since, h.reason) == (L.VERIFYING, L.READY, T + 5, "")
    assert (h.verified_at, h.verified_boot, h.verified_driver) == (T + 5, "b1", "570")
    assert h.last_verification == {"passed": True}
    assert L.view(h, "b1") == (L.READY, "", True)


def test_no_record_is_not_ready():
    state, reason, ready = L.view(None, "b1")
    assert (state, ready) == (L.FAILING, False) and "no recovery record" in reason


# --- failing, healing ------------------------------------------------------------------------------------------
def test_a_failure_takes_a_ready_host_out_and_heals_move_it_to_healing():
    h = ready_host()
    step = bad(h, T + 100)
    assert (step.before, step.after, h.since) == (L.READY, L.FAILING, T + 100)
    assert h.reason == "failing: CUDA init failed" and h.failing_now and h.roots == ["cuda.init"]
    assert L.view(h, "b1") == (L.FAILING, "failing: CUDA init failed", False)
    assert L.may_heal(h)
    step = L.observe_heal(h, T + 101, "devices.uvm")
    assert (step.before, step.after, h.since) == (L.FAILING, L.HEALING, T + 101)
    assert h.reason == "healing: applied devices.uvm, waiting for a passing check"
    step = bad(h, T + 200)  # the same fault still there after the heal: still healing, since kept
    assert (step.after, h.since, h.reason) == (L.HEALING, T + 101, "healing: CUDA init failed")
    assert not step.moved
    L.observe_heal(h, T + 201, "lxc.reboot")
    assert (h.state, h.since) == (L.HEALING, T + 101)
    assert h.reason == "healing: applied lxc.reboot, waiting for a passing check"
    step = ok(h, T + 300)
    assert (step.before, step.after, h.since) == (L.HEALING, L.VERIFYING, T + 300)


def test_a_failing_host_stays_failing_and_keeps_its_transition_time():
    h = ready_host()
    bad(h, T + 1)
    step = bad(h, T + 2, summary="still broken")
    assert (step.after, step.moved, h.since, h.reason) == (L.FAILING, False, T + 1, "failing: still broken")


def test_a_heal_does_not_move_a_verifying_or_ready_host():
    h = ready_host()
    assert not L.observe_heal(h, T + 1, "x").moved and h.state == L.READY
    bad(h, T + 2)
    ok(h, T + 3)
    assert h.state == L.VERIFYING
    L.observe_heal(h, T + 4, "x")
    assert (h.state, h.since) == (L.VERIFYING, T + 3)


def test_a_new_fault_during_healing_is_failing_again():
    h = ready_host()
    bad(h, T + 1, roots=["a"])
    L.observe_heal(h, T + 2, "fix-a")
    step = bad(h, T + 3, roots=["b"], summary="B broke")
    assert (step.after, h.since, h.reason) == (L.FAILING, T + 3, "failing: B broke")
    assert step.between_failures_s == 2


def test_a_failure_without_roots_or_summary_is_still_a_failure():
    h = ready_host()
    L.observe_check(h, P, T + 1, passed=False, boot_id="b1", driver="570")
    assert h.roots == ["check"] and h.reason == "failing: the passive check failed" and h.state == L.FAILING


# --- the clean window -------------------------------------------------------------------------------------------
def test_the_clean_window_needs_both_cycles_and_seconds():
    pol = RecoveryPolicy(clean_cycles=3, clean_seconds=100)
    h = HostLadder(since=T)
    ok(h, T, pol)
    assert h.reason == "verifying: clean window 1/3 checks, 0/100 s" and not L.verification_due(h, pol, T)
    ok(h, T + 40, pol)
    assert h.reason == "verifying: clean window 2/3 checks, 40/100 s" and h.since == T
    ok(h, T + 80, pol)  # three checks, but 80 s < 100 s
    assert h.clean_cycles == 3 and not L.verification_due(h, pol, T + 80)
    assert h.reason == "verifying: clean window 3/3 checks, 80/100 s"
    assert not L.window_done(h, pol, T + 99) and L.window_done(h, pol, T + 100)
    ok(h, T + 100, pol)
    assert h.reason == "verifying: verification due" and L.verification_due(h, pol, T + 100)
    # a verification reported before the window passed is ignored
    h2 = HostLadder(since=T)
    ok(h2, T, pol)
    step = verified(h2, T, pol)
    assert (step.after, h2.verified_at, h2.last_verification) == (L.VERIFYING, None, None)


def test_the_clean_window_counts_cycles_exactly():
    pol = RecoveryPolicy(clean_cycles=2, clean_seconds=0)
    h = HostLadder(since=T)
    ok(h, T, pol)
    assert not L.verification_due(h, pol, T + 1000)
    ok(h, T + 1, pol)
    assert L.verification_due(h, pol, T + 1)


def test_a_failure_restarts_the_clean_window():
    pol = RecoveryPolicy(clean_cycles=2)
    h = HostLadder(since=T)
    ok(h, T, pol)
    bad(h, T + 1, policy=pol)
    assert (h.clean_cycles, h.clean_since) == (0, None)
    ok(h, T + 2, pol)
    assert (h.clean_cycles, h.clean_since) == (1, T + 2) and not L.verification_due(h, pol, T + 2)


def test_window_done_needs_a_start():
    h = HostLadder(clean_cycles=5)
    assert not L.window_done(h, P, T)


# --- the verification ------------------------------------------------------------------------------------------
def test_a_failed_verification_stays_not_ready_and_retries_on_the_backoff():
    h = HostLadder(since=T)
    ok(h, T)
    step = verified(h, T + 10, passed=False, reason="dcgmi diag exited 1")
    assert (step.after, h.since) == (L.VERIFYING, T)
    assert h.reason == "verifying: verification failed (dcgmi diag exited 1); retry in 300 s"
    assert (h.verify_failures, h.next_verify_at) == (1, T + 310)
    assert h.last_verification == {"passed": False}
    assert not L.verification_due(h, P, T + 309) and L.verification_due(h, P, T + 310)
    ok(h, T + 200)  # a passing check before the retry keeps the verification's reason
    assert h.reason == "verifying: verification failed (dcgmi diag exited 1); retry in 300 s"
    assert L.view(h, "b1")[2] is False
    ok(h, T + 310)
    assert h.reason == "verifying: verification due"
    verified(h, T + 320, passed=False, reason="")
    assert h.reason == "verifying: verification failed (no reason given); retry in 600 s"
    assert (h.verify_failures, h.next_verify_at) == (2, T + 920)
    assert not L.observe_verification(h, P, T + 919, passed=True).moved  # not due yet: ignored
    assert h.state == L.VERIFYING
    step = verified(h, T + 920)
    assert step.after == L.READY and (h.verify_failures, h.next_verify_at) == (0, None)


def test_a_verification_after_a_new_failure_proves_nothing():
    h = HostLadder(since=T)
    ok(h, T)
    bad(h, T + 1)
    step = verified(h, T + 2)
    assert (step.after, h.state, h.verified_at) == (L.FAILING, L.FAILING, None)


def test_a_verification_of_a_ready_host_is_ignored():
    h = ready_host()
    assert not L.verification_due(h, P, T + 1)
    before = h.verified_at
    verified(h, T + 1, passed=False)
    assert h.state == L.READY and h.verified_at == before


def test_a_new_failure_resets_the_verification_backoff():
    h = HostLadder(since=T)
    ok(h, T)
    verified(h, T + 1, passed=False, reason="x")
    bad(h, T + 2)
    assert (h.verify_failures, h.next_verify_at) == (0, None)
    ok(h, T + 3)
    assert L.verification_due(h, P, T + 3) and h.reason == "verifying: verification due"


# --- boot id and driver ---------------------------------------------------------------------------------------
def test_a_reboot_sends_a_ready_host_back_to_verifying():
    h = ready_host()
    step = ok(h, T + 50, boot="b2")
    assert (step.before, step.after, h.since) == (L.READY, L.VERIFYING, T + 50)
    assert h.reason == "verifying: rebooted since it was last verified, verification due"
    assert L.verification_due(h, P, T + 50)
    assert (h.clean_cycles, h.clean_since, h.verify_failures, h.next_verify_at) == (1, T + 50, 0, None)
    verified(h, T + 55, passed=False, reason="x")  # the first failure of this episode: the first backoff step
    assert h.reason == "verifying: verification failed (x); retry in 300 s" and h.verify_failures == 1
    verified(h, T + 355)
    assert h.state == L.READY and h.verified_boot == "b2"


def test_a_driver_change_sends_a_ready_host_back_to_verifying():
    h = ready_host()
    ok(h, T + 50, driver="575")
    assert h.state == L.VERIFYING
    assert h.reason == "verifying: driver changed since it was last verified (570 -> 575), verification due"


def test_a_ready_host_on_the_same_boot_and_driver_stays_ready():
    h = ready_host()
    step = ok(h, T + 50)
    assert (step.after, step.moved, h.since, h.reason) == (L.READY, False, T, "")


def test_a_reboot_uses_the_clean_window_again():
    pol = RecoveryPolicy(clean_cycles=2)
    h = HostLadder(since=T)
    ok(h, T, pol)
    ok(h, T + 1, pol)
    verified(h, T + 1, pol)
    ok(h, T + 5, pol, boot="b2")
    assert (h.clean_cycles, h.clean_since) == (1, T + 5) and not L.verification_due(h, pol, T + 5)
    assert h.reason == "verifying: clean window 1/2 checks, 0/0 s"


def test_view_of_a_ready_record_on_another_boot_or_driver():
    h = ready_host()
    assert L.view(h, "b1") == (L.READY, "", True)
    assert L.view(h, None) == (L.READY, "", True)  # a reader that cannot know the boot trusts the record
    assert L.view(h, "b2") == (L.VERIFYING, "verifying: rebooted since it was last verified", False)
    assert L.view(h, "b1", "575") == (L.READY, "", True)  # the driver is judged only when asked
    state, reason, ready = L.view(h, "b1", "575", check_driver=True)
    assert (state, ready) == (L.VERIFYING, False) and reason.endswith("(570 -> 575)")
    assert L.view(h, "b1", "570", check_driver=True) == (L.READY, "", True)


def test_changed_is_none_only_for_the_verified_boot_and_driver():
    h = ready_host()
    assert L._changed(h) is None
    assert L._changed(HostLadder()) == "never verified"


# --- recurrence ----------------------------------------------------------------------------------------------
def _episode(h, t, roots=("cuda.init",), policy=P):
    bad(h, t, roots=roots, policy=policy)
    ok(h, t + 1, policy)
    verified(h, t + 1, policy)


def test_the_same_root_cause_back_twice_needs_inspection():
    h = ready_host()
    _episode(h, T + 100)
    assert h.state == L.READY
    bad(h, T + 200)  # second occurrence: came back once
    assert h.state == L.FAILING
    ok(h, T + 201)
    verified(h, T + 201)
    step = bad(h, T + 300, summary="CUDA init failed")  # third: came back twice
    assert (step.before, step.after, h.since) == (L.READY, L.INSPECT, T + 300)
    assert h.inspect_count == 3
    assert h.reason == ("needs inspection: came back 2 times (3 failures) within the window: CUDA init failed; "
                        "no unattended heals until `gpudoctor release`")
    assert not L.may_heal(h)
    assert L.view(h, "b1")[:1] == (L.INSPECT,) and not L.view(h, "b1")[2]


def test_needs_inspection_survives_passing_checks_heals_and_verifications():
    h = ready_host()
    for t in (100, 200):
        _episode(h, T + t)
    bad(h, T + 300)
    assert h.state == L.INSPECT
    step = ok(h, T + 301)
    assert (step.after, h.since, h.failing_now) == (L.INSPECT, T + 300, False)
    assert not L.verification_due(h, P, T + 301)
    L.observe_heal(h, T + 302, "x")
    verified(h, T + 303)
    assert h.state == L.INSPECT
    bad(h, T + 400, summary="again")  # a fourth time: the count grows, the transition time stays
    assert (h.state, h.since, h.inspect_count) == (L.INSPECT, T + 300, 4)
    assert h.reason.startswith("needs inspection: came back 3 times (4 failures)") and "again" in h.reason


def test_recurrence_counts_only_the_same_root_cause():
    h = ready_host()
    _episode(h, T + 100, roots=["a"])
    _episode(h, T + 200, roots=["b"])
    bad(h, T + 300, roots=["c"])
    assert h.state == L.FAILING
    ok(h, T + 301)
    verified(h, T + 301)
    bad(h, T + 400, roots=["a"])  # a: 2 occurrences = came back once
    assert h.state == L.FAILING


def test_recurrence_counts_only_within_the_window():
    pol = RecoveryPolicy(window_s=1000)
    h = ready_host()
    _episode(h, T, policy=pol)
    _episode(h, T + 500, policy=pol)
    bad(h, T + 1001, policy=pol)  # the first occurrence is 1001 s old: out of the window
    assert h.state == L.FAILING
    assert [o[1] for o in h.onsets] == [T + 500, T + 1001]
    h2 = ready_host()
    _episode(h2, T, policy=pol)
    _episode(h2, T + 500, policy=pol)
    bad(h2, T + 1000, policy=pol)  # exactly at the window's edge: still inside
    assert h2.state == L.INSPECT


def test_recurrence_of_one_root_among_several():
    h = ready_host()
    _episode(h, T + 100, roots=["a"])
    _episode(h, T + 200, roots=["a"])
    step = bad(h, T + 300, roots=["b", "a", "c"], summary="A and B and C")
    assert step.after == L.INSPECT and h.inspect_count == 3
    assert h.reason.startswith("needs inspection: came back 2 times (3 failures)")


def test_recurrences_policy_of_one():
    pol = RecoveryPolicy(recurrences=1)
    h = ready_host()
    _episode(h, T + 1, policy=pol)
    bad(h, T + 10, policy=pol)
    assert h.state == L.INSPECT and h.inspect_count == 2


def test_a_continuing_failure_is_one_occurrence():
    h = ready_host()
    for t in range(1, 6):
        bad(h, T + t)
    assert h.state == L.FAILING and len(h.onsets) == 1


def test_a_new_root_while_failing_is_a_new_onset_of_that_root_only():
    h = ready_host()
    bad(h, T + 1, roots=["a"])
    step = bad(h, T + 2, roots=["a", "b"])
    assert h.onsets == [["a", T + 1], ["b", T + 2]] and step.between_failures_s == 1


def test_onset_history_is_bounded():
    h = ready_host()
    for i in range(L.HISTORY + 10):
        bad(h, T + 2 * i + 1, roots=[f"r{i}"])
        ok(h, T + 2 * i + 2)
    assert len(h.onsets) == L.HISTORY and h.onsets[-1][0] == f"r{L.HISTORY + 9}"


def test_time_between_failures():
    h = ready_host()
    assert bad(h, T + 100).between_failures_s is None  # the first failure has no predecessor
    assert bad(h, T + 150).between_failures_s is None  # not a new onset
    ok(h, T + 200)
    step = bad(h, T + 700)
    assert step.between_failures_s == 600 and h.last_failure_at == T + 700


# --- release ---------------------------------------------------------------------------------------------------
def _inspected():
    h = ready_host()
    for t in (100, 200):
        _episode(h, T + t)
    bad(h, T + 300)
    ok(h, T + 301)
    assert h.state == L.INSPECT
    return h


def test_release_with_a_passing_verification():
    h = _inspected()
    step = L.release(h, T + 400, passed=True, record={"passed": True}, boot_id="b1", driver="570")
    assert (step.before, step.after, h.since, h.reason) == (L.INSPECT, L.READY, T + 400, "")
    assert (h.onsets, h.inspect_count, h.verified_at, h.verified_boot) == ([], 0, T + 400, "b1")
    assert (h.clean_cycles, h.clean_since, h.verify_failures, h.next_verify_at) == (0, None, 0, None)
    assert h.last_verification == {"passed": True}
    bad(h, T + 500)  # the history is forgotten: one failure is just failing
    assert h.state == L.FAILING


def test_release_with_a_failing_verification_changes_nothing_but_the_reason():
    h = _inspected()
    reason = h.reason
    step = L.release(h, T + 400, passed=False, reason="dcgmi exited 1", boot_id="b1")
    assert (step.after, h.since) == (L.INSPECT, T + 300)
    assert h.reason == reason + "; release refused: verification failed (dcgmi exited 1)"
    L.release(h, T + 401, passed=False, reason="again")
    assert h.reason == reason + "; release refused: verification failed (again)"


def test_release_refused_while_the_check_fails():
    h = _inspected()
    bad(h, T + 350)
    reason, before = h.reason, h.verified_at
    step = L.release(h, T + 400, passed=True, boot_id="b1")
    assert step.after == L.INSPECT and h.reason == reason + "; release refused: the passive check still fails"
    assert h.verified_at == before == T + 201  # the earlier verification, not this one


def test_release_of_a_failing_host_with_a_failing_verification_keeps_its_reason():
    h = HostLadder(since=T)
    bad(h, T)
    L.release(h, T + 1, passed=False, reason="x")
    assert h.reason == "failing: CUDA init failed" and h.state == L.FAILING


def test_release_of_a_verifying_host_makes_it_ready_and_keeps_boot_and_driver_when_not_given():
    h = HostLadder(since=T)
    ok(h, T, RecoveryPolicy(clean_cycles=5))
    L.release(h, T + 1, passed=True)
    assert (h.state, h.verified_boot, h.verified_driver) == (L.READY, "b1", "570")
    L.release(h, T + 2, passed=True, boot_id="b9", driver="580")
    assert (h.boot_id, h.driver, h.verified_boot, h.verified_driver) == ("b9", "580", "b9", "580")


def test_release_of_a_ready_host_whose_verification_fails_takes_it_out_of_ready():
    h = HostLadder(since=T)
    ok(h, T)
    L.observe_verification(h, RecoveryPolicy(), T + 1, passed=True)
    assert h.state == L.READY
    step = L.release(h, T + 2, passed=False, reason="GEMM 400 TFLOP/s under its floor")
    assert (step.before, step.after, h.since) == (L.READY, L.VERIFYING, T + 2)
    assert h.reason == "verifying: verification failed at release (GEMM 400 TFLOP/s under its floor)"
    assert h.verify_failures == 1


# --- persistence -----------------------------------------------------------------------------------------------
def test_round_trip_and_bad_records():
    h = _inspected()
    again = HostLadder.from_json(h.to_json())
    assert again == h
    assert HostLadder.from_json({"state": "ready", "extra": 1}).state == L.READY
    with pytest.raises(ValueError, match="unknown ladder state 'sleeping'"):
        HostLadder.from_json({"state": "sleeping"})
    with pytest.raises(ValueError, match="must be a mapping"):
        HostLadder.from_json(["ready"])


def test_move_sets_since_when_missing():
    h = HostLadder()
    assert h.since is None
    bad(h, T)
    assert h.since == T


def test_a_new_record_as_persisted():
    assert HostLadder().to_json() == {
        "state": "failing", "since": None, "reason": "never verified: waiting for a passing check",
        "failing_now": False, "roots": [], "clean_cycles": 0, "clean_since": None, "verify_failures": 0,
        "next_verify_at": None, "last_verification": None, "verified_at": None, "verified_boot": None,
        "verified_driver": None, "boot_id": None, "driver": None, "onsets": [], "last_failure_at": None,
        "inspect_count": 0}
    assert L.HISTORY == 64  # failure onsets kept per host: the file stays small
    assert L.STATES == ("failing", "healing", "verifying", "ready", "needs-inspection")
