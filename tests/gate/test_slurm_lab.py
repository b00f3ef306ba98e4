"""`gpudoctor gate --slurm` against the real Slurm 22.05 (tests/slurmlab.py): as a command, as HealthCheckProgram
through the wrapper docs/gate.md documents, as a Prolog; and an admin's state, set with scontrol as an admin would,
is never changed by it — neither by a failing gate (no drain over it) nor by a passing one (no resume). The gate is
live (a replay acts on no node): gate_harness.Live, a host whose verdict one mknod turns."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from gate_harness import LIVE_CAUSE, Live

from gpudoctor.integrations.slurm import RESUMED_NOTE, make_reason, parse_show_node

pytestmark = pytest.mark.usefixtures("node")

ROOT = Path(__file__).resolve().parents[2]
BAD, GOOD = "bad", "good"
ROOT_CAUSE = LIVE_CAUSE
LIVES: dict = {}


@pytest.fixture(autouse=True)
def verified(tmp_path, node):
    """The lab's node as a live inventory host (gate_harness.Live) whose verification (policy verify: commands)
    passes while the flag file exists, and the ladder's file in this test's directory: the gate resumes a node only
    after a passing verification (docs/recovery.md)."""
    flag = tmp_path / "verify-passes"
    flag.touch()
    LIVES[tmp_path] = Live(tmp_path, flag, name=node.node)
    yield flag
    del LIVES[tmp_path]


def gate(lab, tmp_path, verdict, *extra):
    """`gpudoctor gate --slurm` inside the lab's namespace, as slurmd's node would run it, on the live host made to
    fail (BAD) or pass (GOOD) first."""
    live = LIVES[tmp_path]
    (live.bad if verdict == BAD else live.good)()
    return lab.run([*live.cli, "gate", "--slurm", *live.args, "--recovery-file", str(tmp_path / "recovery.json"),
                    *extra], cwd=tmp_path,
                   env={**live.env, "HOME": str(tmp_path), "SLURMD_NODENAME": lab.node, "GPUDOCTOR_INVENTORY": ""})


def info(lab):
    return parse_show_node(lab.show())


def test_a_failing_gate_drains_and_a_passing_one_resumes(node, tmp_path):
    r = gate(node, tmp_path, BAD)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"slurm: {node.node} drained: gpudoctor: {ROOT_CAUSE}" in r.stderr
    i = info(node)
    assert i.state == "IDLE+DRAIN" and i.reason == make_reason(ROOT_CAUSE)  # Slurm keeps our reason byte for byte
    r = gate(node, tmp_path, BAD)  # the same failure again: nothing to change
    assert r.returncode == 2 and "already drained by gpudoctor for this reason" in r.stderr
    r = gate(node, tmp_path, GOOD)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"slurm: {node.node} resumed (gpudoctor had drained it: gpudoctor: {ROOT_CAUSE})" in r.stderr
    node.wait_state(lambda s: s == "IDLE", 10)
    i = info(node)
    if node.keeps_reasons():  # 24.11 without accounting storage: ours replaced by a note that is no drain reason
        assert "Slurm kept the drain reason: replaced by" in r.stderr, r.stderr
        assert i.reason.startswith(f"{RESUMED_NOTE} ") and f"(was: {make_reason(ROOT_CAUSE)})" in i.reason, i.reason
    else:
        assert i.reason is None


def _down(lab):
    lab.scontrol("update", f"nodename={lab.node}", "state=down", "reason=bad PSU, ticket 812")


def _drain(lab):
    lab.scontrol("update", f"nodename={lab.node}", "state=drain", "reason=bad DIMM, ticket 4711")


def _drain_long(lab):
    lab.scontrol("update", f"nodename={lab.node}", "state=drain", "reason=" + "fan curve under review; " * 220)


def _fail(lab):
    lab.scontrol("update", f"nodename={lab.node}", "state=fail", "reason=failing disk")


def _maint(lab):
    lab.scontrol("create", "reservation", "reservationname=gpd_maint", "starttime=now", "duration=10",
                 f"nodes={lab.node}", "users=root", "flags=maint")


def _reboot(lab):
    lab.run(["sbatch", "-N1", "-n1", "-o", "/dev/null", "--wrap", "sleep 60"])  # busy: the reboot waits for it
    lab.wait_state(lambda s: s.startswith("MIXED"), 10)
    lab.scontrol("reboot", "ASAP", "nextstate=resume", "reason=kernel update", lab.node)


ADMIN = {  # how an admin sets it -> what State= shows right after (the reservation shows only a few s later)
    "down": (_down, "DOWN", "bad PSU, ticket 812"),
    "drain-other-reason": (_drain, "IDLE+DRAIN", "bad DIMM, ticket 4711"),
    "drain-5000-chars": (_drain_long, "IDLE+DRAIN", ("fan curve under review; " * 220).strip()),
    "fail": (_fail, "IDLE+FAIL", "failing disk"),
    "maint-reservation": (_maint, ("IDLE", "IDLE+MAINTENANCE+RESERVED"), None),
    "reboot-requested": (_reboot, "MIXED+DRAIN+REBOOT_REQUESTED", "kernel update"),
}


@pytest.mark.parametrize("admin", list(ADMIN))
def test_an_admins_state_is_never_changed(node, tmp_path, admin):
    setup, state, reason = ADMIN[admin]
    states = state if isinstance(state, tuple) else (state,)
    setup(node)
    before = node.show()
    assert info(node).state in states and info(node).reason == reason
    for verdict, code in ((BAD, 2), (GOOD, 0)):  # a failing gate drains nothing over it, a passing one resumes nothing
        r = gate(node, tmp_path, verdict)
        assert r.returncode == code, r.stdout + r.stderr
        assert f"slurm: {node.node} left as is: " in r.stderr
        assert any(f"(State={s}" in r.stderr for s in states), r.stderr
        assert "gpudoctor changes only a node in service or one it drained itself" in r.stderr
        assert "Traceback" not in r.stderr
        after = info(node)
        assert after.state in states and after.reason == reason, node.show()
    assert _reason_line(node.show()) == _reason_line(before)


def _reason_line(text):
    return [line for line in text.splitlines() if line.strip().startswith("Reason=")]


def test_a_gpudoctor_drain_an_admin_took_down_is_not_resumed(node, tmp_path):
    assert gate(node, tmp_path, BAD).returncode == 2
    node.scontrol("update", f"nodename={node.node}", "state=down", "reason=gpudoctor: PSU swap, ticket 813")
    r = gate(node, tmp_path, GOOD)  # our prefix, but DOWN is not the state gpudoctor left it in
    assert r.returncode == 0 and "left as is: DOWN (State=DOWN+DRAIN, Reason=gpudoctor: PSU swap" in r.stderr
    assert info(node).state == "DOWN+DRAIN"


def _wrapper(lab, tmp_path) -> Path:
    """docs/gate.md's wrapper, verbatim but for two lines a test needs: the lab's slurm.conf (a real node reads
    /etc/slurm/slurm.conf) and, in place of /usr/local/bin/gpudoctor, this run's gpudoctor gating the live host."""
    doc = (ROOT / "docs" / "gate.md").read_text()
    text = re.search(r"```sh\n(#!/bin/sh\n.*?)```", doc, re.S).group(1)
    assert "export PATH" in text and "/usr/local/bin/gpudoctor gate --slurm" in text
    shim = LIVES[tmp_path].shim(tmp_path / "gpudoctor-under-test", "--recovery-file", str(tmp_path / "recovery.json"))
    text = text.replace("/usr/local/bin/gpudoctor", str(shim), 1)
    text = text.replace("#!/bin/sh\n", f"#!/bin/sh\nSLURM_CONF={lab.conf}; export SLURM_CONF\n", 1)
    path = tmp_path / "gpudoctor-slurm-check"
    path.write_text(text)
    path.chmod(0o755)
    tmp_path.chmod(0o755)
    return path


