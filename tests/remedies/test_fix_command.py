"""`gpudoctor fix` through the real CLI (subprocesses) on an inventory host whose filesystem is a temp root with real
mknod'ed nodes and whose PATH starts with the stand-in tools: dry run shows diffs and changes nothing; --apply needs
--yes without a terminal, asks on one; --apply --yes fixes, writes the audit log and returns the re-checked verdict."""

import json
import os
import pty
import re
import select
import stat
import subprocess
import time

import pytest

from tests.childenv import pythonpath
from tests.rooted import CLI, use_roots

UNIT = "[Unit]\nDescription=NVIDIA Persistence Daemon\n\n[Service]\nType=forking\n" \
       "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced --verbose\n"


@pytest.fixture
def broken(make_root, tmp_path, monkeypatch):
    """The seed's faults on one host: a stale nvidia-uvm node, nvidia-uvm-tools at mode 000, persistence off."""
    r = make_root(uvm_major=511).healthy_nodes(511)
    r.node("/dev/nvidia-uvm", 509, 0)
    r.node("/dev/nvidia-uvm-tools", 511, 1, 0o000)
    r.write("/lib/systemd/system/nvidia-persistenced.service", UNIT)
    r.path("/run/systemd/system").mkdir(parents=True)
    inv = tmp_path / "inventory.yaml"
    inv.write_text("version: 1\nhosts:\n  gpu1:\n    address: local\n")
    use_roots(monkeypatch, gpu1=(r.root, [r.bin]))
    r.state = ["--inventory", str(inv), "--host", "gpu1", "--audit-log", str(tmp_path / "audit.jsonl"),
               "--lock-dir", str(tmp_path / "locks"), "--backup-dir", "/var/lib/gpudoctor/backups"]
    r.audit = tmp_path / "audit.jsonl"
    return r


def gd(*args, stdin=subprocess.DEVNULL):
    env = {**os.environ, "PYTHONPATH": pythonpath()}  # make_root set GPUDOCTOR_STANDIN_ROOT/PYTHON for the stand-ins
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True,
                          env=env, stdin=stdin, timeout=120)


def changing_calls(r):
    """Stand-in calls that would change something (the gather's queries excluded)."""
    return [c for c in r.calls() if not (c[0] == "systemctl" and c[1] in ("is-enabled", "is-active"))
            and not (c[0] == "nvidia-smi" and c[1:] in (["-q", "-x"], ["topo", "-m"]))]


