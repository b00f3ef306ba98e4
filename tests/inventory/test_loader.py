"""The inventory loader on good input: the model it builds, defaults, where it looks, and the factory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.errors import InventoryError
from gpudoctor.target import host_for, open_target
from gpudoctor.host.local import LocalHost
from gpudoctor.host.ssh import SSHHost
from gpudoctor.inventory import load_inventory, parse_inventory

REPO = Path(__file__).resolve().parents[2]

FULL = """\
version: 1
x-common: &gpu {gpus: 8}
defaults:
  user: root
  port: 2222
  host_key_policy: accept-new
  connect_timeout: 4.5
proxmox:
  kpro6:
    address: kpro6.lab.example
    user: admin
    config_dir: /srv/fake/etc/pve/lxc
    pct: [sudo, /usr/sbin/pct]
hosts:
  ct200:
    address: 192.0.2.200
    port: 22
    identity_file: keys/ct200
    known_hosts: ~/kh
    python: /opt/py/bin/python3
    lxc: {proxmox: kpro6, vmid: 200}
    expect: {gpus: 8, model_path: /mnt/tmpfs/m}
    groups: [h200, serving]
  ct201:
    address: "2001:db8::1"
    lxc: {proxmox: kpro6}
    expect: *gpu
    groups: h200
  bare:
    address: local
profiles:
  serving: ["host.*", "!bench.*"]
policy:
  auto_apply: [lxc.cgroup_allow]
  never_apply: []
  budgets: {max_changes_per_hour: 3, cooldown_s: 0.5}
  checks:
    fabric.pcie.mrrs: {expect: 512, allowed: [512, 4096]}
