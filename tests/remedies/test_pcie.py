"""fabric.pcie.mrrs on a temp root holding the H200's real config space; a stand-in setpci (modelled on setpci.c)
edits that file. Contract: only with a policy; only bits 14:12 change; plan → apply → plan is None; a failed verify
writes the recorded bits back and removes the unit; a dry run never runs setpci."""

import subprocess
import sys

import pytest

from gpudoctor.remedies.pcie import PcieMrrs
from gpudoctor.remedy import AuditLog, Engine, RemedyContext

from .hostroot import BDF, NAME

FACTS = ("host", "devices", "tools", "fabric")
UNIT = "/etc/systemd/system/gpudoctor-pcie-mrrs.service"


def setup(make_root, **kw):
    r = make_root(uvm_major=238, **kw).healthy_nodes(238)
    r.pci()
    (r.path("/run/systemd/system")).mkdir(parents=True)
    return r


def devctl(r) -> int:
    cfg = r.path(f"/sys/bus/pci/devices/{BDF}/config").read_bytes()
    return int.from_bytes(cfg[0x68:0x6A], "little")


def engine(r):
    ctx = RemedyContext(hosts={NAME: r.host()}, backup_dir="/var/lib/gpudoctor/backups", timeout=5)
    return Engine([PcieMrrs()], ctx, audit_log=AuditLog(str(r.root.parent / "audit.jsonl")),
                  lock_dir=str(r.root.parent / "locks"))


def facts(r, mrrs=512):
    return r.facts(only=FACTS, policy={"pcie": {"mrrs": mrrs}} if mrrs else {})


def test_stand_in_setpci_matches_the_real_tools_formats(make_root):
    r = setup(make_root)
    run = lambda *a: subprocess.run([str(r.bin / "setpci"), *a], capture_output=True, text=True)  # noqa: E731
    assert run("-s", BDF, "CAP_EXP+08.w").stdout == "5134\n"
    assert run("-v", "-s", BDF, "CAP_EXP+08.w").stdout == "0000:00:06.0 (cap 10 @60) @68 = 5134\n"
    dry = run("-D", "-v", "-s", BDF, "CAP_EXP+08.w=2000:7000")
    assert dry.stdout == "0000:00:06.0 (cap 10 @60) @68 5134->(2000:7000)->2134\n" and devctl(r) == 0x5134
    gone = run("-s", "0000:00:07.0", "CAP_EXP+08.w=2000:7000")
    assert gone.returncode == 0 and "No devices selected" in gone.stderr


def test_without_a_policy_nothing_is_planned(make_root):
    r = setup(make_root)
    plan = engine(r).plan(facts(r, mrrs=None))
    assert plan.changes == [] and plan.refusals == []


def test_masked_write_then_a_boot_unit(make_root):
    r = setup(make_root)
    eng = engine(r)
    plan = eng.plan(facts(r))
    (change,) = plan.changes
    assert change.risk == "high"
    assert change.commands[:1] == [f"setpci -s {BDF} CAP_EXP+08.w=2000:7000"]
    assert change.data["preview"] == [f"setpci -D -v -s {BDF} CAP_EXP+08.w=2000:7000"]
    assert f"-{BDF}  DevCtl 0x5134  MaxReadReq 4096" in change.diff and f"+{BDF}  DevCtl 0x2134  MaxReadReq 512" \
        in change.diff
    assert "+ExecStart=" in change.diff and "CAP_EXP+08.w=2000:7000" in change.diff
    assert r.calls("setpci") == [] and devctl(r) == 0x5134  # planning never runs setpci
    (out,) = eng.apply(plan)
    assert out.result == "applied", out.detail
    assert devctl(r) == 0x2134  # bits 14:12 = 2 (512); MPS bits 7:5 and the rest untouched
    assert [c[1:] for c in r.calls("setpci")][:3] == [["-s", BDF, "CAP_EXP+08.w"],
                                                     ["-D", "-v", "-s", BDF, "CAP_EXP+08.w=2000:7000"],
                                                     ["-s", BDF, "CAP_EXP+08.w=2000:7000"]]
    unit = r.read(UNIT)
    assert "Type=oneshot" in unit and f"-s {BDF} CAP_EXP+08.w=2000:7000" in unit and "WantedBy=multi-user.target" in unit
    assert ["systemctl", "enable", "gpudoctor-pcie-mrrs.service"] in r.calls("systemctl")
    assert eng.plan(facts(r)).changes == []
    n = len(r.calls("setpci"))
    assert eng.apply(plan)[0].result == "unchanged"
    assert [c[1:] for c in r.calls("setpci")[n:]] == [["-s", BDF, "CAP_EXP+08.w"]]  # a read; no write the 2nd time


def test_failed_verify_writes_the_old_bits_back_and_removes_the_unit(make_root):
    r = setup(make_root)
    r.fault("pcie-mrrs-sticky")
    eng = engine(r)
    (out,) = eng.apply(eng.plan(facts(r)))
    assert out.result == "rolled_back" and "MaxReadReq 4096 ≠ policy 512" in out.verify.summary
    assert devctl(r) == 0x5134
    assert not r.path(UNIT).exists()
    assert out.applied["rollback"]["restored"] == [f"setpci -s {BDF} CAP_EXP+08.w=5000:7000",
                                                   "systemctl disable gpudoctor-pcie-mrrs.service",
                                                   f"removed {UNIT}"]


@pytest.mark.parametrize("tweak,reason", [
    (lambda f: f["meta"]["context"]["policy"]["pcie"].update(mrrs=500), "not a MaxReadReq size"),
    (lambda f: f["tools"]["commands"].update(setpci=None), "setpci (pciutils) is not installed"),
    (lambda f: f["tools"].update(systemd=False), "systemd is not running"),
    (lambda f: f["host"]["container"].update(kind="lxc"), "config space belongs to the host"),
])
def test_refusals(make_root, tweak, reason):
    r = setup(make_root)
    f = facts(r)
    tweak(f)
    plan = engine(r).plan(f)
    assert plan.changes == [] and reason in plan.refusals[0].reason


def test_a_device_that_vanished_fails_before_any_write(make_root):
    r = setup(make_root)
    eng = engine(r)
    plan = eng.plan(facts(r))
    r.path(f"/sys/bus/pci/devices/{BDF}/config").rename(r.path(f"/sys/bus/pci/devices/{BDF}/config.gone"))
    (out,) = eng.apply(plan)
    assert out.result == "failed" and "cannot read DevCtl" in out.detail
    assert not any("=" in c[-1] for c in r.calls("setpci"))


def test_the_inventory_policy_becomes_what_the_check_reads(tmp_path):
    from gpudoctor.gather.context import policy_from_inventory
    from gpudoctor.inventory import load_inventory

    inv = tmp_path / "inventory.yaml"
    inv.write_text("version: 1\nhosts:\n  gpu1:\n    address: local\npolicy:\n  checks:\n"
                   "    fabric.pcie.mrrs:\n      expect: 512\n")
    pol = policy_from_inventory(load_inventory(str(inv)).policy)
    assert pol["pcie"] == {"mrrs": 512} and pol["checks"]["fabric.pcie.mrrs"] == {"expect": 512}
    assert policy_from_inventory(load_inventory(str(inv)).policy, mrrs=1024)["pcie"] == {"mrrs": 1024}
    assert "pcie" not in policy_from_inventory(None)
