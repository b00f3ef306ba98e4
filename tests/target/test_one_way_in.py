"""Acceptance for "one way in": check, gate, fix (plan), fleet and a daemon cycle see the same target the same way.

Three targets, one inventory whose policy sets `checks.fabric.pcie.mrrs.expect: 512` (and, for the live targets,
`checks.workload.port.serving.port`: a port the test really listens on, so that check's verdict changes there):
  - a local temp root (a HostRoot with the seed's stale nvidia-uvm node, stand-in tools first on PATH),
  - the same root served over the tests' real sshd (an SSH host of the test lab),
  - the H200 snapshot with the uvm node blocked (real config space: MaxReadReq 4096, so the policy turns
    fabric.pcie.mrrs into a warning there).
Every consumer runs as a user runs it (the CLI in a subprocess); each must report the same findings (key and
status) and the same root cause, and the policy must be the one the inventory gives. Fleet and the daemon take
inventory hosts only, so the snapshot is judged by check, gate and fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.childenv import pythonpath
from tests.remedies.hostroot import HostRoot
from tests.rooted import CLI, use_roots

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "h200-uvm-blocked.json"
POLICY = "policy:\n  checks:\n    fabric.pcie.mrrs:\n      expect: 512\n"


@pytest.fixture
def listening():
    """A real listening socket; an inventory policy naming its port as the serving port turns
    workload.port.serving for that port from absent (the default port 30000 is judged) to info (in use)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def port_policy(port: int) -> str:
    return POLICY + f"    workload.port.serving:\n      port: {port}\n"


def gd(*args, cwd: Path):
    env = {**os.environ, "PYTHONPATH": pythonpath(), "XDG_CONFIG_HOME": str(cwd / ".xdg")}  # no inventory of ours
    env.pop("GPUDOCTOR_INVENTORY", None)
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=180)


def doc(r) -> dict:
    assert r.stdout.strip(), r.stderr
    return json.loads(r.stdout)


def statuses(findings) -> dict[str, str]:
    return {(f"{f['id']}[{f['subject']}]" if f.get("subject") else f["id"]): f["status"] for f in findings}


@pytest.fixture
def seed_root(tmp_path, monkeypatch):
    r = HostRoot(tmp_path, uvm_major=511).healthy_nodes(511)
    r.node("/dev/nvidia-uvm", 509, 0)  # the seed's stale node: nvidia-uvm moved to 511
    monkeypatch.setenv("GPUDOCTOR_STANDIN_ROOT", str(r.root))
    monkeypatch.setenv("GPUDOCTOR_STANDIN_PYTHON", sys.executable)
    use_roots(monkeypatch, gpu1=(r.root, [r.bin]))  # tests/rooted.py: gpu1's files live under the temp root
    return r


def gate_and_fix_agree(check: dict, tmp_path: Path, gate_args: list, fix_args: list) -> dict:
    """gate blocks on exactly check's failures with check's headline; fix plans from check's findings and root."""
    want = statuses(check["findings"])
    gate = doc(gd("gate", "--json", *gate_args, cwd=tmp_path))
    assert {b["key"] for b in gate["blockers"]} == {k for k, s in want.items() if s == "fail"}
    assert gate["headline"] == check["root_cause"]["summary"]
    fix = doc(gd("fix", "--json", *fix_args, "--audit-log", tmp_path / "audit.jsonl", "--lock-dir", tmp_path / "locks",
                 cwd=tmp_path))
    assert fix["before"]["root_cause"] == check["root_cause"]["key"]
    assert fix["before"]["bad"] == {k: s for k, s in want.items() if s in ("warn", "fail", "unknown")}
    return fix


def consumers_agree(tmp_path: Path, inv: Path, host: str) -> dict:
    """Run every consumer on inventory host `host`; assert they agree; return check's document."""
    check = doc(gd("check", "--json", "--inventory", inv, "--host", host, cwd=tmp_path))
    want, root = statuses(check["findings"]), check["root_cause"]["key"]
    assert check["verdict"] == "fail"
    fleet = doc(gd("check", "--all", "--json", "--inventory", inv, cwd=tmp_path))
    (rec,) = fleet["hosts"]
    assert statuses(rec["check"]["findings"]) == want and rec["root_cause"]["key"] == root
    gate_and_fix_agree(check, tmp_path, ["--inventory", inv, "--host", host], ["--inventory", inv, "--host", host])
    state = tmp_path / "daemon.json"
    r = gd("daemon", "--once", "--inventory", inv, "--host", host, "--state", state, "--no-xid", cwd=tmp_path)
    assert r.returncode == check["exit_code"], r.stderr
    hs = json.loads(state.read_text())["hosts"][host]
    assert hs["findings"] == want and hs["root_cause"] == check["root_cause"]["summary"]
    assert f"{check['root_cause']['key']}: {check['root_cause']['summary']}" in r.stdout  # --once says what it found
    return check


def policy_changed_a_verdict(check: dict, port: int) -> None:
    """The inventory's policy reached the check: the serving port judged is the policy's, found in use."""
    got = statuses(check["findings"])
    assert got.get(f"workload.port.serving[port {port}]") == "info", got
    assert "workload.port.serving[port 30000]" not in got


def test_a_local_temp_root(seed_root, listening, tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text("version: 1\nhosts:\n  gpu1:\n    address: local\n" + port_policy(listening))
    check = consumers_agree(tmp_path, inv, "gpu1")
    assert check["root_cause"]["key"] == "devices.node.major[/dev/nvidia-uvm]"
    policy_changed_a_verdict(check, listening)


def test_an_ssh_host_of_the_test_lab(seed_root, sshd, listening, tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(sshd.inventory_yaml("gpu1") + port_policy(listening))
    check = consumers_agree(tmp_path, inv, "gpu1")
    assert check["root_cause"]["key"] == "devices.node.major[/dev/nvidia-uvm]"
    policy_changed_a_verdict(check, listening)


def test_a_snapshot(tmp_path):
    plain = doc(gd("check", "--json", "--snapshot", SNAPSHOT, cwd=tmp_path))  # no inventory anywhere: no policy
    inv = tmp_path / "inv" / "inventory.yaml"
    inv.parent.mkdir()
    inv.write_text("version: 1\nhosts:\n  gpu1:\n    address: 192.0.2.1\n" + POLICY)
    check = doc(gd("check", "--json", "--snapshot", SNAPSHOT, "--inventory", inv, cwd=tmp_path))
    want, root = statuses(check["findings"]), check["root_cause"]["key"]
    assert check["verdict"] == "fail" and root == plain["root_cause"]["key"]
    mrrs = {k: s for k, s in want.items() if k.startswith("fabric.pcie.mrrs")}
    assert mrrs and set(mrrs.values()) == {"warn"}  # MaxReadReq 4096 ≠ policy 512
    assert not any(s == "warn" for k, s in statuses(plain["findings"]).items() if k.startswith("fabric.pcie.mrrs"))
    fix = gate_and_fix_agree(check, tmp_path, ["--snapshot", SNAPSHOT, "--inventory", inv],
                             ["--facts", SNAPSHOT, "--inventory", inv])
    # the policy reaches fix's planning too: fabric.pcie.mrrs plans (or refuses with its reason), never "nothing"
    assert "fabric.pcie.mrrs" not in fix["plan"]["nothing_to_do"]
    # and the inventory found by the one search (./inventory.yaml) is the same as the one given
    found = doc(gd("check", "--json", "--snapshot", SNAPSHOT, cwd=inv.parent))
    assert statuses(found["findings"]) == want
