"""The end-to-end lab: the seed's LXC container ct200 and its Proxmox host kpro6, built from real parts on one
machine without a GPU (docs/testing.md explains every choice).

Proxmox host kpro6 = the shared test sshd (tests/sshd.py) with a fake root: /etc/pve/lxc/200.conf (the seed's
config), /proc/devices (nvidia-uvm at 511), the host's /dev/nvidia* nodes (mknod), /var/lib/lxc/200/config, and
a `pct` stand-in (tests/standins/pct.py) named by the inventory's `pct:` key.

Container ct200 = a second real sshd started inside
  - a cgroup v1 `devices` child cgroup whose rules `pct start` builds from the container config, as LXC does
    (deny all, LXC's base list, then the config's allow rules): major 511 is not allowed, so every open() of
    /dev/nvidia-uvm in every SSH session gets a real EPERM from the kernel although the node's mode is 0666;
  - new mount, pid and uts namespaces: its /dev is the directory `pct start` populates from the config's mount
    entries (real nodes with the host's majors), /proc/devices and /proc/modules are bind-mounted captures,
    /proc/driver/nvidia/version sits on a small tmpfs, pid 1 carries container=lxc, the hostname is ct200.
Every session gets (sshd SetEnv): PATH with the nvidia-smi stand-in first, LD_LIBRARY_PATH with the libcuda
stand-in (libcuda.so.1, tests/standins/libcuda_stub.c), and LD_PRELOAD with the driver shim
(tests/standins/nvidia_driver_shim.c) that answers open() where the kernel found no NVIDIA driver (ENXIO) — and
nowhere else: the cgroup's EPERM and every other refusal stay the kernel's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.sshd import SSHD, start_sshd

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "standins"
CAPTURE = REPO / "tests" / "fixtures" / "captures" / "h200-healthy"
PROXMOX_FIXTURES = REPO / "tests" / "fixtures" / "proxmox"
SEED_CONFIG = (PROXMOX_FIXTURES / "configs" / "200-seed.conf").read_bytes()
PROC_DEVICES = (PROXMOX_FIXTURES / "proc-devices-uvm511.txt").read_text()
CGROUP_V1 = Path("/sys/fs/cgroup/devices")
CGROUP_PREFIX = "gpudoctor-e2e-"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The fixed line the LXC fix inserts into the seed config (after the last live allow line), and the keyless line
# it removes: the fully fixed file.
SEED_FIXED = SEED_CONFIG.replace(b"c 511:* rwm\n", b"").replace(
    b"c 234:* rwm\n", b"c 234:* rwm\nlxc.cgroup2.devices.allow: c 511:* rwm\n")


def capture(name: str) -> str:
    """A capture file without its `$ command` first line and `# rc=N` last line."""
    lines = (CAPTURE / name).read_text().splitlines(keepends=True)
    return "".join(ln for ln in lines if not ln.startswith(("$ ", "# rc=")))


def majors(proc_devices: str) -> dict[str, int]:
    out, section = {}, None
    for line in proc_devices.splitlines():
        if line.endswith(":"):
            section = line
        elif section and section.startswith("Character") and line.strip():
            num, name = line.split(None, 1)
            out.setdefault(name.strip(), int(num))
    return out


def gpu_nodes(proc_devices: str) -> list[tuple[str, int, int, int]]:
    """The Proxmox host's NVIDIA nodes as the H200 had them (path, major, minor, mode), majors from /proc/devices."""
    m = majors(proc_devices)
    return [("/dev/nvidia0", m["nvidia"], 0, 0o666), ("/dev/nvidiactl", m["nvidia"], 255, 0o666),
            ("/dev/nvidia-uvm", m["nvidia-uvm"], 0, 0o666), ("/dev/nvidia-uvm-tools", m["nvidia-uvm"], 1, 0o666),
            ("/dev/nvidia-caps/nvidia-cap1", m["nvidia-caps"], 1, 0o400),
            ("/dev/nvidia-caps/nvidia-cap2", m["nvidia-caps"], 2, 0o444)]


@dataclass
class Standins:
    bin: Path  # nvidia-smi
    lib: Path  # libcuda.so.1
    shim: Path  # the driver shim (LD_PRELOAD)


