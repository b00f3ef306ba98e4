"""The resume and the drain bracketed by reads (#42, NHC #134): an admin's drain set between gpudoctor's read and
its write is left as the admin set it, and Slurm 24.11's kept reason is replaced by a note that is not a drain
reason. scontrol here is a stand-in that keeps the node's state in a file and follows slurmctld's update_node as
24.11 and 22.05 do it (src/slurmctld/node_mgr.c: a non-empty Reason= replaces the reason, an empty one is ignored;
state=resume takes DRAIN off; the reason is cleared by the accounting node_up hook, which 24.11 skips under
accounting_storage/none); the real slurmctld meets the same code in tests/gate/test_slurm_lab.py (22.05 in the main
suite, 24.11 in CI's Debian 13 stage)."""

from __future__ import annotations

import json
import sys

import pytest

from gpudoctor.gate import GateResult
from gpudoctor.host.local import LocalHost
from gpudoctor.integrations.slurm import RESUMED_NOTE, apply, make_reason

SCONTROL = r'''#!PYTHON
import json, os, sys
st_path = os.environ["SC_STATE"]
st = json.load(open(st_path))
st["calls"] += 1
args = sys.argv[1:]
inject = os.environ.get("SC_INJECT", "")
if inject and int(inject.split(":", 1)[0]) == st["calls"]:  # the admin, just before this call of ours
    st["state"] = st["state"].split("+")[0] + "+DRAIN"
    st["reason"] = inject.split(":", 1)[1]
    st["log"].append("admin drain")
st["log"].append(" ".join(args))
if args[:2] == ["show", "node"]:
    r = f"   Reason={st['reason']} [root@2026-12-05T10:00:00]\n" if st["reason"] else ""
    version = "24.11.5" if os.environ.get("SC_KEEPS_REASON") else "22.05.8"
    sys.stdout.write(f"NodeName={args[2]} Arch=x86_64\n   State={st['state']} ThreadsPerCore=1\n"
                     f"   Version={version}\n{r}")
elif args[:2] == ["show", "reservation"]:
    print("No reservations in the system")
elif args[0] == "update":
    kv = dict(a.split("=", 1) for a in args[1:])
    if kv.get("reason"):
        st["reason"] = kv["reason"]
    state = kv.get("state")
    if state == "drain":
        st["state"] = st["state"].split("+")[0] + "+DRAIN"
    elif state == "resume":
        st["state"] = st["state"].split("+")[0]
        if not os.environ.get("SC_KEEPS_REASON"):
            st["reason"] = None
json.dump(st, open(st_path, "w"))
'''


@pytest.fixture
def sc(tmp_path, monkeypatch):
    exe = tmp_path / "bin" / "scontrol"
    exe.parent.mkdir()
    exe.write_text(SCONTROL.replace("PYTHON", sys.executable + " -I"))
    exe.chmod(0o755)
    state = tmp_path / "state.json"
    monkeypatch.setenv("PATH", f"{exe.parent}:/usr/bin:/bin")
    monkeypatch.setenv("SC_STATE", str(state))

    def node(st, reason):
        state.write_text(json.dumps({"state": st, "reason": reason, "calls": 0, "log": []}))

    def now():
        return json.loads(state.read_text())

    return node, now


def passing():
    return GateResult("gpu01", "default")


OURS = make_reason("cuInit → 999")
ADMIN = "bad DIMM, ticket 4711"


@pytest.mark.parametrize("keeps", [False, True], ids=["slurm-22.05", "slurm-24.11"])
def test_an_admins_drain_before_the_re_read_is_left_as_set(sc, monkeypatch, keeps):
    node, now = sc
    node("IDLE+DRAIN", OURS)
    if keeps:
        monkeypatch.setenv("SC_KEEPS_REASON", "1")
    monkeypatch.setenv("SC_INJECT", f"3:{ADMIN}")  # after the read and the reservations, before the re-read
    act = apply(passing(), LocalHost(), node="gpu01")
    assert act.action == "kept" and "changed while gpudoctor decided" in act.detail and act.argv is None, act
    st = now()
    assert (st["state"], st["reason"]) == ("IDLE+DRAIN", ADMIN)
    assert not [c for c in st["log"] if c.startswith("update")], st["log"]


def test_an_admins_drain_undone_by_the_resume_is_put_back_where_slurm_keeps_reasons(sc, monkeypatch):
    node, now = sc
    node("IDLE+DRAIN", OURS)
    monkeypatch.setenv("SC_KEEPS_REASON", "1")
    monkeypatch.setenv("SC_INJECT", f"4:{ADMIN}")  # between the re-read and the resume
    act = apply(passing(), LocalHost(), node="gpu01")
    assert act.action == "kept" and "drained again in its words" in act.detail, act
    st = now()
    assert (st["state"], st["reason"]) == ("IDLE+DRAIN", ADMIN), st


def test_slurm_24_11_keeps_our_reason_and_it_is_replaced_by_a_note(sc, monkeypatch):
    node, now = sc
    node("IDLE+DRAIN", OURS)
    monkeypatch.setenv("SC_KEEPS_REASON", "1")
    act = apply(passing(), LocalHost(), node="gpu01")
    assert act.action == "resumed" and "Slurm kept the drain reason: replaced by" in act.detail, act
    st = now()
    assert st["state"] == "IDLE" and st["reason"].startswith(RESUMED_NOTE + " ")
    assert not st["reason"].startswith("gpudoctor:")  # not a drain of ours any more: a later drain is not "ours"
    assert "(was: " + OURS + ")" in st["reason"]
    # the next passing check finds an in-service node and writes nothing
    node(st["state"], st["reason"])
    again = apply(passing(), LocalHost(), node="gpu01")
    assert again.action == "none" and not [c for c in now()["log"] if c.startswith("update")]


def test_slurm_22_05_clears_the_reason_and_nothing_more_is_written(sc):
    node, now = sc
    node("IDLE+DRAIN", OURS)
    act = apply(passing(), LocalHost(), node="gpu01")
    assert act.action == "resumed" and act.detail == f"gpu01 resumed (gpudoctor had drained it: {OURS})"
    st = now()
    assert (st["state"], st["reason"]) == ("IDLE", None)
    assert [c for c in st["log"] if c.startswith("update")] == ["update nodename=gpu01 state=resume"]


def test_a_drain_whose_reason_changed_before_the_write_is_not_written(sc, monkeypatch):
    node, now = sc
    node("IDLE", None)
    monkeypatch.setenv("SC_INJECT", f"3:{ADMIN}")
    act = apply(_failing(), LocalHost(), node="gpu01")
    assert act.action == "kept" and "changed while gpudoctor decided" in act.detail
    assert now()["reason"] == ADMIN  # never over-written by ours


def _failing():
    class R:  # a GateResult that failed with this headline (what apply reads of it)
        passed = False
        headline = "cuInit → 999"
    return R()
