"""The verification's deep step on real H200 deep snapshots (2026-12-03), through the one pipeline (#31).

These tests open each snapshot with its transcript set aside: the recorded facts go through open_target ->
pipeline.check_host -> the checks, exactly as a live deep run's facts do (the contended snapshot's facts are the forced
measurement's, with its clock event and H2D figure). Replayed from the transcript instead (tests/core/
test_deep_h200_replay.py), the contended card is refused before it is measured — a verification never forces: "GPU 0:
not measured: pid 4461 (python3, 2922 MiB) holds it". The PID-first assertion below holds both ways.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.recovery.verify import VerifyPolicy, judge_deep, run_verification
from gpudoctor.target import open_target
from tests.needs import unavailable

SNAPS = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "h200-2026-12-03"
DEEP_ONLY = VerifyPolicy(deep="on", serving="off", timeout_s=120.0)


def replayable(name: str) -> dict:
    doc = json.loads((SNAPS / f"h200-deep-{name}.snapshot.json").read_text())
    doc.pop("transcript")  # see the module docstring (#33 item 2)
    return doc


def verify(name: str, policy: VerifyPolicy = DEEP_ONLY):
    t = open_target(snapshot=replayable(name), search=False)
    before = dict(t.context.policy)
    try:
        v = run_verification(t, policy)
    finally:
        t.close()
    assert t.context.policy == before  # the caller's target is not changed: the deep run has its own context
    return t, v


def test_the_healthy_h200_passes_on_every_figure():
    t, v = verify("healthy")
    assert v.passed, v.reason
    deep = v.steps[0]
    assert deep.name == "deep" and deep.status == "pass"
    assert "4 figures on 1 GPU(s) at or above their floors" in deep.detail


def test_the_contended_h200_fails_naming_the_contenders_pid_first():
    _, v = verify("contended")
    assert not v.passed
    first = v.reason.split("; ")[0]
    assert first.startswith("deep: GPU 0: ") and "pid 4461 (python3, 2922 MiB)" in first, v.reason
    assert first == "deep: GPU 0: another process used the GPU during the measurement: pid 4461 (python3, 2922 MiB)"
    # and the clock event and the figure it cost are in the same line
    assert "clocks held down by sw_power_cap" in v.reason and "H2D pinned 43.9 GB/s" in v.reason
    assert "\n" not in v.reason


def test_a_gpu_without_gemm_is_not_verified():
    """The ctypes backend (no torch) measures no GEMM: the gate's deep_floors passes that, the verification does
    not — it names what is missing and the key that fixes it."""
    _, v = verify("ctypes-default")
    assert not v.passed
    # the deep tier's own words for it may change (issue #33); what must hold: the GPU, the figure, the way out
    assert "GPU 0: " in v.reason and "not measured" in v.reason and "gemm" in v.reason.lower(), v.reason
    assert v.reason.endswith("the ctypes backend measures no GEMM: policy.verify.deep_python names a python with "
                             "torch"), v.reason


def test_deep_off_and_auto_without_a_gpu():
    _, v = verify("healthy", VerifyPolicy(deep="off", serving="off"))
    assert not v.passed and v.reason.startswith("nothing to verify:") and "policy.verify.deep" in v.reason
    _, v = verify("healthy", VerifyPolicy(deep="auto", serving="off"))
    assert v.passed, v.reason  # the snapshot measured a GPU: auto applies


def test_a_diagnosis_without_deep_figures_fails():
    from gpudoctor.diagnose import diagnose

    facts = open_target(snapshot=replayable("healthy"), search=False).facts()
    facts.pop("deep")
    status, detail = judge_deep(diagnose(facts))
    assert status == "fail" and "none were measured" in detail, detail


def test_deep_on_a_host_without_nvidia_fails_closed():
    """This machine has no NVIDIA GPU: deep "on" must fail (could not judge), auto must not apply."""
    t = open_target(None, search=False)
    try:
        if t.host.listdir("/dev") and any(n.startswith("nvidia") and n[6:].isdigit() for n in t.host.listdir("/dev")):
            unavailable("this machine has an NVIDIA GPU: the no-GPU verification cannot be shown here")
        v = run_verification(t, VerifyPolicy(deep="auto", serving="off"))
        assert v.steps[0].status == "not-run" and "no NVIDIA GPU" in v.steps[0].detail
        v = run_verification(t, VerifyPolicy(deep="on", serving="off", timeout_s=120))
        assert not v.passed and v.steps[0].status == "fail" and v.reason.startswith("deep: "), v.reason
    finally:
        t.close()


@pytest.mark.parametrize("what, sample, words", [
    ("procs", [{"pid": 31337, "name": "python3", "used_mib": 4096}],
     "GPU 0: another process used the GPU during the measurement: pid 31337 (python3, 4096 MiB)"),
    ("reasons", ["hw_thermal_slowdown"], "GPU 0: clocks held down by hw_thermal_slowdown during the measurement"),
])
def test_a_contender_or_clock_event_fails_even_when_every_figure_met_its_floor(what, sample, words):
    """The healthy H200's own record with a process (or a clock event) added to its GEMM's samples: every figure
    is still above its floor, so the checks name no cause; the verification fails all the same."""
    doc = replayable("healthy")
    gemm = next(t for t in doc["facts"]["deep"]["gpus"][0]["result"]["tests"] if t["kind"] == "gemm")
    gemm["samples"][what] = sample
    t = open_target(snapshot=doc, search=False)
    v = run_verification(t, DEEP_ONLY)
    assert not v.passed and v.reason == f"deep: {words}", v.reason


def test_a_deep_run_past_its_deadline_fails_and_is_never_doubled():
    """This machine's real pipeline with deep on, given 50 ms: the run outlives its verification (fail), and a
    verification started while it still measures does not start a second one on the same host (fail, said why)."""
    from gpudoctor.recovery import verify as vmod

    t = open_target(None, search=False)
    try:
        short = VerifyPolicy(deep="on", serving="off", timeout_s=0.05)
        v = run_verification(t, short)
        assert not v.passed and "the deep tier did not finish in 0.05 s" in v.reason, v.reason
        again = run_verification(t, VerifyPolicy(deep="on", serving="off", timeout_s=30))
        assert not again.passed and "is still measuring: not started again" in again.reason, again.reason
        th = vmod._DEEP_RUNS[t.name][0]
        th.join(60)
        assert not th.is_alive()
    finally:
        t.close()


def test_a_required_figure_reported_as_not_measured_fails_once():
    """At the interface (the findings): a GEMM the deep tier reports as 'not measured' (info, no floor: what it says
    without torch) fails the step, said once; a GEMM with no finding at all fails as missing."""
    from gpudoctor.diagnose import Diagnosis
    from gpudoctor.findings import Finding, Status

    def fig(kind, status=Status.OK, summary=None, floor=0.7):
        return Finding("fabric.deep.figure", status, summary or f"GPU 0: {kind} ok", subject=f"GPU 0 {kind}",
                       data={"gpu": 0, "kind": kind, "floor": floor, "backend": "ctypes"})

    ok = [fig(k) for k in ("h2d", "d2h", "d2d")]
    status, detail = judge_deep(Diagnosis("h", ok + [fig("gemm", Status.INFO, "GPU 0: gemm: not measured: no python "
                                                                              "with torch", floor=None)]))
    assert status == "fail" and detail.count("not measured") == 1 and "no python with torch" in detail, detail
    status, detail = judge_deep(Diagnosis("h", ok))
    assert status == "fail" and detail.startswith("GPU 0: bf16 GEMM not measured (backend ctypes); the ctypes "
                                                  "backend measures no GEMM"), detail
    assert judge_deep(Diagnosis("h", ok + [fig("gemm")]))[0] == "pass"


def test_through_the_ladder_the_contended_card_stays_not_ready_and_the_healthy_one_is_ready(tmp_path):
    """The ladder's own sequence (recovery.advance) with this verification: the H200 while a contender ran keeps
    the host verifying with the PID in its reason; the same card measured healthy makes it ready."""
    from gpudoctor.recovery.advance import advance
    from gpudoctor.recovery.ladder import RecoveryPolicy
    from gpudoctor.recovery.store import RecoveryStore

    store, pol = RecoveryStore(tmp_path / "recovery.json"), RecoveryPolicy(retry_s=0.0)

    def check(now, snap):
        t = open_target(snapshot=replayable(snap), search=False)
        return advance(store, "vm", pol, now, passed=True, boot_id="b", driver="580.159.04",
                       verify=lambda: run_verification(t, DEEP_ONLY), clock=lambda: now)

    adv = check(100.0, "contended")
    assert not adv.ready and adv.ladder.state == "verifying" and "pid 4461" in adv.ladder.reason, adv.ladder.reason
    adv = check(200.0, "healthy")
    assert adv.ready and adv.ladder.state == "ready" and adv.verification.passed, adv.ladder.reason
