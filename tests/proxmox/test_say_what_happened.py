"""`gpudoctor lxc fix` says only what happened (#19): a refusal when the edit cannot reach the healthy state, APPLIED
only with what was verified (and what remains), the same report for the same state on a second run."""

import shutil

from tests import needs

from .conftest import CONFIGS, DEV511
from .test_cli import gd, work  # noqa: F401 - fixture


def test_apply_without_devices_off_the_node_changes_nothing_and_says_how(work):
    """Off the node this machine's /proc/devices says nothing about the node's majors (#23): one line, exit 3."""
    needs.not_a_proxmox_node()
    tmp, conf, state = work
    before = conf.read_bytes()
    r = gd("lxc", "fix", "--config", conf, "--apply", "--yes", *state)
    assert r.returncode == 3 and r.stdout == "", r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "this machine is not a Proxmox node (no /etc/pve)" in lines[0]
    assert "--devices FILE" in lines[0] and "--host NODE VMID" in lines[0]
    assert conf.read_bytes() == before and not (tmp / "backups").exists() and not (tmp / "audit.jsonl").exists()


def test_audit_hint_repeats_the_audits_own_files(work):
    _, conf, _ = work
    r = gd("lxc", "audit", "--config", conf, "--devices", DEV511)
    assert f"gpudoctor lxc fix --config {conf} --devices {DEV511} --apply" in r.stdout


def test_applied_says_what_was_verified_then_nothing_to_fix(work):
    _, conf, state = work
    r = gd("lxc", "fix", "--config", conf, "--devices", DEV511, "--apply", "--yes", *state)
    assert r.returncode == 1, r.stdout + r.stderr  # applied; the restart is pending
    assert "APPLIED" in r.stdout and "now allows c 511:* in its live section; keyless line 20 removed" in r.stdout
    assert "every GPU node it passes is allowed" in r.stdout and "no new majors" not in r.stdout
    r = gd("lxc", "fix", "--config", conf, "--devices", DEV511, "--apply", "--yes", *state)
    assert r.returncode == 0 and r.stdout.strip() == "nothing to fix"


def test_a_partial_change_says_what_remains(work, tmp_path):
    """nvidia-caps is not registered: the uvm rule is written, the caps node is named as still not allowed."""
    _, conf, state = work
    dev = tmp_path / "devices-no-caps.txt"
    dev.write_text("".join(ln for ln in DEV511.read_text().splitlines(True) if "nvidia-caps" not in ln))
    r = gd("lxc", "fix", "--config", conf, "--devices", dev, "--apply", "--yes", *state)
    assert "not touching: /dev/nvidia-caps" in r.stdout
    assert "APPLIED" in r.stdout and "still not allowed: /dev/nvidia-caps" in r.stdout
    assert "every GPU node it passes is allowed" not in r.stdout


def test_second_apply_with_restart_pending_reports_the_same_state(work, tmp_path):
    _, conf, state = work
    running = tmp_path / "running.config"  # what LXC generated when the container started, before the fix
    running.write_text("".join(f"lxc.cgroup2.devices.allow = c {m}:* rwm\n" for m in (195, 509, 226, 234)))
    args = ["lxc", "fix", "--config", conf, "--devices", DEV511, "--running", running, "--apply", "--yes", *state]
    first = gd(*args)
    assert first.returncode == 1 and "restart pending: pct reboot 200" in first.stdout, first.stdout + first.stderr
    second = gd(*args)
    assert second.returncode == first.returncode, second.stdout + second.stderr
    assert "REFUSED" not in second.stdout and "UNCHANGED" in second.stdout
    assert "restart pending: pct reboot 200 (or re-run with --reboot)" in second.stdout


def test_no_placeholder_when_the_container_is_unknown(tmp_path):
    conf = tmp_path / "seed-copy.conf"  # no VMID in the name
    shutil.copyfile(CONFIGS / "200-seed.conf", conf)
    r = gd("lxc", "audit", "--config", conf, "--devices", DEV511)
    assert "seed-copy.conf's config" not in r.stdout and "VMID" not in r.stdout.replace("container's VMID", "")
    assert "is not allowed by seed-copy.conf;" in r.stdout
