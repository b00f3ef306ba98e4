"""#14 acceptance 3: a systemd unit whose DeviceAllow= misses the live uvm major is named, and fixed by a drop-in
that the real systemd-analyze verifies before it is written.

Real: systemd-analyze (verify of the unit and the new drop-in), the files on a LocalHost root, gpudoctor.files.edit.
Stand-in: systemctl (tests/boundary/standins/systemctl) — no systemd runs as PID 1 here — which prints, in systemd
252's `systemctl show` format (tests/fixtures/systemd/sglang-show.txt is that format), the properties of the unit files
under the test root as of the last daemon-reload.
"""

import shutil
from pathlib import Path

import pytest

from gpudoctor.boundary import systemd_devices as SD
from gpudoctor.diagnose import diagnose
from gpudoctor.findings import Status
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.gather.platform import parse_show
from gpudoctor.remedies.systemd_unit import SystemdDeviceAllow, verify_dropin
from gpudoctor.remedy import AuditLog, Engine, RemedyContext
from tests.needs import need
from tests.remedies.hostroot import NAME, HostRoot

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "systemd"
STANDINS = Path(__file__).resolve().parent / "standins"
UNIT = "sglang.service"
KEY = f"boundary.systemd.device_allow[{UNIT}:/dev/nvidia-uvm]"


def test_show_output_parses_one_device_allow_per_line():
    show = parse_show((FIX / "sglang-show.txt").read_text())
    assert show["DevicePolicy"] == "closed" and show["LoadState"] == "loaded"
    assert show["DeviceAllow"] == ["/dev/nvidiactl rw", "/dev/nvidia0 rw", "/dev/char/510:0 rw", "/dev/char/510:1 rw"]


@pytest.mark.parametrize("policy,allow,ok", [
    ("auto", [], True),
    ("closed", ["char-nvidia-uvm rw"], True),
    ("strict", ["char-nvidia* rw"], True),
    ("closed", ["/dev/char/510:0 rw"], False),
    ("closed", ["/dev/nvidia-uvm r"], False),
    ("auto", ["/dev/nvidiactl rw"], False),
    ("closed", ["/dev/nvidia-uvm rw"], True),
])
def test_device_allow_semantics(policy, allow, ok):
    live = {"nvidia": 195, "nvidiactl": 195, "nvidia-uvm": 238}
    nodes = {"/dev/nvidia-uvm": {"kind": "char", "major": 238, "minor": 0}}
    assert SD.allowed(policy, allow, 238, 0, live, nodes)[0] is ok


@pytest.fixture
def root(tmp_path, monkeypatch):
    r = HostRoot(tmp_path, uvm_major=238)
    r.healthy_nodes(uvm_major=238)
    (r.bin / "systemctl").unlink()  # the host root's own systemctl is a symlink into tests/remedies/standins
    shutil.copy(STANDINS / "systemctl", r.bin / "systemctl")
    r.write(f"/etc/systemd/system/{UNIT}", (FIX / UNIT).read_text())
    monkeypatch.setenv("GPUDOCTOR_STANDIN_ROOT", str(r.root))
    return r


def facts_of(r, units=(UNIT,)):
    f = r.facts(only=("host", "devices", "tools"))
    f["platform"] = gather(r.host(), GatherContext(name=NAME, timeout=5, units=list(units)), only={"platform"})["platform"]
    return f


def test_unit_missing_the_live_uvm_major_is_named(root):
    d = diagnose(facts_of(root))
    bad = {f.key: f for f in d.findings if f.id == "boundary.systemd.device_allow" and f.bad}
    assert set(bad) == {KEY}, sorted(bad)
    f = bad[KEY]
    assert f.status == Status.FAIL and UNIT in f.summary and "c 238:0" in f.summary
    ev = " ".join(f.evidence)
    assert "DevicePolicy=closed" in ev and "DeviceAllow=/dev/char/510:0 rw → c 510:0" in ev
    assert "DeviceAllow=char-nvidia-uvm rw" in f.hint and f.remedy == "systemd.device_allow"


