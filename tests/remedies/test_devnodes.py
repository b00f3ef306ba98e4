"""devices.node.create and devices.node.mode on a temp root with real mknod'ed nodes and a stand-in nvidia-modprobe.

Contract: plan is read-only; plan → apply → plan is None; applying the same change twice changes nothing the second
time; a failed verification rolls back to the node states seen just before apply; refusals say why."""

import json
import os
import stat

import pytest

from gpudoctor.host.local import LocalHost
from gpudoctor.remedies.devnodes import CreateNodes, NodeMode
from gpudoctor.remedy import AuditLog, Engine, RemedyContext

from .hostroot import NAME


def engine(r, *remedies, host=None):
    host = host or r.host()
    ctx = RemedyContext(hosts={NAME: host}, backup_dir="/var/lib/gpudoctor/backups", timeout=5)
    return Engine(list(remedies) or [CreateNodes(), NodeMode()], ctx,
                  audit_log=AuditLog(str(r.root.parent / "audit.jsonl")), lock_dir=str(r.root.parent / "locks"))


def audit(r):
    f = r.root.parent / "audit.jsonl"
    recs = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
    return [a for a in recs if a["result"] != "started"]  # the outcomes


def dev_listing(r):
    return sorted(os.listdir(r.path("/dev")))


def test_missing_uvm_nodes_are_made_with_the_live_major_by_mknod(make_root):
    r = make_root(uvm_major=511, without=("nvidia-modprobe",))
    r.node("/dev/nvidiactl", 195, 255)
    r.node("/dev/nvidia0", 195, 0)
    facts = r.facts()
    assert facts["tools"]["commands"]["nvidia-modprobe"] is None
    eng = engine(r, CreateNodes())
    plan = eng.plan(facts)
    (change,) = plan.changes
    assert not plan.refusals and dev_listing(r) == ["nvidia0", "nvidiactl"]  # planning changed nothing
    assert change.commands[0].startswith("mknod -m 666 /dev/.nvidia-uvm.gpudoctor c 511 0")
    assert "-/dev/nvidia-uvm  (missing)" in change.diff and "+/dev/nvidia-uvm  char 511:0 mode 0666" in change.diff
    assert change.risk == "low" and not change.needs_reboot
    (out,) = eng.apply(plan)
    assert out.result == "applied", out.detail
    assert r.stat("/dev/nvidia-uvm") == (stat.S_IFCHR, 511, 0, 0o666)
    assert r.stat("/dev/nvidia-uvm-tools") == (stat.S_IFCHR, 511, 1, 0o666)
    assert dev_listing(r) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]  # no temp names left
    assert eng.plan(r.facts()).changes == []  # plan → apply → plan is None
    (again,) = eng.apply(plan)  # the same change a second time: nothing to do
    assert again.result == "unchanged" and r.stat("/dev/nvidia-uvm") == (stat.S_IFCHR, 511, 0, 0o666)
    assert [a["result"] for a in audit(r)] == ["applied", "unchanged"]
    assert r.calls() == []  # mknod happened in-process; no tool ran


def test_a_stale_major_is_replaced_in_one_rename(make_root):
    r = make_root(uvm_major=511, without=("nvidia-modprobe",)).healthy_nodes(511)
    r.node("/dev/nvidia-uvm", 509, 0)  # made for the driver before a reinstall
    old_ino = os.lstat(r.path("/dev/nvidia-uvm")).st_ino
    eng = engine(r, CreateNodes())
    plan = eng.plan(r.facts())
    (change,) = plan.changes
    assert change.risk == "medium" and "replace" in change.summary
    assert "(major 509 is not in /proc/devices)" in change.diff
    (out,) = eng.apply(plan)
    assert out.result == "applied", out.detail
    assert r.stat("/dev/nvidia-uvm") == (stat.S_IFCHR, 511, 0, 0o666)
    assert os.lstat(r.path("/dev/nvidia-uvm")).st_ino != old_ino
    assert eng.plan(r.facts()).changes == []


def test_nvidia_modprobe_makes_the_nodes_when_present(make_root):
    r = make_root(uvm_major=238).healthy_nodes(238)
    os.unlink(r.path("/dev/nvidia-uvm"))
    os.unlink(r.path("/dev/nvidia-uvm-tools"))
    os.unlink(r.path("/dev/nvidia0"))
    eng = engine(r, CreateNodes())
    plan = eng.plan(r.facts())
    (change,) = plan.changes
    assert [c.split("/")[-1] for c in change.commands] == ["nvidia-modprobe -c 0", "nvidia-modprobe -u -c 0"]
    (out,) = eng.apply(plan)
    assert out.result == "applied", out.detail
    assert r.calls("nvidia-modprobe") == [["nvidia-modprobe", "-c", "0"], ["nvidia-modprobe", "-u", "-c", "0"]]
    assert r.stat("/dev/nvidia-uvm-tools") == (stat.S_IFCHR, 238, 1, 0o666)
    assert r.stat("/dev/nvidia0") == (stat.S_IFCHR, 195, 0, 0o666)
    assert eng.plan(r.facts()).changes == []
    eng.apply(plan)
    assert len(r.calls("nvidia-modprobe")) == 2  # already right: the second apply runs nothing


