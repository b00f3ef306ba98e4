"""The systemd lab: systemd 252 as PID 1 of a `systemd-nspawn --boot` container, so the project's own units run under
the real service manager (docs/testing.md says what is real and what stands in).

    skip_reason() -> str | None     why the lab cannot run here (one line), None when it can
    SystemdLab(base)                everything lives under `base` and in one cgroup <cgroup2>/gpudoctor-sdlab-<id>
      .start() / .close()           boot (waits for `systemctl is-system-running --wait`) / power off, kill what is
                                    left in the cgroup, remove it; also a context manager
      .sh(cmd) / .systemctl(*a)     a shell command inside (nsenter into the leader: every namespace of PID 1)
      .run_unit(argv, env)          a command as a transient service inside (systemd-run --wait --pipe), as the
                                    units' own processes run
      .journal(unit) / .show(unit)  journalctl -u UNIT / systemctl show UNIT as a dict
      .reboot()                     `systemctl reboot` inside: nspawn exits 133 and the lab starts it again, as
                                    systemd-nspawn@.service does (Restart on 133); waits for the new boot
      .leader() / .boots / .leftovers()

How it is built: the host's /usr bound read-only, a private /etc and /var made here (os-release, machine-id,
passwd/group, the units under test in /etc/systemd/system), pure cgroup2 (SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1) inside
the lab's own cgroup, `--system-call-filter=bpf` (nspawn's default filter blocks bpf(), and systemd then enforces no
DevicePolicy= at all), `--private-network`, `--register=no --keep-unit` (no systemd runs on this machine to register
with). gpudoctor is installed inside as the running test interpreter has it installed: that interpreter's prefix
(and its base prefix, and the source tree of an editable install) bound read-only at the same paths, and
/usr/local/bin/gpudoctor a console script for it, as pip writes one — the path the shipped units execute.

No GPU: /dev/nvidia-uvm(-tools) are nodes on major 7 (the kernel's vcs driver, which really opens once the device
program allows it) and the container's /proc/devices names major 7 nvidia-uvm, as in the LXC lab (tests/lxclab.py);
systemd itself resolves `DeviceAllow=char-nvidia-uvm` from that /proc/devices when a unit starts. /proc/modules and
/proc/driver/nvidia/version are the H200 capture's. The NVIDIA tools (nvidia-smi, libcuda, the driver's answer on
major 195) are the LXC lab's stand-ins, on PATH only for `run_unit(..., env=lab.standin_env())`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from tests import lxclab

PREFIX = "gpudoctor-sdlab-"
REPO = Path(__file__).resolve().parents[1]
UNITS = REPO / "systemd"
LAB_UNITS = Path(__file__).resolve().parent / "systemd" / "units"
STANDIN_DIR = "/opt/gpudoctor-lab"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MODEL = "/dev/shm/models/Qwen3-32B"  # the path systemd/examples/sglang.service.d/gpudoctor.conf gates on
REBOOT_EXIT = 133  # systemd-nspawn's exit status when the container asked for a reboot
# units of a full Debian /usr that this container has no use for (no consoles, no logins): masked, for a fast boot;
# D-Bus stays (systemd-run --wait talks to systemd through it)
MASKED = ("console-getty.service", "getty@.service", "systemd-logind.service",
          "systemd-networkd.service", "systemd-resolved.service", "systemd-timesyncd.service", "cron.service",
          "e2scrub_reap.service", "apt-daily.timer", "apt-daily-upgrade.timer", "man-db.timer", "fstrim.timer",
          "e2scrub_all.timer", "logrotate.timer", "dpkg-db-backup.timer", "systemd-tmpfiles-clean.timer")


def skip_reason() -> str | None:
    from tests import needs

    if os.geteuid() != 0:
        return "the systemd lab needs root (it boots systemd in a container)"
    from gpudoctor.commands.daemon import install_problem  # what `gpudoctor daemon --check-install` says

    hidden = install_problem([sys.executable, *_install_roots()])  # the lab's /usr/local/bin/gpudoctor runs these
    if hidden:  # the units would exit 203 in every test: say why once instead
        return f"the systemd lab: {hidden}"
    if not shutil.which("systemd-nspawn"):
        return f"systemd-nspawn is not installed{needs.MARK}: apt-get install systemd-container"
    for name in ("nsenter", "bpftool", "gcc"):
        if needs.find(name) is None:
            return f"{name} is not installed{needs.MARK}: {needs.COMPONENTS[name][1]}"
    if not os.path.exists("/usr/lib/systemd/systemd"):
        return f"systemd is not installed{needs.MARK}: apt-get install systemd"
    if not shutil.which("dbus-daemon"):
        return f"dbus-daemon is not installed{needs.MARK}: apt-get install dbus"
    if lxclab._cgroup2_root() is None:
        return "no cgroup2 hierarchy is mounted (/sys/fs/cgroup/unified or /sys/fs/cgroup)"
    if ["7", "vcs"] not in [ln.split() for ln in Path("/proc/devices").read_text().splitlines()]:
        return "this kernel has no vcs driver on major 7 (CONFIG_VT): the lab stands nvidia-uvm on it"
    return None


def _install_roots() -> list[str]:
    """What the running interpreter's gpudoctor needs from this machine, outside /usr: its prefixes, the source of
    an editable install."""
    import gpudoctor

    roots = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    src = Path(gpudoctor.__file__).resolve().parents[1]
    if not any(str(src).startswith(r + "/") for r in roots):
        roots.add(str(src))
    out = []
    for r in sorted(roots):
        if r.startswith("/usr/") or r == "/usr" or any(r.startswith(o + "/") for o in out):
            continue
        out.append(r)
    return out


def kill_cgroup(cg: Path) -> None:
    """The lab's cgroup2 tree and, on a hybrid host (cgroup v1 with cgroup2 at /sys/fs/cgroup/unified), the
    same-named directory systemd-nspawn makes in the name=systemd v1 hierarchy."""
    lxclab.kill_cgroup(cg)
    for mirror in _v1_mirrors(cg.name):
        lxclab.kill_cgroup(mirror)


def _v1_mirrors(name: str) -> list[Path]:
    return [p for p in (Path("/sys/fs/cgroup/systemd") / name,) if p.is_dir()]


def remove_stale() -> None:
    """Labs of an earlier, killed test session (their owner pid is gone): what is in their cgroups, the cgroups."""
    root = lxclab._cgroup2_root()
    found = list(root.glob(PREFIX + "*")) if root is not None else []
    found += [m for m in Path("/sys/fs/cgroup/systemd").glob(PREFIX + "*") if m.is_dir()]
    for cg in found:
        pid = cg.name[len(PREFIX):].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            kill_cgroup(cg)


class SystemdLab:
    def __init__(self, base: Path):
        self.base = Path(base)
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.machine = f"gdsd-{uuid.uuid4().hex[:8]}"
        self.root = self.base / "root"
        self.bin = self.base / "usr-local-bin"
        self.log = self.base / "nspawn.log"
        self.cgroup = (lxclab._cgroup2_root() or Path("/sys/fs/cgroup")) / f"{PREFIX}{self.id}"
        self.proc: subprocess.Popen | None = None
        self.boots = 0
        self.exits: list[int] = []
        self._closing = False
        self._booted = threading.Event()
        self._watch: threading.Thread | None = None

    def __enter__(self) -> SystemdLab:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- building ----------------------------------------------------------------------------------------------

    def _build(self) -> None:
        r = self.root
        for d in ("etc/systemd/system", "var/lib", "var/log/journal", "root", "tmp", "run", "dev", "proc", "sys",
                  "usr", "opt", STANDIN_DIR.lstrip("/") + "/bin", STANDIN_DIR.lstrip("/") + "/lib"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "tmp", 0o1777)
        for link in ("bin", "sbin", "lib", "lib64"):
            if os.path.isdir(f"/usr/{link}"):
                os.symlink(f"usr/{link}", r / link)
        shutil.copy("/usr/lib/os-release", r / "etc/os-release")
        (r / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
        (r / "etc/hostname").write_text(self.machine + "\n")
        (r / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {self.machine}\n")
        (r / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n"
                                      "messagebus:x:100:102::/nonexistent:/usr/sbin/nologin\n"
                                      "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        (r / "etc/group").write_text("root:x:0:\nsystemd-journal:x:101:\nmessagebus:x:102:\nnogroup:x:65534:\n")
        if os.path.exists("/etc/ld.so.cache"):
            shutil.copy("/etc/ld.so.cache", r / "etc/ld.so.cache")
        sysd = r / "etc/systemd/system"
        for name in MASKED:
            os.symlink("/dev/null", sysd / name)
        # the units under test, byte for byte
        for unit in UNITS.glob("*.service"):
            shutil.copy(unit, sysd / unit.name)
        for unit in LAB_UNITS.glob("*.service"):
            shutil.copy(unit, sysd / unit.name)
        # gpudoctor as pip installs its console script, for the interpreter that runs these tests
        self.bin.mkdir(parents=True, exist_ok=True)
        exe = self.bin / "gpudoctor"
        exe.write_text(f"#!{sys.executable}\nimport sys\nfrom gpudoctor.cli import main\n"
                       f"if __name__ == '__main__':\n    sys.exit(main())\n")
        exe.chmod(0o755)
        # the NVIDIA stand-ins (the LXC lab's): the driver's /proc files, nvidia-smi, libcuda, the driver's open()
        sd = r / STANDIN_DIR.lstrip("/")
        (sd / "proc-devices").write_text(lxclab.PROC_DEVICES)
        (sd / "proc-modules").write_text(lxclab.capture("modules.txt"))
        (sd / "driver-version").write_text(lxclab.capture("driver-version.txt"))
        shutil.copytree(lxclab.CAPTURE, sd / "capture")
        shutil.copy(lxclab.STANDINS / "nvidia-smi", sd / "bin" / "nvidia-smi")
        os.chmod(sd / "bin" / "nvidia-smi", 0o755)
        from tests.model.modelfiles import write_model

        write_model(sd / "models" / MODEL.rsplit("/", 1)[1])  # a small, real, complete model: a stage's source
        for src, out, extra in (("libcuda_stub.c", sd / "lib" / "libcuda.so.1", ["-Wl,-soname,libcuda.so.1"]),
                                ("nvidia_driver_shim.c", sd / "nvidia_driver_shim.so", ["-ldl"])):
            subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(out),
                            str(lxclab.STANDINS / src), *extra], check=True, capture_output=True, text=True)

    def standin_env(self) -> dict[str, str]:
        d = STANDIN_DIR
        return {"PATH": f"{d}/bin:{PATH}", "LD_LIBRARY_PATH": f"{d}/lib", "LD_PRELOAD": f"{d}/nvidia_driver_shim.so",
                "GPUDOCTOR_SHIM_MAJORS": f"195,{lxclab.CAPS_MAJOR}", "GPUDOCTOR_STANDIN_CAPTURE": f"{d}/capture"}

    def model_source(self) -> str:
        return f"{STANDIN_DIR}/models/{MODEL.rsplit('/', 1)[1]}"

    def standin_dropin(self) -> str:
        """A drop-in that gives a unit's processes the NVIDIA stand-ins (a GPU host has the real ones on PATH)."""
        env = " ".join(f'"{k}={v}"' for k, v in self.standin_env().items())
        return f"# the systemd lab's NVIDIA stand-ins (tests/systemdlab.py)\n[Service]\nEnvironment={env}\n"

    def write(self, path: str, text: str) -> None:
        """A file inside the container (its /etc, /run, ...), written from here."""
        self.sh(f"mkdir -p {shlex.quote(os.path.dirname(path))} && cat > {shlex.quote(path)}", check=True,
                input=text)

    def _argv(self) -> list[str]:
        argv = ["systemd-nspawn", "--boot", "--quiet", "-D", str(self.root), "-M", self.machine,
                "--register=no", "--keep-unit", "--private-network", "--system-call-filter=bpf",
                "--capability=CAP_SYSLOG", "--console=passive", "--bind-ro=/usr",
                f"--bind-ro={self.bin}:/usr/local/bin"]
        argv += [f"--bind-ro={p}" for p in _install_roots()]
        return argv

    def _spawn(self) -> None:
        cg = self.cgroup

        def into_cgroup():
            (cg / "cgroup.procs").write_text("0")

        env = {"PATH": PATH, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1", "LANG": "C.UTF-8"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self._argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, preexec_fn=into_cgroup, start_new_session=True)
        self.boots += 1

    def _supervise(self) -> None:
        """Restart nspawn when the container rebooted (exit 133), as systemd-nspawn@.service does."""
        while True:
            proc = self.proc
            rc = proc.wait()
            self.exits.append(rc)
            if rc != REBOOT_EXIT or self._closing:
                return
            self._booted.clear()
            self._spawn()

    def start(self) -> SystemdLab:
        try:
            remove_stale()
            self._build()
            self.cgroup.mkdir()
            self._spawn()
            self._watch = threading.Thread(target=self._supervise, daemon=True)
            self._watch.start()
            self.wait_booted()
        except BaseException:
            self.close()
            raise
        return self

    def leader(self, timeout: float = 30.0) -> int:
        """PID 1 of the container as this machine sees it (nspawn's child)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.proc
            if proc is not None and proc.poll() is None:
                try:
                    kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
                except OSError:
                    kids = []
                for k in kids:
                    try:
                        if Path(f"/proc/{k}/comm").read_text().strip() == "systemd":
                            return int(k)
                    except OSError:
                        pass
            time.sleep(0.02)
        raise AssertionError(f"the container's systemd did not start: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def wait_booted(self, timeout: float = 60.0) -> str:
        """Wait for the boot to finish; set the lab's views of /proc and its device nodes. Returns the state."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            r = self.sh("systemctl is-system-running --wait", timeout=max(1.0, deadline - time.monotonic()),
                        check=False)
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the container did not boot ({state!r}): {self._log_tail()}")
        self._setup_views()
        self._booted.set()
        return state

    def _setup_views(self) -> None:
        """The driver's /proc files and the NVIDIA nodes, in the container's mount namespace (PID 1 sees them:
        systemd resolves char-NAME from this /proc/devices)."""
        d = STANDIN_DIR
        caps = lxclab.CAPS_MAJOR
        self.sh(f"""set -e
mount --bind {d}/proc-devices /proc/devices
if [ -e /proc/modules ]; then mount --bind {d}/proc-modules /proc/modules; fi
mount -t tmpfs -o mode=0755,size=64k gpudoctor-lab /proc/driver
mkdir -p /proc/driver/nvidia && cp {d}/driver-version /proc/driver/nvidia/version
mknod -m 666 /dev/nvidia0 c 195 0; mknod -m 666 /dev/nvidiactl c 195 255
mknod -m 666 /dev/nvidia-uvm c 7 0; mknod -m 666 /dev/nvidia-uvm-tools c 7 1
mkdir -p /dev/nvidia-caps; mknod -m 400 /dev/nvidia-caps/nvidia-cap1 c {caps} 1
mknod -m 444 /dev/nvidia-caps/nvidia-cap2 c {caps} 2
[ -e /dev/kmsg ] || mknod -m 644 /dev/kmsg c 1 11
""")

    # -- using -------------------------------------------------------------------------------------------------

    def sh(self, cmd: str, timeout: float = 60.0, check: bool = True, input: str | None = None
           ) -> subprocess.CompletedProcess:
        """A shell command in every namespace of the container's PID 1 (not in one of its units)."""
        r = subprocess.run(["nsenter", "-t", str(self.leader()), "-a", "/bin/sh", "-c", cmd], capture_output=True,
                           text=True, timeout=timeout, env={"PATH": PATH, "LANG": "C.UTF-8", "SYSTEMD_PAGER": "",
                                                            "SYSTEMD_COLORS": "0"}, input=input,
                           **({} if input is not None else {"stdin": subprocess.DEVNULL}))
        if check and r.returncode != 0:
            raise AssertionError(f"in the container: {cmd!r} → rc {r.returncode}: {r.stdout[-2000:]}"
                                 f"{r.stderr[-2000:]}")
        return r

    def systemctl(self, *args: str, check: bool = True, timeout: float = 300.0) -> subprocess.CompletedProcess:
        return self.sh("systemctl " + shlex.join(args), timeout=timeout, check=check)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        r = self.systemctl("show", unit, *(f"--property={p}" for p in props))
        return dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln)

    def journal(self, unit: str | None = None, *, since_boot: bool = True) -> str:
        args = ["journalctl", "--no-pager", "-o", "short-monotonic", *(["-b"] if since_boot else [])]
        args += ["-u", unit] if unit else []
        return self.sh(shlex.join(args), check=False).stdout

    def run_unit(self, argv: list[str], env: dict | None = None, timeout: float = 180.0,
                 properties: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        """`argv` as a transient service inside (systemd-run --wait --pipe): its rc, stdout and stderr."""
        cmd = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect", "--service-type=exec"]
        cmd += [f"--setenv={k}={v}" for k, v in (env or {}).items()]
        cmd += [f"--property={p}" for p in properties]
        return self.sh(shlex.join([*cmd, "--", *argv]), timeout=timeout, check=False)

    def reboot(self, timeout: float = 60.0) -> None:
        """`systemctl reboot` inside; nspawn exits 133, the supervisor starts it again; wait for the new boot."""
        boots = self.boots
        old = self.leader()
        self.systemctl("reboot", "--no-block")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (self.boots == boots or not self.proc or self.proc.poll() is not None):
            if self._watch is not None and not self._watch.is_alive():
                raise AssertionError(f"nspawn exited {self.exits} and was not restarted: {self._log_tail()}")
            time.sleep(0.05)
        while self.leader() == old:
            time.sleep(0.05)
        self.wait_booted(max(5.0, deadline - time.monotonic()))

    def bpf_programs(self) -> dict[str, list[str]]:
        """bpftool's view of the lab's cgroup tree: cgroup path (relative to the lab's) → attach types."""
        r = subprocess.run(["bpftool", "cgroup", "tree", str(self.cgroup)], capture_output=True, text=True,
                           timeout=30)
        out: dict[str, list[str]] = {}
        cur = None
        for ln in r.stdout.splitlines():
            if ln.startswith("/"):
                cur = os.path.relpath(ln.strip(), self.cgroup)
                out[cur] = []
            elif cur is not None and ln.strip() and ln.split()[0].isdigit():
                out[cur].append(ln.split()[1])
        return out

    # -- teardown ----------------------------------------------------------------------------------------------

    def close(self) -> None:
        self._closing = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)  # nspawn: SIGRTMIN+3 to the container's systemd, a clean poweroff
                proc.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)
        if self._watch is not None:
            self._watch.join(5)
        kill_cgroup(self.cgroup)
        shutil.rmtree(f"/run/systemd/nspawn/propagate/{self.machine}", ignore_errors=True)
        left = self.leftovers()
        shutil.rmtree(self.root, ignore_errors=True)
        if left:
            raise AssertionError(f"the systemd lab left: {left}")

    def leftovers(self) -> list[str]:
        out = []
        if self.proc is not None and self.proc.poll() is None:
            out.append(f"systemd-nspawn pid {self.proc.pid}")
        if self.cgroup.exists():
            out.append(f"cgroup {self.cgroup}")
        out += [f"cgroup {m}" for m in _v1_mirrors(self.cgroup.name)]
        if os.path.exists(f"/run/systemd/nspawn/propagate/{self.machine}"):
            out.append(f"/run/systemd/nspawn/propagate/{self.machine}")
        with open("/proc/self/mountinfo") as fh:
            out += [f"mount {ln.split()[4]}" for ln in fh if str(self.base) in ln.split()[4]]
        return out
