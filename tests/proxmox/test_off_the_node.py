"""`gpudoctor lxc audit` off a Proxmox node (#23): the unreadable /etc/pve config is named together with what to do
(--host, --config), and a --config file is never judged against this machine's /proc/devices (the wrong kernel's
majors would make the node's 509 and 234 look stale). Through the installed console script, on this machine, which
is not a Proxmox node."""

from __future__ import annotations

import json

import pytest

from tests import needs
from tests.console import gpudoctor

from .conftest import CONFIGS, DEV509, DEV511



@pytest.fixture(autouse=True)
def _off_the_node():
    needs.not_a_proxmox_node()


SEED = CONFIGS / "200-seed.conf"


@pytest.mark.parametrize("cmd", ["audit", "fix"])
def test_a_vmid_off_the_node_names_the_file_and_the_way_to_the_node(cmd):
    r = gpudoctor("lxc", cmd, "200")
    assert r.returncode == 3 and r.stdout == "" and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("gpudoctor: /etc/pve/lxc/200.conf: cannot read it (ENOENT): this machine is not a "
                               "Proxmox node (no /etc/pve); ")
    assert "--host NODE 200" in lines[0] and "--config FILE --devices FILE" in lines[0]


@pytest.mark.parametrize("cmd", ["audit", "fix"])
def test_a_config_without_devices_is_not_judged_by_this_machines_majors(cmd):
    r = gpudoctor("lxc", cmd, "--config", SEED)
    assert r.returncode == 3 and r.stdout == "", r.stdout
    line = r.stderr.strip()
    assert "\n" not in line and f"--config {SEED} without --devices" in line
    assert "no node /proc/devices here to judge the majors against" in line
    assert "--devices FILE" in line and "--host NODE VMID" in line
    assert "stale" not in r.stdout + r.stderr


def _judged(devices):
    r = gpudoctor("lxc", "audit", "--config", SEED, "--devices", devices, "--json")
    assert "not a Proxmox node" not in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["exit_code"] == r.returncode, r.stderr
    return r.returncode, doc["verdict"], {f["key"]: (f["status"], f["data"].get("major")) for f in doc["findings"]}


def test_with_the_nodes_devices_the_same_config_is_judged():
    """The majors come from the --devices file, not from this machine: the seed's 509 rule passes against a node
    whose uvm is at 509 (only the keyless 511 line is warned about) and fails against one at 511."""
    code, verdict, found = _judged(DEV509)
    assert (code, verdict) == (1, "warn"), found
    assert found["boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"] == ("ok", 509)
    assert [k for k, (status, _) in found.items() if status != "ok"] == [f"boundary.lxc.malformed[{SEED}:20]"]
    code, verdict, found = _judged(DEV511)
    assert (code, verdict) == (2, "fail"), found
    assert found["boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"] == ("fail", 511)
    assert found["boundary.lxc.stale_allow[c 509]"] == ("warn", 509)
