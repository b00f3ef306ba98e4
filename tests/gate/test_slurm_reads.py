"""integrations/slurm.py reading a node through a real LocalHost (#35: what bench/mutation.py found no test failing
on): each scontrol read that fails leaves the node as it is and says which command failed; a MAINT reservation
found past other reservations, by `scontrol show hostnames` of its node list; the reason's 200-character edge; the
action's JSON. scontrol is a stand-in script on PATH, in scontrol's words (tests/gate/test_slurm_lab.py meets the
real one)."""

from __future__ import annotations

import json

import pytest

from gpudoctor.gate import GateResult
from gpudoctor.host.local import LocalHost
from gpudoctor.integrations.slurm import MAX_REASON, SlurmAction, apply, decide, make_reason, read_node, NodeInfo

SHOW = ("NodeName=gpu01 Arch=x86_64\n   NodeAddr=gpu01 NodeHostName=gpu01 Version=22.05.8\n"
        "   State=IDLE+DRAIN ThreadsPerCore=1\n"
        "   Reason=gpudoctor: old [root@2024-05-02T09:00:00]\n")
RESV = ("ReservationName=users1 StartTime=2026-12-01T21:30:26 EndTime=2026-12-01T22:30:26\n"
        "   Nodes=gpu[01-02] NodeCnt=2 Flags=SPEC_NODES State=ACTIVE\n"
        "ReservationName=later StartTime=2027-01-01T00:00:00 EndTime=2027-01-01T01:00:00\n"
        "   Nodes=gpu01 NodeCnt=1 Flags=MAINT,SPEC_NODES State=INACTIVE\n"
        "ReservationName=maint1 StartTime=2026-12-01T21:30:26 EndTime=2026-12-01T22:30:26\n"
        "   Nodes=gpu[01-02] NodeCnt=2 Flags=MAINT,SPEC_NODES State=ACTIVE\n")

SCONTROL = """#!/bin/sh
echo "$*" >> "$SC_LOG"
case "$1 $2" in
  "show node") [ -n "$SC_FAIL_NODE" ] && { echo "slurm_load_node error: Unable to contact slurm controller" >&2; exit 1; }
               cat "$SC_SHOW" ;;
  "show reservation") [ -n "$SC_FAIL_RESV" ] && { echo "slurm_load_reservations error: Zero Bytes" >&2; exit 1; }
               cat "$SC_RESV" ;;
  "show hostnames") [ -n "$SC_FAIL_HOSTS" ] && { echo "Invalid hostlist: $3" >&2; exit 1; }
               [ "$3" = "gpu[01-02]" ] && printf 'gpu01\\ngpu02\\n' ;;
  update*) [ -n "$SC_FAIL_UPDATE" ] && { echo "slurm_update error: Access/permission denied" >&2; exit 1; } ;;
esac
exit 0
"""


def passing():
    return GateResult("gpu01", "default")  # no blockers: the gate passed


@pytest.fixture
def sc(tmp_path, monkeypatch):
    exe = tmp_path / "bin" / "scontrol"
    exe.parent.mkdir()
    exe.write_text(SCONTROL)
    exe.chmod(0o755)
    (tmp_path / "show").write_text(SHOW)
    (tmp_path / "resv").write_text("No reservations in the system\n")
    monkeypatch.setenv("PATH", f"{exe.parent}:/usr/bin:/bin")
    for k, v in {"SC_LOG": "log", "SC_SHOW": "show", "SC_RESV": "resv"}.items():
        monkeypatch.setenv(k, str(tmp_path / v))

    def calls():
        log = tmp_path / "log"
        return log.read_text().splitlines() if log.exists() else []

    return tmp_path, calls


@pytest.mark.parametrize("fail,said", [
    ("SC_FAIL_NODE", "`scontrol show node gpu01` failed: $ scontrol show node gpu01 → rc 1: slurm_load_node error"),
    ("SC_FAIL_RESV", "`scontrol show reservation` failed: $ scontrol show reservation → rc 1: "
                     "slurm_load_reservations error: Zero Bytes"),
], ids=["show-node", "show-reservation"])
def test_a_failed_read_leaves_the_node_and_names_the_command(sc, monkeypatch, fail, said):
    tmp, calls = sc
    monkeypatch.setenv(fail, "1")
    info = read_node(LocalHost(), "gpu01")
    assert isinstance(info, str) and info.startswith(said), info
    act = apply(passing(), LocalHost(), node="gpu01")  # a pass would resume this gpudoctor drain...
    assert (act.action, act.argv) == ("failed", None)
    assert act.detail == f"gpu01 left as is: its state could not be read ({info})"
    assert not [c for c in calls() if c.startswith("update")]  # ...but nothing is changed unread


