"""Every `scontrol show node` State= form met on the real Slurm 22.05 (tests/fixtures/slurm/, captured from the lab in
tests/slurmlab.py) parses, and the gate's decision on each keeps an admin's state untouched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpudoctor.integrations.slurm import NodeInfo, decide, make_reason, parse_reservations, parse_show_node

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
NEW = "cuInit → 999"

# fixture -> (State=, reason, on a failing gate, on a passing gate); actions: drained, resumed, kept, none
CASES = {
    "idle": ("IDLE", None, "drained", "none"),
    "mixed": ("MIXED", None, "drained", "none"),
    "idle-not-responding": ("IDLE+NOT_RESPONDING", None, "drained", "none"),  # ~1 s after every resume
    "idle-drain-gpudoctor": ("IDLE+DRAIN", "gpudoctor: test cause", "drained", "resumed"),
    "idle-completing-drain": ("IDLE+COMPLETING+DRAIN", "admin drain", "kept", "kept"),
    "idle-drain-admin": ("IDLE+DRAIN", "bad DIMM, ticket 4711", "kept", "kept"),
    "mixed-drain-admin": ("MIXED+DRAIN", "admin drain while busy", "kept", "kept"),
    "idle-drain-long-reason": ("IDLE+DRAIN", "gpudoctor: " + "x" * 5200, "drained", "resumed"),
    "idle-drain-not-responding-gpudoctor": ("IDLE+DRAIN+NOT_RESPONDING", "gpudoctor: old", "drained", "kept"),
    "down-admin": ("DOWN", "bad PSU, ticket 812", "kept", "kept"),
    "down-drain-gpudoctor": ("DOWN+DRAIN", "gpudoctor: x", "kept", "kept"),
    "down-drain-not-responding-gpudoctor": ("DOWN+DRAIN+NOT_RESPONDING", "gpudoctor: old", "kept", "kept"),
    "idle-fail": ("IDLE+FAIL", "failing disk", "kept", "kept"),
    "idle-maintenance-reserved": ("IDLE+MAINTENANCE+RESERVED", None, "kept", "kept"),
    "idle-reboot-requested": ("IDLE+REBOOT_REQUESTED", "reboot requested", "kept", "kept"),
    "mixed-drain-reboot-requested": ("MIXED+DRAIN+REBOOT_REQUESTED", "kernel update", "kept", "kept"),
    "down-reboot-issued": ("DOWN+REBOOT_ISSUED", "reboot requested : reboot issued", "kept", "kept"),
}


def test_every_captured_fixture_has_a_case():
    assert sorted(p.stem for p in FIX.glob("*.txt")) == sorted(CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_real_states_parse_and_decide(name):
    state, reason, on_fail, on_pass = CASES[name]
    info = parse_show_node((FIX / f"{name}.txt").read_text())
    assert (info.state, info.reason) == (state, reason)
    failing = decide(info, False, "gpu01", NEW)
    passing = decide(info, True, "gpu01")
    assert (failing.action, passing.action) == (on_fail, on_pass), (failing.detail, passing.detail)
    if on_fail == "drained":
        assert failing.argv == ["scontrol", "update", "nodename=gpu01", "state=drain", f"reason={make_reason(NEW)}"]
    if on_pass == "resumed":
        assert passing.argv == ["scontrol", "update", "nodename=gpu01", "state=resume"]
    for act in (failing, passing):
        if act.action == "kept":
            assert act.argv is None and len(act.detail) < 400  # a 5000-character reason is shortened in the line


def test_the_completing_admin_drain_names_its_state_and_reason():
    info = parse_show_node((FIX / "idle-completing-drain.txt").read_text())
    assert decide(info, True, "gpu01").detail == (
        "gpu01 left as is: drained by someone else (State=IDLE+COMPLETING+DRAIN, Reason=admin drain); gpudoctor "
        "changes only a node in service or one it drained itself")
    down = parse_show_node((FIX / "down-drain-not-responding-gpudoctor.txt").read_text())
    assert decide(down, True, "gpu01").detail.startswith(
        "gpu01 left as is: DOWN (State=DOWN+DRAIN+NOT_RESPONDING, Reason=gpudoctor: old)")


@pytest.mark.parametrize("state", ["DRAINED", "DRNG", "IDLE+DRAINED", "FUTURE", "UNKNOWN", "IDLE+POWERED_DOWN", "IDLE+POWERING_UP",
                                   "IDLE+INVALID_REG", "ERROR", ""])
def test_states_gpudoctor_does_not_know_are_left_alone(state):
    info = NodeInfo(state or None, "gpudoctor: old")
    assert decide(info, True, "n1").action == "kept"
    assert decide(info, False, "n1", NEW).action == "kept"


def test_an_active_maint_reservation_is_an_admins_state_before_state_shows_it():
    text = ("ReservationName=maint1 StartTime=2026-12-01T21:30:26 EndTime=2026-12-01T22:30:26 Duration=01:00:00\n"
            "   Nodes=gpu01 NodeCnt=1 CoreCnt=2 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES\n"
            "   TRES=cpu=2\n"
            "   Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a\n")
    (r,) = parse_reservations(text)
    assert (r["ReservationName"], r["Flags"], r["State"], r["Nodes"]) == ("maint1", "MAINT,SPEC_NODES", "ACTIVE",
                                                                         "gpu01")
    assert parse_reservations("No reservations in the system\n") == []
    info = NodeInfo("IDLE", None, ("maint1",))
    assert decide(info, False, "gpu01", NEW).detail.startswith(
        "gpu01 left as is: in maintenance reservation maint1 (State=IDLE)")


def test_only_slurm_py_runs_scontrol():
    """One implementation: no other module drains or resumes a node (the daemon's healing, --npd)."""
    root = Path(__file__).resolve().parents[2]
    literal = re.compile(r"""["']scontrol\b|state=(resume|drain|down|undrain)""", re.I)
    users = sorted(str(p.relative_to(root)) for d in ("gpudoctor", "checks", "remedies")
                   for p in (root / d).rglob("*.py") if literal.search(p.read_text()))
    assert users == ["gpudoctor/integrations/slurm.py"]
