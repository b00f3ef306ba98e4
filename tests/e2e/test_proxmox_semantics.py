"""What Proxmox and LXC do with a container config, on the real LXC lab: devN: passthrough (Proxmox allows the node's
live major:minor at every start), a [snapshot] section that mentions the new major (never applied, never edited),
"edited but not restarted" (the running container keeps its old device program), and a hybrid cgroup host where
LXC ignores every lxc.cgroup2 rule and applies lxc.cgroup.devices.* — each seen by the kernel and by the audit."""

from __future__ import annotations

import json

import pytest

from gpudoctor.target import open_target
from tests import lxclab as L
from tests.e2e.test_lab import EPERM, opens
from tests.e2e.test_seed_over_ssh import check_json, gd

M = L.UVM_MAJOR


def findings(d) -> dict:
    return {f"{f['id']}[{f['subject']}]" if f.get("subject") else f["id"]: f for f in d["findings"]}


def state(tmp_path) -> list[str]:
    return ["--audit-log", str(tmp_path / "audit.jsonl"), "--lock-dir", str(tmp_path / "locks")]


def devn_config(seed: bytes) -> bytes:
    """The seed with devN: entries instead of the GPU mount entries and allow lines."""
    keep = [ln for ln in seed.split(b"\n") if not ln.startswith((b"lxc.cgroup2.devices.allow", b"lxc.mount.entry"))
            and ln != f"c {M}:* rwm".encode()]
    devs = [b"dev0: /dev/nvidia0,mode=0666", b"dev1: /dev/nvidiactl,mode=0666", b"dev2: /dev/nvidia-uvm,mode=0666",
            b"dev3: /dev/nvidia-uvm-tools,mode=0666"]
    at = keep.index(next(ln for ln in keep if ln.startswith(b"entrypoint:")))
    return b"\n".join(keep[:at] + devs + keep[at:])


def test_devn_passthrough_allows_the_live_major_at_start_and_uvm_opens(seed_lab):
    lab = seed_lab
    lab.reset(devn_config(lab.seed))
    running = lab.running_config()
    for rule in ("c 195:0 rw", "c 195:255 rw", f"c {M}:0 rw", f"c {M}:1 rw"):
        assert f"lxc.cgroup2.devices.allow = {rule}\n" in running
    assert running.index(f"c {M}:0 rw") < running.index("lxc.rootfs.path")  # devN: rules before the raw lines
    assert (lab.lxcpath / "200/passthrough/devices").read_text().splitlines()[2] == f"c:{M}:0:/dev/nvidia-uvm"
    with open_target("ct200", str(lab.inventory)) as t:
        assert opens(t.host, ("env", "-u", "LD_PRELOAD"))["/dev/nvidia-uvm"] == "OK"  # the real driver answers
        st = t.host.run(["stat", "-c", "%a %t:%T", "/dev/nvidia-uvm"]).stdout.split()
        assert st == ["666", f"{M:x}:0"]  # the passthrough node, bind-mounted by the autodev hook
    code, d = check_json(lab)
    f = findings(d)
    uvm = f["boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"]
    assert uvm["status"] == "ok" and f"(nvidia-uvm {M}:0) is allowed in ct200's config" in uvm["summary"]
    assert "`dev2: /dev/nvidia-uvm,mode=0666`" in uvm["evidence"][0]  # the devN: line is what allows it
    assert f["devices.node.open[/dev/nvidia-uvm]"]["status"] == "ok" and f["cuda.init"]["status"] == "ok"
    assert code in (0, 1), d["root_cause"]


SNAPSHOT = (b"\n[before-update]\n#taken before the driver update\narch: amd64\nhostname: ct200\n"
            b"lxc.cgroup2.devices.allow: c 195:* rwm\n"
            + f"lxc.cgroup2.devices.allow: c {M}:* rwm\n".encode()
            + b"snaptime: 1764500000\n")


def test_a_snapshot_section_mentioning_the_major_is_not_applied_and_stays_byte_identical(seed_lab, tmp_path):
    lab = seed_lab
    config = lab.seed + SNAPSHOT
    lab.reset(config)
    assert f"c {M}:* rwm" not in lab.running_config()  # Proxmox never applies a snapshot section
    with open_target("ct200", str(lab.inventory)) as t:
        assert opens(t.host)["/dev/nvidia-uvm"] == EPERM
    r = gd("fix", "--host", "ct200", "--inventory", str(lab.inventory), "--apply", "--yes", "--reboot",
           *state(tmp_path))
    assert "APPLIED  lxc.cgroup_allow on kpro6:" in r.stdout, r.stdout + r.stderr
    after = lab.config_file.read_bytes()
    assert after.endswith(SNAPSHOT) and after[: -len(SNAPSHOT)] == L.fixed(lab.seed)  # snapshot: byte-identical
    with open_target("ct200", str(lab.inventory)) as t:
        assert opens(t.host)["/dev/nvidia-uvm"] == "OK"


