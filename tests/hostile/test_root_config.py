"""Root obeys no file another user can write (#40, docs/security.md), and bad input as root stays one line.

An inventory names programs gpudoctor runs (deep python, verify commands) and hosts `release` marks ready; a campaign
names the servers it starts. As root, gpudoctor refuses one that another user owns or can change — the file or any
directory above it — like sshd's StrictModes: one line naming the part, its owner and mode, exit 3. Also: an ordinary
user's `fix --apply` and a 100,000-digit integer are one line, exit 3, never a traceback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import needs
from tests.console import console_script, gpudoctor
from tests.hostile.attacker import NOBODY, as_user, attacker_dir, owned_by

INV = "hosts:\n  gpu1: {address: 192.0.2.10}\n"
CAMPAIGN = Path(__file__).resolve().parents[2] / "examples" / "campaign.yaml"


@pytest.fixture
def env(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    e = {k: v for k, v in os.environ.items() if k not in ("GPUDOCTOR_INVENTORY", "XDG_CONFIG_HOME")}
    return {**e, "HOME": str(home), "STATE_DIRECTORY": str(home / "state")}


def refused(r, part: str, owner_or_mode: str):
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and "refusing this" in line and "as root" in line, line
    assert part in line and owner_or_mode in line, line
    return line


@pytest.mark.parametrize("how", ["owned-by-another-user", "world-writable", "group-writable",
                                 "in-a-directory-another-user-owns"])
def test_an_inventory_another_user_can_change_is_refused_as_root(tmp_path, env, how):
    needs.root()
    tmp_path.chmod(0o755)
    d = tmp_path / "etc"
    d.mkdir()
    if how == "in-a-directory-another-user-owns":
        d = attacker_dir(tmp_path, "eve")
    inv = d / "inventory.yaml"
    inv.write_text(INV)
    inv.chmod(0o644)
    want = {"owned-by-another-user": (str(inv), f"owned by nobody (uid {NOBODY}), mode 0644"),
            "world-writable": (str(inv), "writable by every user (mode 0666)"),
            "group-writable": (str(inv), "writable by group 100 (mode 0664)"),
            "in-a-directory-another-user-owns": (str(d), f"owned by nobody (uid {NOBODY}), mode 0755")}[how]
    if how == "owned-by-another-user":
        owned_by(inv)
    elif how == "world-writable":
        inv.chmod(0o666)
    elif how == "group-writable":
        os.chown(inv, 0, 100)
        inv.chmod(0o664)
    r = gpudoctor("inventory", "show", "--inventory", inv, env=env, cwd=tmp_path)
    refused(r, *want)
    assert "gpu1" not in r.stdout
    r = gpudoctor("inventory", "show", env={**env, "GPUDOCTOR_INVENTORY": str(inv)}, cwd=tmp_path)  # the variable too
    refused(r, *want)


def test_root_reads_its_own_inventory(tmp_path, env):
    """The healthy path: root's file in root's directories (under /tmp, whose sticky bit keeps others out) is read."""
    needs.root()
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INV)
    r = gpudoctor("inventory", "show", "--inventory", inv, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "gpu1" in r.stdout, r.stderr


def test_an_inventory_in_a_hostile_working_directory_is_not_obeyed(tmp_path, env):
    """Root runs gpudoctor in a directory another user writes, which holds that user's ./inventory.yaml."""
    needs.root()
    cwd = attacker_dir(tmp_path, "shared", mode=0o777)
    (cwd / "inventory.yaml").write_text(INV)
    owned_by(cwd / "inventory.yaml")
    r = gpudoctor("inventory", "show", env=env, cwd=cwd)
    refused(r, "inventory.yaml", f"owned by nobody (uid {NOBODY})")
    assert "gpu1" not in r.stdout


def test_a_campaign_another_user_can_change_is_refused_as_root(tmp_path, env):
    needs.root()
    d = attacker_dir(tmp_path, "eve")
    camp = d / "campaign.yaml"
    camp.write_text(CAMPAIGN.read_text())
    owned_by(camp)
    r = gpudoctor("bench", "run", camp, "--out", tmp_path / "out", env=env, cwd=tmp_path)
    refused(r, str(d), f"owned by nobody (uid {NOBODY})")
    assert not (tmp_path / "out").exists()


