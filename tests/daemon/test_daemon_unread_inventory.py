"""The daemon reads only the inventory named with -i: its policy decides what it heals, so one is never picked up
from the working directory or a home (systemd starts it in /). Where every other command would have found one
(./inventory.yaml, ~/.config/gpudoctor/inventory.yaml), the daemon says in one line that it does not read it (#49).
$GPUDOCTOR_INVENTORY is -i's default, for the daemon too: named, not found."""

from __future__ import annotations

import os
import subprocess
import sys

LINE = ("the daemon heals only by the policy of an inventory named with -i (-i FILE to use it); watching this "
        "machine")


def _daemon(cwd, *args, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("GPUDOCTOR_INVENTORY", "PYTHONPATH")}
    e.update(env or {}, XDG_CONFIG_HOME=str(cwd / "no-config"))
    return subprocess.run([sys.executable, "-m", "gpudoctor", "daemon", "--once", "--no-xid", "--state",
                           str(cwd / "state" / "daemon.json"), *args], capture_output=True, text=True, cwd=cwd,
                          env=e, timeout=60)


def test_the_daemon_says_it_does_not_read_the_inventory_others_find(tmp_path):
    (tmp_path / "inventory.yaml").write_text("version: 1\nhosts:\n  vm:\n    address: 127.0.0.1\n"
                                             "policy:\n  auto_apply: ['*']\n")
    r = _daemon(tmp_path)
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("gpudoctor daemon: not reading")]
    assert notes == [f"gpudoctor daemon: not reading ./inventory.yaml: {LINE}"], r.stderr
    assert "Traceback" not in r.stderr and r.returncode in (0, 1, 2, 3)
    assert "remedy.refused" not in r.stderr  # its policy (auto_apply: '*') was not obeyed: nothing was tried
    # named with -i or $GPUDOCTOR_INVENTORY, it is read, its policy obeyed (the heal tried and refused: no driver)
    for named in (_daemon(tmp_path, "-i", str(tmp_path / "inventory.yaml")),
                  _daemon(tmp_path, env={"GPUDOCTOR_INVENTORY": str(tmp_path / "inventory.yaml")})):
        assert "not reading" not in named.stderr and "Traceback" not in named.stderr, named.stderr
        assert "remedy.refused" in named.stderr, named.stderr
    home = tmp_path / "no-config" / "gpudoctor"  # XDG_CONFIG_HOME's, from elsewhere
    home.mkdir(parents=True)
    (tmp_path / "inventory.yaml").rename(home / "inventory.yaml")
    r = _daemon(tmp_path)
    assert f"gpudoctor daemon: not reading {home}/inventory.yaml: {LINE}" in r.stderr, r.stderr
    # -q says nothing
    assert "not reading" not in _daemon(tmp_path, "-q").stderr


def test_nothing_to_say_where_no_inventory_would_be_found(tmp_path):
    r = _daemon(tmp_path)
    assert "not reading" not in r.stderr and "Traceback" not in r.stderr, r.stderr
