"""The LXC lab: a Proxmox node and its container ct200 on real LXC, the kernel's cgroup2 eBPF device controller and
real sshd, built and torn down per test session on one machine without a GPU (docs/testing.md says what is real).

Fixture API (tests/e2e/conftest.py gives `lxclab` for the session and `seed_lab` reset per test; anything else can
build its own with `with LxcLab(tmp_dir) as lab:`):

    skip_reason() -> str | None        why the lab cannot run here (one line naming what is missing and the
                                       install command), None when it can
    LxcLab(base, *, layout="unified", config=SEED_CONFIG)
      .start() / .close()              (also a context manager) everything the lab makes lives under `base`,
                                       one cgroup /sys/fs/cgroup/unified/gpudoctor-lab-<id>, one veth pair and
                                       the namespaces of its processes; close() removes all of it and checks
      .leftovers() -> list[str]        what of this lab still exists (empty after close())
      .inventory_text(**kw) / .write_inventory(path, **kw)
                                       an inventory naming ct200 (lxc: {proxmox: kpro6, vmid: 200}) and kpro6
      .config_file / .write_config(b) / .backups() / .temps()
                                       /etc/pve/lxc/200.conf of the node (a real file the test can read)
      .pct(*args) -> CompletedProcess  the node's `pct` (list/config/status/start/stop/reboot/exec), run in the
                                       node's namespaces as an SSH session would; .calls() lists the calls
      .reset(config=SEED_CONFIG)       the seed's state: that config, no backups or temp files, ct200 running
                                       with it (restarted only when it started from other bytes), uvm on 7
      .move_uvm(major=511)             a driver update's device naming: nvidia-uvm(-tools) on `major` in the
                                       node's /dev and in the lab's /proc/devices (node and ct200); ct200 keeps
                                       its device program and its bind-mounted old nodes until it restarts
      .init_pid() -> int               ct200's init (pid 1 inside) as the host sees it; a restart changes it
      .running_config() -> str         /var/lib/lxc/200/config, written by `pct start`
      .wait_ssh() / .sessions()        ct200's sshd accepts; how many sessions it has started
      .node_sshd / .ct_addr / .ct_port / .known_hosts / .client_key / .lxc_log()
    Layout "unified": the node's /sys/fs/cgroup is a pure cgroup2 mount (a PVE 7+ host): LXC builds an eBPF
    device program from lxc.cgroup2.devices.*. Layout "hybrid": the node keeps this machine's hybrid layout (a
    host booted with systemd.unified_cgroup_hierarchy=0): LXC ignores lxc.cgroup2.* and writes the v1
    lxc.cgroup.devices.* rules to the devices controller.

Names: nvidia0 195:0, nvidiactl 195:255 (no driver here: the kernel answers ENXIO after the device program let
the open through; the driver shim answers in its place); nvidia-uvm and nvidia-uvm-tools on major 7 with minors
0 and 1: the lab's /proc/devices (in the node's and ct200's namespaces) names major 7 nvidia-uvm, and major 7
is the kernel's vcs driver, which really accepts the open once the device program allows it. After move_uvm()
nvidia-uvm is on 511 as on the seed's host after its driver update: no driver holds 511 here, so an open the device
program lets through gets ENXIO from the kernel, which the driver shim answers (GPUDOCTOR_SHIM_MAJORS lists 511);
one the device program refuses gets the kernel's EPERM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.sshd import find_sshd, lab_penalty_config, sshd_config, sshd_version

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "tests" / "standins"
CAPTURE = REPO / "tests" / "fixtures" / "captures" / "h200-healthy"
PROXMOX_FIXTURES = REPO / "tests" / "fixtures" / "proxmox"
PREFIX = "gpudoctor-lab-"
REGISTRY = Path("/run/gpudoctor-lab")  # one file per running lab: what a killed session's lab must have removed
UVM_MAJOR = 7  # the kernel's vcs driver: a real driver that accepts open(O_RDWR) of minors 0 and 1
MOVED_UVM_MAJOR = 511  # where the seed's driver update put nvidia-uvm (move_uvm): no driver holds it here
CAPS_MAJOR = 234
PACKAGES = "apt-get install lxc bpftool busybox-static openssh-server gcc util-linux iproute2"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STANDIN_DIR = "/opt/gpudoctor-lab"  # in ct200's rootfs


def _lab_proc_devices(uvm_major: int = UVM_MAJOR) -> str:
    """The H200's /proc/devices with nvidia-uvm on UVM_MAJOR (the line of the driver that really holds it goes), or
    as captured (nvidia-uvm on MOVED_UVM_MAJOR, 7 the kernel's vcs) after move_uvm()."""
    text = (PROXMOX_FIXTURES / "proc-devices-uvm511.txt").read_text()
    if uvm_major == MOVED_UVM_MAJOR:
        return text
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] == str(UVM_MAJOR) and out and not out[-1].startswith("Block"):
            if "Block devices:" not in out:
                out.append(f"{UVM_MAJOR:3d} nvidia-uvm")
                continue
        if f == ["511", "nvidia-uvm"]:
            continue
        out.append(line)
    return "\n".join(out) + "\n"