def test_health_check_program_drains_then_resumes(node, tmp_path):
    live = LIVES[tmp_path].bad()
    node.write_conf(HealthCheckProgram=str(_wrapper(node, tmp_path)), HealthCheckInterval="1")
    try:
        node.scontrol("reconfigure")
        node.wait_state(lambda s: s == "IDLE+DRAIN", 30)  # slurmd ran it with only SLURMD_NODENAME set
        assert info(node).reason == make_reason(ROOT_CAUSE)
        live.good()
        node.wait_state(lambda s: s == "IDLE", 30)
    finally:
        node.write_conf(HealthCheckProgram=None, HealthCheckInterval=None)
        node.scontrol("reconfigure")


def test_a_failing_prolog_drains_and_the_job_is_requeued_held(node, tmp_path):
    LIVES[tmp_path].bad()
    node.write_conf(Prolog=str(_wrapper(node, tmp_path)))
    try:
        node.scontrol("reconfigure")
        job = node.run(["sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap", "true"]).stdout.strip()
        assert job.isdigit()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            shown = node.run(["scontrol", "show", "job", job]).stdout
            # the requeue passes through COMPLETING (seen under load: JobState=COMPLETING with the held reason)
            if "JobState=PENDING" in shown and "Reason=launch_failed_requeued_held" in shown:
                break
            time.sleep(0.2)
        assert "JobState=PENDING" in shown and "Reason=launch_failed_requeued_held" in shown, shown
        while time.monotonic() < deadline and info(node).state != "IDLE+DRAIN":  # COMPLETING leaves the node too
            time.sleep(0.2)
        i = info(node)
        assert i.state == "IDLE+DRAIN" and i.reason == make_reason(ROOT_CAUSE)  # the gate's reason, not "Prolog error"
    finally:
        node.write_conf(Prolog=None)
        node.scontrol("reconfigure")


