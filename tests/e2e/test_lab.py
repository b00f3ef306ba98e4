"""The LXC lab is faithful where docs/testing.md says it is: LXC compiled the config's rules into a cgroup2 device
program and the kernel, not a stand-in, refuses /dev/nvidia-uvm; after the rule is allowed the open reaches a real
driver and succeeds; the driver shim only answers major 195's ENXIO and never overrides the device program;
`pct reboot` restarts the real container from the regenerated config; ct200 looks like an LXC guest from inside;
and the lab leaves nothing behind, even when a start fails."""

from __future__ import annotations

import json
import socket
import subprocess
import time

from gpudoctor.target import open_target
from tests import lxclab as L
from tests.childenv import pythonpath
from tests.e2e.test_seed_over_ssh import gd

OPEN = ("import json, os, sys\nout = {}\nfor p in sys.argv[1:]:\n    try:\n        os.close(os.open(p, os.O_RDWR))\n"
        "        out[p] = 'OK'\n    except OSError as e:\n        out[p] = os.strerror(e.errno)\nprint(json.dumps(out))\n")
NODES = ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"]
EPERM, ENXIO = "Operation not permitted", "No such device or address"


def gone(pid: int, timeout: float = 10) -> bool:
    """The process has exited (a zombie waiting for its reaper counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = L.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def opens(host, env_prefix=()) -> dict:
    r = host.run([*env_prefix, "python3", "-I", "-S", "-c", OPEN, *NODES])
    assert r.rc == 0, r.stderr
    return json.loads(r.stdout)


def test_lxc_built_an_ebpf_device_program_and_the_kernel_refuses_uvm(seed_lab):
    lab = seed_lab
    log = lab.lxc_log()
    assert "Ignoring legacy cgroup limits on pure cgroup2 system" in log
    assert "Limits for the unified cgroup hierarchy have been setup" in log
    r = subprocess.run(["bpftool", "cgroup", "show", str(lab.cgroup / "lxc" / "200")], capture_output=True, text=True)
    assert r.returncode == 0 and "cgroup_device" in r.stdout, r.stdout + r.stderr
    with open_target("ct200", str(lab.inventory)) as t:
        # with the shim (every session has it): NVIDIA's nodes open, the device program refuses major 7
        assert opens(t.host) == {"/dev/nvidiactl": "OK", "/dev/nvidia0": "OK", "/dev/nvidia-uvm": EPERM}
        # without it the kernel answers alone: no driver behind 195 (ENXIO), and still EPERM for uvm
        assert opens(t.host, ("env", "-u", "LD_PRELOAD")) == {"/dev/nvidiactl": ENXIO, "/dev/nvidia0": ENXIO,
                                                             "/dev/nvidia-uvm": EPERM}


def test_a_live_rule_lets_the_open_reach_a_real_driver_and_the_shim_never_overrides_a_deny(seed_lab):
    lab = seed_lab
    with open_target("ct200", str(lab.inventory)) as t:
        # LXC swaps the device program live (lxc-cgroup): uvm's major 7 now opens, without the shim: the kernel's
        # own driver behind the major answers
        r = lab.node_run("lxc-cgroup", "-n", "200", "-P", str(lab.lxcpath), "devices.allow", f"c {L.UVM_MAJOR}:* rwm")
        assert r.returncode == 0, r.stderr
        assert opens(t.host, ("env", "-u", "LD_PRELOAD"))["/dev/nvidia-uvm"] == "OK"
        r = t.host.run(["python3", "-I", "-S", "-c", "import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))"])
        assert r.stdout.strip() == "0", r.stdout + r.stderr  # the libcuda stand-in follows the kernel's answers
        # deny 195 too: nvidiactl is EPERM even with the shim, and nvidia-smi exits 17 as on the H200
        r = lab.node_run("lxc-cgroup", "-n", "200", "-P", str(lab.lxcpath), "devices.deny", "c 195:* rwm")
        assert r.returncode == 0, r.stderr
        assert opens(t.host)["/dev/nvidiactl"] == EPERM
        r = t.host.run(["nvidia-smi", "-q", "-x"])
        assert r.rc == 17 and "GPU access blocked by the operating system" in r.stdout
        r = t.host.run(["python3", "-I", "-S", "-c", "import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))"])
        assert r.stdout.strip() == "100", r.stdout + r.stderr
    r = lab.pct("reboot", "200")  # the rules from the config again (a new program at start)
    assert r.returncode == 0, r.stderr
    lab.wait_ssh()
    with open_target("ct200", str(lab.inventory)) as t:
        assert opens(t.host) == {"/dev/nvidiactl": "OK", "/dev/nvidia0": "OK", "/dev/nvidia-uvm": EPERM}


def test_ct200_looks_like_an_lxc_guest_from_inside(seed_lab):
    with open_target("ct200", str(seed_lab.inventory)) as t:
        r = t.host.run(["sh", "-c", "hostname; tr '\\0' '\\n' < /proc/1/environ | grep '^container='; "
                                    "grep nvidia-uvm /proc/devices; ls /dev | grep nvidia; cat /proc/self/cgroup"])
        lines = r.stdout.split("\n")
        assert lines[:3] == ["ct200", "container=lxc", f"  {L.UVM_MAJOR} nvidia-uvm"], r.stdout
        assert lines[3:8] == ["nvidia-caps", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"]
        assert lines[-2] == "0::/"  # its own cgroup namespace (lxc.cgroup.dir.container.inner = ns)
        assert t.host.read_file("/proc/driver/nvidia/version").text.startswith("NVRM version: NVIDIA UNIX Open Kernel")
        assert t.host.run(["cat", "/proc/1/comm"]).stdout.strip() in ("sh", "dash", "lab-init")  # a shell is pid 1


def test_pct_reboot_restarts_the_container_with_the_edited_config(seed_lab):
    lab = seed_lab
    lab.write_config(L.fixed(lab.seed))  # edited, not restarted: the running program still refuses uvm
    pid = lab.init_pid()
    with open_target("ct200", str(lab.inventory)) as t:
        assert opens(t.host)["/dev/nvidia-uvm"] == EPERM
    r = lab.pct("reboot", "200")
    assert r.returncode == 0, r.stderr
    lab.wait_ssh()
    assert lab.init_pid() != pid
    with open_target("ct200", str(lab.inventory)) as t:
        assert opens(t.host)["/dev/nvidia-uvm"] == "OK"
    running = lab.running_config()
    assert f"lxc.cgroup2.devices.allow = c {L.UVM_MAJOR}:* rwm" in running
    assert f"\nc {L.UVM_MAJOR}:* rwm" not in running  # the keyless line was never passed on


def test_an_unreachable_proxmox_host_leaves_the_guest_checked_and_the_boundary_unknown(seed_lab, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    inv = seed_lab.write_inventory(tmp_path / "inventory.yaml", node_port=dead)
    r = gd("check", "--host", "ct200", "--inventory", str(inv), "--json")
    d = json.loads(r.stdout)
    assert r.returncode == 2 and d["root_cause"]["key"] == "devices.node.open[/dev/nvidia-uvm]"
    cfg = next(f for f in d["findings"] if f["id"] == "boundary.lxc.config")
    assert cfg["status"] == "unknown" and cfg["summary"].startswith("cannot reach the Proxmox host: kpro6: connection")


def test_lxc_audit_and_fix_name_the_proxmox_host_and_vmid(seed_lab):
    inv = str(seed_lab.inventory)
    r = gd("lxc", "audit", "--host", "kpro6", "200", "--inventory", inv)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.startswith("ct200 (/etc/pve/lxc/200.conf): FAIL\nFAIL boundary.lxc.cgroup_allow[/dev/nvidia-uvm]: "
                               f"/dev/nvidia-uvm: major {L.UVM_MAJOR} (nvidia-uvm) is not allowed by ct200's config")
    r = gd("lxc", "fix", "--host", "kpro6", "--inventory", inv)
    assert r.returncode == 3 and "kpro6 is a Proxmox host: give the container's VMID too" in r.stderr
    r = gd("lxc", "fix", "--host", "ct200", "--config", "/x.conf", "--inventory", inv)
    assert r.returncode == 3 and "cannot be combined with it" in r.stderr


def test_a_lab_cycle_leaves_nothing_behind_even_when_a_start_fails(lab_parts, tmp_path):
    """Acceptance 3: no container, cgroup, veth, route, mount, sshd or lock of a lab remains after it closes."""
    t0 = time.monotonic()
    with L.LxcLab(tmp_path / "ok") as lab:
        started = time.monotonic() - t0
        assert lab.status() == "running" and lab.cgroup.is_dir() and lab.leftovers()
        pid = lab.init_pid()
        with open_target("ct200", str(lab.inventory)) as t:
            assert t.host.run(["hostname"]).stdout.strip() == "ct200"
    cycle = time.monotonic() - t0
    assert lab.leftovers() == []
    assert gone(pid)  # ct200's init is gone
    # a start that fails (a devN: path the node does not have) cleans up before it raises
    bad = L.LxcLab(tmp_path / "bad")
    bad.config = bad.seed.replace(b"features:", b"dev0: /dev/nvidia9\nfeatures:")
    try:
        bad.start()
        raise AssertionError("a start with a missing devN: path succeeded")
    except RuntimeError as exc:
        assert "Device /dev/nvidia9 does not exist" in str(exc)
    assert bad.leftovers() == []
    print(f"\nLXC lab: start to sshd accepting {started:.2f} s, whole cycle {cycle:.2f} s")


KILLED = """
import json, sys, time
from pathlib import Path
from tests import lxclab as L
lab = L.LxcLab(Path(sys.argv[1])).start()
print(json.dumps({"cgroup": str(lab.cgroup), "pair": lab.pair, "net": lab.net, "port": lab.node_port,
                  "registry": str(lab.registry), "init": lab.init_pid()}), flush=True)