def test_an_active_maint_reservation_past_others_is_found_through_hostnames(sc):
    tmp, calls = sc
    (tmp / "resv").write_text(RESV)
    info = read_node(LocalHost(), "gpu01")
    assert isinstance(info, NodeInfo), info
    assert (info.state, info.reason, info.maintenance) == ("IDLE+DRAIN", "gpudoctor: old", ("maint1",))
    assert "show hostnames gpu[01-02]" in calls() and "show hostnames gpu01" not in calls()  # inactive: not asked
    act = apply(passing(), LocalHost(), node="gpu01")
    assert act.action == "kept" and "in maintenance reservation maint1" in act.detail
    assert not [c for c in calls() if c.startswith("update")]
    assert read_node(LocalHost(), "gpu03").maintenance == ()  # not in the reservation's list


def test_a_failed_hostnames_expansion_is_a_failed_read(sc, monkeypatch):
    tmp, calls = sc
    (tmp / "resv").write_text(RESV)
    monkeypatch.setenv("SC_FAIL_HOSTS", "1")
    assert read_node(LocalHost(), "gpu01") == ("`scontrol show hostnames gpu[01-02]` failed: "
                                               "$ scontrol show hostnames 'gpu[01-02]' → rc 1: Invalid hostlist: "
                                               "gpu[01-02]")


def test_the_reason_is_kept_to_200_characters_and_cut_on_one():
    assert MAX_REASON == 200
    exact = "x" * (200 - len("gpudoctor: "))
    assert make_reason(exact) == "gpudoctor: " + exact and len(make_reason(exact)) == 200
    cut = make_reason(exact + "yz")
    assert cut == "gpudoctor: " + exact[:-1] + "…" and len(cut) == 200


def test_the_action_as_json():
    act = decide(NodeInfo("IDLE", None), False, "gpu01", "cuInit → 999")
    assert json.loads(json.dumps(act.to_json())) == {
        "action": "drained", "detail": "gpu01 drained: gpudoctor: cuInit → 999",
        "argv": ["scontrol", "update", "nodename=gpu01", "state=drain", "reason=gpudoctor: cuInit → 999"]}
    assert SlurmAction("none", "x").to_json() == {"action": "none", "detail": "x", "argv": None}


def test_a_refused_resume_is_named_as_a_resume(sc, monkeypatch):
    tmp, calls = sc
    monkeypatch.setenv("SC_FAIL_UPDATE", "1")
    act = apply(passing(), LocalHost(), node="gpu01")
    assert act.action == "failed" and act.argv == ["scontrol", "update", "nodename=gpu01", "state=resume"]
    assert act.detail == ("could not resume gpu01: $ scontrol update nodename=gpu01 state=resume → rc 1: "
                          "slurm_update error: Access/permission denied")


def test_every_reason_to_leave_a_node_is_named_and_our_own_drain_is_kept():
    act = decide(NodeInfo("DOWN+DRAIN+FAIL", "bad PSU", ("m1",)), False, "gpu01", "x")
    assert act.detail.startswith("gpu01 left as is: DOWN, FAIL, in maintenance reservation m1, drained by someone "
                                 "else (State=DOWN+DRAIN+FAIL, Reason=bad PSU)")
    same = decide(NodeInfo("IDLE+DRAIN", make_reason("cuInit → 999")), False, "gpu01", "cuInit → 999")
    assert (same.action, same.argv, same.detail) == ("kept", None, "gpu01 already drained by gpudoctor for this reason")


@pytest.mark.parametrize("state", ["ALLOCATED", "MIXED+COMPLETING", "IDLE+RESERVED", "MIXED+PLANNED", "IDLE+CLOUD",
                                   "IDLE+DYNAMIC_NORM", "ALLOCATED+NOT_RESPONDING"])
def test_a_node_in_service_with_a_harmless_flag_is_drained_on_failure(state):
    """Slurm's words for a node that runs or may run jobs (a job ending, a reservation for users, the scheduler's
    plans, a cloud or dynamic node): gpudoctor drains it when the gate fails."""
    act = decide(NodeInfo(state, None), False, "gpu01", "cuInit → 999")
    assert act.action == "drained", act.detail


def test_a_state_that_could_not_be_read_is_named():
    assert decide(NodeInfo(None, None), False, "gpu01", "x").detail.startswith(
        "gpu01 left as is: its state could not be read (State=None)")