def test_the_recovery_ladder_in_real_slurm(node, tmp_path, verified):
    """The arc through the real slurmctld: drained with a gpudoctor: reason -> checks pass but the verification
    fails (still drained, Slurm's reason says why) -> passes -> resumed; the same fault three times ->
    needs-inspection (not resumed by passing checks); `gpudoctor release` verifies (fails, then passes) and the next
    gate resumes. An admin's drain over ours at the end is never resumed."""
    live = LIVES[tmp_path]
    inv = live.inventory
    inv.write_text(inv.read_text() + "  recovery: {retry_s: 0}\n")  # a failed verification is retried at once

    def release():
        return node.run([*live.cli, "release", node.node, "--inventory", str(inv), "--recovery-file",
                         str(tmp_path / "recovery.json")], cwd=tmp_path, env={**live.env, "HOME": str(tmp_path)})

    assert gate(node, tmp_path, BAD).returncode == 2
    assert info(node).state == "IDLE+DRAIN" and info(node).reason == make_reason(ROOT_CAUSE)
    verified.unlink()
    r = gate(node, tmp_path, GOOD)
    assert r.returncode == 2, r.stdout + r.stderr
    i = info(node)
    assert i.state == "IDLE+DRAIN" and i.reason.startswith("gpudoctor: verifying: verification failed (commands: "
                                                           "test -e "), i.reason
    verified.touch()
    r = gate(node, tmp_path, GOOD)
    assert r.returncode == 0 and "resumed (gpudoctor had drained it: gpudoctor: verifying:" in r.stderr, r.stderr
    node.wait_state(lambda s: s == "IDLE", 10)

    for _ in range(2):  # the fault comes back: twice more is three times
        assert gate(node, tmp_path, BAD).returncode == 2
        if info(node).reason.startswith("gpudoctor: needs inspection"):
            break
        assert gate(node, tmp_path, GOOD).returncode == 0
        node.wait_state(lambda s: s == "IDLE", 10)
    i = info(node)
    assert i.state == "IDLE+DRAIN", node.show()
    assert i.reason.startswith("gpudoctor: needs inspection: came back 2 times (3 failures) within the window"), i.reason
    r = gate(node, tmp_path, GOOD)  # the checks pass: still drained, the reason says a person must look
    assert r.returncode == 2 and info(node).state == "IDLE+DRAIN"
    assert info(node).reason.startswith("gpudoctor: needs inspection")

    verified.unlink()
    r = release()
    assert r.returncode == 1 and "not released" in r.stderr and "verification failed" in r.stderr, r.stderr
    assert gate(node, tmp_path, GOOD).returncode == 2 and info(node).state == "IDLE+DRAIN"
    verified.touch()
    r = release()
    assert r.returncode == 0 and r.stdout.startswith("released "), r.stdout + r.stderr
    r = gate(node, tmp_path, GOOD)
    assert r.returncode == 0, r.stdout + r.stderr
    node.wait_state(lambda s: s == "IDLE", 10)

    # an admin drains the node: the ladder says ready, the gate passes, and the admin's drain stays
    _drain(node)
    r = gate(node, tmp_path, GOOD)
    assert r.returncode == 0 and "drained by someone else" in r.stderr
    assert info(node).reason == "bad DIMM, ticket 4711"