time.sleep(600)
"""


def test_a_lab_whose_test_session_was_killed_is_removed_at_the_next_start(lab_parts, tmp_path):
    """SIGKILL the process that owns a running lab: the node, ct200 and its veth live on; remove_stale() (which
    every session fixture calls first) kills them through the lab's cgroup and removes cgroups, route, registry."""
    import os
    import sys

    p = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path / "lab")], stdout=subprocess.PIPE, text=True,
                         cwd=str(L.REPO), env={**os.environ, "PYTHONPATH": pythonpath(env={})})
    try:
        info = json.loads(p.stdout.readline())
    finally:
        p.kill()
        p.wait()
    assert L.Path(info["cgroup"]).is_dir() and L.Path(f"/proc/{info['init']}").exists()  # still running
    assert subprocess.run(["ip", "link", "show", info["pair"]], capture_output=True).returncode == 0
    L.remove_stale()
    assert not L.Path(info["cgroup"]).exists() and not L.Path(info["registry"]).exists()
    assert gone(info["init"])
    assert subprocess.run(["ip", "link", "show", info["pair"]], capture_output=True).returncode != 0
    assert subprocess.run(["ip", "route", "show", info["net"], "table", "all"], capture_output=True,
                          text=True).stdout.strip() == ""
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", info["port"])) != 0  # the node's sshd is gone
