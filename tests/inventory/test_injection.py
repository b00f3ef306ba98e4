"""Inventory values cannot run shell. Each payload tries to create a marker file through one field; fields that
name machines or users reject it with file:line, fields that become arguments or paths reach the real sshd
literally. Either way the marker never exists."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpudoctor.errors import InventoryError
from gpudoctor.target import host_for, open_target
from gpudoctor.inventory import parse_inventory

PAYLOADS = ["; touch {m}", "$(touch {m})", "`touch {m}`", "'; touch {m}; '", "\"; touch {m}; \"", "\ntouch {m}\n"]


def yq(s: str) -> str:
    """A YAML double-quoted scalar holding s exactly."""
    import json

    return json.dumps(s)


@pytest.fixture(params=range(len(PAYLOADS)), ids=["semicolon", "dollar-paren", "backtick", "squote", "dquote",
                                                  "newline"])
def payload(request, tmp_path):
    marker = tmp_path / "marker"
    yield PAYLOADS[request.param].format(m=marker)
    assert not marker.exists()


def base(sshd, *, host_extra: str = "", px_extra: str = "") -> str:
    return sshd.inventory_yaml("ct200", proxmox="kpro6", extra_host=host_extra, extra_proxmox=px_extra)


@pytest.mark.parametrize("field,template", [
    ("address", "hosts:\n  ct200:\n    address: {v}\n"),
    ("user", "hosts:\n  ct200:\n    address: 192.0.2.1\n    user: {v}\n"),
    ("port", "hosts:\n  ct200:\n    address: 192.0.2.1\n    port: {v}\n"),
    ("host name", "hosts:\n  {v}:\n    address: 192.0.2.1\n"),
    ("group", "hosts:\n  ct200:\n    address: 192.0.2.1\n    groups: [{v}]\n"),
    ("vmid", "proxmox:\n  kpro6: {{address: 192.0.2.6}}\nhosts:\n  ct200:\n    address: 192.0.2.1\n"
             "    lxc: {{proxmox: kpro6, vmid: {v}}}\n"),
    ("proxmox name", "proxmox:\n  {v}: {{address: 192.0.2.6}}\nhosts:\n  ct200: {{address: 192.0.2.1}}\n"),
    ("profile pattern", "hosts:\n  ct200: {{address: 192.0.2.1}}\nprofiles:\n  p: [{v}]\n"),
    ("policy pattern", "hosts:\n  ct200: {{address: 192.0.2.1}}\npolicy:\n  auto_apply: [{v}]\n"),
])
def test_identity_fields_reject_shell_with_a_line(payload, field, template):
    with pytest.raises(InventoryError) as e:
        parse_inventory(template.format(v=yq("x" + payload)), "inv.yaml")
    assert e.value.path == "inv.yaml" and e.value.line is not None


def test_python_field(sshd, payload):
    inv = parse_inventory(base(sshd, host_extra=f"    python: {yq('python3' + payload)}\n"), "inv.yaml")
    with host_for(inv.host("ct200")) as h:
        assert h.stat("/dev/null", timeout=30).error == "PROBE_FAILED rc=127"


def test_pct_field(sshd, payload):
    inv = parse_inventory(base(sshd, px_extra=f"    pct: {yq('pct' + payload)}\n"), "inv.yaml")
    t = open_target("ct200", inv)
    r = t.proxmox.run([*t.proxmox_entry.pct, "list"])
    assert r.rc == 127
    t.close()


def test_config_dir_field(sshd, payload, tmp_path):
    cdir = str(tmp_path / ("lxc" + payload))
    inv = parse_inventory(base(sshd, px_extra=f"    config_dir: {yq(cdir)}\n"), "inv.yaml")
    t = open_target("ct200", inv)
    assert t.proxmox.listdir(t.proxmox_entry.config_dir) == "ENOENT"
    Path(cdir).mkdir(parents=True)
    Path(cdir, "200.conf").write_text("arch: amd64\n")
    assert t.proxmox.read_file(t.proxmox_entry.config_path(200)).data == b"arch: amd64\n"
    t.close()


def test_model_path_field(sshd, payload, tmp_path):
    mp = str(tmp_path / ("model" + payload))
    inv = parse_inventory(base(sshd, host_extra=f"    expect: {{model_paths: [{yq(mp)}]}}\n"), "inv.yaml")
    t = open_target("ct200", inv)
    assert t.context.model_paths == [mp]
    assert t.host.stat(mp, timeout=30).exists is False and t.host.read_file(mp, timeout=30).error == "ENOENT"
    assert t.host.listdir(mp, timeout=30) == "ENOENT" and t.host.try_open_many([mp], timeout=30) == {mp: "ENOENT"}
    t.close()


def test_known_hosts_and_identity_file_fields(sshd, payload, tmp_path):
    kh = tmp_path / ("kh" + payload)
    key = tmp_path / ("key" + payload)
    for p, src in ((kh, sshd.known_hosts), (key, sshd.client_key)):
        p.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, p)
    text = (f"hosts:\n  ct200:\n    address: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
            f"    identity_file: {yq(str(key))}\n    known_hosts: {yq(str(kh))}\n")
    inv = parse_inventory(text, "inv.yaml")
    with host_for(inv.host("ct200")) as h:
        assert h.run(["echo", "literal paths"]).stdout == "literal paths\n"


def test_test_keys_are_not_part_of_the_schema(sshd):
    """Tests root hosts their own way (tests/rooted.py); an inventory with test_root is refused like any typo."""
    for key in ("test_root: /tmp/x", "test_path: [/tmp/bin]"):
        with pytest.raises(InventoryError) as e:
            parse_inventory(base(sshd, host_extra=f"    {key}\n"), "inv.yaml")
        assert f"unknown key '{key.split(':')[0]}'" in str(e.value)