PROC_DEVICES = _lab_proc_devices()


def _lab_config(seed: bytes) -> bytes:
    """The seed config for the lab: uvm's major is the lab's, ct200 boots the lab's init, net0 is host-managed."""
    return seed.replace(b"511:", f"{UVM_MAJOR}:".encode()).replace(
        b"cores: 32\n", b"cores: 32\nentrypoint: /sbin/lab-init\n").replace(
        b"ip=dhcp,type=veth", b"host-managed=1,ip=@CTIP@,type=veth")


SEED_TEMPLATE = _lab_config((PROXMOX_FIXTURES / "configs" / "200-seed.conf").read_bytes())


COMPONENTS = ("lxc-start", "bpftool", "busybox", "sshd", "ssh-keygen", "gcc", "unshare", "nsenter")


def skip_reason() -> str | None:
    """One line naming what is missing (and the install command), None when the lab can run."""
    from tests import needs

    if os.geteuid() != 0:
        return needs.ROOT_LINE  # it starts real containers and cgroups
    for name in COMPONENTS:
        if needs.find(name) is None:
            return f"{name} is not installed{needs.MARK}: {needs.COMPONENTS[name][1]}"
    if not shutil.which("ip"):
        return f"ip is not installed{needs.MARK}: apt-get install iproute2"
    if _cgroup2_root() is None:
        return "no cgroup2 hierarchy is mounted (/sys/fs/cgroup/unified or /sys/fs/cgroup)"
    if [str(UVM_MAJOR), "vcs"] not in [ln.split() for ln in Path("/proc/devices").read_text().splitlines()]:
        return (f"this kernel has no vcs driver on major {UVM_MAJOR} (CONFIG_VT): the LXC lab stands nvidia-uvm on "
                f"it so that an allowed open reaches a real driver")
    return None


def _busybox() -> str:
    from tests import needs

    return needs.find("busybox")


def _cgroup2_root() -> Path | None:
    for p in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        try:
            with open("/proc/self/mountinfo") as fh:
                if any(ln.split(" - ")[1].split()[0] == "cgroup2" and ln.split()[4] == p for ln in fh):
                    return Path(p)
        except (OSError, IndexError):
            return None
    return None


def seed_config(ct_ip: str) -> bytes:
    return SEED_TEMPLATE.replace(b"@CTIP@", f"{ct_ip}/30".encode())


def fixed(config: bytes) -> bytes:
    """What `lxc fix` makes of the seed: the keyless line gone, the keyed allow line after the last allow line."""
    line = f"c {UVM_MAJOR}:* rwm\n".encode()
    return config.replace(b"\n" + line, b"\n", 1).replace(
        b"c 234:* rwm\n", b"c 234:* rwm\nlxc.cgroup2.devices.allow: " + line, 1)


def capture(name: str) -> str:
    lines = (CAPTURE / name).read_text().splitlines(keepends=True)
    return "".join(ln for ln in lines if not ln.startswith(("$ ", "# rc=")))


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpudoctor-lab", "-f", str(path)],
                   check=True, stdout=subprocess.DEVNULL)
    return path


def _pub(path: Path) -> str:
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_banner(addr: str, port: int, timeout: float, alive=lambda: True) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            return False
        try:
            with socket.create_connection((addr, port), timeout=1.0) as s:
                if s.recv(64).startswith(b"SSH-2.0"):
                    return True
        except OSError:
            time.sleep(0.02)
    return False


