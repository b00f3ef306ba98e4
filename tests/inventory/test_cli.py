"""`gpudoctor inventory show|ping` through gpudoctor.cli.main against the real sshd."""

from __future__ import annotations

import json
import socket

import pytest

from gpudoctor.cli import main


def cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.fixture
def inv_file(sshd, tmp_path):
    p = tmp_path / "inventory.yaml"
    p.write_text(sshd.inventory_yaml("ct200", proxmox="kpro6"))
    return p


def test_show_table_and_json(capsys, inv_file, sshd):
    rc, out, _ = cli(capsys, "inventory", "show", "--inventory", str(inv_file))
    assert rc == 0
    assert "ct200" in out and f"127.0.0.1:{sshd.port}" in out and "200@kpro6" in out and "/etc/pve/lxc" in out
    rc, out, _ = cli(capsys, "inventory", "show", "--inventory", str(inv_file), "--json")
    d = json.loads(out)
    assert rc == 0 and d["hosts"]["ct200"]["lxc"] == {"proxmox": "kpro6", "vmid": 200}


def test_ping_reaches_host_and_its_proxmox_node(capsys, inv_file):
    rc, out, _ = cli(capsys, "inventory", "ping", "--inventory", str(inv_file), "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 0
    assert {(r["role"], r["name"], r["ok"]) for r in rows} == {("host", "ct200", True), ("proxmox", "kpro6", True)}
    assert all(r["detail"] == socket.gethostname() for r in rows)


def test_ping_unknown_host_key_is_refused_exit_3_then_accepted_on_request(capsys, sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    p = tmp_path / "inventory.yaml"
    p.write_text(sshd.inventory_yaml("ct200").replace(str(sshd.known_hosts), str(kh)))
    rc, out, err = cli(capsys, "inventory", "ping", "--inventory", str(p))
    assert rc == 3
    assert "FAIL" in out and "unknown SSH host key" in out and "Traceback" not in out + err
    assert not kh.exists()
    rc, out, _ = cli(capsys, "inventory", "ping", "--inventory", str(p), "--accept-new-host-key")
    assert rc == 0 and kh.read_text() == sshd.known_hosts_line()
    rc, out, _ = cli(capsys, "inventory", "ping", "--inventory", str(p))  # now strict checking passes
    assert rc == 0


def test_ping_unreachable_is_exit_3_one_line_per_host(capsys, sshd, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        p = tmp_path / "inventory.yaml"
        p.write_text(sshd.inventory_yaml("ct200", port=port))
        rc, out, err = cli(capsys, "inventory", "ping", "--inventory", str(p), "ct200")
    assert rc == 3 and "Traceback" not in out + err
    rows = [ln for ln in out.splitlines() if ln.strip()][2:]  # after the title and the column header
    assert len(rows) == 1 and rows[0].split()[:3] == ["ct200", "host", "FAIL"], out  # exactly one line for the host
    assert f"ct200: connection to root@127.0.0.1:{port} refused" in rows[0], out
    assert err.splitlines() == [f"inventory: {p}"], err  # nothing else on stderr


def test_ping_unknown_spec_is_bad_input(capsys, inv_file):
    rc, _, err = cli(capsys, "inventory", "ping", "--inventory", str(inv_file), "nope")
    assert rc == 3 and err.startswith("gpudoctor: ") and "no host named 'nope'" in err


@pytest.mark.parametrize("cmd", [("inventory", "ping"), ("check", "--host")])
def test_identity_file_that_is_a_directory_is_file_line_exit_3(capsys, sshd, tmp_path, cmd):
    # It printed a raw "[Errno 21] Is a directory" (#33); a missing one names FILE:LINE: so does a directory.
    keys = tmp_path / "keys"
    keys.mkdir()
    p = tmp_path / "inventory.yaml"
    p.write_text(sshd.inventory_yaml("ct200").replace(f"identity_file: {sshd.client_key}", f"identity_file: {keys}"))
    line = next(i for i, x in enumerate(p.read_text().splitlines(), 1) if "identity_file" in x)
    rc, out, err = cli(capsys, *cmd, *(["ct200"] if cmd[0] == "check" else []), "--inventory", str(p))
    text = out + err
    assert rc == 3, text
    assert "Errno" not in text and "Traceback" not in text
    assert f"{p}:{line}: ct200: identity_file {keys} is a directory, not a key file" in text, text
    keys.rmdir()  # the missing-file case, for comparison: the same form
    rc, out, err = cli(capsys, *cmd, *(["ct200"] if cmd[0] == "check" else []), "--inventory", str(p))
    assert rc == 3 and f"{p}:{line}: ct200: identity_file {keys} does not exist" in out + err, out + err