def build_standins(d: Path) -> Standins:
    """Compile the libcuda stand-in and the driver shim with gcc; put nvidia-smi alone in a bin directory."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "bin").mkdir(exist_ok=True)
    (d / "lib").mkdir(exist_ok=True)
    shutil.copy(STANDINS / "nvidia-smi", d / "bin" / "nvidia-smi")
    os.chmod(d / "bin" / "nvidia-smi", 0o755)
    for src, out, extra in (("libcuda_stub.c", d / "lib" / "libcuda.so.1", ["-Wl,-soname,libcuda.so.1"]),
                            ("nvidia_driver_shim.c", d / "nvidia_driver_shim.so", ["-ldl"])):
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(out), str(STANDINS / src),
                        *extra], check=True, capture_output=True, text=True)
    return Standins(d / "bin", d / "lib", d / "nvidia_driver_shim.so")


@dataclass
class Proxmox:
    """The fake Proxmox host's files. `lab.json` describes the lab to the pct stand-in."""

    root: Path
    lab_json: Path
    pct: Path  # the wrapper the inventory's `pct:` names
    state: Path
    config_dir: str = "/etc/pve/lxc"

    def path(self, remote: str) -> Path:
        return self.root / remote.lstrip("/")

    def config_file(self, vmid: int = 200) -> Path:
        return self.path(f"{self.config_dir}/{vmid}.conf")

    def write_config(self, data: bytes, vmid: int = 200) -> None:
        p = self.config_file(vmid)
        p.write_bytes(data)
        os.chmod(p, 0o640)

    def backups(self, vmid: int = 200) -> list[Path]:
        d = self.path("/var/lib/gpudoctor/backups") / self.config_dir.lstrip("/")
        return sorted(d.glob(f"{vmid}.conf.*")) if d.is_dir() else []

    def temps(self, vmid: int = 200) -> list[str]:
        return sorted(n for n in os.listdir(self.config_file(vmid).parent) if n != f"{vmid}.conf")

    def calls(self) -> list[str]:
        p = self.state / "calls"
        return p.read_text().splitlines() if p.exists() else []

    def pct_run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.pct), *args], capture_output=True, text=True, timeout=30)

    def reset(self, config: bytes = SEED_CONFIG) -> None:
        """The seed's state: original config, no backups, no temp files, the container (re)started with it."""
        self.write_config(config)
        for name in self.temps():
            os.unlink(self.config_file().parent / name)
        shutil.rmtree(self.path("/var/lib/gpudoctor"), ignore_errors=True)
        r = self.pct_run("start", "200")
        assert r.returncode == 0, r.stderr


def make_proxmox(d: Path, guests: dict) -> Proxmox:
    root, state = d / "root", d / "state"
    state.mkdir(parents=True)
    (root / "etc/pve/lxc").mkdir(parents=True)
    (root / "proc").mkdir()
    (root / "proc/devices").write_text(PROC_DEVICES)
    (root / "var/lib/lxc").mkdir(parents=True)
    (root / "usr/sbin").mkdir(parents=True)
    (root / "dev/nvidia-caps").mkdir(parents=True)
    for path, major, minor, mode in gpu_nodes(PROC_DEVICES):
        p = root / path.lstrip("/")
        os.mknod(p, 0o020000 | mode, os.makedev(major, minor))
        os.chmod(p, mode)
    lab_json = d / "lab.json"
    lab_json.write_text(json.dumps({"root": str(root), "config_dir": "/etc/pve/lxc", "state_dir": str(state),
                                    "nsenter": shutil.which("nsenter") or "/usr/bin/nsenter", "guests": guests},
                                   indent=1))
    pct = root / "usr/sbin/pct"
    pct.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S {STANDINS / 'pct.py'} {lab_json} \"$@\"\n")
    os.chmod(pct, 0o755)
    px = Proxmox(root, lab_json, pct, state)
    px.write_config(SEED_CONFIG)
    return px


INIT = """\
#!/bin/sh
# pid 1 of the test container (tests/e2e/lab.py): its /dev and /proc views, its hostname; then sshd.
set -e
ct=$1; shift
hostname "$(cat "$ct/hostname")"
mount --bind "$ct/dev" /dev
mount --bind "$ct/proc-devices" /proc/devices
# a kernel built without module support (CONFIG_MODULES=n, like our CI VMs) has no /proc/modules to cover
if [ -e /proc/modules ]; then mount --bind "$ct/proc-modules" /proc/modules; fi
mount -t tmpfs -o mode=0755,size=64k gpudoctor-lab /proc/driver
mkdir /proc/driver/nvidia
cp "$ct/driver-version" /proc/driver/nvidia/version
"$@" &
trap 'kill $! 2>/dev/null' TERM INT
wait
"""


@dataclass
class Container:
    name: str
    vmid: int
    dir: Path
    cgroup: Path
    sshd: SSHD
    init_pid: int
    env: dict = field(default_factory=dict)

    def stop(self) -> None:
        """SIGKILL to unshare kills the container's pid 1 (--kill-child), which takes every process inside with it."""
        p = self.sshd.proc
        if p.poll() is None:
            p.kill()
        p.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if not (self.cgroup / "cgroup.procs").read_text().split():
                    break
            except OSError:
                break
            time.sleep(0.02)
        try:
            self.cgroup.rmdir()
        except OSError:
            pass

    def sessions(self) -> int:
        """How many commands or SFTP sessions the container's sshd has started so far."""
        return self.sshd.log.read_text(errors="replace").count("Starting session: ")


