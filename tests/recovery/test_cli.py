"""`gpudoctor release` and `gpudoctor recovery show` through the real CLI: exit codes 0/1/3, --json, one line of
bad input; the verification is the real one (policy verify: commands) made to pass or fail by a flag file."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from tests.childenv import pythonpath

HERE = socket.gethostname()


def cli(tmp_path, *args):
    env = {**os.environ, "HOME": str(tmp_path), "STATE_DIRECTORY": str(tmp_path / "state")}
    env.pop("GPUDOCTOR_INVENTORY", None)
    env["PYTHONPATH"] = pythonpath(env=env)
    return subprocess.run([sys.executable, "-m", "gpudoctor", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def _inventory(tmp_path, flag):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(f"hosts:\n  {HERE}: {{address: local}}\npolicy:\n  verify: {{deep: 'off', serving: 'off', "
                   f"commands: [[test, -e, '{flag}']]}}\n")
    return inv


def _inspected(tmp_path):
    from gpudoctor.recovery.ladder import INSPECT, HostLadder
    from gpudoctor.recovery.store import RecoveryStore

    with RecoveryStore(tmp_path / "state" / "recovery.json").edit() as hosts:
        hosts[HERE] = HostLadder(state=INSPECT, since=100.0, reason="needs inspection: came back 2 times (3 failures)",
                                 onsets=[["a", 1.0], ["a", 2.0], ["a", 3.0]], inspect_count=3)


def test_release_verifies_first(tmp_path):
    flag = tmp_path / "verify-passes"
    inv = _inventory(tmp_path, flag)
    _inspected(tmp_path)
    r = cli(tmp_path, "recovery", "show")
    assert r.returncode == 1 and f"{HERE}  needs-inspection  since 1970-01-01T00:01:40Z  needs inspection" in r.stdout
    r = cli(tmp_path, "release", "local", "-i", str(inv))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"not released {HERE} (needs-inspection): verification failed: commands: test -e {flag}" in r.stderr
    flag.touch()
    r = cli(tmp_path, "release", "local", "-i", str(inv), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpudoctor.release/1" and doc["released"] and doc["state"] == "ready"
    assert doc["verification"]["passed"] is True
    r = cli(tmp_path, "recovery", "show", "--json")
    assert r.returncode == 0
    shown = json.loads(r.stdout)["hosts"]
    assert [(h["host"], h["state"], h["ready"]) for h in shown] == [(HERE, "ready", True)]
    flag.unlink()  # a release of a ready host whose verification now fails: not released, and not ready any more
    r = cli(tmp_path, "release", "local", "-i", str(inv))
    assert r.returncode == 1 and "released" not in r.stdout, r.stdout
    assert f"not released {HERE} (verifying): verification failed: commands: test -e {flag}" in r.stderr
    r = cli(tmp_path, "recovery", "show", "--json")
    assert [(h["state"], h["ready"]) for h in json.loads(r.stdout)["hosts"]] == [("verifying", False)]


def test_release_bad_input_is_one_line_exit_3(tmp_path):
    inv = _inventory(tmp_path, tmp_path / "f")
    r = cli(tmp_path, "release", "nosuch", "-i", str(inv))
    assert r.returncode == 3 and "nosuch" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "bad.yaml").write_text("hosts:\n  a: {address: local}\npolicy:\n  recovery: {clean_cycles: -1}\n")
    r = cli(tmp_path, "release", "local", "-i", str(tmp_path / "bad.yaml"))
    assert r.returncode == 3 and r.stderr.strip().count("\n") == 0
    assert "bad.yaml:4" in r.stderr and "policy.recovery.clean_cycles must be an integer >= 0" in r.stderr


def test_show_an_unreadable_file(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "recovery.json").write_text("{nope")
    r = cli(tmp_path, "recovery", "show", "--json")
    doc = json.loads(r.stdout)
    assert doc["hosts"] == [] and doc["set_aside"].startswith(str(tmp_path / "state" / "recovery.json.corrupt-"))