def test_edited_but_not_restarted_is_what_the_running_container_shows(seed_lab, tmp_path):
    lab = seed_lab
    pid = lab.init_pid()
    lab.write_config(L.fixed(lab.seed))  # someone fixed the file but did not restart the container
    code, d = check_json(lab)
    f = findings(d)
    allow = f["boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"]
    assert allow["status"] == "fail" and "the running container does not (edited, not restarted)" in allow["summary"]
    assert f["boundary.lxc.restart_pending[ct200]"]["status"] == "warn"
    assert f"lxc.cgroup2.devices.allow: c {M}:* rwm — not in the running config" in " ".join(
        f["boundary.lxc.restart_pending[ct200]"]["evidence"])
    assert f["devices.node.open[/dev/nvidia-uvm]"]["status"] == "fail"  # the kernel still refuses: real
    assert code == 2 and d["root_cause"]["key"] == "boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"
    # without --reboot the fix says what is left; with it, the container restarts and uvm opens
    r = gd("lxc", "fix", "--host", "ct200", "--inventory", str(lab.inventory), "--apply", "--yes", *state(tmp_path))
    assert "runs with its old rules" in r.stdout + r.stderr and lab.init_pid() == pid, r.stdout + r.stderr
    r = gd("lxc", "fix", "--host", "ct200", "--inventory", str(lab.inventory), "--apply", "--yes", "--reboot",
           *state(tmp_path))
    assert lab.init_pid() != pid, r.stdout + r.stderr
    lab.wait_ssh()
    code, d = check_json(lab)
    assert findings(d)["devices.node.open[/dev/nvidia-uvm]"]["status"] == "ok"
    assert not [k for k in findings(d) if k.startswith("boundary.lxc.restart_pending")]


@pytest.fixture(scope="module")
def hybrid_lab(lxclab, tmp_path_factory):
    """A second node keeping this machine's hybrid cgroup layout (v1 controllers + cgroup2 at .../unified), with
    ct200 started from the seed's fixed config: its lxc.cgroup2 rules allow the uvm major."""
    lab = L.LxcLab(tmp_path_factory.mktemp("hybrid"), layout="hybrid")
    lab.config = L.fixed(lab.seed)
    with lab:
        yield lab


def test_a_hybrid_host_ignores_lxc_cgroup2_rules_and_the_audit_says_so(hybrid_lab, tmp_path):
    lab = hybrid_lab
    lab.reset(L.fixed(lab.seed))
    assert "Ignoring cgroup2 limits on legacy cgroup system" in lab.lxc_log()
    devices = [cg for mnt, _, cg in lab.v1 if mnt.name == "devices"][0] / "lxc" / "200" / "devices.list"
    assert f"c {M}:* rwm" not in devices.read_text()  # the v1 devices controller got only common.conf's base
    with open_target("ct200", str(lab.inventory)) as t:
        assert opens(t.host)["/dev/nvidia-uvm"] == EPERM  # the cgroup2 allow line is in the config, and ignored
    code, d = check_json(lab)
    f = findings(d)
    uvm = f["boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"]
    assert uvm["status"] == "fail" and "on this hybrid cgroup host (its lxc.cgroup2 rules are ignored there)" in \
        uvm["summary"]
    assert any("cgroup2 only at /sys/fs/cgroup/unified" in e for e in uvm["evidence"])
    assert any(f"`lxc.cgroup2.devices.allow: c {M}:* rwm` is a cgroup2 rule: LXC ignores it" in e
               for e in uvm["evidence"])
    assert uvm["data"]["fix_line"] == f"lxc.cgroup.devices.allow: c {M}:* rwm"
    assert f["devices.node.open[/dev/nvidia-uvm]"]["status"] == "fail" and code == 2
    # gpudoctor writes cgroup2 rules only: on this host it refuses and names the v1 line to add
    r = gd("lxc", "fix", "--host", "ct200", "--inventory", str(lab.inventory), "--apply", "--yes", *state(tmp_path))
    assert f"`lxc.cgroup.devices.allow: c {M}:* rwm`" in r.stdout + r.stderr and "hybrid cgroup layout" in \
        r.stdout + r.stderr, r.stdout + r.stderr
    assert lab.config_file.read_bytes() == L.fixed(lab.seed)


def test_on_a_hybrid_host_the_v1_rules_are_what_apply(hybrid_lab):
    lab = hybrid_lab
    v1 = "".join(f"lxc.cgroup.devices.allow: c {m}:* rwm\n" for m in (195, M, 234)).encode()
    lab.reset(L.fixed(lab.seed) + v1)
    with open_target("ct200", str(lab.inventory)) as t:
        assert opens(t.host) == {"/dev/nvidiactl": "OK", "/dev/nvidia0": "OK", "/dev/nvidia-uvm": "OK"}
    code, d = check_json(lab)
    f = findings(d)
    assert f["boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"]["status"] == "ok"
    assert "lxc.cgroup.devices.allow" in " ".join(f["boundary.lxc.cgroup_allow[/dev/nvidia-uvm]"]["evidence"])
    assert not [k for k in f if k.startswith("boundary.lxc.cgroup_v1")]  # the key that applies here: no rename asked
    assert f["cuda.init"]["status"] == "ok", json.dumps(f["cuda.init"])
