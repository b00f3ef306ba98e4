"""The audit over real config files and /proc/devices captures: the seed's scenario and every finding kind."""

from gpudoctor.findings import Status
from gpudoctor.proxmox import config as C
from gpudoctor.proxmox.audit import AuditInput, decide, live_rules, needed_nodes
from gpudoctor.proxmox.devices import ProcDevices, classify_node

from .conftest import CONFIGS, DEV509, DEV511, audit


def run(fixture, devices=DEV511, **kw):
    cfg = C.parse((CONFIGS / fixture).read_bytes(), f"/etc/pve/lxc/{fixture.split('-')[0]}.conf")
    return audit(AuditInput(cfg, ProcDevices.parse(devices.read_text()), vmid=int(fixture.split("-")[0]), **kw))


def by(findings, fid, subject=None):
    return [f for f in findings if f.id == fid and (subject is None or f.subject == subject)]


def test_seed_scenario_names_missing_511_as_fail_with_exact_fix():
    fs = run("200-seed.conf")
    uvm = by(fs, "boundary.lxc.cgroup_allow", "/dev/nvidia-uvm")[0]
    assert uvm.status == Status.FAIL
    assert uvm.evidence[0] == "major 511 (nvidia-uvm) is not in ct200's allow-list (has 195, 509, 226, 234)"
    assert uvm.data["fix_line"] == "lxc.cgroup2.devices.allow: c 511:* rwm"
    assert "`lxc.cgroup2.devices.allow: c 511:* rwm`" in uvm.hint and "pct reboot 200" in uvm.hint
    assert "devN: /dev/nvidia-uvm" in uvm.hint  # the durable alternative
    assert uvm.remedy == "lxc.cgroup_allow"
    assert any("line 20 `c 511:* rwm` has no key" in e for e in uvm.evidence)
    assert by(fs, "boundary.lxc.cgroup_allow", "/dev/nvidia-uvm-tools")[0].status == Status.WARN  # not needed by CUDA
    for ok in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-caps"):
        assert by(fs, "boundary.lxc.cgroup_allow", ok)[0].status == Status.OK
    stale = by(fs, "boundary.lxc.stale_allow")
    assert [f.subject for f in stale] == ["c 509"] and stale[0].status == Status.WARN
    assert "belongs to no device" in stale[0].evidence[1] and "nvidia-uvm is 511" in stale[0].evidence[1]
    bad = by(fs, "boundary.lxc.malformed")
    assert len(bad) == 1 and bad[0].subject.endswith("200.conf:20") and bad[0].remedy == "lxc.cgroup_allow"


def test_before_the_driver_update_the_same_config_is_healthy_apart_from_the_keyless_line():
    fs = run("200-seed.conf", DEV509)
    assert all(f.status == Status.OK for f in by(fs, "boundary.lxc.cgroup_allow"))
    assert not by(fs, "boundary.lxc.stale_allow")


def test_stale_major_names_the_device_that_holds_it_now():
    cfg = C.parse("arch: amd64\nlxc.cgroup2.devices.allow: c 243:* rwm\nlxc.cgroup2.devices.allow: c 226:* rwm\n"
                  "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,create=file\n", "/etc/pve/lxc/9.conf")
    fs = audit(AuditInput(cfg, ProcDevices.parse(DEV511.read_text()), vmid=9))
    stale = by(fs, "boundary.lxc.stale_allow")
    assert [f.subject for f in stale] == ["c 243"]  # 226 (drm) is a fixed major: not flagged
    assert "held by hidraw" in stale[0].evidence[1]
    assert by(fs, "boundary.lxc.cgroup_allow", "/dev/nvidia0")[0].status == Status.FAIL  # 195 not allowed


def test_rule_stranded_in_a_snapshot_is_misplaced_not_allowed():
    fs = run("201-snapshots.conf")
    uvm = by(fs, "boundary.lxc.cgroup_allow", "/dev/nvidia-uvm")[0]
    assert uvm.status == Status.FAIL
    assert any("sits in snapshot [after-driver]" in e for e in uvm.evidence)
    mis = by(fs, "boundary.lxc.misplaced")
    assert [f.subject for f in mis] == ["after-driver"]
    assert any("end of the file" in e for e in mis[0].evidence)
    assert mis[0].data["lines"] == [39, 40]
    # the snapshot's keyless line is reported but not offered to the remedy (snapshots are never edited)
    bare = by(fs, "boundary.lxc.malformed")[0]
    assert bare.subject.endswith(":40") and bare.remedy is None and "[after-driver]" in bare.summary


def test_pending_only_rule_is_misplaced():
    fs = run("202-pending.conf")
    assert by(fs, "boundary.lxc.cgroup_allow", "/dev/nvidia-uvm")[0].status == Status.FAIL
    assert [f.subject for f in by(fs, "boundary.lxc.misplaced")] == [C.PENDING]


def test_devn_passthrough_is_allowed_and_v1_key_flagged():
    fs = run("205-devn.conf")
    allow = {f.subject: f for f in by(fs, "boundary.lxc.cgroup_allow")}
    assert allow["/dev/nvidia-uvm"].status == Status.OK and "dev2" in allow["/dev/nvidia-uvm"].summary
    assert allow["/dev/nvidia0"].status == Status.OK
    # the cap node is allowed read-only by a path rule: open(O_RDWR) would need rw, so it is a warning
    assert allow["/dev/nvidia-caps/nvidia-cap1"].status == Status.WARN
    v1 = by(fs, "boundary.lxc.cgroup_v1")
    assert len(v1) == 1 and "lxc.cgroup2.devices.allow" in v1[0].hint