def _pick_subnet() -> tuple[str, str, str]:
    """A private /30 that no address or route of this machine uses: (network/30, host end, ct200)."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    for _ in range(200):
        n = int.from_bytes(os.urandom(2), "big")
        base = f"10.{200 + n % 50}.{(n >> 6) % 256}"
        last = (n % 64) * 4
        net = f"{base}.{last}/30"
        if f" {base}." not in used and f"{base}.{last}/30" not in routes:
            return net, f"{base}.{last + 1}", f"{base}.{last + 2}"
    raise RuntimeError("no free 10.200-249.x.x/30 for the lab's veth")


NODE_INIT = """\
#!/bin/sh
# The Proxmox node's namespaces (tests/lxclab.py): a private mount namespace and a cgroup namespace rooted at the
# lab's cgroup; then its sshd.
set -e
L=$1 layout=$2; shift 2
if [ "$layout" = unified ]; then mount -t cgroup2 cgroup2 /sys/fs/cgroup; fi
# hybrid: this machine's layout, each hierarchy mounted afresh inside the cgroup namespace (rooted at the lab's
# cgroups), so LXC builds below them and never in the machine's root cgroups
if [ "$layout" = hybrid ]; then . "$L/node/hybrid-mounts.sh"; fi
mount -t overlay gpudoctor-lab-etc -o "lowerdir=/etc,upperdir=$L/node/etc.upper,workdir=$L/node/etc.work" /etc
mount --bind "$L/node/pve" /etc/pve
mount -t overlay gpudoctor-lab-var -o "lowerdir=/var/lib,upperdir=$L/node/var.upper,workdir=$L/node/var.work" /var/lib
mount --bind "$L/lxc" /var/lib/lxc
mount --bind "$L/node/gpudoctor" /var/lib/gpudoctor
mount -t tmpfs -o mode=0755,size=1m gpudoctor-lab-run /run/lxc
mount --bind "$L/node/sbin" /usr/local/sbin
mount --bind "$L/node/proc-devices" /proc/devices
mount --bind "$L/node/dev" /dev
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts
mount -t tmpfs -o mode=1777,size=1m shm /dev/shm
echo ready > "$L/node/state/ns-ready"
exec "$@"
"""

CT_INIT = """\
#!/bin/sh
# pid 1 of ct200 (tests/lxclab.py): the lab's /proc views, then sshd; a shell stays pid 1 (as LXC's init would).
D=/opt/gpudoctor-lab
mount --bind $D/proc-devices /proc/devices
if [ -e /proc/modules ]; then mount --bind $D/proc-modules /proc/modules; fi
mount -t tmpfs -o mode=0755,size=64k gpudoctor-lab /proc/driver
mkdir /proc/driver/nvidia
cp $D/driver-version /proc/driver/nvidia/version
mkdir -p /run/sshd
/usr/sbin/sshd -D -E /var/log/sshd.log -f /etc/ssh/sshd_config &
trap 'kill $! 2>/dev/null' TERM INT
while :; do wait; done
"""

AUTODEV_HOOK = """\
#!/bin/sh
# lxc.hook.autodev (the job of pve-container's lxc-pve-autodev-hook): bind the devN: nodes `pct start` made in
# /var/lib/lxc/VMID/passthrough into the container's /dev.
set -e
list=/var/lib/lxc/$LXC_NAME/passthrough/devices
[ -f "$list" ] || exit 0
while IFS=: read -r type major minor path; do
  rel=${path#/dev/}
  mkdir -p "$(dirname "$LXC_ROOTFS_MOUNT/dev/$rel")"
  : > "$LXC_ROOTFS_MOUNT/dev/$rel"
  mount --bind "/var/lib/lxc/$LXC_NAME/passthrough/dev/$rel" "$LXC_ROOTFS_MOUNT/dev/$rel"
done < "$list"
"""

NETUP = """\
#!/bin/sh
# lxc.net.N.script.up (where PVE's lxcnetaddbr adds the host end to a bridge): give it the /30's host address.
exec ip addr add {addr}/30 dev "$5"
"""

BUSYBOX_APPLETS = ("sh", "mount", "umount", "mkdir", "cat", "cp", "ls", "sleep", "hostname", "ip", "kill", "ps",
                   "grep", "tr", "rm", "env", "true", "false", "echo", "test", "[", "head", "sed", "id")


def _apparmor_enabled() -> bool:
    try:
        return Path("/sys/module/apparmor/parameters/enabled").read_text().strip() == "Y"
    except OSError:
        return False


def _v1_hierarchies() -> list[tuple[Path, str, str]]:
    """This machine's cgroup v1 mounts under /sys/fs/cgroup: (mount point, mount options, our cgroup in it)."""
    mine = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(","):
            if c:
                mine[c] = path
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(r) >= 3 and r[0] == "cgroup" and f[4].startswith("/sys/fs/cgroup/"):
            opts = [o for o in r[2].split(",") if o not in ("rw", "ro")]
            key = next((o for o in opts if o in mine), None)
            out.append((Path(f[4]), ",".join(opts if key != "name=systemd" else ["none", *opts]),
                        mine.get(key, "/")))
    return out


class LxcLab:
    def __init__(self, base: Path, *, layout: str = "unified", config: bytes | None = None, vmid: int = 200,
                 name: str = "ct200"):
        self.base = Path(base)
        self.layout = layout
        self.vmid, self.name = vmid, name
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        root = _cgroup2_root()
        self.cgroup = (root or Path("/sys/fs/cgroup/unified")) / f"{PREFIX}{self.id}"
        # hybrid: one lab cgroup below ours in each v1 hierarchy too (memory's stays inside our own memory cgroup)
        self.v1 = [(mnt, opts, mnt / cur.lstrip("/") / f"{PREFIX}{self.id}")
                   for mnt, opts, cur in _v1_hierarchies()] if layout == "hybrid" else []
        self.pair = f"gdl{uuid.uuid4().hex[:8]}i0"
        self.net, self.host_ip, self.ct_ip = _pick_subnet()
        self.ct_addr, self.ct_port = self.ct_ip, 22
        self.node = self.base / "node"
        self.lxcpath = self.base / "lxc"
        self.rootfs = self.lxcpath / str(vmid) / "rootfs"
        self.state = self.node / "state"
        self.config = config  # the config ct200 first starts with (None: the seed's)
        self.node_proc: subprocess.Popen | None = None
        self.node_port = 0
        self._started_pids: list[int] = []
        self.uvm_major = UVM_MAJOR

    # -- building --------------------------------------------------------------------------------------------

    def __enter__(self) -> LxcLab:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> LxcLab:
        try:
            self._build()
            self._start_node()
            self.write_config(self.seed if self.config is None else self.config)
            r = self.pct("start", str(self.vmid))
            if r.returncode != 0:
                raise RuntimeError(f"pct start {self.vmid} failed: {r.stderr.strip()}\n{self.lxc_log()[-3000:]}")
            self.wait_ssh()
            self.known_hosts = self.base / "known_hosts"
            self.known_hosts.write_text(self.known_hosts_lines)
            self.inventory = self.write_inventory(self.base / "inventory.yaml")
        except BaseException:
            self.close(check=False)
            raise
        return self

    @property
    def seed(self) -> bytes:
        """The seed's config for this run (its net0 carries this run's address)."""
        return seed_config(self.ct_ip)

    def _build(self) -> None:
        for d in (self.node / "etc.upper" / "pve", self.node / "etc.work", self.node / "pve" / "lxc",
                  self.node / "var.upper" / "lxc", self.node / "var.upper" / "gpudoctor", self.node / "var.work",
                  self.node / "gpudoctor",
                  self.node / "sbin", self.state, self.node / "dev" / "pts", self.node / "dev" / "shm",
                  self.node / "dev" / "nvidia-caps", self.lxcpath / str(self.vmid)):
            d.mkdir(parents=True, exist_ok=True)
        self.cgroup.mkdir()
        self.registry = None
        for mnt, _, cg in self.v1:
            cg.mkdir()
            if (cg / "cpuset.cpus").exists():  # a new cpuset takes no process until it has CPUs and memory nodes
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (cg / f).write_text((cg.parent / f).read_text())
        (self.node / "cgroups").write_text("".join(f"{p}\n" for p in self.procs_files()))
        (self.node / "hybrid-mounts.sh").write_text(
            "mount -t tmpfs -o mode=0755 gpudoctor-lab-cgroup /sys/fs/cgroup\n"
            + "".join(f"mkdir /sys/fs/cgroup/{m.name}; mount -t cgroup -o {o} cgroup /sys/fs/cgroup/{m.name}\n"
                      for m, o, _ in self.v1)
            + "mkdir /sys/fs/cgroup/unified; mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified\n")
        # while the veth is down (before start, across restarts, after a failure) the /30 is unreachable here:
        # nothing aimed at ct200 may leave through the default route
        REGISTRY.mkdir(exist_ok=True)
        self.registry = REGISTRY / f"{self.id}.json"
        self.registry.write_text(json.dumps({"cgroups": [str(self.cgroup), *(str(c) for _, _, c in self.v1)],
                                             "route": self.net, "pair": self.pair}))
        subprocess.run(["ip", "route", "add", "unreachable", self.net, "metric", "4242"], check=True)
        self._route = True
        self._mkdev(self.node / "dev")
        (self.node / "proc-devices").write_text(PROC_DEVICES)
        keys = self.base / "keys"
        keys.mkdir()
        self.client_key = _keygen(keys / "client_key")
        self.node_host_key = _keygen(keys / "node_host_key")
        self.ct_host_key = _keygen(keys / "ct_host_key")
        self._build_rootfs()
        env = self.session_env()
        lab = {"lxcpath": str(self.lxcpath), "state_dir": str(self.state), "node": "kpro6",
               "netup": str(self.node / "netup"), "autodev_hook": str(self.node / "autodev-hook"),
               "guests": {str(self.vmid): {"name": self.name, "env": env, "net": {"pair": self.pair},
                                           "lab_lines": self.lab_lines()}}}
        (self.node / "lab.json").write_text(json.dumps(lab, indent=1))
        for name, text in (("netup", NETUP.format(addr=self.host_ip)), ("autodev-hook", AUTODEV_HOOK),
                           ("init.sh", NODE_INIT)):
            (self.node / name).write_text(text)
            os.chmod(self.node / name, 0o755)
        pct = self.node / "sbin" / "pct"
        pct.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S {STANDINS / 'pct.py'} {self.node / 'lab.json'} "
                       "\"$@\"\n")
        os.chmod(pct, 0o755)

    def lab_lines(self) -> list[str]:
        # relative = 1: LXC 5.0.2 with relative = 0 opens the hierarchy's root through ".." of its own cgroup,
        # which fails (EXDEV) at the root of the node's cgroup namespace; with 1 it builds below it, which there
        # is the same place (the namespace's root)
        lines = ["lxc.cgroup.relative = 1", "lxc.tty.dir =", "lxc.mount.entry = /usr usr none ro,bind 0 0"]
        if _apparmor_enabled() and not shutil.which("apparmor_parser"):
            # PVE's `generated` profile needs apparmor_parser; a CI machine with AppArmor on but no parser gets
            # none (this kernel has no AppArmor: LXC then ignores the apparmor lines, as here)
            lines.append("lxc.apparmor.profile = unconfined")
        return lines

    def session_env(self) -> dict[str, str]:
        d = STANDIN_DIR
        return {"PATH": f"{d}/bin:{BASE_PATH}", "LD_LIBRARY_PATH": f"{d}/lib", "LD_PRELOAD": f"{d}/nvidia_driver_shim.so",
                "GPUDOCTOR_SHIM_MAJORS": f"195,{CAPS_MAJOR},{MOVED_UVM_MAJOR}", "GPUDOCTOR_STANDIN_CAPTURE": f"{d}/capture"}

    def _mkdev(self, dev: Path) -> None:
        """The node's /dev: the base nodes sshd and LXC use, and the GPU nodes with the H200's modes."""
        for name, major, minor, mode in (("null", 1, 3, 0o666), ("zero", 1, 5, 0o666), ("full", 1, 7, 0o666),
                                         ("random", 1, 8, 0o666), ("urandom", 1, 9, 0o666), ("tty", 5, 0, 0o666),
                                         ("nvidia0", 195, 0, 0o666), ("nvidiactl", 195, 255, 0o666),
                                         ("nvidia-uvm", self.uvm_major, 0, 0o666),
                                         ("nvidia-uvm-tools", self.uvm_major, 1, 0o666),
                                         ("nvidia-caps/nvidia-cap1", CAPS_MAJOR, 1, 0o400),
                                         ("nvidia-caps/nvidia-cap2", CAPS_MAJOR, 2, 0o444)):
            os.mknod(dev / name, 0o020000 | mode, os.makedev(major, minor))
            os.chmod(dev / name, mode)
        os.symlink("pts/ptmx", dev / "ptmx")
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                             ("stderr", "/proc/self/fd/2")):
            os.symlink(target, dev / name)

    def _build_rootfs(self) -> None:
        r = self.rootfs
        for d in ("bin", "sbin", "etc/ssh", "root", "dev", "proc", "sys", "run", "tmp", "var/log", "usr",
                  STANDIN_DIR.lstrip("/") + "/bin", STANDIN_DIR.lstrip("/") + "/lib"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "tmp", 0o1777)
        for link in ("lib", "lib64"):
            if os.path.isdir(f"/usr/{link}"):
                os.symlink(f"usr/{link}", r / link)
        shutil.copy(_busybox(), r / "bin" / "busybox")
        for applet in BUSYBOX_APPLETS:
            # sh: the node's dynamic shell where there is one, so the driver shim (LD_PRELOAD) reaches scripts
            dash = applet == "sh" and os.path.exists("/usr/bin/dash")
            os.symlink("/usr/bin/dash" if dash else "busybox", r / "bin" / applet)
        (r / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nsshd:x:100:65534::/run/sshd:/bin/false\n"
                                      "nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
        (r / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
        (r / "etc/hosts").write_text(f"127.0.0.1 localhost\n{self.ct_ip} {self.name}\n")
        if os.path.exists("/etc/ld.so.cache"):
            shutil.copy("/etc/ld.so.cache", r / "etc/ld.so.cache")
        shutil.copy(self.ct_host_key, r / "etc/ssh/ssh_host_ed25519_key")
        os.chmod(r / "etc/ssh/ssh_host_ed25519_key", 0o600)
        (r / "etc/ssh/authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        env = " ".join(f"{k}={v}" for k, v in self.session_env().items())
        (r / "etc/ssh/sshd_config").write_text(sshd_config(
            listen="0.0.0.0", port=22, host_key="/etc/ssh/ssh_host_ed25519_key", pid_file="/run/sshd.pid",
            authorized_keys="/etc/ssh/authorized_keys", loglevel="VERBOSE", setenv=" " + env if env else "",
            penalties=lab_penalty_config(sshd_version(find_sshd() or "/usr/sbin/sshd"), "0.0.0.0/0")))
        (r / "sbin/lab-init").write_text(CT_INIT)
        os.chmod(r / "sbin/lab-init", 0o755)
        sd = r / STANDIN_DIR.lstrip("/")
        (sd / "proc-devices").write_text(PROC_DEVICES)
        (sd / "proc-modules").write_text(capture("modules.txt"))
        (sd / "driver-version").write_text(capture("driver-version.txt"))
        shutil.copytree(CAPTURE, sd / "capture")
        shutil.copy(STANDINS / "nvidia-smi", sd / "bin" / "nvidia-smi")
        os.chmod(sd / "bin" / "nvidia-smi", 0o755)
        for src, out, extra in (("libcuda_stub.c", sd / "lib" / "libcuda.so.1", ["-Wl,-soname,libcuda.so.1"]),
                                ("nvidia_driver_shim.c", sd / "nvidia_driver_shim.so", ["-ldl"])):
            subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(out),
                            str(STANDINS / src), *extra], check=True, capture_output=True, text=True)

    def _start_node(self) -> None:
        d = self.node
        os.makedirs("/run/lxc", exist_ok=True)  # the mount point of the node's private /run/lxc
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        shutil.copy(self.node_host_key, d / "host_key")
        os.chmod(d / "host_key", 0o600)
        (d / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        for _ in range(5):
            self.node_port = _free_port()
            (d / "sshd_config").write_text(sshd_config(
                listen="127.0.0.1", port=self.node_port, host_key=f"{d}/host_key", pid_file=f"{d}/sshd.pid",
                authorized_keys=f"{d}/authorized_keys", loglevel="VERBOSE",
                penalties=lab_penalty_config(sshd_version(find_sshd() or "/usr/sbin/sshd"))))
            log = open(d / "sshd.log", "ab")
            self.node_proc = subprocess.Popen(
                ["sh", "-c", 'for f in $(cat "$0"); do echo $$ > "$f" || exit 1; done; exec "$@"',
                 str(d / "cgroups"), "unshare", "-m", "-C", "--propagation", "private", "sh", str(d / "init.sh"), str(self.base),
                 self.layout, shutil.which("sshd") or "/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
            log.close()
            if _wait_banner("127.0.0.1", self.node_port, 10, lambda: self.node_proc.poll() is None):
                return
            self.node_proc.kill()
            self.node_proc.wait()
        raise RuntimeError(f"the node's sshd did not start: {(d / 'sshd.log').read_text()[-2000:]}")

    # -- using ----------------------------------------------------------------------------------------------

    def pct(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """The node's pct, in the node's mount and cgroup namespaces (and the lab's cgroup), as a session runs it."""
        return self.node_run("/usr/local/sbin/pct", *args, timeout=timeout)

    def procs_files(self) -> list[Path]:
        return [self.cgroup / "cgroup.procs", *(cg / "cgroup.procs" for _, _, cg in self.v1)]

    def node_run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Any command on the node (its mount and cgroup namespaces, the lab's cgroup), e.g. lxc-cgroup."""
        assert self.node_proc is not None
        return subprocess.run(
            ["sh", "-c", 'for f in $(cat "$0"); do echo $$ > "$f" || exit 1; done; exec "$@"', str(self.node / "cgroups"),
             "nsenter", "-t", str(self.node_proc.pid), "-m", "-C", "--", *argv],
            capture_output=True, text=True, timeout=timeout)

    def calls(self) -> list[str]:
        p = self.state / "calls"
        return p.read_text().splitlines() if p.exists() else []

    @property
    def config_file(self) -> Path:
        return self.node / "pve" / "lxc" / f"{self.vmid}.conf"

    def write_config(self, data: bytes) -> None:
        self.config_file.write_bytes(data)
        os.chmod(self.config_file, 0o640)

    def backups(self) -> list[Path]:
        """gpudoctor's backups on the node (/var/lib/gpudoctor/backups there)."""
        d = self.node / "gpudoctor/backups/etc/pve/lxc"
        return sorted(d.glob(f"{self.vmid}.conf.*")) if d.is_dir() else []

    def temps(self) -> list[str]:
        return sorted(n for n in os.listdir(self.config_file.parent) if n != f"{self.vmid}.conf")

    def running_config(self) -> str:
        return (self.lxcpath / str(self.vmid) / "config").read_text()

    def lxc_log(self) -> str:
        p = self.state / f"{self.vmid}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def status(self) -> str:
        return self.pct("status", str(self.vmid)).stdout.split(":")[-1].strip()

    def init_pid(self) -> int:
        r = self.node_run("lxc-info", "-n", str(self.vmid), "-P", str(self.lxcpath), "-p", "-H")
        return int(r.stdout.strip())

    def wait_ssh(self, timeout: float = 15) -> None:
        if not _wait_banner(self.ct_addr, self.ct_port, timeout):
            raise RuntimeError(f"ct200's sshd does not answer on {self.ct_addr}:22\n{self.lxc_log()[-3000:]}")

    def sessions(self) -> int:
        p = self.rootfs / "var/log/sshd.log"
        return p.read_text(errors="replace").count("Starting session: ") if p.exists() else 0

    def move_uvm(self, major: int = MOVED_UVM_MAJOR) -> None:
        """nvidia-uvm and nvidia-uvm-tools on `major`, as after a driver update: the node's nodes made anew, the
        lab's /proc/devices (bind-mounted into the node and into ct200: rewritten in place) naming it there. A
        running ct200 keeps what it started with until it restarts."""
        self.uvm_major = major
        for name, minor in (("nvidia-uvm", 0), ("nvidia-uvm-tools", 1)):
            node = self.node / "dev" / name
            node.unlink()
            os.mknod(node, 0o020000 | 0o666, os.makedev(major, minor))
            os.chmod(node, 0o666)
        text = _lab_proc_devices(major)
        for p in (self.node / "proc-devices", self.rootfs / STANDIN_DIR.lstrip("/") / "proc-devices"):
            with open(p, "r+") as fh:  # the same inode: the bind mounts over /proc/devices see it
                fh.truncate(0)
                fh.write(text)

    def reset(self, config: bytes | None = None) -> None:
        """The seed's state: that config, no backups, no temp files, uvm on UVM_MAJOR, ct200 running as started
        from it."""
        config = self.seed if config is None else config
        if self.uvm_major != UVM_MAJOR:
            self.move_uvm(UVM_MAJOR)
            (self.state / f"{self.vmid}.started-from").unlink(missing_ok=True)  # its nodes were the moved ones
        self.write_config(config)
        for name in self.temps():
            os.unlink(self.config_file.parent / name)
        shutil.rmtree(self.node / "gpudoctor/backups", ignore_errors=True)
        started = self.state / f"{self.vmid}.started-from"
        if self.status() == "running" and started.exists() and started.read_bytes() == config:
            return
        if self.status() == "running":
            r = self.pct("stop", str(self.vmid))
            assert r.returncode == 0, r.stderr
        r = self.pct("start", str(self.vmid))
        assert r.returncode == 0, r.stderr + self.lxc_log()[-2000:]
        self.wait_ssh()

    def node_known_hosts_line(self, port: int | None = None) -> str:
        """kpro6's host key as known_hosts has it (on `port`: e.g. a proxy in front of it)."""
        return f"[127.0.0.1]:{port or self.node_port} {_pub(self.node_host_key)}\n"

    def ct_known_hosts_line(self) -> str:
        return f"{self.ct_addr} {_pub(self.ct_host_key)}\n"

    @property
    def known_hosts_lines(self) -> str:
        return self.node_known_hosts_line() + self.ct_known_hosts_line()

    def write_inventory(self, path: Path, **kw) -> Path:
        path.write_text(self.inventory_text(**kw))
        return path

    def inventory_text(self, known_hosts: Path | None = None, *, node_port: int | None = None, vmid: int | None = 200,
                       host_extra: str = "", proxmox_extra: str = "", config_dir: str | None = None,
                       pct: list[str] | None = None) -> str:
        lxc = f"{{proxmox: kpro6, vmid: {vmid}}}" if vmid is not None else "{proxmox: kpro6}"
        return (
            "version: 1\n"
            "defaults:\n"
            "  user: root\n"
            f"  known_hosts: {json.dumps(str(known_hosts or self.known_hosts))}\n"
            f"  identity_file: {json.dumps(str(self.client_key))}\n"
            "  host_key_policy: strict\n"
            "  connect_timeout: 5\n"
            "proxmox:\n"
            "  kpro6:\n"
            f"    address: 127.0.0.1\n    port: {node_port or self.node_port}\n"
            + (f"    config_dir: {json.dumps(config_dir)}\n" if config_dir else "")
            + (f"    pct: {json.dumps(pct)}\n" if pct is not None else "")
            + f"{proxmox_extra}"
            "hosts:\n"
            f"  {self.name}:\n"
            f"    address: {self.ct_addr}\n"
            f"    lxc: {lxc}\n"
            "    expect: {gpus: 1}\n"
            f"{host_extra}"
        )

    # -- tearing down ---------------------------------------------------------------------------------------

    def close(self, check: bool = True) -> None:
        """Stop ct200, end the node, kill what is left in the lab's cgroup, remove the cgroups; then check."""
        if self.node_proc is not None and self.node_proc.poll() is None:
            try:
                if self.status() == "running":
                    self.pct("stop", str(self.vmid), timeout=30)
            except (subprocess.TimeoutExpired, OSError):
                pass
        if self.node_proc is not None and self.node_proc.poll() is None:
            self.node_proc.kill()
        if self.node_proc is not None:
            self.node_proc.wait(10)
        kill_cgroup(self.cgroup)
        for _, _, cg in self.v1:
            kill_cgroup(cg)
        remove_veth(self.pair)
        if getattr(self, "_route", False):
            subprocess.run(["ip", "route", "del", "unreachable", self.net, "metric", "4242"], capture_output=True)
        if getattr(self, "registry", None) is not None and not self.leftovers():
            self.registry.unlink(missing_ok=True)
        left = self.leftovers()
        if check and left:
            raise RuntimeError(f"the LXC lab left behind: {'; '.join(left)}")

    def leftovers(self) -> list[str]:
        """What of this lab still exists: container, cgroups, veth, mounts, sshd, LXC lock."""
        out = []
        out += [f"cgroup {cg}" for cg in [self.cgroup, *(c for _, _, c in self.v1)] if cg.exists()]
        r = subprocess.run(["ip", "-o", "link", "show", self.pair], capture_output=True, text=True)
        if r.returncode == 0:
            out.append(f"veth {self.pair}")
        if self.node_proc is not None and self.node_proc.poll() is None:
            out.append(f"node sshd pid {self.node_proc.pid}")
        with open("/proc/self/mountinfo") as fh:
            mounts = [ln.split()[4] for ln in fh if str(self.base) in ln]
        out += [f"mount {m}" for m in mounts]
        lock = Path("/run/lxc/lock") / str(self.lxcpath).lstrip("/")
        if lock.exists():
            out.append(f"lock {lock}")
        if self.node_port and _wait_banner("127.0.0.1", self.node_port, 0.05):
            out.append(f"an sshd on 127.0.0.1:{self.node_port}")
        r = subprocess.run(["ip", "-4", "route", "show", self.net, "table", "all"], capture_output=True, text=True)
        out += [f"route {ln.strip()}" for ln in r.stdout.splitlines() if ln.strip()]
        reg = getattr(self, "registry", None)
        if reg is not None and reg.exists() and out:
            out.append(f"registry {reg}")
        return out


def kill_cgroup(cg: Path) -> None:
    """SIGKILL everything in a cgroup tree (cgroup.kill, or each pid), then rmdir it depth-first."""
    if not cg.exists():
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (cg / "cgroup.kill").exists():
            try:
                (cg / "cgroup.kill").write_text("1")
            except OSError:
                pass
        else:
            for p in cg.rglob("cgroup.procs"):
                for pid in p.read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
        dirs = sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [cg]
        for d in dirs:
            try:
                d.rmdir()
            except OSError:
                pass
        if not cg.exists():
            return
        time.sleep(0.05)


def remove_veth(pair: str, timeout: float = 10) -> None:
    """Wait for the lab's veth to go with ct200's network namespace (the kernel tears a namespace down
    asynchronously after its last process); delete it if it is still there then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if subprocess.run(["ip", "link", "show", pair], capture_output=True).returncode != 0:
            return
        time.sleep(0.05)
    subprocess.run(["ip", "link", "del", pair], capture_output=True)


def remove_stale() -> None:
    """Labs an earlier, killed test session left (their owner pid is gone): every process in their cgroups (the
    veth and the namespaces go with them), the cgroups, the unreachable route."""
    for reg in REGISTRY.glob("*.json") if REGISTRY.is_dir() else []:
        pid = reg.name.split("-")[0]
        if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
            continue
        try:
            d = json.loads(reg.read_text())
        except (OSError, ValueError):
            continue
        for cg in d.get("cgroups", []):
            kill_cgroup(Path(cg))
        if d.get("pair"):
            remove_veth(d["pair"])
        if d.get("route"):
            subprocess.run(["ip", "route", "del", "unreachable", d["route"], "metric", "4242"], capture_output=True)
        reg.unlink(missing_ok=True)
    root = _cgroup2_root()
    for cg in root.glob(PREFIX + "*") if root is not None else []:
        pid = cg.name[len(PREFIX):].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            kill_cgroup(cg)
