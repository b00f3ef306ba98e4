"""Which inventory a command read (#23): every command that read one names the file; the checkout's example
(`example: true`) is never picked up by the search — inside a checkout `inventory show` says so instead of showing
its placeholder hosts — and is used, and called the example, only when named; the gate's "known" profiles and
`inventory show`'s profiles are one list. Through the installed console script, HOME and cwd in temp dirs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gpudoctor.gate import BUILTIN_PROFILES
from tests.console import gpudoctor

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "inventory.yaml"
MINE = "hosts:\n  gpu1: {address: 192.0.2.10}\nprofiles:\n  serving: [\"host.*\"]\n"


@pytest.fixture
def where(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUDOCTOR_INVENTORY", "XDG_CONFIG_HOME")}
    env["HOME"] = str(home)
    env["STATE_DIRECTORY"] = str(home / "state")  # a gate --npd keeps its recovery ladder here, never in /var/lib

    def run(*args, **kw):
        return gpudoctor(*args, cwd=cwd, env={**env, **kw.pop("env", {})}, **kw)

    return home, cwd, run


def test_the_committed_example_says_it_is_one():
    assert "\nexample: true\n" in EXAMPLE.read_text()


def test_the_example_in_the_cwd_is_not_used_silently(where):
    home, cwd, run = where
    shutil.copyfile(EXAMPLE, cwd / "inventory.yaml")  # a checkout: its sample sits in the cwd
    r = run("inventory", "show")
    assert r.returncode == 3 and r.stdout == "" and "ct200" not in r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("gpudoctor: no inventory found: ")
    assert "inventory.yaml is an example inventory (example: true), used only when named: --inventory inventory.yaml" \
        in line
    # the search goes on past it: the user's own inventory is the one used, and named
    (home / ".config/gpudoctor").mkdir(parents=True)
    (home / ".config/gpudoctor/inventory.yaml").write_text(MINE)
    r = run("inventory", "show")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"inventory: {home}/.config/gpudoctor/inventory.yaml"
    assert "gpu1" in r.stdout and "ct200" not in r.stdout


def test_the_example_named_is_used_and_called_the_example(where):
    _, cwd, run = where
    r = run("inventory", "show", "--inventory", EXAMPLE)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"inventory: {EXAMPLE} (an example inventory: its hosts are placeholders)"
    j = json.loads(run("inventory", "show", "--inventory", EXAMPLE, "--json").stdout)
    assert j["path"] == str(EXAMPLE) and j["example"] is True and "ct200" in j["hosts"]
    r = run("inventory", "show", env={"GPUDOCTOR_INVENTORY": str(EXAMPLE)})
    assert r.returncode == 0 and "an example inventory" in r.stdout.splitlines()[0]


def test_a_bad_example_value_is_its_line(where, tmp_path):
    _, _, run = where
    bad = tmp_path / "bad.yaml"
    bad.write_text("example: maybe\nhosts:\n  a: {address: 192.0.2.1}\n")
    r = run("inventory", "show", "--inventory", bad)
    assert r.returncode == 3 and r.stderr.strip() == f"gpudoctor: {bad}:1: example must be true or false"


def test_commands_that_read_an_inventory_name_it(where, tmp_path):
    _, cwd, run = where
    inv = tmp_path / "inv.yaml"
    inv.write_text(MINE)
    said = f"inventory: {inv}"
    for args in (["gate", "--profile", "serving", "--snapshot", REPO / "tests/fixtures/snapshots/h200-healthy.json"],
                 ["check", "--snapshot", REPO / "tests/fixtures/snapshots/h200-healthy.json", "--json"],
                 ["fix", "--facts", REPO / "tests/fixtures/snapshots/h200-uvm-missing.json"]):
        r = run(*args, "--inventory", inv)
        assert r.stderr.splitlines()[-1] == said, (args, r.stderr)  # its last line on stderr
    r = run("inventory", "ping", "nosuch", "--inventory", inv)  # an error: one line, which names the file itself
    assert r.returncode == 3 and r.stderr.strip().splitlines() == [f"gpudoctor: {inv}: no host named 'nosuch' "
                                                                   f"(hosts: gpu1)"]
    r = run("gate", "--npd", "--snapshot", REPO / "tests/fixtures/snapshots/h200-healthy.json", "--inventory", inv)
    assert said not in r.stdout + r.stderr and r.stdout.count("\n") == 1  # NPD's contract: one line


def test_the_gates_known_profiles_are_the_ones_inventory_show_lists(where, tmp_path):
    _, _, run = where
    inv = tmp_path / "inv.yaml"
    inv.write_text(MINE)
    r = run("gate", "--profile", "nosuch", "--inventory", inv,
            "--snapshot", REPO / "tests/fixtures/snapshots/h200-healthy.json")
    assert r.returncode == 3
    known = r.stderr.strip().splitlines()[-1].split("(known: ", 1)[1].rstrip(")").split(", ")
    shown = json.loads(run("inventory", "show", "--inventory", inv, "--json").stdout)["gate_profiles"]
    assert known == sorted(shown) == sorted({*BUILTIN_PROFILES, "serving"})
    assert shown["serve"]["source"] == "built-in" and shown["serving"]["source"] == "inventory"
    table = run("inventory", "show", "--inventory", inv).stdout.split("Gate profiles\n", 1)[1].split("\n\n")[0]
    assert [line.split()[0] for line in table.splitlines()[1:]] == known
