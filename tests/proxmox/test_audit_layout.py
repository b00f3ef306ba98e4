"""The audit knows the Proxmox host's cgroup layout: on a hybrid or legacy host LXC ignores every lxc.cgroup2 rule
(devN:'s generated rules included) and applies only lxc.cgroup.devices.*; on a unified host it is the other way
round. Mount tables are real captures (tests/fixtures/proxmox/README.md)."""

import re
import subprocess
import sys

from gpudoctor.findings import Status
from gpudoctor.proxmox import config as C
from gpudoctor.proxmox.audit import AuditInput, cgroup_layout

from .conftest import CONFIGS, DEV511, audit

FIX = CONFIGS.parent


def mountinfo(name: str) -> str:
    return (FIX / f"mountinfo-{name}.txt").read_text()


def run(text: str, layout: str | None):
    cfg = C.parse(text.encode(), "/etc/pve/lxc/200.conf")
    lay, why = cgroup_layout(mountinfo(layout)) if layout else (None, "")
    return audit(AuditInput(cfg, procdev(), vmid=200, name="ct200", layout=lay, layout_evidence=why))


def procdev():
    from gpudoctor.proxmox.devices import ProcDevices

    return ProcDevices.parse(DEV511.read_text())


def allow(fs, subject):
    return next(f for f in fs if f.id == "boundary.lxc.cgroup_allow" and f.subject == subject)


V2_FIXED = (CONFIGS / "200-seed.conf").read_text().replace("c 511:* rwm\n", "").replace(
    "c 234:* rwm\n", "c 234:* rwm\nlxc.cgroup2.devices.allow: c 511:* rwm\n")
V1_TOO = V2_FIXED + "".join(f"lxc.cgroup.devices.allow: c {m}:* rwm\n" for m in (195, 511, 234))


def test_the_layout_is_read_from_the_mount_table():
    assert cgroup_layout(mountinfo("hybrid"))[0] == "hybrid"
    assert "cgroup2 only at /sys/fs/cgroup/unified" in cgroup_layout(mountinfo("hybrid"))[1]
    assert cgroup_layout(mountinfo("unified")) == ("unified", "cgroup2 is mounted at /sys/fs/cgroup (pure cgroup v2)")
    assert cgroup_layout(mountinfo("legacy"))[0] == "legacy"
    assert cgroup_layout(None)[0] is None and cgroup_layout("")[0] is None
    assert cgroup_layout("22 27 0:21 / /proc rw - proc proc rw\n")[0] is None  # no cgroup mount at all: unknown


def test_on_a_hybrid_host_cgroup2_rules_are_ignored_and_the_fix_line_is_v1():
    fs = run(V2_FIXED, "hybrid")
    uvm = allow(fs, "/dev/nvidia-uvm")
    assert uvm.status == Status.FAIL
    assert "not allowed by ct200's config on this hybrid cgroup host (its lxc.cgroup2 rules are ignored there)" \
        in uvm.summary
    assert uvm.evidence[0] == "major 511 (nvidia-uvm) is not in ct200's lxc.cgroup.devices.allow list (has none)"
    assert "LXC applies only lxc.cgroup.devices.* there and ignores every lxc.cgroup2.* line" in uvm.evidence[1]
    assert any("`lxc.cgroup2.devices.allow: c 511:* rwm` is a cgroup2 rule: LXC ignores it on this host's hybrid"
               in e for e in uvm.evidence)
    assert uvm.data["fix_line"] == "lxc.cgroup.devices.allow: c 511:* rwm" and uvm.data["layout"] == "hybrid"
    assert "`lxc.cgroup.devices.allow: c 511:* rwm`" in uvm.hint and "unified cgroup layout" in uvm.hint
    assert allow(fs, "/dev/nvidiactl").status == Status.FAIL  # 195 is only a cgroup2 rule as well
    # the same file on a unified host is fine
    fs2 = run(V2_FIXED, "unified")
    assert allow(fs2, "/dev/nvidia-uvm").status == Status.OK and allow(fs2, "/dev/nvidiactl").status == Status.OK


def test_on_a_hybrid_host_v1_rules_apply_and_are_not_called_deprecated():
    fs = run(V1_TOO, "hybrid")
    for node in ("/dev/nvidia-uvm", "/dev/nvidiactl", "/dev/nvidia0"):
        f = allow(fs, node)
        assert f.status == Status.OK and "lxc.cgroup.devices.allow" in f.evidence[0], (node, f)
    assert not [f for f in fs if f.id == "boundary.lxc.cgroup_v1"]
    # on a unified host the v1 lines are the deprecated, ignored ones
    fs2 = run(V1_TOO, "unified")
    assert len([f for f in fs2 if f.id == "boundary.lxc.cgroup_v1"]) == 3


def test_devn_passthrough_is_a_cgroup2_rule_that_a_hybrid_host_ignores():
    text = ("arch: amd64\nhostname: ct200\nostype: ubuntu\nrootfs: local:200/x.raw\n"
            "dev0: /dev/nvidia0\ndev1: /dev/nvidiactl\ndev2: /dev/nvidia-uvm\ndev3: /dev/nvidia-uvm-tools\n")
    ok = allow(run(text, "unified"), "/dev/nvidia-uvm")
    assert ok.status == Status.OK and "passed through by dev2" in ok.summary
    bad = allow(run(text, "hybrid"), "/dev/nvidia-uvm")
    assert bad.status == Status.FAIL
    assert any("line 7 dev2: Proxmox turns it into a lxc.cgroup2 rule, which LXC ignores" in e for e in bad.evidence)


def test_unknown_layout_keeps_the_cgroup2_reading():
    assert allow(run(V2_FIXED, None), "/dev/nvidia-uvm").status == Status.OK


def test_lxc_audit_cli_takes_the_layout_for_a_config_file(tmp_path):
    conf = tmp_path / "200.conf"
    conf.write_text(V2_FIXED)
    base = [sys.executable, "-m", "gpudoctor", "lxc", "audit", "--config", str(conf), "--devices", str(DEV511)]
    r = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert re.search(r"\bok\s+boundary\.lxc\.cgroup_allow\s+5 nodes: ", r.stdout), r.stdout  # read as cgroup v2
    assert not re.search(r"FAIL\s+boundary\.lxc\.cgroup_allow", r.stdout), r.stdout
    r = subprocess.run(base + ["--cgroup-layout", "hybrid"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "on this hybrid cgroup host" in r.stdout and "given with --cgroup-layout" in r.stdout
