"""The frictions of a stranger's second hour (#49), each as a user meets it: `--json` prints one document whatever
happened (an unreachable host, a bad flag), `-o json`, `check --all` into a pipe without box tables, `inventory ping`
naming `host` and `-q` showing only what is not ok, `--version --json`, `gpudoctor help COMMAND`."""

from __future__ import annotations

import json
import socket

import click
import pytest

from gpudoctor.cli import cli as root
from tests.console import commands, gpudoctor

JSON_LEAVES = sorted(" ".join(p) for p, c in commands(root) if not isinstance(c, click.Group)
                     and any("--json" in getattr(o, "opts", ()) and not getattr(o, "hidden", False) for o in c.params))


@pytest.fixture
def unreachable(tmp_path):
    """An inventory whose one host refuses at once (a port nothing listens on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inv = tmp_path / "inv.yaml"
    inv.write_text(f"version: 1\nhosts:\n  vm:\n    address: 127.0.0.1\n    port: {port}\n")
    return str(inv)


def one_document(stdout: str) -> dict:
    docs = [json.loads(ln) for ln in stdout.splitlines() if ln.strip()] if stdout.lstrip().startswith("{\"") \
        and "\n{" not in stdout.strip() else [json.loads(stdout)]
    assert len(docs) == 1, stdout
    return docs[0]


# `sglang validate`'s ARGS are SGLang's own flags: an unknown one is judged (its own document), not refused
@pytest.mark.parametrize("name", [n for n in JSON_LEAVES if n != "sglang validate"])
def test_every_json_command_prints_one_document_on_bad_input(name):
    r = gpudoctor(*name.split(), "--json", "--no-such-flag")
    doc = one_document(r.stdout)
    assert r.returncode == 3 and doc["schema"] == "gpudoctor.error/1" and doc["exit_code"] == 3, r
    assert doc["command"] == name and "--no-such-flag" in doc["error"] and len(r.stderr.splitlines()) == 1


@pytest.mark.parametrize("args", [["check", "--host", "vm"], ["check", "--host", "vm", "-o", "json"],
                                  ["gate", "--host", "vm"], ["fix", "--host", "vm"], ["inventory", "ping"]])
def test_an_unreachable_host_with_json_is_still_one_document(unreachable, args):
    r = gpudoctor(*args, "-i", unreachable, *([] if "-o" in args else ["--json"]))
    doc = one_document(r.stdout)  # `check --host X --json` printed nothing on stdout
    assert r.returncode == 3 and doc["schema"].startswith("gpudoctor."), r
    assert "Traceback" not in r.stderr


def test_o_json_is_json_and_output_json_does_not_suggest_group():
    a = gpudoctor("check", "--snapshot", "examples/h200-uvm-blocked.json", "-o", "json", cwd=root_dir())
    b = gpudoctor("check", "--snapshot", "examples/h200-uvm-blocked.json", "--output", "json", cwd=root_dir())
    assert a.returncode == b.returncode == 2 and json.loads(a.stdout)["schema"] == "gpudoctor.check/1", a.stderr
    assert "--group" not in b.stderr and json.loads(b.stdout)["verdict"] == json.loads(a.stdout)["verdict"]


def test_check_all_into_a_pipe_draws_no_box(unreachable):
    r = gpudoctor("check", "--all", "-i", unreachable)
    assert r.returncode == 3, r.stderr
    assert not set("┏┃━│─┡┗┛└┘") & set(r.stdout), r.stdout  # one host, one plain line
    host = [ln for ln in r.stdout.splitlines() if ln.startswith("vm ")]
    assert len(host) == 1 and "unreachable" in host[0] and "refused" in host[0], r.stdout


def test_inventory_ping_json_names_host_and_quiet_shows_only_what_failed(unreachable, tmp_path):
    r = gpudoctor("inventory", "ping", "-i", unreachable, "--json")
    doc = one_document(r.stdout)
    assert doc["host"] == "vm" and doc["name"] == "vm" and doc["ok"] is False
    ok_inv = tmp_path / "local.yaml"
    ok_inv.write_text("version: 1\nhosts:\n  here:\n    address: local\n")  # this machine, no SSH
    q = gpudoctor("inventory", "ping", "-q", "-i", str(ok_inv))
    assert q.returncode == 0 and q.stdout.strip() == "all 1 targets answered", q  # it printed the whole table
    q = gpudoctor("inventory", "ping", "-q", "-i", unreachable)
    assert "vm" in q.stdout and q.stdout.strip().endswith("1 of 1 targets did not answer"), q.stdout


def test_version_json_and_help_command():
    v = gpudoctor("--version", "--json")
    doc = json.loads(v.stdout)
    assert v.returncode == 0 and doc["schema"] == "gpudoctor.version/1" and doc["version"], v.stdout
    h = gpudoctor("help", "inventory", "ping")
    assert h.returncode == 0 and h.stdout == gpudoctor("inventory", "ping", "--help").stdout
    assert gpudoctor("help").stdout == gpudoctor("--help").stdout


def root_dir():
    from pathlib import Path

    return Path(__file__).resolve().parents[2]