def remove_stale_cgroups() -> None:
    """Cgroups an earlier, killed test session left (no process in them any more)."""
    for cg in CGROUP_V1.glob(CGROUP_PREFIX + "*"):
        try:
            if not (cg / "cgroup.procs").read_text().split():
                cg.rmdir()
        except OSError:
            pass


def start_container(d: Path, px: Proxmox, standins: Standins, guest: dict, *, name: str = "ct200",
                    vmid: int = 200) -> Container:
    """Start ct200's sshd inside its device cgroup and namespaces (see the module docstring)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "hostname").write_text(name + "\n")
    (d / "proc-devices").write_text(PROC_DEVICES)  # one kernel: the guest sees the host's /proc/devices
    (d / "proc-modules").write_text(capture("modules.txt"))
    (d / "driver-version").write_text(capture("driver-version.txt"))
    (d / "init.sh").write_text(INIT)
    cgroup = Path(guest["cgroup"])
    cgroup.mkdir()
    try:
        r = px.pct_run("start", str(vmid))
        assert r.returncode == 0, r.stderr
        wrap = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"),
                "unshare", "--fork", "--pid", "--mount-proc", "--mount", "--uts", "--propagation", "private",
                "--kill-child", "env", "container=lxc", "/bin/sh", str(d / "init.sh"), str(d)]
        # VERBOSE: sshd logs "Starting session: command|subsystem ..." for every command run (tests count them)
        server = start_sshd(d / "sshd", setenv=guest["env"], wrap=wrap, loglevel="VERBOSE")
    except BaseException:
        cgroup.rmdir()
        raise
    init_pid = _child_of(server.proc.pid)
    Path(guest["init_pid_file"]).write_text(f"{init_pid}\n")
    return Container(name, vmid, d, cgroup, server, init_pid, guest["env"])


def _child_of(pid: int) -> int:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if kids:
            return int(kids[0])
        time.sleep(0.01)
    raise RuntimeError(f"unshare {pid} has no child")


def guest_spec(d: Path, standins: Standins, proc_devices: str = PROC_DEVICES, name: str = "ct200") -> dict:
    """The pct stand-in's view of the container: name, cgroup, /dev directory, pid file, session environment."""
    driver_majors = sorted({v for k, v in majors(proc_devices).items() if k.startswith("nvidia")})
    env = {"PATH": f"{standins.bin}:{BASE_PATH}", "LD_LIBRARY_PATH": str(standins.lib),
           "LD_PRELOAD": str(standins.shim), "GPUDOCTOR_SHIM_MAJORS": ",".join(map(str, driver_majors)),
           "GPUDOCTOR_STANDIN_CAPTURE": str(CAPTURE)}
    return {"name": name, "cgroup": str(CGROUP_V1 / f"{CGROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"),
            "dev_dir": str(d / "dev"), "init_pid_file": str(d / "init.pid"), "env": env}


def inventory_text(px_sshd: SSHD, px: Proxmox, ct: Container, known_hosts: Path, ssh_config: Path, *,
                   vmid: int | None = 200, host_extra: str = "", proxmox_extra: str = "",
                   config_dir: str | None = None, pct: list[str] | None = None) -> str:
    """An inventory naming ct200 (the container's sshd) on kpro6 (the shared sshd with the fake Proxmox root)."""
    lxc = f"{{proxmox: kpro6, vmid: {vmid}}}" if vmid is not None else "{proxmox: kpro6}"
    pct_list = json.dumps(pct if pct is not None else [str(px.pct)])
    return (
        "version: 1\n"
        "defaults:\n"
        f"  user: {px_sshd.user}\n"
        f"  known_hosts: {json.dumps(str(known_hosts))}\n"
        f"  ssh_config: {json.dumps(str(ssh_config))}\n"
        "  host_key_policy: strict\n"
        "  connect_timeout: 5\n"
        "proxmox:\n"
        "  kpro6:\n"
        f"    address: 127.0.0.1\n    port: {px_sshd.port}\n"
        f"    identity_file: {json.dumps(str(px_sshd.client_key))}\n"
        f"    test_root: {json.dumps(str(px.root))}\n"
        f"    config_dir: {json.dumps(config_dir or px.config_dir)}\n"
        f"    pct: {pct_list}\n"
        f"{proxmox_extra}"
        "hosts:\n"
        "  ct200:\n"
        f"    address: 127.0.0.1\n    port: {ct.sshd.port}\n"
        f"    identity_file: {json.dumps(str(ct.sshd.client_key))}\n"
        f"    lxc: {lxc}\n"
        "    expect: {gpus: 1}\n"
        f"{host_extra}"
    )

