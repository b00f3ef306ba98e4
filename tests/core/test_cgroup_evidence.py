"""An EPERM at mode 0666 proves its cause: the finding names the cgroup the probe ran in and the eBPF device
program ids attached there — on this machine's real kernel, with a real BPF_PROG_TYPE_CGROUP_DEVICE program."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests import needs

ROOT = Path(__file__).parents[2]

_PROBE = r"""
import json, sys
from gpudoctor.diagnose import diagnose
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost

facts = gather(LocalHost(root=sys.argv[1], python=[sys.executable]), GatherContext(name="t"), only={"devices"})
d = diagnose(facts, only_layers={"devices"})
f = d.by_key()["devices.node.open[/dev/nvidia-uvm]"]
print(json.dumps({"finding": f.to_json(), "cgroup": facts["devices"].get("cgroup")}))
"""


def _cgdev():
    spec = importlib.util.spec_from_file_location("cgdev", ROOT / "tools" / "cgdev.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def tmp_path(dev_tmp_path):
    """Device nodes are made here: a directory where they open as on /dev, whatever /tmp's mount (tests/devmount.py)."""
    return dev_tmp_path


@pytest.fixture
def node_tree(tmp_path, unused_major):
    needs.root()  # mknod
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "nvidia-uvm", 0o666 | stat.S_IFCHR, os.makedev(unused_major, 0))
    os.chmod(dev / "nvidia-uvm", 0o666)
    return tmp_path


def _probe(root, preexec=None) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(root)], capture_output=True, text=True, timeout=60,
                         preexec_fn=preexec, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_eperm_finding_carries_the_cgroup_path_and_the_device_program_ids(node_tree, unused_major):
    cgdev = _cgdev()
    if cgdev.own_cgroup2() is None:
        needs.unavailable("needs a cgroup2 mount (mount -t cgroup2 none /sys/fs/cgroup/unified)")
    outside = _probe(node_tree)
    assert outside["finding"]["data"]["errno"] == "ENXIO" and outside["cgroup"] is None  # no driver: stale major
    with cgdev.DeviceDenyCgroup([unused_major]) as cg:
        inside = _probe(node_tree, cg.enter)
    f = inside["finding"]
    assert f["status"] == "fail" and f["data"]["errno"] == "EPERM" and "although its mode is 0666" in f["summary"]
    proof = f["data"]["cgroup"]
    assert proof["v2_path"] == cg.path and proof["device_programs"] == [cg.prog_id]
    assert proof["attached"] == [{"path": cg.path, "ids": [cg.prog_id]}]
    line = next(e for e in f["evidence"] if e.startswith("cgroup2 "))
    assert cg.path in line and str(cg.prog_id) in line and "BPF_CGROUP_DEVICE" in line


def test_without_capability_the_evidence_says_why_the_programs_are_unknown():
    from gpudoctor.gather.cgroup import evidence

    cg = {"v2": {"path": "/sys/fs/cgroup/user.slice", "cgroup": "/user.slice", "effective": None, "levels": [],
                 "error": "EPERM (BPF_PROG_QUERY needs CAP_NET_ADMIN)"}, "v1": None}
    assert evidence(cg) == ["cgroup2 /sys/fs/cgroup/user.slice: device programs unknown "
                            "(EPERM (BPF_PROG_QUERY needs CAP_NET_ADMIN))"]
    v1 = {"v2": None, "v1": {"path": "/sys/fs/cgroup/devices/lxc/200", "cgroup": "/lxc/200",
                             "list": ["c 195:* rwm", "c 509:* rwm"], "error": None}}
    assert evidence(v1) == ["cgroup v1 devices /sys/fs/cgroup/devices/lxc/200: devices.list = c 195:* rwm, c 509:* rwm"]
