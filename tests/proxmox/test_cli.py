"""`gpudoctor lxc audit|fix` through the real CLI (subprocesses): exit codes, output, bad input, dry run, apply."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from .conftest import BAD_CONFIGS, CONFIGS, DEV509, DEV511


def gd(*args, cwd=None, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpudoctor", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=e, timeout=60)


@pytest.fixture
def work(tmp_path):
    (tmp_path / "pve").mkdir()
    conf = tmp_path / "pve" / "200.conf"  # backups must live outside the edited directory
    shutil.copyfile(CONFIGS / "200-seed.conf", conf)
    state = ["--backup-dir", tmp_path / "backups", "--audit-log", tmp_path / "audit.jsonl",
             "--lock-dir", tmp_path / "locks"]
    return tmp_path, conf, state


def test_audit_seed_fails_with_the_evidence_line(work):
    _, conf, _ = work
    r = gd("lxc", "audit", "--config", conf, "--devices", DEV511)
    assert r.returncode == 2, r.stderr
    assert "major 511 (nvidia-uvm) is not in ct200's allow-list (has 195, 509, 226, 234)" in r.stdout
    assert "fix: add `lxc.cgroup2.devices.allow: c 511:* rwm` to the live section" in r.stdout
    j = gd("lxc", "audit", "--config", conf, "--devices", DEV511, "--json")
    doc = json.loads(j.stdout)
    assert j.returncode == 2 and doc["verdict"] == "fail" and doc["vmid"] == 200
    assert {f["key"] for f in doc["findings"] if f["status"] == "fail"} == {"boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"}
    assert {f["key"] for f in doc["findings"] if f["status"] == "warn"} >= {
        "boundary.lxc.cgroup_allow[/dev/nvidia-uvm-tools]", "boundary.lxc.stale_allow[c 509]"}


def test_audit_exit_codes_ok_and_warn(tmp_path):
    ok = tmp_path / "300.conf"
    ok.write_text("arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 511:* rwm\n"
                  "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
                  "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file\n")
    r = gd("lxc", "audit", "--config", ok, "--devices", DEV511)
    assert r.returncode == 0 and r.stdout.startswith("ct300 (") and ": OK" in r.stdout.splitlines()[0]
    r = gd("lxc", "audit", "--config", ok, "--devices", DEV509)  # after a downgrade 511 is stale, 509 missing
    assert r.returncode == 2
    warn = tmp_path / "301.conf"
    warn.write_text(ok.read_text() + "lock: snapshot\n")
    assert gd("lxc", "audit", "--config", warn, "--devices", DEV511).returncode == 1


BAD = sorted(BAD_CONFIGS.glob("*.conf"))


@pytest.mark.parametrize("cmd", ["audit", "fix"])
@pytest.mark.parametrize("bad", BAD, ids=lambda p: p.name)
def test_unusable_config_is_one_line_exit_3(tmp_path, cmd, bad):
    r = gd("lxc", cmd, "--config", bad, "--devices", DEV511, "--backup-dir", tmp_path / "b",
           "--audit-log", tmp_path / "a", "--lock-dir", tmp_path / "l") if cmd == "fix" else \
        gd("lxc", cmd, "--config", bad, "--devices", DEV511)
    assert r.returncode == 3
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gpudoctor: {bad}:"), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "a").exists()


@pytest.mark.parametrize("args,where", [
    (["--config", "/nonexistent/200.conf", "--devices", DEV511], "/nonexistent/200.conf: cannot read it (ENOENT)"),
    (["--config", str(CONFIGS), "--devices", DEV511], f"{CONFIGS}: cannot read it (EISDIR)"),
    (["--config", str(CONFIGS / "200-seed.conf"), "--devices", "/nonexistent/devices"], "/nonexistent/devices: "),
    (["--config", str(CONFIGS / "200-seed.conf"), "--devices", str(CONFIGS / "203-crlf.conf")],
     "not a /proc/devices file"),
    (["--config", str(CONFIGS / "200-seed.conf"), "--devices", DEV511, "--running", "/nonexistent/run"],
     "/nonexistent/run: cannot read it"),
])
def test_bad_inputs_name_the_file(args, where):
    r = gd("lxc", "audit", *args)
    assert r.returncode == 3 and len(r.stderr.strip().splitlines()) == 1 and where in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [[], ["200", "--config", "x.conf"], ["--config"], ["abc"]])
def test_usage_errors_exit_3(args):
    r = gd("lxc", "audit", *args)
    assert r.returncode == 3 and "Traceback" not in r.stderr


def test_fix_dry_run_changes_nothing_then_apply_then_nothing_to_do(work):
    tmp, conf, state = work
    before = conf.read_bytes()
    r = gd("lxc", "fix", "--config", conf, "--devices", DEV511, *state)
    assert r.returncode == 1, r.stderr
    assert "+lxc.cgroup2.devices.allow: c 511:* rwm" in r.stdout and "-c 511:* rwm" in r.stdout
    assert "dry run: nothing was changed" in r.stdout
    assert conf.read_bytes() == before and not (tmp / "backups").exists() and not (tmp / "audit.jsonl").exists()

    r = gd("lxc", "fix", "--config", conf, "--devices", DEV511, "--apply", "--yes", *state)
    assert r.returncode == 1, r.stdout + r.stderr  # applied; the container still has to restart
    assert "APPLIED  lxc.cgroup_allow" in r.stdout and "restart pending: pct reboot 200" in r.stdout
    after = conf.read_bytes()
    assert after == before.replace(b"c 511:* rwm\n", b"").replace(
        b"c 234:* rwm\n", b"c 234:* rwm\nlxc.cgroup2.devices.allow: c 511:* rwm\n")
    (bk,) = (tmp / "backups").rglob("200.conf.*")
    assert bk.read_bytes() == before
    started, rec = [json.loads(x) for x in (tmp / "audit.jsonl").read_text().splitlines()]
    assert started["result"] == "started" and started["remedy"] == "lxc.cgroup_allow"  # written before the change
    assert rec["result"] == "applied" and rec["remedy"] == "lxc.cgroup_allow" and rec["backup"] == str(bk)
    assert "+lxc.cgroup2.devices.allow: c 511:* rwm" in rec["diff"]

    r = gd("lxc", "fix", "--config", conf, "--devices", DEV511, "--apply", "--yes", *state)
    assert r.returncode == 0 and "nothing to fix" in r.stdout
    assert conf.read_bytes() == after and len((tmp / "audit.jsonl").read_text().splitlines()) == 2
    assert gd("lxc", "audit", "--config", conf, "--devices", DEV511).returncode == 1  # only the stale 509 warns


def test_lxc_fix_apply_asks_as_fix_does_and_refuses_without_yes_off_a_terminal(work):
    """One rule for every command that changes a host (conventions.confirm_change; #49: lxc fix edited unasked)."""
    tmp, conf, state = work
    before = conf.read_bytes()
    r = gd("lxc", "fix", "--config", conf, "--devices", DEV511, "--apply", *state)  # stdin: not a terminal
    assert r.returncode == 3 and "add --yes to apply unattended (nothing was changed)" in r.stderr, r.stderr
    assert conf.read_bytes() == before and not (tmp / "backups").exists()
    import pty

    leader, follower = pty.openpty()  # a person at a terminal, who answers no
    try:
        p = subprocess.Popen([sys.executable, "-m", "gpudoctor", "lxc", "fix", "--config", str(conf), "--devices",
                              str(DEV511), "--apply", *map(str, state)], stdin=follower, stdout=subprocess.PIPE,
                             stderr=follower, text=True)
        os.close(follower)
        os.write(leader, b"n\n")
        out, _ = p.communicate(timeout=60)
    finally:
        os.close(leader)
    assert "nothing was changed" in out and conf.read_bytes() == before, out


def test_fix_json_and_refusal_exit_2(tmp_path):
    conf = tmp_path / "206.conf"
    shutil.copyfile(CONFIGS / "206-locked.conf", conf)
    r = gd("lxc", "fix", "--config", conf, "--devices", DEV511, "--json", "--apply", "--yes", "--lock-dir", tmp_path / "l",
           "--audit-log", tmp_path / "a.jsonl", "--backup-dir", tmp_path / "b")
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["exit_code"] == 2 and doc["plan"]["changes"] == []
    assert "locked (lock: backup)" in doc["plan"]["refusals"][0]["reason"]
    assert conf.read_bytes() == (CONFIGS / "206-locked.conf").read_bytes()


HOLD = """
import sys, time
from gpudoctor.remedy import host_lock
with host_lock(sys.argv[1], "localhost", "gpudoctor lxc fix 200 --apply"):
    print("held", flush=True)
    time.sleep(30)
"""


def test_fix_apply_while_another_run_holds_the_lock(work):
    tmp, conf, state = work
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp / "locks")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = conf.read_bytes()
        r = gd("lxc", "fix", "--config", conf, "--devices", DEV511, "--apply", "--yes", *state)
        assert r.returncode == 2
        assert f"another gpudoctor run is changing localhost: pid {holder.pid}" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and conf.read_bytes() == before
    finally:
        holder.kill()
        holder.wait()


def test_reboot_needs_apply():
    r = gd("lxc", "fix", "--config", CONFIGS / "200-seed.conf", "--devices", DEV511, "--reboot")
    assert r.returncode == 3 and "--reboot needs --apply" in r.stderr


def test_help_teaches():
    r = gd("lxc", "fix", "--help")
    assert r.returncode == 0 and "Examples:" in r.stdout and "Exit codes:" in r.stdout
    r = gd("lxc", "audit", "--help")
    assert "gpudoctor lxc audit 200" in r.stdout and "3  bad input" in r.stdout
