"""Remedy lxc.cgroup_allow over a fake Proxmox root (real files, a real `pct` stand-in on PATH).

Contract: plan → apply → plan is None; snapshot/pending sections byte-identical; refusals say why."""

import os

import pytest

from gpudoctor.report import fix_result_lines
from gpudoctor.gather.boundary import gather_lxc
from gpudoctor.host.local import LocalHost
from gpudoctor.proxmox import config as C
from gpudoctor.remedies.lxc_cgroup import LxcCgroupAllow, fix_text
from gpudoctor.remedy import AuditLog, Engine, FixRun, RemedyContext

from tests.proxmox.conftest import CONFIGS, install

NEEDS_FIX = ["200-seed.conf", "201-snapshots.conf", "202-pending.conf", "203-crlf.conf",
             "204-trailing-ws-no-eol.conf", "208-no-allow-no-eol.conf"]


def engine(root, host, reboot=False):
    ctx = RemedyContext(hosts={host.name: host}, backup_dir="/var/lib/gpudoctor/backups", reboot=reboot,
                        reboot_wait_s=10)
    return Engine([LxcCgroupAllow()], ctx, audit_log=AuditLog(str(root / "audit.jsonl")),
                  lock_dir=str(root / "locks"))


def facts(host, vmid, status=True):
    return {"boundary": gather_lxc(host, vmid, ask_status=status)}


def non_live(data: bytes) -> list[str]:
    return [ln.raw for ln in C.parse(data, "x").lines if ln.section != C.LIVE]


@pytest.mark.parametrize("fixture", NEEDS_FIX)
def test_plan_apply_plan_is_none_and_only_the_live_section_changes(pve_root, fixture):
    host = LocalHost(root=str(pve_root))
    target = install(pve_root, 200, fixture)
    before = target.read_bytes()
    eng = engine(pve_root, host)
    plan = eng.plan(facts(host, 200, status=False))
    assert len(plan.changes) == 1 and not plan.refusals, plan.to_json()
    change = plan.changes[0]
    assert target.read_bytes() == before  # planning is read-only
    (out,) = eng.apply(plan)
    assert out.result == "applied", out.detail
    after = target.read_bytes()
    assert non_live(after) == non_live(before)  # snapshots and [pve:pending] untouched, byte for byte
    cfg = C.parse(after, str(target))
    assert "lxc.cgroup2.devices.allow" in cfg.text and not [ln for ln in cfg.live if ln.bare_rule]
    assert cfg.eol == C.parse(before, "x").eol  # CRLF stays CRLF
    first = cfg.first_header
    inserted = [ln for ln in cfg.live if ln.key == C.ALLOW_KEY and ln.rule.major == 511]
    assert len(inserted) == 1 and (first is None or inserted[0].no < first.no)
    assert eng.plan(facts(host, 200, status=False)).changes == []
    assert eng.apply(eng.plan(facts(host, 200, status=False))) == []
    assert target.read_bytes() == after
    backups = list((pve_root / "var/lib/gpudoctor/backups/etc/pve/lxc").iterdir())
    assert [b.read_bytes() for b in backups] == [before]
    assert change.needs_reboot  # status unknown: the change only applies at the next start


def test_seed_fix_is_exactly_one_line_added_and_the_keyless_one_removed(pve_root):
    before = (CONFIGS / "200-seed.conf").read_text()
    text, removed, inserted = fix_text(C.parse(before, "200.conf"), [511])
    assert removed == [20] and inserted == ["lxc.cgroup2.devices.allow: c 511:* rwm"]
    want = before.replace("c 511:* rwm\n", "").replace(
        "lxc.cgroup2.devices.allow: c 234:* rwm\n",
        "lxc.cgroup2.devices.allow: c 234:* rwm\nlxc.cgroup2.devices.allow: c 511:* rwm\n")
    assert text == want


def test_equals_style_and_missing_final_newline_are_respected():
    cfg = C.parse((CONFIGS / "202-pending.conf").read_text(), "202.conf")
    text, _, inserted = fix_text(cfg, [511])
    assert inserted == ["lxc.cgroup2.devices.allow = c 511:* rwm"]
    cfg = C.parse("arch: amd64\nlxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind", "x.conf")
    text, _, _ = fix_text(cfg, [511])
    assert text == ("arch: amd64\nlxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind\n"
                    "lxc.cgroup2.devices.allow: c 511:* rwm\n")


def test_header_first_config_gets_its_line_at_the_top(pve_root):
    cfg = C.parse((CONFIGS / "209-header-first.conf").read_text(), "209.conf")
    text, _, _ = fix_text(cfg, [511])
    assert text.startswith("lxc.cgroup2.devices.allow: c 511:* rwm\n[pve:pending]\n")


@pytest.mark.parametrize("fixture,reason", [
    ("206-locked.conf", "locked (lock: backup)"),
    ("207-deny.conf", "an explicit deny rule wins"),
])
def test_refusals(pve_root, fixture, reason):
    host = LocalHost(root=str(pve_root))
    target = install(pve_root, 200, fixture)
    before = target.read_bytes()
    plan = engine(pve_root, host).plan(facts(host, 200, status=False))
    assert plan.changes == [] and reason in plan.refusals[0].reason
    assert target.read_bytes() == before