def test_nvidia_modprobe_loads_nvidia_uvm_when_it_is_not_loaded(make_root):
    r = make_root(uvm_major=None)
    r.node("/dev/nvidiactl", 195, 255)
    r.node("/dev/nvidia0", 195, 0)
    r.write("/standin-modules/nvidia-uvm", "508")  # the major the module gets when loaded
    eng = engine(r, CreateNodes())
    plan = eng.plan(r.facts())
    (change,) = plan.changes
    assert "loads the nvidia_uvm kernel module" in change.summary and change.risk == "medium"
    (out,) = eng.apply(plan)
    assert out.result == "applied", out.detail
    assert "508 nvidia-uvm" in r.read("/proc/devices")
    assert r.stat("/dev/nvidia-uvm") == (stat.S_IFCHR, 508, 0, 0o666)
    assert eng.plan(r.facts()).changes == []


def without_sys_module(r):
    """The process as the daemon's hardened unit leaves it: every capability but CAP_SYS_MODULE (bit 16)."""
    eff = 0x000001FFFFFFFFFF & ~(1 << 16)
    r.write("/proc/self/status", f"Name:\tpython3\nCapInh:\t0000000000000000\nCapEff:\t{eff:016x}\n")


def test_without_cap_sys_module_systemd_loads_nvidia_uvm_then_nvidia_modprobe_makes_the_nodes(make_root):
    """#40: the daemon's unit drops CAP_SYS_MODULE: nvidia-modprobe could not load the module, PID 1 can."""
    r = make_root(uvm_major=None)
    r.node("/dev/nvidiactl", 195, 255)
    r.node("/dev/nvidia0", 195, 0)
    r.write("/standin-modules/nvidia-uvm", "508")
    r.write("/lib/systemd/system/modprobe@.service", "[Service]\nType=oneshot\nExecStart=-/sbin/modprobe -abq %I\n")
    without_sys_module(r)
    eng = engine(r, CreateNodes())
    (change,) = eng.plan(r.facts()).changes
    assert change.commands[0] == "systemctl start modprobe@nvidia_uvm.service", change.commands
    assert "through systemd" in change.summary
    (out,) = eng.apply(eng.plan(r.facts()))
    assert out.result == "applied", out.detail
    assert r.stat("/dev/nvidia-uvm") == (stat.S_IFCHR, 508, 0, 0o666)
    calls = [json.loads(x) for x in r.read("/standin-calls.jsonl").splitlines()]
    assert ["systemctl", "start", "modprobe@nvidia_uvm.service"] in calls
    assert eng.plan(r.facts()).changes == []


def test_without_cap_sys_module_the_old_way_fails_so_the_test_above_can(make_root):
    """The stand-in nvidia-modprobe cannot load a module without CAP_SYS_MODULE, as the real one cannot."""
    r = make_root(uvm_major=None)
    r.node("/dev/nvidiactl", 195, 255)
    r.node("/dev/nvidia0", 195, 0)
    r.write("/standin-modules/nvidia-uvm", "508")
    without_sys_module(r)
    res = r.host().run(["nvidia-modprobe", "-u", "-c", "0"], timeout=10)
    assert not res.ok and "nvidia-uvm" not in r.read("/proc/devices")


def test_without_cap_sys_module_and_without_systemctl_it_refuses(make_root):
    r = make_root(uvm_major=None)
    r.node("/dev/nvidiactl", 195, 255)
    r.node("/dev/nvidia0", 195, 0)
    without_sys_module(r)
    facts = r.facts()
    facts["tools"]["commands"]["systemctl"] = None  # a host without systemd
    plan = engine(r, CreateNodes()).plan(facts)
    (ref,) = plan.refusals
    assert plan.changes == [] and "no CAP_SYS_MODULE" in ref.reason and "modprobe nvidia_uvm" in ref.reason


def test_no_live_major_no_node(make_root):
    r = make_root(uvm_major=None, without=("nvidia-modprobe",))
    r.node("/dev/nvidiactl", 195, 255)
    r.node("/dev/nvidia0", 195, 0)
    eng = engine(r, CreateNodes())
    plan = eng.plan(r.facts())
    assert plan.changes == []
    (ref,) = plan.refusals
    assert "/proc/devices has no 'nvidia-uvm' device" in ref.reason and "nvidia-modprobe -u" in ref.reason
    assert dev_listing(r) == ["nvidia0", "nvidiactl"]


