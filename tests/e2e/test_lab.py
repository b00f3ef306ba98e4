"""The lab is faithful where it claims to be: the kernel, not a stand-in, refuses /dev/nvidia-uvm; the driver shim
only answers where no driver exists (ENXIO) and never overrides the device cgroup; `pct reboot` rebuilds the
container's device cgroup from its config; ct200 looks like an LXC guest from inside."""

from __future__ import annotations

import json

from gpudoctor.target import open_target
from tests.e2e.lab import SEED_FIXED
from tests.e2e.test_seed_over_ssh import gd

OPEN = ("import json, os, sys\nout = {}\nfor p in sys.argv[1:]:\n    try:\n        os.close(os.open(p, os.O_RDWR))\n"
        "        out[p] = 'OK'\n    except OSError as e:\n        out[p] = os.strerror(e.errno)\nprint(json.dumps(out))\n")
NODES = ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"]


def opens(host, env_prefix=()) -> dict:
    r = host.run([*env_prefix, "python3", "-I", "-S", "-c", OPEN, *NODES])
    assert r.rc == 0, r.stderr
    return json.loads(r.stdout)


def test_only_the_missing_driver_is_stood_in_for(seed_lab):
    with open_target("ct200", str(seed_lab.inventory)) as t:
        # with the shim (every session has it): NVIDIA's nodes open, the device cgroup refuses 511
        assert opens(t.host) == {"/dev/nvidiactl": "OK", "/dev/nvidia0": "OK",
                                 "/dev/nvidia-uvm": "Operation not permitted"}
        # without it the kernel answers alone: no driver behind 195 (ENXIO), and still EPERM for 511
        assert opens(t.host, ("env", "-u", "LD_PRELOAD")) == {
            "/dev/nvidiactl": "No such device or address", "/dev/nvidia0": "No such device or address",
            "/dev/nvidia-uvm": "Operation not permitted"}
        # the shim never overrides the cgroup: deny 195 too and nvidiactl is EPERM, nvidia-smi exits 17 as on the H200
        (seed_lab.ct.cgroup / "devices.deny").write_text("c 195:* rwm")
        try:
            assert opens(t.host)["/dev/nvidiactl"] == "Operation not permitted"
            r = t.host.run(["nvidia-smi", "-q", "-x"])
            assert r.rc == 17 and "GPU access blocked by the operating system" in r.stdout
        finally:
            assert seed_lab.px.pct_run("start", "200").returncode == 0  # rules from the config again
        assert opens(t.host)["/dev/nvidiactl"] == "OK"


def test_ct200_looks_like_an_lxc_guest_from_inside(seed_lab):
    with open_target("ct200", str(seed_lab.inventory)) as t:
        r = t.host.run(["sh", "-c", "hostname; tr '\\0' '\\n' < /proc/1/environ | grep '^container='; "
                                    "grep nvidia-uvm /proc/devices; ls /dev | grep nvidia"])
        assert r.stdout.split("\n")[:3] == ["ct200", "container=lxc", "511 nvidia-uvm"]
        assert r.stdout.split("\n")[3:-1] == ["nvidia-caps", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]
        assert t.host.read_file("/proc/driver/nvidia/version").text.startswith("NVRM version: NVIDIA UNIX Open Kernel")


def test_pct_reboot_applies_the_edited_config_to_the_running_container(seed_lab):
    px = seed_lab.px
    px.write_config(SEED_FIXED)  # edited, not restarted: the container still runs with 509, not 511
    with open_target("ct200", str(seed_lab.inventory)) as t:
        assert opens(t.host)["/dev/nvidia-uvm"] == "Operation not permitted"
        r = px.pct_run("reboot", "200")
        assert r.returncode == 0, r.stderr
        assert opens(t.host)["/dev/nvidia-uvm"] == "OK"
    running = px.path("/var/lib/lxc/200/config").read_text()
    assert "lxc.cgroup2.devices.allow = c 511:* rwm" in running and "c 511:* rwm\n" not in running.replace(" = c", "")


def test_an_unreachable_proxmox_host_leaves_the_guest_checked_and_the_boundary_unknown(seed_lab, tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    text = seed_lab.inventory_text().replace(f"    port: {seed_lab.px_sshd.port}\n", f"    port: {dead}\n")
    inv = tmp_path / "inventory.yaml"
    inv.write_text(text)
    r = gd("check", "--host", "ct200", "--inventory", str(inv), "--json")
    d = json.loads(r.stdout)
    assert r.returncode == 2 and d["root_cause"]["key"] == "devices.node.open[/dev/nvidia-uvm]"
    cfg = next(f for f in d["findings"] if f["id"] == "boundary.lxc.config")
    assert cfg["status"] == "unknown" and cfg["summary"].startswith("cannot reach the Proxmox host: kpro6: connection")


def test_lxc_audit_and_fix_name_the_proxmox_host_and_vmid(seed_lab, tmp_path):
    inv = str(seed_lab.inventory)
    r = gd("lxc", "audit", "--host", "kpro6", "200", "--inventory", inv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.startswith("ct200 (/etc/pve/lxc/200.conf): FAIL\nFAIL    boundary.lxc.cgroup_allow  /dev/nvidia-uvm: "
                               "major 511 (nvidia-uvm) is not allowed by ct200's config")
    r = gd("lxc", "fix", "--host", "kpro6", "--inventory", inv)
    assert r.returncode == 3 and "kpro6 is a Proxmox host: give the container's VMID too" in r.stderr
    r = gd("lxc", "fix", "--host", "ct200", "--config", "/x.conf", "--inventory", inv)
    assert r.returncode == 3 and "cannot be combined with it" in r.stderr