def test_refuses_when_the_major_is_unknown_or_the_fs_read_only(pve_root):
    host = LocalHost(root=str(pve_root))
    install(pve_root, 200, "200-seed.conf")
    f = facts(host, 200, status=False)
    f["boundary"]["config"]["readonly"] = True
    plan = engine(pve_root, host).plan(f)
    assert "read-only filesystem" in plan.refusals[0].reason
    (pve_root / "proc/devices").write_text("Character devices:\n195 nvidia\n\nBlock devices:\n")
    install(pve_root, 200, "205-devn.conf")
    (pve_root / "etc/pve/lxc/200.conf").write_text(
        "arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,create=file\n")
    plan = engine(pve_root, host).plan(facts(host, 200, status=False))
    assert "not in the host's /proc/devices" in plan.refusals[0].reason


def test_reboot_when_running_and_idle_then_recheck(pve_root, fake_pct):
    bindir, state = fake_pct
    host = LocalHost(root=str(pve_root), path_prepend=[str(bindir)])
    install(pve_root, 200, "200-seed.conf")
    run_dir = pve_root / "var/lib/lxc/200"
    run_dir.mkdir()
    (run_dir / "config").write_text("lxc.cgroup2.devices.allow = c 195:* rwm\nlxc.cgroup2.devices.allow = c 509:* rwm\n")
    eng = engine(pve_root, host, reboot=True)
    plan = eng.plan(facts(host, 200))
    assert plan.changes[0].commands == ["pct reboot 200"] and plan.changes[0].needs_reboot
    # the stand-in "restarts" the container; LXC would regenerate the running config from the new file
    (run_dir / "config").write_text("lxc.cgroup2.devices.allow = c 195:* rwm\nlxc.cgroup2.devices.allow = c 511:* rwm\n")
    (out,) = eng.apply(plan)
    assert out.result == "applied" and out.reboot.done, out.reboot
    assert "now allows c 511:*; still denied there: /dev/nvidia-caps" in out.reboot.message  # the stand-in's config has no 234
    calls = (state / "calls").read_text().splitlines()
    assert "exec 200 -- nvidia-smi --query-compute-apps=pid --format=csv,noheader" in calls
    assert "reboot 200" in calls
    rec = AuditLog(str(pve_root / "audit.jsonl")).records()[0]
    assert rec["reboot"]["done"] is True


@pytest.mark.parametrize("pids,smi_rc,why", [("4242\n4243\n", "0", "2 GPU compute process(es)"),
                                             ("", "9", "unknown whether a GPU job runs")])
def test_reboot_is_left_pending_when_busy_or_unknown(pve_root, fake_pct, pids, smi_rc, why):
    bindir, state = fake_pct
    (state / "pids").write_text(pids)
    (state / "smi_rc").write_text(smi_rc)
    host = LocalHost(root=str(pve_root), path_prepend=[str(bindir)])
    install(pve_root, 200, "200-seed.conf")
    eng = engine(pve_root, host, reboot=True)
    (out,) = eng.apply(eng.plan(facts(host, 200)))
    assert out.result == "applied" and not out.reboot.done
    assert why in out.reboot.message and "reboot pending: pct reboot 200" in out.reboot.message
    assert "reboot 200" not in (state / "calls").read_text().splitlines()


def test_stopped_container_is_not_rebooted_and_needs_no_restart(pve_root, fake_pct):
    bindir, state = fake_pct
    (state / "status").write_text("stopped\n")
    host = LocalHost(root=str(pve_root), path_prepend=[str(bindir)])
    install(pve_root, 200, "200-seed.conf")
    eng = engine(pve_root, host, reboot=True)
    plan = eng.plan(facts(host, 200))
    assert not plan.changes[0].needs_reboot and plan.changes[0].commands == []
    (out,) = eng.apply(plan)
    assert out.result == "applied" and out.reboot is None


def test_restart_only_change_when_the_file_is_already_fixed(pve_root, fake_pct):
    bindir, state = fake_pct
    host = LocalHost(root=str(pve_root), path_prepend=[str(bindir)])
    t = install(pve_root, 200, "200-seed.conf")
    t.write_bytes(t.read_bytes().replace(b"c 511:* rwm\n", b"lxc.cgroup2.devices.allow: c 511:* rwm\n"))
    (pve_root / "var/lib/lxc/200").mkdir()
    (pve_root / "var/lib/lxc/200/config").write_text("lxc.cgroup2.devices.allow = c 195:* rwm\n")
    # without --reboot: the same state the first run left (edit done, restart pending), reported the same way
    plan = engine(pve_root, host).plan(facts(host, 200))
    assert plan.refusals == [] and plan.changes[0].diff == "" and plan.changes[0].needs_reboot
    (out,) = engine(pve_root, host).apply(plan)
    assert out.result == "unchanged" and out.reboot is None
    run = FixRun(apply=True, plan=plan, outcomes=[out])
    assert run.exit_code == 1
    assert "      restart pending: pct reboot 200 (or re-run with --reboot)" in fix_result_lines(run)
    assert "every GPU node it passes is allowed" in out.detail
    plan = engine(pve_root, host, reboot=True).plan(facts(host, 200))
    (c,) = plan.changes
    assert c.diff == "" and c.needs_reboot and c.commands == ["pct reboot 200"]
    before = t.read_bytes()
    # what LXC regenerates at start: every allow line of the config
    (pve_root / "var/lib/lxc/200/config").write_text("".join(
        f"lxc.cgroup2.devices.allow = c {m}:* rwm\n" for m in (195, 509, 226, 234, 511)))
    (out,) = engine(pve_root, host, reboot=True).apply(plan)
    assert out.result == "unchanged" and out.reboot.done and t.read_bytes() == before
    assert "running config now allows c 234:*, c 511:*; every GPU node the config passes is allowed there" \
        in out.reboot.message
    assert os.path.exists(pve_root / "audit.jsonl")
