"""The remedy engine with a real remedy over real files: dry run, apply, verify, rollback, lock, audit log."""

import json
import os
import subprocess
import sys

import pytest

from gpudoctor.files.edit import apply_edit, plan_edit
from gpudoctor.errors import LockHeld
from gpudoctor.findings import Finding, Status
from gpudoctor.host.local import LocalHost
from gpudoctor.remedy import AuditLog, Change, Engine, Remedy, RemedyContext, host_lock


class AppendLine(Remedy):
    """Appends facts["want"] to facts["path"] unless present; verify passes only if facts["verify_ok"]."""

    id = "test.append"
    fixes = ("test.line",)

    def plan(self, facts, ctx):
        if facts.get("refuse"):
            return self.refuse(facts["refuse"])
        host = ctx.host("localhost")
        cur = host.read_file(facts["path"]).data
        want = facts["want"].encode()
        if want in cur:
            return None
        p = plan_edit(facts["path"], cur, cur + want)
        return Change(self.id, "localhost", f"append {facts['want'].strip()}", diff=p.diff, risk="low",
                      data={"path": facts["path"], "before": cur.decode(), "after": (cur + want).decode(),
                            "verify_ok": facts.get("verify_ok", True)})

    def apply(self, host, change, ctx):
        d = change.data
        return apply_edit(host, plan_edit(d["path"], d["before"].encode(), d["after"]),
                          backup_dir=ctx.backup_dir).to_json()

    def verify(self, host, change, ctx):
        ok = change.data["verify_ok"] and host.read_file(change.data["path"]).data == change.data["after"].encode()
        return Finding("test.line", Status.OK if ok else Status.FAIL, "line present" if ok else "still broken")

    def rollback(self, host, change, ctx, applied):
        d = change.data
        return apply_edit(host, plan_edit(d["path"], d["after"].encode(), d["before"]),
                          backup_dir=ctx.backup_dir).to_json()


class Crashes(Remedy):
    id = "test.crash"

    def plan(self, facts, ctx):
        raise KeyError("boundary")


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/app.conf").write_bytes(b"a: 1\n")
    host = LocalHost(root=str(tmp_path))
    ctx = RemedyContext(hosts={"localhost": host}, backup_dir="/backups")
    log = AuditLog(str(tmp_path / "state/audit.jsonl"))
    eng = Engine([AppendLine(), Crashes()], ctx, audit_log=log, lock_dir=str(tmp_path / "state/locks"))
    return eng, log, tmp_path


def test_dry_run_changes_nothing_and_apply_then_plan_is_none(setup):
    eng, log, root = setup
    facts = {"path": "/etc/app.conf", "want": "b: 2\n"}
    plan = eng.plan(facts)
    assert [c.summary for c in plan.changes] == ["append b: 2"]
    assert "+b: 2" in plan.changes[0].diff
    assert [(r.remedy, r.reason) for r in plan.refusals] == [("test.crash", "plan failed: KeyError: 'boundary'")]
    assert (root / "etc/app.conf").read_bytes() == b"a: 1\n" and log.records() == []  # planning writes nothing
    out = eng.apply(plan)
    assert [o.result for o in out] == ["applied"] and out[0].verify.status == Status.OK
    assert (root / "etc/app.conf").read_bytes() == b"a: 1\nb: 2\n"
    assert eng.plan(facts).changes == []
    assert "test.append" in eng.plan(facts).nothing
    (rec,) = log.records()
    assert rec["result"] == "applied" and rec["remedy"] == "test.append" and rec["host"] == "localhost"
    assert "+b: 2" in rec["diff"] and rec["backup"].startswith("/backups/etc/app.conf.") and rec["when"]


def test_failed_verify_rolls_back_to_the_original_bytes(setup):
    eng, log, root = setup
    out = eng.apply(eng.plan({"path": "/etc/app.conf", "want": "b: 2\n", "verify_ok": False}))
    assert [o.result for o in out] == ["rolled_back"] and "still broken" in out[0].detail
    assert (root / "etc/app.conf").read_bytes() == b"a: 1\n"
    assert [r["result"] for r in log.records()] == ["rolled_back"]


def test_refusal_says_why(setup):
    eng, _, _ = setup
    plan = eng.plan({"refuse": "config is locked (lock: backup)"})
    assert ("test.append", "config is locked (lock: backup)") in [(r.remedy, r.reason) for r in plan.refusals]
    assert plan.changes == []


def test_change_validates_risk_and_round_trips_json():
    c = Change("x", "h", "s", risk="medium", needs_reboot=True, commands=["pct reboot 200"], data={"k": [1]})
    assert Change.from_json(json.loads(json.dumps(c.to_json()))) == c
    with pytest.raises(ValueError):
        Change("x", "h", "s", risk="extreme")


HOLD = """
import sys, time
from gpudoctor.remedy import host_lock
with host_lock(sys.argv[1], "localhost", "gpudoctor lxc fix 200 --apply (test holder)"):
    print("held", flush=True)
    time.sleep(30)
"""


def test_lock_contention_between_two_processes_names_the_holder(setup):
    eng, log, root = setup
    lock_dir = str(root / "state/locks")
    holder = subprocess.Popen([sys.executable, "-c", HOLD, lock_dir], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld) as exc:
            eng.apply(eng.plan({"path": "/etc/app.conf", "want": "b: 2\n"}))
        msg = exc.value.one_line()
        assert f"pid {holder.pid}" in msg and "gpudoctor lxc fix 200 --apply (test holder)" in msg
        assert (root / "etc/app.conf").read_bytes() == b"a: 1\n"
    finally:
        holder.kill()
        holder.wait()
    # the kernel drops a dead holder's flock: the next run proceeds
    out = eng.apply(eng.plan({"path": "/etc/app.conf", "want": "b: 2\n"}))
    assert out[0].result == "applied"


def test_lock_is_per_host(tmp_path):
    with host_lock(str(tmp_path), "kpro6"):
        with host_lock(str(tmp_path), "kpro7"):
            pass
        with pytest.raises(LockHeld, match="kpro6"):
            with host_lock(str(tmp_path), "kpro6"):
                pass


APPEND = """
import sys
from gpudoctor.remedy import AuditLog
log = AuditLog(sys.argv[1])
for i in range(int(sys.argv[3])):
    log.append({"host": "h", "writer": int(sys.argv[2]), "i": i, "diff": "x" * 5000})
"""


def test_audit_log_concurrent_writers_never_interleave(tmp_path):
    path = str(tmp_path / "audit.jsonl")
    procs = [subprocess.Popen([sys.executable, "-c", APPEND, path, str(w), "40"]) for w in range(6)]
    assert all(p.wait() == 0 for p in procs)
    lines = open(path, "rb").read().split(b"\n")
    assert lines[-1] == b""
    recs = [json.loads(x) for x in lines[:-1]]
    assert len(recs) == 240
    assert sorted((r["writer"], r["i"]) for r in recs) == [(w, i) for w in range(6) for i in range(40)]


def test_audit_log_after_a_torn_line_starts_a_fresh_line(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"host": "h", "result": "applied"}\n{"host": "h", "res')  # a writer died mid-line
    log = AuditLog(str(path))
    log.append({"host": "h2", "result": "unchanged"})
    assert [r["host"] for r in log.records()] == ["h", "h2"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"  # existing file's mode is left alone
    fresh = AuditLog(str(tmp_path / "new" / "audit.jsonl"))
    fresh.append({"host": "h"})
    assert oct(os.stat(fresh.path).st_mode & 0o777) == "0o600"