def test_lxc_guest_without_cap_mknod_is_sent_to_the_host(make_root):
    r = make_root(uvm_major=511, container="lxc", userns=True)
    r.node("/dev/nvidiactl", 195, 255)
    plan = engine(r, CreateNodes()).plan(r.facts())
    (ref,) = plan.refusals
    assert "LXC guest" in ref.reason and "gpudoctor lxc fix" in ref.reason and "CAP_MKNOD" in ref.reason
    assert not plan.changes


def test_a_bind_mounted_node_is_not_replaced(make_root):
    r = make_root(uvm_major=511, without=("nvidia-modprobe",)).healthy_nodes(511)
    r.node("/dev/nvidia-uvm", 1, 3)  # what `mount --bind /dev/null /dev/nvidia-uvm` shows
    r.bind_mount("/dev/nvidia-uvm", source="udev", root="/null")
    plan = engine(r, CreateNodes()).plan(r.facts())
    (ref,) = plan.refusals
    assert "/dev/nvidia-uvm is a bind mount (devtmpfs udev:/null)" in ref.reason
    assert r.stat("/dev/nvidia-uvm")[1:3] == (1, 3)


def test_an_empty_file_left_by_a_bind_mount_is_replaced_a_non_empty_one_refused(make_root):
    r = make_root(uvm_major=511, without=("nvidia-modprobe",)).healthy_nodes(511)
    os.unlink(r.path("/dev/nvidia-uvm"))
    r.write("/dev/nvidia-uvm", "")  # lxc.mount.entry ... create=file of a missing source
    eng = engine(r, CreateNodes())
    (out,) = eng.apply(eng.plan(r.facts()))
    assert out.result == "applied" and r.stat("/dev/nvidia-uvm") == (stat.S_IFCHR, 511, 0, 0o666)
    os.unlink(r.path("/dev/nvidia-uvm"))
    r.write("/dev/nvidia-uvm", "precious")
    plan = eng.plan(r.facts())
    assert "regular file of 8 bytes: not deleting data" in plan.refusals[0].reason
    assert r.read("/dev/nvidia-uvm") == "precious"


def test_failed_verify_rolls_back_to_the_old_node(make_root):
    """nvidia-modprobe reports success but makes an unusable node: verify fails, the stale node comes back."""
    r = make_root(uvm_major=511).healthy_nodes(511)
    r.node("/dev/nvidia-uvm", 509, 0, 0o640)
    r.fault("modprobe-wrong-major")
    eng = engine(r, CreateNodes())
    (out,) = eng.apply(eng.plan(r.facts()))
    assert out.result == "rolled_back", out.detail
    assert "512:0" in out.verify.summary and "511:0" in out.verify.summary
    assert r.stat("/dev/nvidia-uvm") == (stat.S_IFCHR, 509, 0, 0o640)  # exactly as before apply
    assert r.stat("/dev/nvidia-uvm-tools") == (stat.S_IFCHR, 511, 1, 0o666)  # the tool replaced it: put back too
    assert audit(r)[-1]["result"] == "rolled_back"


class DriverReloadedMidway(LocalHost):
    """The nvidia-uvm major moves while gpudoctor makes the node (a driver reload racing the remedy)."""

    def mknod(self, path, major, minor, mode=0o666, timeout=10.0):
        super().mknod(path, major, minor, mode, timeout)
        devices = self._path("/proc/devices")
        with open(devices) as fh:
            text = fh.read()
        with open(devices, "w") as fh:
            fh.write(text.replace("511 nvidia-uvm", "510 nvidia-uvm"))


def test_failed_verify_removes_the_nodes_it_made(make_root):
    r = make_root(uvm_major=511, without=("nvidia-modprobe",))
    r.node("/dev/nvidiactl", 195, 255)
    r.node("/dev/nvidia0", 195, 0)
    host = DriverReloadedMidway(name=NAME, root=str(r.root), path_prepend=[str(r.bin)])
    eng = engine(r, CreateNodes(), host=host)
    (out,) = eng.apply(eng.plan(r.facts()))
    assert out.result == "rolled_back"
    assert dev_listing(r) == ["nvidia0", "nvidiactl"]  # both made nodes removed, no temp left
    assert sorted(out.applied["rollback"]["restored"]) == ["removed /dev/nvidia-uvm", "removed /dev/nvidia-uvm-tools"]