class _RacedHost:
    """The compute node as gpudoctor's slurm mode sees it (a LocalHost inside the lab's namespace), with an admin who
    drains the node with the real scontrol just before gpudoctor's call number `at` (#42; NHC #134)."""

    def __init__(self, lab, at: int, reason: str):
        from gpudoctor.host.local import LocalHost

        self.lab, self.at, self.reason, self.calls = lab, at, reason, []
        self.local = LocalHost()

    def run(self, argv, timeout=None, input=None, env=None):
        self.calls.append(" ".join(argv))
        if len(self.calls) == self.at:
            self.lab.scontrol("update", f"nodename={self.lab.node}", "state=drain", f"reason={self.reason}")
        return self.local.run(self.lab._in_ns(argv), timeout=timeout, env=self.lab.env())


def test_an_admins_drain_set_between_the_read_and_the_write_is_left_as_set(node, tmp_path):
    """The real race: gpudoctor drained the node, its checks now pass; between its read of the node and its resume
    an admin drains the node for a reason of their own. The re-read right before the write sees it: no resume."""
    from gpudoctor.gate import GateResult
    from gpudoctor.integrations.slurm import apply

    assert gate(node, tmp_path, BAD).returncode == 2 and info(node).reason == make_reason(ROOT_CAUSE)
    host = _RacedHost(node, 3, "bad DIMM, ticket 4711")  # 1 show node, 2 show reservation, 3 the re-read
    act = apply(GateResult(node.node, "default"), host, node=node.node)
    assert act.action == "kept" and "changed while gpudoctor decided" in act.detail, act
    assert not [c for c in host.calls if c.startswith("scontrol update")], host.calls
    i = info(node)
    assert (i.state, i.reason) == ("IDLE+DRAIN", "bad DIMM, ticket 4711")


def test_an_admins_drain_undone_by_the_resume_is_put_back_where_slurm_keeps_reasons(node, tmp_path):
    """The narrower window, between the re-read and the resume: the resume undoes the admin's drain. Where Slurm
    keeps a resumed node's reason (>= 23.11 without accounting storage) the read right after sees the admin's reason
    on a node no longer drained, and gpudoctor drains it again in the admin's words; 22.05 clears the reason with
    the resume and leaves no trace to see (docs/gate.md says so)."""
    from gpudoctor.gate import GateResult
    from gpudoctor.integrations.slurm import apply

    assert gate(node, tmp_path, BAD).returncode == 2
    host = _RacedHost(node, 4, "bad DIMM, ticket 4711")  # just before the resume itself
    act = apply(GateResult(node.node, "default"), host, node=node.node)
    i = info(node)
    if node.keeps_reasons():
        assert act.action == "kept" and "drained again in its words" in act.detail, act
        assert (i.state.split("+")[0], "DRAIN" in i.state, i.reason) == ("IDLE", True, "bad DIMM, ticket 4711")
    else:
        assert act.action == "resumed" and i.reason is None and "DRAIN" not in i.state