def test_a_huge_integer_in_an_inventory_is_one_line(tmp_path, env):
    inv = tmp_path / "inventory.yaml"
    inv.write_text("hosts:\n  gpu1:\n    address: 192.0.2.10\n    port: " + "9" * 100_000 + "\n")
    r = gpudoctor("inventory", "show", "--inventory", inv, env=env, cwd=tmp_path)
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr[-300:]
    line = r.stderr.strip()
    assert "\n" not in line and f"{inv}:4: an integer of 100000 characters" in line


@pytest.fixture
def open_tmp():
    """A root-owned 0755 directory another uid can reach (pytest's own tmp_path sits under a 0700 directory)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="gpudoctor-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d)


def test_an_ordinary_users_fix_apply_is_one_line_and_changes_nothing(open_tmp):
    """An ordinary user's `fix --apply` on facts that plan a real change (an LXC config root owns): one line saying
    which permission failed and that it needs root, exit 3, the file unchanged."""
    from gpudoctor.gather.boundary import gather_lxc
    from gpudoctor.host.local import LocalHost
    from tests.proxmox.conftest import CONFIGS, DEV511

    needs.root()
    tmp_path = open_tmp
    (tmp_path / "pve").mkdir()
    conf = tmp_path / "pve/200.conf"
    conf.write_bytes((CONFIGS / "200-seed.conf").read_bytes())
    b = gather_lxc(LocalHost(), 200, config=str(conf), devices=str(DEV511), ask_status=False, stat_nodes=False,
                   read_running=False)
    snap = tmp_path / "snap.json"
    snap.write_text(json.dumps({"schema": "gpudoctor.snapshot/1", "host": "ct200",
                                "facts": {"schema": "gpudoctor.facts/1", "boundary": b}}))
    home = attacker_dir(tmp_path, "home")
    devices = tmp_path / "proc-devices"  # readable by uid 65534 wherever the checkout is (CI's is under /root)
    devices.write_bytes(DEV511.read_bytes())
    before = conf.read_bytes()
    r = as_user([console_script(), "lxc", "fix", "--config", conf, "--devices", devices, "--apply", "--yes"],
                cwd=home, env={"PATH": "/usr/bin:/bin", "HOME": str(home)})
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stdout + r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "this needs root (gpudoctor runs as uid 65534)" in line and "ermission denied" in line, r.stderr
    assert conf.read_bytes() == before


def test_facts_another_user_can_change_are_not_applied_as_root(tmp_path, env):
    """`fix --facts SNAP --apply` makes its changes to the files the facts name: as root the snapshot must be root's.
    A dry run (a plan only) still reads it."""
    from gpudoctor.gather.boundary import gather_lxc
    from gpudoctor.host.local import LocalHost
    from tests.proxmox.conftest import CONFIGS, DEV511

    needs.root()
    (tmp_path / "pve").mkdir()
    conf = tmp_path / "pve/200.conf"
    conf.write_bytes((CONFIGS / "200-seed.conf").read_bytes())
    b = gather_lxc(LocalHost(), 200, config=str(conf), devices=str(DEV511), ask_status=False, stat_nodes=False,
                   read_running=False)
    snap = attacker_dir(tmp_path) / "snap.json"
    snap.write_text(json.dumps({"schema": "gpudoctor.snapshot/1", "host": "ct200",
                                "facts": {"schema": "gpudoctor.facts/1", "boundary": b}}))
    owned_by(snap)
    state = ["--backup-dir", tmp_path / "backups", "--audit-log", tmp_path / "audit.jsonl",
             "--lock-dir", tmp_path / "locks"]
    before = conf.read_bytes()
    r = gpudoctor("fix", "--facts", snap, "--only", "lxc.cgroup_allow", *state, env=env, cwd=tmp_path)
    assert r.returncode == 1 and "PLAN  lxc.cgroup_allow" in r.stdout, r.stderr
    r = gpudoctor("fix", "--facts", snap, "--only", "lxc.cgroup_allow", "--apply", "--yes", *state, env=env,
                  cwd=tmp_path)
    refused(r, str(snap.parent), f"owned by nobody (uid {NOBODY})")
    assert conf.read_bytes() == before


def test_a_recovery_file_another_user_can_change_is_refused_as_root(tmp_path, env):
    """The ladder's file decides drains and resumes: as root, one another user can write is refused."""
    needs.root()
    f = tmp_path / "recovery.json"
    f.write_text(json.dumps({"schema": "gpudoctor.recovery/1", "hosts": {}}))
    f.chmod(0o666)
    r = gpudoctor("recovery", "show", "--recovery-file", f, env=env, cwd=tmp_path)
    refused(r, str(f), "writable by every user (mode 0666)")
