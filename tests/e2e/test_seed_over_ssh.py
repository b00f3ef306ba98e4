"""The seed's worst hour, end to end over real SSH on real LXC (tests/lxclab.py): `gpudoctor check --host ct200`
reads the container (real LXC, the kernel's cgroup2 device program, a real sshd inside) and its Proxmox node,
names the missing allow rule for the live uvm major as the root cause with the chain and the config's line
numbers, offers the exact fix; `gpudoctor fix --host ct200 --apply --reboot` fixes it on the node and restarts
the real container (new init); the container's next check opens /dev/nvidia-uvm; a second fix changes nothing."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.lxclab import UVM_MAJOR, fixed

ROOT = "boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"
M = UVM_MAJOR


def gd(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real CLI in its own process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True, timeout=timeout)


def check_json(lab, inventory=None) -> tuple[int, dict]:
    r = gd("check", "--host", "ct200", "--inventory", str(inventory or lab.inventory), "--json")
    assert r.stderr == "" or "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


def test_check_names_the_missing_uvm_rule_with_the_chain_and_the_fix(seed_lab):
    lab = seed_lab
    r = gd("check", "--host", "ct200", "--inventory", str(lab.inventory))
    out = r.stdout
    assert r.returncode == 2, out + r.stderr
    assert "Traceback" not in r.stderr
    assert f"Root cause {ROOT}:" in " ".join(out.split())
    flat = " ".join(out.split())
    # the chain, from what works to the cause
    assert ("chain: NVML ok → cuInit 999 CUDA_ERROR_UNKNOWN → open(/dev/nvidia-uvm) EPERM although its mode is 0666 → "
            f"root cause: /dev/nvidia-uvm: major {M} (nvidia-uvm) is not allowed by ct200's config") in flat
    # the evidence a human can verify, and the exact fix three ways
    assert f"major {M} (nvidia-uvm) is not in ct200's allow-list (has 195, 509, 226, 234)" in flat
    assert "/etc/pve/lxc/200.conf: line 17 lxc.mount.entry passes /dev/nvidia-uvm" in flat
    assert f"line 21 `c {M}:* rwm` has no key: Proxmox ignores it" in flat
    assert f"add `lxc.cgroup2.devices.allow: c {M}:* rwm` to the live section of /etc/pve/lxc/200.conf" in flat
    assert "`gpudoctor lxc fix 200 --apply` does this safely" in flat
    assert "devN: /dev/nvidia-uvm" in flat
    assert f"remedy: gpudoctor fix --inventory {lab.inventory} --host ct200 --only lxc.cgroup_allow" in flat


def test_every_layer_was_read_for_real_over_ssh(seed_lab):
    code, d = check_json(seed_lab)
    assert code == 2 and d["root_cause"]["id"] == "boundary.lxc.cgroup_allow"
    assert d["root_cause"]["subject"] == "/dev/nvidia-uvm"
    by = {f["key"] if "key" in f else f"{f['id']}[{f['subject']}]" if f.get("subject") else f["id"]: f
          for f in d["findings"]}
    status = {k: f["status"] for k, f in by.items()}
    # container side: the kernel's EPERM (mode 0666), NVML fine, cuInit 999 from the libcuda stand-in
    assert status["driver.nvml.init"] == "ok"
    assert status["devices.node.open[/dev/nvidiactl]"] == "ok" and status["devices.node.open[/dev/nvidia0]"] == "ok"
    uvm = by["devices.node.open[/dev/nvidia-uvm]"]
    assert uvm["status"] == "fail" and uvm["blocked_by"] == ROOT
    assert "open(/dev/nvidia-uvm, O_RDWR) → EPERM although its mode is 0666" in uvm["evidence"]
    cuda = by["cuda.init"]
    assert cuda["status"] == "fail" and cuda["blocked_by"] == ROOT and "999" in cuda["summary"]
    assert status["devices.node.major[/dev/nvidia-uvm]"] == "ok"  # the node itself is right: M:0
    assert by["host.platform"]["evidence"][0] == "/proc/1/environ has container=lxc"
    # Proxmox side: the config and /proc/devices were read from kpro6, vmid from the inventory
    cfg = by["boundary.lxc.config"]
    assert cfg["status"] == "ok" and "read /etc/pve/lxc/200.conf on kpro6" in cfg["summary"]
    assert cfg["data"]["vmid"] == 200 and cfg["data"]["vmid_source"] == "inventory"
    assert by[ROOT]["data"]["fix_line"] == f"lxc.cgroup2.devices.allow: c {M}:* rwm"
    assert d["chain"][0] == "NVML ok" and d["chain"][-1].startswith(f"root cause: /dev/nvidia-uvm: major {M}")


def test_vmid_found_by_hostname_with_pct_list(seed_lab, tmp_path):
    inv = seed_lab.write_inventory(tmp_path / "inventory.yaml", vmid=None)
    calls = len(seed_lab.calls())
    code, d = check_json(seed_lab, inv)
    assert code == 2 and d["root_cause"]["id"] == "boundary.lxc.cgroup_allow"
    cfg = next(f for f in d["findings"] if f["id"] == "boundary.lxc.config")
    assert cfg["data"]["vmid"] == 200
    assert cfg["data"]["vmid_source"] == "$ pct list → 200 running ct200"
    assert seed_lab.calls()[calls:] == ["list", "status 200"]


def test_config_dir_from_the_inventory_is_where_the_config_is_read(seed_lab, tmp_path):
    other = seed_lab.config_file.parent / "alt"  # /etc/pve/lxc/alt on the node
    other.mkdir(exist_ok=True)
    (other / "200.conf").write_bytes(fixed(seed_lab.seed))  # a different file: its findings tell where it was read
    inv = seed_lab.write_inventory(tmp_path / "inventory.yaml", config_dir="/etc/pve/lxc/alt")
    code, d = check_json(seed_lab, inv)
    cfg = next(f for f in d["findings"] if f["id"] == "boundary.lxc.config")
    (other / "200.conf").unlink()
    other.rmdir()
    assert "read /etc/pve/lxc/alt/200.conf on kpro6" in cfg["summary"]
    allow = next(f for f in d["findings"] if f["id"] == "boundary.lxc.cgroup_allow" and f["subject"] == "/dev/nvidia-uvm")
    # this config allows the uvm major, but the container still runs with the seed's rules: the check says so
    assert "the running container does not (edited, not restarted)" in allow["summary"]
    assert d["root_cause"]["key"] == ROOT


def test_fix_apply_reboot_restarts_the_real_container_and_uvm_opens_then_a_second_fix_changes_nothing(seed_lab,
                                                                                                      tmp_path):
    lab = seed_lab
    seed, init_before = lab.seed, lab.init_pid()
    state = ["--audit-log", str(tmp_path / "audit.jsonl"), "--lock-dir", str(tmp_path / "locks")]
    # dry run: the plan and its diff; nothing changes
    r = gd("fix", "--host", "ct200", "--inventory", str(lab.inventory), *state)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"+lxc.cgroup2.devices.allow: c {M}:* rwm" in r.stdout and f"-c {M}:* rwm" in r.stdout
    assert "PLAN  lxc.cgroup_allow on kpro6:" in r.stdout
    assert lab.config_file.read_bytes() == seed and lab.backups() == []
    assert lab.init_pid() == init_before
    # apply with the guarded reboot: pct exec finds no GPU process in ct200, pct reboot = lxc-stop, the config
    # regenerated, lxc-start: a new init, a new device program
    r = gd("fix", "--host", "ct200", "--inventory", str(lab.inventory), "--apply", "--yes", "--reboot", *state)
    assert "APPLIED  lxc.cgroup_allow on kpro6:" in r.stdout and "restarted: ct200 rebooted and is running" in r.stdout
    # fix re-checks ct200 after the change: only the leftover 509 rule (a warning) is left
    assert "NEW VERDICT ct200: WARN (exit 1; was FAIL)" in r.stdout, r.stdout + r.stderr
    assert "root cause: boundary.lxc.stale_allow[c 509]" in r.stdout
    assert r.returncode == 1, r.stdout + r.stderr
    assert lab.config_file.read_bytes() == fixed(seed)  # only the live section's two lines changed
    assert [b.read_bytes() for b in lab.backups()] == [seed]
    assert oct(lab.config_file.stat().st_mode & 0o777) == "0o640"
    assert lab.temps() == []
    calls = lab.calls()
    assert "exec 200 -- nvidia-smi --query-compute-apps=pid --format=csv,noheader" in calls and "reboot 200" in calls
    assert lab.init_pid() != init_before  # the real container was restarted
    assert f"lxc.cgroup2.devices.allow = c {M}:* rwm" in lab.running_config()  # regenerated at start
    # the container now opens /dev/nvidia-uvm (the new device program allows the major) and cuInit succeeds
    code, d = check_json(lab)
    status = {f"{f['id']}[{f['subject']}]" if f.get("subject") else f["id"]: f["status"] for f in d["findings"]}
    assert status["devices.node.open[/dev/nvidia-uvm]"] == "ok" and status["cuda.init"] == "ok"
    assert status[ROOT] == "ok"
    assert not any(f["id"] == "boundary.lxc.restart_pending" for f in d["findings"])  # running config = config
    assert d["root_cause"]["id"] == "boundary.lxc.stale_allow"  # what is left: the leftover 509 rule, a warning
    assert code == 1
    # a second fix has nothing to do and touches nothing
    before, init_after = lab.config_file.stat(), lab.init_pid()
    r = gd("fix", "--host", "ct200", "--inventory", str(lab.inventory), "--apply", "--yes", "--reboot", *state)
    assert "nothing to fix" in r.stdout and "APPLIED" not in r.stdout, r.stdout + r.stderr
    assert "VERDICT ct200: WARN (exit 1; nothing was changed)" in r.stdout and r.returncode == 1
    after = lab.config_file.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert len(lab.backups()) == 1 and lab.init_pid() == init_after
    audit = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(a["host"], a["result"]) for a in audit] == [("kpro6", "started"), ("kpro6", "applied")]


def test_snapshot_over_ssh_replays_both_hosts_to_the_same_diagnosis(seed_lab, tmp_path):
    snap = tmp_path / "ct200.json"
    r = gd("snapshot", "--host", "ct200", "--inventory", str(seed_lab.inventory), "-o", str(snap))
    assert r.returncode == 0, r.stderr
    doc = json.loads(snap.read_text())
    assert doc["context"]["proxmox"] == "kpro6"
    assert doc["proxmox_transcript"]  # kpro6's reads travel with the snapshot
    seed_lab.write_config(fixed(seed_lab.seed))  # the live host changes; the snapshot does not
    r = gd("check", "--snapshot", str(snap), "--json")
    d = json.loads(r.stdout)
    assert r.returncode == 2 and d["root_cause"]["key"] == ROOT
    assert d["chain"][-1].startswith(f"root cause: /dev/nvidia-uvm: major {M}")


def test_lxc_fix_dry_run_shows_the_diff_then_apply_reboot_restarts_the_container_and_uvm_opens(seed_lab, tmp_path):
    """Acceptance 1 through `gpudoctor lxc fix --host ct200`: the diff, then --apply --reboot edits only the live
    section, keeps a backup, restarts the real container (new init PID); the next check opens /dev/nvidia-uvm."""
    lab = seed_lab
    seed, pid = lab.seed, lab.init_pid()
    args = ["lxc", "fix", "--host", "ct200", "--inventory", str(lab.inventory), "--audit-log",
            str(tmp_path / "audit.jsonl"), "--lock-dir", str(tmp_path / "locks")]
    r = gd(*args)
    assert f"+lxc.cgroup2.devices.allow: c {M}:* rwm" in r.stdout and f"-c {M}:* rwm" in r.stdout, r.stdout + r.stderr
    assert lab.config_file.read_bytes() == seed and lab.init_pid() == pid
    r = gd(*args, "--apply", "--yes", "--reboot")
    assert "APPLIED" in r.stdout and "rebooted and is running" in r.stdout, r.stdout + r.stderr
    assert lab.config_file.read_bytes() == fixed(seed) and [b.read_bytes() for b in lab.backups()] == [seed]
    assert lab.init_pid() != pid
    lab.wait_ssh()
    code, d = check_json(lab)
    status = {f"{f['id']}[{f['subject']}]" if f.get("subject") else f["id"]: f["status"] for f in d["findings"]}
    assert status["devices.node.open[/dev/nvidia-uvm]"] == "ok" and status[ROOT] == "ok"
    assert status["cuda.init"] == "ok" and d["root_cause"]["id"] == "boundary.lxc.stale_allow"
