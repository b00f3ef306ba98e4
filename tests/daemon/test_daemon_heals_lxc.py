"""End to end, no stand-in engine: the real daemon, real pipeline and real remedy engine heal the seed's fault.

The container ct200 and its Proxmox node are `address: local` inventory hosts over fake roots (the Proxmox one
holds the seed's config: uvm allowed at 509, live major 511) with the `pct` stand-in of tests/proxmox. The daemon
must add the 511 rule, restart the container once, credit the remedy when the next check shows the boundary
fixed, and never restart it twice within the hour when the fault comes back.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.proxmox.conftest import fake_pct, install, pve_root  # noqa: F401 - fixtures
from tests.childenv import pythonpath
from tests.rooted import CLI, use_roots

FINDING = "boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"


def daemon_once(inv: Path, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "daemon", "--once", "--inventory", str(inv),
                           "--host", "ct200", "--state", str(state)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": pythonpath()})


def test_daemon_fixes_the_seed_boundary_fault_and_restarts_once_per_hour(tmp_path, pve_root, fake_pct,  # noqa: F811
                                                                         monkeypatch):
    bindir, pct_state = fake_pct
    conf = install(pve_root, 200, "200-seed.conf")
    (tmp_path / "ct").mkdir()
    inv = tmp_path / "inventory.yaml"
    inv.write_text("hosts:\n  ct200:\n    address: local\n"
                   "    lxc: {proxmox: kpro6, vmid: 200}\n"
                   "proxmox:\n  kpro6:\n    address: local\n"
                   "policy:\n  auto_apply: [lxc.cgroup_allow, lxc.cgroup_allow.reboot]\n")
    use_roots(monkeypatch, ct200=tmp_path / "ct", kpro6=(pve_root, [bindir]))
    state = tmp_path / "state" / "daemon.json"
    seed = conf.read_bytes()
    assert b"lxc.cgroup2.devices.allow: c 511:" not in seed  # only the seed's keyless hand fix "c 511:* rwm"

    daemon_once(inv, state)
    assert b"lxc.cgroup2.devices.allow: c 511:* rwm" in conf.read_bytes()
    calls = (pct_state / "calls").read_text().splitlines()
    assert calls.count("reboot 200") == 1
    host = json.loads(state.read_text())["hosts"]["ct200"]
    assert host["pending_verify"] == {"lxc.cgroup_allow": FINDING}
    audit = [json.loads(x) for x in (state.parent / "audit.jsonl").read_text().splitlines()]
    assert [(a["remedy"], a["result"]) for a in audit] == [("lxc.cgroup_allow", "started"),
                                                          ("lxc.cgroup_allow", "applied")]
    audit = audit[1:]
    assert (pve_root / audit[0]["backup"].lstrip("/")).read_bytes() == seed  # the backup lives on the edited host

    daemon_once(inv, state)  # the next check sees the boundary fixed: the remedy is credited
    host = json.loads(state.read_text())["hosts"]["ct200"]
    assert host["findings"][FINDING] == "ok" and host["pending_verify"] == {}
    assert host["remedies"]["lxc.cgroup_allow"]["last_result"] == "ok"

    conf.write_bytes(seed)  # the fault comes back within the hour: the config is fixed, no second restart
    daemon_once(inv, state)
    daemon_once(inv, state)
    assert (pct_state / "calls").read_text().splitlines().count("reboot 200") == 1
    host = json.loads(state.read_text())["hosts"]["ct200"]
    assert host["findings"][FINDING] == "fail"
    assert host["remedies"]["lxc.cgroup_allow"]["total_attempts"] == 1
