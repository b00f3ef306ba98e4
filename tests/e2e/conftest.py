"""Session fixtures of the end-to-end lab (tests/e2e/lab.py): ct200 (a real sshd in a real device cgroup and its
own namespaces) on kpro6 (the shared test sshd with a fake Proxmox root), and an inventory that names both.

    lab        session: Lab(px, ct, standins, inventory: Path, known_hosts: Path, ssh_config: Path, dir)
    seed_lab   function: the lab reset to the seed's state (original config, container started with it)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e import lab as L
from tests.sshd import SSHD


@dataclass
class Lab:
    px: L.Proxmox
    px_sshd: SSHD
    ct: L.Container
    standins: L.Standins
    inventory: Path
    known_hosts: Path
    ssh_config: Path
    dir: Path

    def inventory_text(self, **kw) -> str:
        return L.inventory_text(self.px_sshd, self.px, self.ct, self.known_hosts, self.ssh_config, **kw)

    def write_inventory(self, path: Path, **kw) -> Path:
        path.write_text(self.inventory_text(**kw))
        return path


@pytest.fixture(scope="session")
def lab(sshd, tmp_path_factory):
    assert L.CGROUP_V1.is_dir(), "the e2e lab needs the cgroup v1 devices controller (present on our CI machines)"
    L.remove_stale_cgroups()
    d = tmp_path_factory.mktemp("e2e")
    standins = L.build_standins(d / "standins")
    guest = L.guest_spec(d / "ct200", standins)
    px = L.make_proxmox(d / "kpro6", {"200": guest})
    ct = L.start_container(d / "ct200", px, standins, guest)
    try:
        known_hosts = d / "known_hosts"
        known_hosts.write_text(sshd.known_hosts_line() + ct.sshd.known_hosts_line())
        ssh_config = d / "ssh_config"
        ssh_config.write_text("")
        lab = Lab(px, sshd, ct, standins, d / "inventory.yaml", known_hosts, ssh_config, d)
        lab.write_inventory(lab.inventory)
        yield lab
    finally:
        ct.stop()


@pytest.fixture
def seed_lab(lab):
    lab.px.reset()
    return lab