def test_lock_is_reported():
    fs = run("206-locked.conf")
    lock = by(fs, "boundary.lxc.lock")
    assert lock[0].status == Status.WARN and "locked (backup)" in lock[0].summary and "pct unlock 206" in lock[0].hint


def test_explicit_deny_and_read_only_rule_are_explained():
    fs = run("207-deny.conf")
    uvm = by(fs, "boundary.lxc.cgroup_allow", "/dev/nvidia-uvm")[0]
    assert uvm.status == Status.FAIL and uvm.data["denied_by"] == "line 4"
    assert "denies 511:0 before any allow" in uvm.evidence[0]
    assert uvm.remedy is None  # not something to fix by adding a line


def test_first_match_wins_and_identical_rule_flips():
    node = classify_node("/dev/nvidia-uvm")
    rules = live_rules(C.parse("lxc.cgroup2.devices.allow: c 511:* rwm\nlxc.cgroup2.devices.deny: c 511:* rwm\n", "x"))
    assert decide(rules, node, 511).allowed is False  # the identical deny flips the earlier allow
    rules = live_rules(C.parse("lxc.cgroup2.devices.allow: c 511:0 rwm\nlxc.cgroup2.devices.deny: c 511:* rwm\n", "x"))
    assert decide(rules, node, 511).allowed is True  # first match decides
    rules = live_rules(C.parse("lxc.cgroup2.devices.allow: a\n", "x"))
    assert decide(rules, node, 511).allowed is True  # allow a: everything
    rules = live_rules(C.parse("lxc.cgroup2.devices.allow: c 511:* r\nlxc.cgroup2.devices.allow: c 511:* w\n", "x"))
    d = decide(rules, node, 511)
    assert d.allowed is False and len(d.partial) == 2  # open(O_RDWR) needs one rule granting both


def test_module_not_loaded_is_unknown_not_healthy():
    text = "".join(ln for ln in DEV511.read_text().splitlines(keepends=True) if "nvidia-uvm" not in ln)
    cfg = C.parse((CONFIGS / "200-seed.conf").read_bytes(), "/etc/pve/lxc/200.conf")
    fs = audit(AuditInput(cfg, ProcDevices.parse(text), vmid=200))
    uvm = by(fs, "boundary.lxc.cgroup_allow", "/dev/nvidia-uvm")[0]
    assert uvm.status == Status.UNKNOWN and "nvidia-modprobe" in uvm.hint


def test_edited_but_not_restarted():
    cfg = C.parse((CONFIGS / "200-seed.conf").read_bytes().replace(b"c 511:* rwm\n",
                                                                  b"lxc.cgroup2.devices.allow: c 511:* rwm\n"),
                  "/etc/pve/lxc/200.conf")
    running = ("lxc.arch = amd64\nlxc.include = /usr/share/lxc/config/ubuntu.common.conf\n"
               "lxc.cgroup2.devices.allow = c 195:* rwm\nlxc.cgroup2.devices.allow = c 509:* rwm\n"
               "lxc.cgroup2.devices.allow = c 226:* rwm\nlxc.cgroup2.devices.allow = c 234:* rwm\n")
    pd = ProcDevices.parse(DEV511.read_text())
    fs = audit(AuditInput(cfg, pd, running=running, status="running", vmid=200))
    uvm = by(fs, "boundary.lxc.cgroup_allow", "/dev/nvidia-uvm")[0]
    assert uvm.status == Status.FAIL and uvm.data["restart_needed"] and "not restarted" in uvm.summary
    pend = by(fs, "boundary.lxc.restart_pending")[0]
    assert any("c 511:* rwm — not in the running config" in e for e in pend.evidence)
    # once stopped, the running config is stale by definition: the next start regenerates it
    fs = audit(AuditInput(cfg, pd, running=running, status="stopped", vmid=200))
    assert by(fs, "boundary.lxc.cgroup_allow", "/dev/nvidia-uvm")[0].status == Status.OK
    assert not by(fs, "boundary.lxc.restart_pending")


def test_missing_host_node_with_optional_mount():
    cfg = C.parse((CONFIGS / "200-seed.conf").read_bytes(), "/etc/pve/lxc/200.conf")
    nodes = {n.node.path: {"path": n.node.path, "exists": True, "kind": "char"} for n in needed_nodes(cfg)}
    nodes["/dev/nvidia-uvm-tools"] = {"path": "/dev/nvidia-uvm-tools", "exists": False, "error": "ENOENT"}
    fs = audit(AuditInput(cfg, ProcDevices.parse(DEV509.read_text()), vmid=200, host_nodes=nodes))
    me = by(fs, "boundary.lxc.mount_entry")
    assert [f.subject for f in me] == ["/dev/nvidia-uvm-tools"] and "skips it silently" in me[0].evidence[1]


def test_no_gpu_nodes_at_all():
    cfg = C.parse("arch: amd64\nhostname: ct9\n", "/etc/pve/lxc/9.conf")
    fs = audit(AuditInput(cfg, ProcDevices.parse(DEV511.read_text()), vmid=9))
    assert [(f.id, f.status) for f in fs] == [("boundary.lxc.mount_entry", Status.WARN)]


def test_guest_path_is_the_mount_target():
    cfg = C.parse("lxc.mount.entry: /dev/nvidia-uvm dev/gpu-uvm none bind,create=file\n", "/etc/pve/lxc/9.conf")
    fs = audit(AuditInput(cfg, ProcDevices.parse(DEV511.read_text()), vmid=9))
    f = by(fs, "boundary.lxc.cgroup_allow")[0]
    assert f.subject == "/dev/gpu-uvm" and f.data["host_path"] == "/dev/nvidia-uvm"
