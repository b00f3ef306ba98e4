"""Blame follows the cause (#19): the real-LXC run without an NVIDIA driver, replayed on facts.

What the lab showed (issue #19): the guest has no nvidia-smi and no libcuda; the config allows 195 but not the uvm
major, so /dev/nvidia-uvm(-tools) give EPERM and the allowed nodes ENXIO (no driver answers); after the fix every node
gives ENXIO. The boundary facts come from the real gather over a fake Proxmox root (tests/proxmox/conftest.py); the
guest facts from the H200 snapshot with the lab's errnos."""

import copy
import json

from gpudoctor.diagnose import diagnose
from gpudoctor.findings import Status
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost

from .conftest import install
from .test_gather_checks import SNAPSHOTS, mknods, proxmox

NO_SMI = {"command": "nvidia-smi -q -x", "rc": 127, "stderr": "nvidia-smi: command not found", "duration_s": 0.01}
NO_LIBCUDA = {"command": "python3 -c <cuInit probe>",
              "dlopen_error": "libcuda.so.1: cannot open shared object file: No such file or directory"}


def lab_facts(pve_root, bindir, *, fixed: bool):
    doc = json.loads((SNAPSHOTS / "h200-healthy.json").read_text())
    f = copy.deepcopy(doc["facts"])
    f["host"]["container"] = {"kind": "lxc", "evidence": ["/proc/1/environ has container=lxc"]}
    f["host"]["proc_devices"]["char"]["nvidia-uvm"] = 511
    f["host"]["proc_devices"]["char"]["nvidia-caps"] = 234
    nodes = f["devices"]["nodes"]
    for p in [p for p in nodes if p.startswith("/dev/nvidia-caps")]:
        del nodes[p]
    for p, minor in (("/dev/nvidia-uvm", 0), ("/dev/nvidia-uvm-tools", 1)):
        nodes[p].update(major=511, minor=minor, open="ENXIO" if fixed else "EPERM")
    for p in ("/dev/nvidia0", "/dev/nvidiactl"):
        nodes[p]["open"] = "ENXIO"  # allowed by the config, but no driver answers
    f["driver"], f["cuda"] = dict(NO_SMI), dict(NO_LIBCUDA)
    conf = install(pve_root, 200, "200-seed.conf")
    if fixed:
        conf.write_text(conf.read_text().replace("c 511:* rwm\n", "")
                        .replace("lxc.cgroup2.devices.allow: c 234:* rwm\n",
                                 "lxc.cgroup2.devices.allow: c 234:* rwm\nlxc.cgroup2.devices.allow: c 511:* rwm\n"))
    mknods(pve_root)
    ctx = GatherContext(name="ct200", vmid=200, proxmox=proxmox(pve_root, bindir))
    f["boundary"] = gather(LocalHost(), ctx, only={"boundary"})["boundary"]
    return f


def test_boundary_outranks_the_nodes_it_explains_and_tools_are_their_own_cause(pve_root, fake_pct):
    bindir, _ = fake_pct
    d = diagnose(lab_facts(pve_root, bindir, fixed=False))
    by = d.by_key()
    assert d.root_cause.key == "boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"
    assert by["devices.node.open[/dev/nvidia-uvm]"].blocked_by == d.root_cause.key
    # the uvm-tools EPERM (warn) is tied to its own allow-list finding (warn), not a separate root cause
    assert by["devices.node.open[/dev/nvidia-uvm-tools]"].blocked_by == "boundary.lxc.cgroup_allow[/dev/nvidia-uvm-tools]"
    assert "devices.node.open[/dev/nvidia-uvm-tools]" not in [f.key for f in d.root_causes]
    # a missing tool or library is its own cause, never a symptom of the allow list
    assert by["driver.nvml.init"].blocked_by is None and by["cuda.init"].blocked_by is None
    assert {"driver.nvml.init", "cuda.init"} <= {f.key for f in d.root_causes}
    assert not any("nvidia-smi" in c or "libcuda" in c for c in d.chain)
    # ENXIO with the live major: no driver answers — never "stale"
    ctl = by["devices.node.open[/dev/nvidiactl]"]
    assert "no driver answers for this node" in ctl.summary and "stale" not in ctl.summary
    assert by["devices.node.major[/dev/nvidiactl]"].status == Status.OK
    assert ctl.blocked_by is None  # the boundary allows 195: it does not explain an ENXIO


def test_after_the_fix_the_enxio_is_the_root_and_nothing_hangs_off_it_that_it_cannot_cause(pve_root, fake_pct):
    bindir, _ = fake_pct
    d = diagnose(lab_facts(pve_root, bindir, fixed=True))
    by = d.by_key()
    assert by["boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"].status == Status.OK
    assert d.root_cause.id == "devices.node.open" and "ENXIO" in d.root_cause.summary
    assert "stale" not in d.root_cause.summary and "major 511 is the live nvidia-uvm major" in d.root_cause.summary
    assert by["driver.nvml.init"].blocked_by is None and by["cuda.init"].blocked_by is None
    assert d.chain == [f"root cause: {d.chain[-1][len('root cause: '):]}"]  # nothing claimed as its symptom
    assert not any("libcuda" in c or "nvidia-smi" in c for c in d.chain)


def test_misplaced_allow_line_is_cleared_by_the_allow_list_fix(pve_root, fake_pct):
    """A rule appended after a [snapshot] header: misplaced is context of the allow-list finding and its remedy
    clears it, so `fix` does not list it as needing a human."""
    bindir, _ = fake_pct
    f = lab_facts(pve_root, bindir, fixed=False)
    conf = pve_root / "etc/pve/lxc/200.conf"
    conf.write_text(conf.read_text().replace("c 511:* rwm\n", "") + "\n[before-update]\narch: amd64\n"
                    "lxc.cgroup2.devices.allow: c 511:* rwm\n")
    ctx = GatherContext(name="ct200", vmid=200, proxmox=proxmox(pve_root, bindir))
    f["boundary"] = gather(LocalHost(), ctx, only={"boundary"})["boundary"]
    d = diagnose(f)
    mis = next(x for x in d.findings if x.id == "boundary.lxc.misplaced")
    assert mis.status == Status.WARN and mis.remedy == "lxc.cgroup_allow"
    assert mis.blocked_by == "boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"