def test_the_probe_runs_in_the_unit_its_eperm_is_explained_by_it(root):
    """A gate in ExecStartPre= runs in the unit's cgroup: the unit's policy is the cause of the probe's own EPERM."""
    root.write("/proc/self/cgroup", f"0::/system.slice/{UNIT}\n")
    f = facts_of(root, units=())
    for n in f["devices"]["nodes"].values():  # the driver's answer (no driver here: ENXIO) as on a GPU host
        if n.get("kind") == "char":
            n["open"] = "OK"
    f["devices"]["nodes"]["/dev/nvidia-uvm"]["open"] = "EPERM"
    f["cuda"] = {"cuinit": 999, "cuinit_name": "CUDA_ERROR_UNKNOWN", "device_count": -1}
    d = diagnose(f)
    assert d.root_cause.key == "boundary.systemd.device_allow[/dev/nvidia-uvm]"
    by = d.by_key()
    assert by["devices.node.open[/dev/nvidia-uvm]"].blocked_by == d.root_cause.key
    assert by["cuda.init"].blocked_by == d.root_cause.key
    assert "drop-in" in by["devices.node.open[/dev/nvidia-uvm]"].hint and "lxc" not in by["devices.node.open[/dev/nvidia-uvm]"].hint


def engine(r):
    ctx = RemedyContext(hosts={NAME: r.host()}, backup_dir="/var/lib/gpudoctor/backups", timeout=10)
    return Engine([SystemdDeviceAllow()], ctx, audit_log=AuditLog(str(r.root.parent / "audit.jsonl")),
                  lock_dir=str(r.root.parent / "locks"))


def test_dropin_is_verified_by_systemd_analyze_applied_and_a_second_plan_is_empty(root):
    need("systemd-analyze")
    f = facts_of(root)
    assert f["platform"]["systemd_analyze"]
    plan = engine(root).plan(f)
    [ch] = plan.changes
    drop = f"/etc/systemd/system/{UNIT}.d/{SD.DROPIN_NAME}"
    assert "+DeviceAllow=char-nvidia-uvm rw" in ch.diff and drop in ch.diff
    assert not root.path(drop).exists(), "plan writes nothing"
    [out] = engine(root).apply(plan)
    assert out.result == "applied" and out.verify.status == Status.OK, out.to_json()
    assert "DeviceAllow=char-nvidia-uvm rw" in root.read(drop)
    assert "daemon-reload" in root.read("/systemctl.log")
    again = facts_of(root)
    assert not [x for x in diagnose(again).findings if x.id == "boundary.systemd.device_allow" and x.bad]
    assert engine(root).plan(again).changes == []


def test_systemd_analyze_rejects_a_bad_dropin_and_nothing_is_written(root):
    analyze = need("systemd-analyze")
    host = root.host()
    unit_text = (FIX / UNIT).read_text()
    assert verify_dropin(host, UNIT, unit_text, b"[Service]\nDeviceAllow=char-nvidia-uvm rw\n", analyze, 10) is None
    why = verify_dropin(host, UNIT, unit_text, b"[Service]\nDeviceAllow=char-nvidia-uvm rwx\n", analyze, 10)
    assert why and "Invalid device rights" in why
    f = facts_of(root)
    plan = engine(root).plan(f)
    plan.changes[0].data["after"] += "DevicePolcy=closed\n"  # a typo systemd ignores with a warning
    [out] = engine(root).apply(plan)
    assert out.result == "failed" and "DevicePolcy" in out.detail, out.to_json()
    assert not root.path(f"/etc/systemd/system/{UNIT}.d/{SD.DROPIN_NAME}").exists()


def test_an_unreadable_policy_is_unknown_when_named_and_information_for_the_probes_own_unit(root):
    (root.bin / "systemctl").unlink()
    (root.bin / "systemctl").write_text("#!/bin/sh\necho 'System has not been booted with systemd' >&2\nexit 1\n")
    (root.bin / "systemctl").chmod(0o755)
    named = [x for x in diagnose(facts_of(root)).findings if x.id == "boundary.systemd.device_allow"]
    assert [x.status for x in named] == [Status.UNKNOWN] and "booted with systemd" in named[0].evidence[0]
    root.write("/proc/self/cgroup", f"0::/system.slice/{UNIT}\n")
    own = [x for x in diagnose(facts_of(root, units=())).findings if x.id == "boundary.systemd.device_allow"]
    assert [x.status for x in own] == [Status.INFO]
