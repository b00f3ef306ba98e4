"""fabric.numa.balancing on a temp root: a stand-in sysctl writes the root's /proc/sys file; the persistent file goes
through gpudoctor.files.edit. Contract: plan → apply → plan is None; a failed verify restores both."""

import json

from gpudoctor.remedies.sysctl import CONTENT, FILE, NumaBalancing
from gpudoctor.remedy import AuditLog, Engine, RemedyContext

from .hostroot import NAME

FACTS = ("host", "devices", "tools", "fabric")


def setup(make_root, value="1", **kw):
    r = make_root(uvm_major=238, **kw).healthy_nodes(238)
    r.write("/proc/sys/kernel/numa_balancing", value + "\n")
    return r


def engine(r):
    ctx = RemedyContext(hosts={NAME: r.host()}, backup_dir="/var/lib/gpudoctor/backups", timeout=5)
    return Engine([NumaBalancing()], ctx, audit_log=AuditLog(str(r.root.parent / "audit.jsonl")),
                  lock_dir=str(r.root.parent / "locks"))


def test_off_now_and_kept_in_sysctl_d(make_root):
    r = setup(make_root)
    eng = engine(r)
    plan = eng.plan(r.facts(only=FACTS))
    (change,) = plan.changes
    assert change.commands == ["sysctl -w kernel.numa_balancing=0"]
    assert f"+++ {FILE} (after)" in change.diff and "+kernel.numa_balancing = 0" in change.diff
    assert "-1\n+0\n" in change.diff
    assert not r.path(FILE).exists() and r.read("/proc/sys/kernel/numa_balancing") == "1\n"  # dry run
    (out,) = eng.apply(plan)
    assert out.result == "applied", out.detail
    assert r.read("/proc/sys/kernel/numa_balancing") == "0\n" and r.read(FILE) == CONTENT
    assert r.calls("sysctl") == [["sysctl", "-w", "kernel.numa_balancing=0"]]
    assert eng.plan(r.facts(only=FACTS)).changes == []
    assert eng.apply(plan)[0].result == "unchanged" and len(r.calls("sysctl")) == 1


def test_an_existing_file_is_backed_up_and_replaced(make_root):
    r = setup(make_root)
    r.write(FILE, "kernel.numa_balancing = 1\n")
    eng = engine(r)
    (out,) = eng.apply(eng.plan(r.facts(only=FACTS)))
    assert out.result == "applied" and r.read(FILE) == CONTENT
    backups = list(r.path("/var/lib/gpudoctor/backups/etc/sysctl.d").iterdir())
    assert [b.read_text() for b in backups] == ["kernel.numa_balancing = 1\n"]


def test_failed_verify_restores_the_runtime_value_and_removes_the_file(make_root):
    r = setup(make_root, value="2")
    r.fault("sysctl-ignored")  # the tool says it set the key; the kernel value stays
    eng = engine(r)
    (out,) = eng.apply(eng.plan(r.facts(only=FACTS)))
    assert out.result == "rolled_back" and "tiering (2)" in out.verify.summary
    assert not r.path(FILE).exists()
    assert r.calls("sysctl") == [["sysctl", "-w", "kernel.numa_balancing=0"], ["sysctl", "-w", "kernel.numa_balancing=2"]]
    assert json.loads((r.root.parent / "audit.jsonl").read_text().splitlines()[-1])["result"] == "rolled_back"


def test_a_read_only_proc_sys_is_a_failure_with_the_tools_message(make_root):
    r = setup(make_root)
    r.fault("sysctl-erofs")
    (out,) = engine(r).apply(engine(r).plan(r.facts(only=FACTS)))
    assert out.result == "failed" and "Read-only file system" in out.detail


def test_a_later_sysctl_file_that_turns_it_back_on_is_refused(make_root):
    r = setup(make_root)
    r.write("/etc/sysctl.d/99-tuning.conf", "vm.swappiness = 10\nkernel.numa_balancing = 1\n")
    r.write("/usr/lib/sysctl.d/50-default.conf", "kernel.numa_balancing=1\n")
    plan = engine(r).plan(r.facts(only=FACTS))
    (ref,) = plan.refusals
    assert "/etc/sysctl.d/99-tuning.conf:2 sets kernel.numa_balancing = 1" in ref.reason
    assert "50-default" not in ref.reason  # read before ours: ours wins


def test_an_earlier_file_is_overridden_and_said_so(make_root):
    r = setup(make_root)
    r.write("/usr/lib/sysctl.d/50-default.conf", "kernel.numa_balancing=1\n")
    (change,) = engine(r).plan(r.facts(only=FACTS)).changes
    assert "overrides /usr/lib/sysctl.d/50-default.conf:1" in change.summary


def test_in_an_lxc_guest_it_is_the_hosts_setting(make_root):
    r = setup(make_root, container="lxc", userns=True)
    (ref,) = engine(r).plan(r.facts(only=FACTS)).refusals
    assert "host-global and this container cannot write it" in ref.reason


def test_a_read_only_proc_sys_is_refused_a_writable_one_planned(make_root):
    """A Docker-style container: refused only when /proc/sys really is read-only (a real ro bind mount here)."""
    import subprocess

    r = setup(make_root, container="docker")
    assert engine(r).plan(r.facts(only=FACTS)).changes  # privileged: /proc/sys writable
    d = str(r.path("/proc/sys"))
    subprocess.run(["mount", "--bind", d, d], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", d], check=True)
        facts = r.facts(only=FACTS)
        assert facts["tools"]["proc_sys_readonly"] is True
        (ref,) = engine(r).plan(facts).refusals
        assert "/proc/sys is mounted read-only" in ref.reason
    finally:
        subprocess.run(["umount", d], check=True)


def test_single_numa_node_is_information_only(make_root):
    r = setup(make_root)
    facts = r.facts(only=FACTS)
    facts["fabric"]["numa_nodes"] = {"node0": "0-15"}
    plan = engine(r).plan(facts)
    assert plan.changes == [] and plan.nothing == ["fabric.numa.balancing"]
