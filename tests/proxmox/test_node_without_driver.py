"""A Proxmox node without the NVIDIA driver is the one root cause of what it explains (#49).

The review's run (the real-LXC lab's node is this machine, which has no NVIDIA driver) got 13 findings from
`lxc audit`, each printed twice, and 16 root causes from `check --host ct200`, none of them the node. Here: the guest
facts of the H200 snapshot as such a guest sees them (no /proc/driver/nvidia, no nvidia module, no nvidia in
/proc/devices, nodes ENXIO or EPERM, no nvidia-smi, no libcuda), the boundary facts from the real gather over a
fake Proxmox root whose /proc/devices is this machine's, captured (tests/fixtures/proxmox/proc-devices-nodriver.txt)."""

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from gpudoctor.diagnose import diagnose
from gpudoctor.findings import Status
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost

from .conftest import CONFIGS, DEV511, FIX, install
from .test_blame import NO_LIBCUDA, NO_SMI
from .test_gather_checks import SNAPSHOTS, proxmox

NODRIVER = FIX / "proc-devices-nodriver.txt"
# What the node's driver cannot explain: the guest's own user space and a hand edit of the config.
INDEPENDENT = {"cuda.init", "driver.nvml.init", "boundary.lxc.malformed[/etc/pve/lxc/200.conf:20]"}


def guest_facts(pve_root, bindir):
    f = copy.deepcopy(json.loads((SNAPSHOTS / "h200-healthy.json").read_text())["facts"])
    h = f["host"]
    h["container"] = {"kind": "lxc", "evidence": ["/proc/1/environ has container=lxc"]}
    h["driver_version_file"] = {"error": "ENOENT", "line": None, "open": None, "version": None}
    h["modules"] = {"error": None, "nvidia": []}
    h["proc_devices"]["char"] = {k: v for k, v in h["proc_devices"]["char"].items() if "nvidia" not in k}
    nodes = f["devices"]["nodes"]
    for p in [p for p in nodes if p.startswith("/dev/nvidia-caps")]:
        del nodes[p]
    for p in nodes:
        nodes[p]["open"] = "ENXIO"  # the lab's nodes: allowed, no driver answers
    for p, minor in (("/dev/nvidia-uvm", 0), ("/dev/nvidia-uvm-tools", 1)):
        nodes[p].update(major=509, minor=minor, open="EPERM")  # the config's old uvm major, not allowed here
    f["driver"], f["cuda"] = dict(NO_SMI), dict(NO_LIBCUDA)
    (pve_root / "proc/devices").write_bytes(NODRIVER.read_bytes())
    install(pve_root, 200, "200-seed.conf")
    ctx = GatherContext(name="ct200", vmid=200, proxmox=proxmox(pve_root, bindir))
    f["boundary"] = gather(LocalHost(), ctx, only={"boundary"})["boundary"]
    return f


def test_the_capture_is_a_node_without_the_driver():
    assert "Character devices:" in NODRIVER.read_text() and "nvidia" not in NODRIVER.read_text()


def test_check_names_the_node_without_the_driver_as_the_root_cause(pve_root, fake_pct):
    bindir, _ = fake_pct
    d = diagnose(guest_facts(pve_root, bindir))
    assert d.root_cause.key == "boundary.lxc.node_driver", [f.key for f in d.root_causes]
    assert d.root_cause.status == Status.FAIL and "kpro6" in d.root_cause.summary
    assert {f.key for f in d.root_causes[1:]} <= INDEPENDENT, [f.key for f in d.root_causes]
    symptoms = {f.key for f in d.findings if f.blocked_by == d.root_cause.key}
    # the guest's own "no driver" (it shares the node's kernel), its nodes, and the node's unknown majors
    assert {"host.driver.loaded", "host.uvm.loaded", "devices.node.open[/dev/nvidia0]",
            "devices.node.open[/dev/nvidia-uvm]", "boundary.lxc.cgroup_allow[/dev/nvidia-uvm]",
            "boundary.lxc.mount_entry[/dev/nvidia-uvm]"} <= symptoms
    # with no driver no major is known: no allow rule is called stale
    assert not [f for f in d.findings if f.id == "boundary.lxc.stale_allow"]


def test_a_node_with_the_driver_is_ok_and_the_seed_cause_stays(pve_root, fake_pct):
    bindir, _ = fake_pct
    f = guest_facts(pve_root, bindir)
    (pve_root / "proc/devices").write_bytes(DEV511.read_bytes())
    f["boundary"] = gather(LocalHost(), GatherContext(name="ct200", vmid=200, proxmox=proxmox(pve_root, bindir)),
                           only={"boundary"})["boundary"]
    d = diagnose(f, {"boundary"})
    assert d.by_key()["boundary.lxc.node_driver"].status == Status.OK
    assert d.root_cause.key == "boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"


def _audit(devices: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_COLOR="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "gpudoctor", "lxc", "audit", "--config",
                           str(CONFIGS / "200-seed.conf"), "--devices", str(devices)],
                          capture_output=True, text=True, env=env, timeout=60)


_HEAD = re.compile(r"^(?:(?:FAIL|WARN|UNKNOWN|ok|info) |\S*\s+(?:FAIL|WARN|UNKNOWN|ok|info)\s+)(boundary\.\S+?):?(?:\s|$)")


def _printed(text: str) -> list[str]:
    """The finding keys the audit prints: each root cause's block head and each row of the table."""
    return [m.group(1) for ln in text.splitlines() if (m := _HEAD.match(ln))]


def test_lxc_audit_names_the_node_and_prints_each_finding_once():
    r = _audit(NODRIVER)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].startswith("FAIL boundary.lxc.node_driver: the NVIDIA driver is not loaded on the Proxmox node")
    keys = _printed(r.stdout)
    assert len(keys) == len(set(keys)) and "boundary.lxc.node_driver" in keys, keys
    assert "(symptom of boundary.lxc.node_driver)" in r.stdout and "stale_allow" not in r.stdout


def test_the_seed_audit_prints_each_finding_once():
    r = _audit(DEV511)
    assert r.returncode == 2, r.stdout + r.stderr
    keys = _printed(r.stdout)
    assert len(keys) == len(set(keys)) and "boundary.lxc.cgroup_allow[/dev/nvidia-uvm]" in keys, keys