"""


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text(FULL)
    return load_inventory(p)


def test_model_of_a_full_inventory(inv, tmp_path):
    ct = inv.host("ct200")
    assert (ct.ssh.address, ct.ssh.port, ct.ssh.user, ct.ssh.host_key_policy) == ("192.0.2.200", 22, "root",
                                                                                  "accept-new")
    assert ct.ssh.identity_files == (str(tmp_path / "keys/ct200"),)  # relative to the inventory file
    assert ct.ssh.known_hosts == str(Path("~/kh").expanduser())
    assert ct.ssh.python == ("/opt/py/bin/python3",) and ct.ssh.connect_timeout == 4.5
    assert (ct.lxc.vmid, ct.lxc.proxmox.name) == (200, "kpro6")
    assert (ct.expect.gpus, ct.expect.model_paths, ct.groups) == (8, ("/mnt/tmpfs/m",), ("h200", "serving"))
    ct201 = inv.host("ct201")
    assert (ct201.ssh.port, ct201.lxc.vmid, ct201.expect.gpus, ct201.groups) == (2222, None, 8, ("h200",))
    px = inv.proxmox_host("kpro6")
    assert (px.ssh.user, px.config_dir, px.pct) == ("admin", "/srv/fake/etc/pve/lxc", ("sudo", "/usr/sbin/pct"))
    assert px.config_path(200) == "/srv/fake/etc/pve/lxc/200.conf"
    assert inv.profile("serving").patterns == ("host.*", "!bench.*")
    assert inv.policy.as_dict() == {"auto_apply": ["lxc.cgroup_allow"], "never_apply": [],
                                    "budgets": {"max_changes_per_hour": 3, "cooldown_s": 0.5},
                                    "checks": {"fabric.pcie.mrrs": {"expect": 512, "allowed": [512, 4096]}}}
    assert ct.line == 15 and ct.lines["identity_file"] == 18


def test_select_by_name_pattern_group_and_all(inv):
    assert [h.name for h in inv.select("ct200")] == ["ct200"]
    assert [h.name for h in inv.select("ct*")] == ["ct200", "ct201"]
    assert [h.name for h in inv.select("@h200")] == ["ct200", "ct201"]
    assert [h.name for h in inv.select("bare,ct2*")] == ["bare", "ct200", "ct201"]
    assert len(inv.select("all")) == 3
    for bad in ("nope", "zz*", "@nogroup"):
        with pytest.raises(InventoryError):
            inv.select(bad)


def test_unknown_names_list_what_exists(inv):
    with pytest.raises(InventoryError, match=r"no host named 'ct999' \(hosts: bare, ct200, ct201\)"):
        inv.host("ct999")
    with pytest.raises(InventoryError, match="no profile named 'x'"):
        inv.profile("x")


def test_to_json_is_plain(inv):
    import json

    d = json.loads(json.dumps(inv.to_json()))
    assert d["hosts"]["ct200"]["lxc"] == {"proxmox": "kpro6", "vmid": 200}
    assert d["proxmox"]["kpro6"]["pct"] == ["sudo", "/usr/sbin/pct"]


def test_the_committed_example_inventory():
    inv = load_inventory(REPO / "inventory.yaml")
    ct = inv.host("ct200")
    assert ct.lxc.proxmox.name == "kpro6" and ct.lxc.vmid == 200
    assert ct.lxc.proxmox.config_dir == "/etc/pve/lxc" and ct.lxc.proxmox.pct == ("pct",)
    assert ct.ssh.host_key_policy == "strict"
    assert set(inv.profiles) >= {"serving", "benchmark"}


# --- where the inventory is found -------------------------------------------------------------------

def test_lookup_order_flag_env_cwd_home(tmp_path, monkeypatch):
    def write(p: Path, name: str) -> Path:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"hosts:\n  {name}: {{address: 192.0.2.1}}\n")
        return p

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("GPUDOCTOR_INVENTORY", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    with pytest.raises(InventoryError, match="no inventory found"):
        load_inventory()
    write(home / ".config/gpudoctor/inventory.yaml", "from_home")
    assert list(load_inventory().hosts) == ["from_home"]
    write(cwd / "inventory.yaml", "from_cwd")
    assert list(load_inventory().hosts) == ["from_cwd"]
    monkeypatch.setenv("GPUDOCTOR_INVENTORY", str(write(tmp_path / "env.yaml", "from_env")))
    assert list(load_inventory().hosts) == ["from_env"]
    assert list(load_inventory(write(tmp_path / "flag.yaml", "from_flag")).hosts) == ["from_flag"]
    monkeypatch.setenv("GPUDOCTOR_INVENTORY", str(tmp_path / "gone.yaml"))
    with pytest.raises(InventoryError, match="GPUDOCTOR_INVENTORY"):
        load_inventory()


# --- the factory ----------------------------------------------------------------------------------------

def test_factory_builds_ssh_and_local_hosts_without_connecting(tmp_path):
    key = tmp_path / "id"
    key.write_text("not used: nothing connects")
    inv = parse_inventory(FULL.replace("keys/ct200", str(key)), str(tmp_path / "inv.yaml"), str(tmp_path))
    ct = host_for(inv.host("ct200"))
    assert isinstance(ct, SSHHost) and not ct.connected
    assert (ct.name, ct.address, ct.port, ct.user, ct.python) == ("ct200", "192.0.2.200", 22, "root",
                                                                  ["/opt/py/bin/python3"])
    assert ct.host_key_policy == "accept-new"
    assert host_for(inv.host("ct200"), host_key_policy="strict").host_key_policy == "strict"
    t = open_target("ct200", inv)
    px = t.proxmox
    assert isinstance(px, SSHHost) and (px.name, px.address, px.user, px.port) == ("kpro6", "kpro6.lab.example",
                                                                                   "admin", 2222)
    assert not px.connected and t.context.proxmox is px
    assert open_target("bare", inv).proxmox is None
    assert isinstance(host_for(inv.host("bare")), LocalHost)
    c = t.context
    assert (t.name, t.vmid, c.expect_gpus, c.model_paths, t.proxmox_entry.name) == ("ct200", 200, 8,
                                                                                      ["/mnt/tmpfs/m"], "kpro6")
    assert isinstance(open_target("local", search=False).host, LocalHost)  # no inventory needed


def test_missing_identity_file_is_an_inventory_error_with_its_line(inv):
    with pytest.raises(InventoryError) as e:
        host_for(inv.host("ct200"))
    assert e.value.line == 18 and "identity_file" in str(e.value) and e.value.path.endswith("inv.yaml")


def test_ssh_config_empty_means_none_and_relative_paths_follow_the_file(tmp_path):
    inv = parse_inventory("defaults: {ssh_config: ''}\nhosts:\n  a: {address: h}\n  b: {address: h, ssh_config: c}\n",
                          "inv.yaml", str(tmp_path))
    assert inv.host("a").ssh.ssh_config == "" and inv.host("b").ssh.ssh_config == str(tmp_path / "c")
    assert host_for(inv.host("a")).ssh_config == ""