def test_dry_run_shows_every_plan_and_changes_nothing(broken):
    r = broken
    before = {p: r.stat(p) for p in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")}
    out = gd("fix", *r.state)
    assert out.returncode == 1, out.stderr  # changes planned
    text = out.stdout
    assert text.index("PLAN  devices.node.create on gpu1") < text.index("PLAN  devices.node.mode on gpu1") \
        < text.index("PLAN  driver.persistence on gpu1")  # the safe order
    assert "-/dev/nvidia-uvm  char 509:0 mode 0666  (major 509 is not in /proc/devices)" in text
    assert "+/dev/nvidia-uvm  char 511:0 mode 0666  (511 is nvidia-uvm in /proc/devices)" in text
    assert "then: chmod 0666 /dev/nvidia-uvm-tools" in text and "risk medium" in text
    assert "dry run: nothing was changed" in text
    assert {p: r.stat(p) for p in before} == before
    assert changing_calls(r) == [] and not r.audit.exists()


def test_dry_run_json_is_one_document(broken):
    out = gd("fix", "--json", "--only", "devices.*", *broken.state)
    doc = json.loads(out.stdout)
    assert out.returncode == 1 == doc["exit_code"] and doc["apply"] is False and doc["after"] is None
    assert [c["remedy"] for c in doc["plan"]["changes"]] == ["devices.node.create", "devices.node.mode"]
    assert doc["before"]["verdict"] == "fail" and doc["outcomes"] == []


def test_apply_without_a_terminal_needs_yes(broken):
    r = broken
    out = gd("fix", "--apply", *r.state)
    assert out.returncode == 3 and out.stderr.strip().count("\n") == 0
    assert "stdin is not a terminal: add --yes" in out.stderr and "nothing was changed" in out.stderr
    assert r.stat("/dev/nvidia-uvm")[1] == 509 and changing_calls(r) == []


def test_apply_yes_fixes_audits_and_returns_the_new_verdict(broken):
    r = broken
    out = gd("fix", "--apply", "--yes", "--json", *r.state)
    doc = json.loads(out.stdout)
    # nvidia-modprobe -u -c 0 also fixes the mode of nvidia-uvm-tools (as the real tool does): mode finds it done
    assert [o["result"] for o in doc["outcomes"]] == ["applied", "unchanged", "applied"], doc["outcomes"]
    assert r.stat("/dev/nvidia-uvm") == (stat.S_IFCHR, 511, 0, 0o666)
    assert r.stat("/dev/nvidia-uvm-tools") == (stat.S_IFCHR, 511, 1, 0o666)
    assert json.loads(r.read("/standin-state/systemd.json"))["nvidia-persistenced.service"] == {
        "enabled": "enabled", "active": "active"}
    still = doc["after"]["still_bad"]
    assert not [k for k in still if k.startswith(("devices.node.major", "devices.node.mode", "devices.node.present",
                                                  "driver.persistence"))]
    # the nodes in a temp root have no driver behind them (open → ENXIO), so the new verdict stays a failure
    assert out.returncode == doc["exit_code"] == doc["after"]["exit_code"] == 2
    audit = [a for a in map(json.loads, r.audit.read_text().splitlines()) if a["result"] != "started"]
    assert [(a["remedy"], a["result"]) for a in audit] == [("devices.node.create", "applied"),
                                                          ("devices.node.mode", "unchanged"),
                                                          ("driver.persistence", "applied")]
    assert all(a["host"] == "gpu1" and a["commands"] for a in audit)
    again = gd("fix", *r.state)  # idempotent: nothing left to change, but the host still fails (ENXIO): a human acts
    assert again.returncode == 2 and "nothing gpudoctor can change: a human must act" in again.stdout
    assert "PLAN" not in again.stdout


def test_human_output_names_outcomes_and_verdict(broken):
    out = gd("fix", "--apply", "--yes", "--only", "devices.node.mode", *broken.state)
    assert "APPLIED  devices.node.mode on gpu1: /dev/nvidia-uvm-tools: mode 0666" in out.stdout
    assert "NEW VERDICT gpu1: FAIL (exit 2; was FAIL)" in out.stdout and out.returncode == 2
    assert "left out by --only: devices.node.create, driver.persistence" in out.stdout


def _run_on_pty(args, answer: str):
    master, slave = pty.openpty()
    p = subprocess.Popen([*CLI, *map(str, args)], stdin=slave, stdout=slave,
                         stderr=slave, env={**os.environ, "PYTHONPATH": pythonpath()}, close_fds=True)
    os.close(slave)
    out, deadline, answered = b"", time.monotonic() + 60, False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
            if not answered and b"[y/N]" in out:
                os.write(master, answer.encode() + b"\n")
                answered = True
        elif p.poll() is not None:
            break
    p.wait(timeout=30)
    os.close(master)
    return p.returncode, re.sub(r"\x1b\[[0-9;]*m", "", out.decode(errors="replace"))  # a terminal gets colours (#41)


def test_on_a_terminal_it_asks_and_no_means_nothing_changes(broken):
    r = broken
    code, out = _run_on_pty(["fix", "--apply", "--only", "devices.node.mode", *r.state], "n")
    assert "Apply 1 change(s) to gpu1? [y/N]" in out and "nothing was changed" in out and code == 1
    assert r.stat("/dev/nvidia-uvm-tools")[3] == 0
    code, out = _run_on_pty(["fix", "--apply", "--only", "devices.node.mode", *r.state], "y")
    assert "APPLIED  devices.node.mode" in out and r.stat("/dev/nvidia-uvm-tools")[3] == 0o666


def test_a_refusal_is_exit_2_with_its_reason(make_root, tmp_path, monkeypatch):
    r = make_root(uvm_major=None, without=("nvidia-modprobe",))
    r.node("/dev/nvidiactl", 195, 255)
    r.node("/dev/nvidia0", 195, 0)
    inv = tmp_path / "inventory.yaml"
    inv.write_text("version: 1\nhosts:\n  gpu1:\n    address: local\n")
    use_roots(monkeypatch, gpu1=(r.root, [r.bin]))
    out = gd("fix", "--inventory", inv, "--host", "gpu1", "--only", "devices.node.create",
             "--lock-dir", tmp_path / "locks", "--audit-log", tmp_path / "a.jsonl")
    assert out.returncode == 2
    assert "REFUSED  devices.node.create: /dev/nvidia-uvm, /dev/nvidia-uvm-tools: /proc/devices has no 'nvidia-uvm'" \
        in out.stdout


def test_a_held_lock_stops_apply(broken, tmp_path):
    from gpudoctor.remedy import host_lock

    with host_lock(str(tmp_path / "locks"), "gpu1", "another run"):
        out = gd("fix", "--apply", "--yes", "--only", "devices.node.mode", *broken.state)
    assert out.returncode == 2 and "another gpudoctor run is changing gpu1" in out.stderr
    assert broken.stat("/dev/nvidia-uvm-tools")[3] == 0


@pytest.mark.parametrize("args,msg", [
    (["--reboot"], "--reboot needs --apply"),
    (["--model-source", "relative/path"], "give SRC or DST=SRC, absolute paths"),
    (["--only", "nope.*"], "unknown remedy nope.*"),
    (["--allow", "everything"], "Invalid value for '--allow'"),
    (["--mrrs", "500"], "Invalid value for '--mrrs'"),
    (["--host", "nosuchhost"], "no host named 'nosuchhost'"),
])
def test_bad_flags_are_one_line_exit_3(broken, args, msg):
    state = [a for a in broken.state]
    if "--host" in args:
        i = state.index("--host")
        del state[i:i + 2]
    out = gd("fix", *state, *args)
    assert out.returncode == 3 and msg in out.stderr, out.stderr
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr  # exactly one line
    assert broken.stat("/dev/nvidia-uvm")[1] == 509


def test_a_snapshot_of_another_machine_is_not_applied_here(tmp_path):
    from pathlib import Path

    snap = Path(__file__).parents[1] / "fixtures/snapshots/h200-uvmtools-000.json"
    out = gd("fix", "--facts", snap, "--apply", "--yes", "--lock-dir", tmp_path / "l", "--audit-log", tmp_path / "a")
    assert out.returncode == 3 and "will not apply fixes from a snapshot of vm recorded" in out.stderr  # a replay
    assert "nothing was changed" in out.stderr and len(out.stderr.splitlines()) == 1
    dry = gd("fix", "--facts", snap, "--lock-dir", tmp_path / "l", "--audit-log", tmp_path / "a")
    assert dry.returncode == 1 and "PLAN  devices.node.mode on vm: chmod 0666 /dev/nvidia-uvm-tools" in dry.stdout


def test_an_lxc_guest_gets_its_proxmox_node_fixed(make_root, pve_root, fake_pct, tmp_path, monkeypatch):
    """--host ct200 (an LXC guest): lxc.cgroup_allow edits 200.conf on its Proxmox node (kpro6); the guest's own
    device remedies are not asked to mknod inside the container."""
    from tests.proxmox.conftest import install

    bindir, _ = fake_pct
    conf = install(pve_root, 200, "200-seed.conf")
    before = conf.read_bytes()
    guest = make_root(uvm_major=511, container="lxc", userns=True).healthy_nodes(511)
    os.unlink(guest.path("/dev/nvidia-uvm-tools"))  # missing in the guest: the host side must provide it
    inv = tmp_path / "inventory.yaml"
    inv.write_text("""version: 1
proxmox:
  kpro6:
    address: local
hosts:
  ct200:
    address: local
    lxc:
      proxmox: kpro6
      vmid: 200
""")
    use_roots(monkeypatch, kpro6=(pve_root, [bindir]), ct200=(guest.root, [guest.bin]))
    state = ["--inventory", inv, "--host", "ct200", "--audit-log", tmp_path / "audit.jsonl", "--lock-dir",
             tmp_path / "locks", "--backup-dir", "/var/lib/gpudoctor/backups"]
    dry = gd("fix", *state)
    assert "PLAN  lxc.cgroup_allow on kpro6" in dry.stdout and "+lxc.cgroup2.devices.allow: c 511:* rwm" in dry.stdout
    assert "REFUSED  devices.node.create: /dev/nvidia-uvm-tools: inside this LXC guest" in dry.stdout
    assert dry.returncode == 2 and conf.read_bytes() == before
    out = gd("fix", "--apply", "--yes", "--only", "lxc.*", *state)
    assert "APPLIED  lxc.cgroup_allow on kpro6" in out.stdout and "restart pending: pct reboot 200" in out.stdout
    assert b"lxc.cgroup2.devices.allow: c 511:* rwm" in conf.read_bytes()
    assert [json.loads(x)["host"] for x in (tmp_path / "audit.jsonl").read_text().splitlines()] == ["kpro6"] * 2
    assert out.returncode in (1, 2) and "NEW VERDICT ct200" in out.stdout
