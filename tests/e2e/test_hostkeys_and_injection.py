"""Through the real CLI against the LXC lab (tests/lxclab.py): an unknown or changed SSH host key, of the container or of its Proxmox
host, refuses `check --host`, `lxc fix --host` and `fix --host` with one line and exit 3, and nothing runs on
either machine; inventory values carrying shell (`;`, `$()`, backticks, quotes, newlines) reach the hosts as
literal arguments and paths, and run nothing extra."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.e2e.test_seed_over_ssh import gd
from tests.sshd import keygen, pub_key_fields

PAYLOADS = ["; touch {m}", "$(touch {m})", "`touch {m}`", "'; touch {m}; '", "\"; touch {m}; \"", "\ntouch {m}\n"]


def state_args(tmp_path) -> list[str]:
    return ["--audit-log", str(tmp_path / "audit.jsonl"), "--lock-dir", str(tmp_path / "locks")]


COMMANDS = {
    "check": lambda inv, tmp: ["check", "--host", "ct200", "--inventory", str(inv)],
    "lxc fix --apply": lambda inv, tmp: ["lxc", "fix", "--host", "ct200", "--inventory", str(inv), "--apply", "--yes",
                                         *state_args(tmp)],
    "fix --apply": lambda inv, tmp: ["fix", "--host", "ct200", "--inventory", str(inv), "--apply", "--yes",
                                     *state_args(tmp)],
}


def inventory_with_known_hosts(lab, tmp_path, lines: str):
    kh = tmp_path / "known_hosts"
    kh.write_text(lines)
    return lab.write_inventory(tmp_path / "inventory.yaml", known_hosts=kh), kh


@pytest.mark.parametrize("command,unknown", [("check", "ct200"), ("check", "kpro6"), ("fix --apply", "ct200"),
                                             ("fix --apply", "kpro6"), ("lxc fix --apply", "kpro6")])
def test_unknown_host_key_refuses_with_exit_3_and_runs_nothing(seed_lab, tmp_path, command, unknown):
    lab = seed_lab
    if unknown == "kpro6":
        lines, where = lab.ct_known_hosts_line(), f"[127.0.0.1]:{lab.node_port}"
    else:
        lines, where = lab.node_known_hosts_line(), lab.ct_addr
    inv, kh = inventory_with_known_hosts(lab, tmp_path, lines)
    sessions, calls = lab.sessions(), lab.calls()
    r = gd(*COMMANDS[command](inv, tmp_path))
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"gpudoctor: {unknown}: unknown SSH host key for "
                                                             f"{where}"), r.stderr
    assert "nothing was run" in r.stderr and "Traceback" not in r.stderr
    # nothing ran anywhere: no command or SFTP session in the container, no pct call, no file touched
    assert lab.sessions() == sessions
    assert lab.calls() == calls
    assert lab.config_file.read_bytes() == lab.seed and lab.backups() == []
    assert kh.read_text() == lines  # strict: never written
    assert not (tmp_path / "audit.jsonl").exists()


def test_changed_host_key_of_the_proxmox_host_is_refused(seed_lab, tmp_path):
    lab = seed_lab
    kind, b64 = pub_key_fields(keygen(tmp_path / "impostor").with_suffix(".pub"))
    lines = lab.ct_known_hosts_line() + f"[127.0.0.1]:{lab.node_port} {kind} {b64}\n"
    inv, _ = inventory_with_known_hosts(lab, tmp_path, lines)
    sessions = lab.sessions()
    r = gd(*COMMANDS["fix --apply"](inv, tmp_path))
    assert r.returncode == 3 and "SSH host key for [127.0.0.1]" in r.stderr and "CHANGED" in r.stderr
    assert lab.sessions() == sessions and lab.config_file.read_bytes() == lab.seed


def yq(s: str) -> str:
    return json.dumps(s)  # a YAML double-quoted scalar holding s exactly


@pytest.mark.parametrize("payload", PAYLOADS, ids=["semicolon", "dollar-paren", "backtick", "squote", "dquote",
                                                   "newline"])
def test_shell_in_inventory_values_runs_nothing(seed_lab, tmp_path, payload):
    """check --host with a hostile `pct:` (and no vmid, so `pct list` runs) and `expect.model_paths:`, lxc audit
    --host with a hostile `config_dir:`; a hostile description rides along. Each arrives as one literal argument
    or path."""
    lab = seed_lab
    marker = tmp_path / "marker"
    p = payload.format(m=marker)
    pct, config_dir, model = "pct" + p, "/etc/pve/lxc" + p, "/srv/models/Qwen3" + p
    inv = tmp_path / "inventory.yaml"
    inv.write_text(lab.inventory_text(vmid=None, host_extra=f"    description: {yq('ct' + p)}\n", pct=[pct])
                   .replace("    expect: {gpus: 1}\n", f"    expect: {{gpus: 1, model_paths: [{yq(model)}]}}\n"))
    calls = lab.calls()
    r = gd("check", "--host", "ct200", "--inventory", str(inv), "--json")
    assert "Traceback" not in r.stderr
    d = json.loads(r.stdout)
    assert r.returncode == 2  # the container's own layers still fail (EPERM, cuInit 999)
    cfg = next(f for f in d["findings"] if f["id"] == "boundary.lxc.config")
    assert cfg["status"] == "unknown"
    assert cfg["summary"].startswith(f"cannot find the container's VMID on kpro6: $ {shlex.quote(pct)} list → rc 127")
    assert lab.calls() == calls  # the node's pct never ran
    complete = next(f for f in d["findings"] if f["id"] == "workload.model.complete")
    assert complete["subject"] == model and complete["summary"] == f"model directory {model} does not exist"
    inv.write_text(lab.inventory_text(config_dir=config_dir))
    r = gd("lxc", "audit", "--host", "ct200", "--inventory", str(inv))
    assert r.returncode == 3 and r.stdout == ""
    shown = f"kpro6:{config_dir}/200.conf".encode("unicode_escape").decode() if "\n" in p else f"kpro6:{config_dir}/200.conf"
    assert r.stderr == f"gpudoctor: {shown}: cannot read it (ENOENT)\n"  # one line, even for a newline
    assert not marker.exists()


def test_shell_in_the_address_is_refused_with_the_inventory_line(seed_lab, tmp_path):
    marker = tmp_path / "marker"
    text = seed_lab.inventory_text().replace(f"  ct200:\n    address: {seed_lab.ct_addr}\n",
                                             f"  ct200:\n    address: {yq('127.0.0.1; touch ' + str(marker))}\n")
    inv = tmp_path / "inventory.yaml"
    inv.write_text(text)
    line = text.splitlines().index(f"    address: {yq('127.0.0.1; touch ' + str(marker))}") + 1
    r = gd("check", "--host", "ct200", "--inventory", str(inv))
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr.startswith(f"gpudoctor: {inv}:{line}: host ct200: address ") and r.stderr.count("\n") == 1
    assert not marker.exists()