def test_apply_refuses_when_the_live_major_moved_since_the_plan(make_root):
    r = make_root(uvm_major=511, without=("nvidia-modprobe",))
    r.node("/dev/nvidiactl", 195, 255)
    eng = engine(r, CreateNodes())
    plan = eng.plan(r.facts())
    r.write("/proc/devices", r.read("/proc/devices").replace("511 nvidia-uvm", "507 nvidia-uvm"))
    (out,) = eng.apply(plan)
    assert out.result == "failed" and "now 507, the plan said 511" in out.detail
    assert not r.path("/dev/nvidia-uvm").exists()


# --- devices.node.mode ------------------------------------------------------------------------------------

def test_uvm_tools_mode_000_is_chmodded_0666(make_root):
    r = make_root(uvm_major=238).healthy_nodes(238)
    r.node("/dev/nvidia-uvm-tools", 238, 1, 0o000)
    eng = engine(r, NodeMode())
    plan = eng.plan(r.facts())
    (change,) = plan.changes
    assert change.commands == ["chmod 0666 /dev/nvidia-uvm-tools"]
    assert "-/dev/nvidia-uvm-tools  char 238:1 mode 0000" in change.diff
    assert r.stat("/dev/nvidia-uvm-tools")[3] == 0  # dry run changed nothing
    (out,) = eng.apply(plan)
    assert out.result == "applied" and r.stat("/dev/nvidia-uvm-tools")[3] == 0o666
    assert eng.plan(r.facts()).changes == []
    assert eng.apply(plan)[0].result == "unchanged"


class UdevResetsMode(LocalHost):
    """A udev rule that puts the mode back right after a chmod."""

    def chmod(self, path, mode, timeout=10.0):
        super().chmod(path, mode, timeout)
        os.chmod(self._path(path), 0o600)


def test_mode_failed_verify_rolls_back(make_root):
    r = make_root(uvm_major=238).healthy_nodes(238)
    r.node("/dev/nvidia-uvm-tools", 238, 1, 0o000)
    host = UdevResetsMode(name=NAME, root=str(r.root), path_prepend=[str(r.bin)])
    eng = engine(r, NodeMode(), host=host)
    (out,) = eng.apply(eng.plan(r.facts()))
    assert out.result == "rolled_back" and "mode 0600" in out.verify.summary
    assert out.applied["rollback"]["restored"] == ["chmod 0000 /dev/nvidia-uvm-tools"]


def test_mode_of_a_host_owned_node_in_a_user_namespace_is_refused(make_root):
    r = make_root(uvm_major=238, userns=True).healthy_nodes(238)
    r.node("/dev/nvidia-uvm-tools", 238, 1, 0o000)
    os.chown(r.path("/dev/nvidia-uvm-tools"), 65534, 65534)
    plan = engine(r, NodeMode()).plan(r.facts())
    assert "belongs to the host (uid 65534" in plan.refusals[0].reason


def test_a_stale_node_with_a_bad_mode_is_left_to_create(make_root):
    r = make_root(uvm_major=511, without=("nvidia-modprobe",)).healthy_nodes(511)
    r.node("/dev/nvidia-uvm", 509, 0, 0o000)
    eng = engine(r)  # both remedies, in registry order
    plan = eng.plan(r.facts())
    assert [c.remedy for c in plan.changes] == ["devices.node.create"] and plan.nothing == ["devices.node.mode"]
    assert [o.result for o in eng.apply(plan)] == ["applied"]
    assert r.stat("/dev/nvidia-uvm") == (stat.S_IFCHR, 511, 0, 0o666)


@pytest.mark.parametrize("fixture", ["h200-uvm-stale-major", "h200-uvmtools-000"])
def test_plans_from_real_h200_snapshots(fixture):
    """The captured H200 faults: the stale uvm node and the mode-000 uvm-tools node get the expected changes."""
    from pathlib import Path

    doc = json.loads((Path(__file__).parents[1] / "fixtures/snapshots" / f"{fixture}.json").read_text())
    facts = doc["facts"]
    plan = Engine([CreateNodes(), NodeMode()], RemedyContext()).plan(facts)
    if fixture == "h200-uvm-stale-major":
        # The fault was injected as a bind mount over /dev/nvidia-uvm, and the snapshot's tools facts saw it: replacing
        # the node would only hide the mount, so the remedy refuses and says where to fix it.
        assert plan.changes == []
        (refusal,) = plan.refusals
        assert refusal.remedy == "devices.node.create" and "/dev/nvidia-uvm is a bind mount" in refusal.reason
    else:
        (change,) = plan.changes
        assert change.remedy == "devices.node.mode" and change.commands == ["chmod 0666 /dev/nvidia-uvm-tools"]
