"""A real OpenSSH server on 127.0.0.1 for tests: throwaway host and user keys, started in well under a second.

Used through the fixtures in tests/conftest.py (`sshd`, `ssh_host`, `ssh_fake_root`, `sshd_factory`, `cut_proxy`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.needs import find, need

def find_sshd() -> str | None:
    return find("sshd")


# The processes of one connection. OpenSSH < 9.8: the listener forks "sshd" per connection (a monitor and its
# unprivileged child). 9.8 execs "sshd-session" for it, 10.0 also "sshd-auth" for the unprivileged pre-login child.
SSHD_NAMES = ("sshd", "sshd-session", "sshd-auth")


def sshd_version(sshd: str, wrap: list[str] | None = None) -> tuple[int, int]:
    """(major, minor) of an sshd binary (`sshd -V` prints "OpenSSH_10.0p2 ..."); (0, 0) when it does not say."""
    out = subprocess.run([*(wrap or []), sshd, "-V"], capture_output=True, text=True, timeout=10)
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stdout + out.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def lab_penalty_config(version: tuple[int, int], exempt: str = "127.0.0.1/32") -> str:
    """The lab's own sshd exempts its one client, 127.0.0.1, from OpenSSH >= 9.8's PerSourcePenalties (on by
    default): its tests cut connections before login on purpose (CutProxy sweeps every byte offset: each cut is a
    "noauth" penalty), kill sshd processes and try wrong keys, and a penalised 127.0.0.1 would make every later test
    see "Error reading SSH protocol banner". Only the lab config does this; tests/openssh10.py runs Debian 13's sshd
    with its defaults to show gpudoctor is never penalised. Older sshd does not know the keyword (it would not start).
    `exempt`: the lab's client addresses (the LXC lab's container is reached over its veth, not loopback)."""
    return f"PerSourcePenaltyExemptList {exempt}\n" if version >= (9, 8) else ""


# Run the lab's sshd from an unpacked root filesystem instead of this machine's, e.g. Debian 13's OpenSSH 10
# (tests/openssh10.py makes one): GPUDOCTOR_TEST_SSHD_ROOT=DIR. The lab's files live under /tmp (pytest's), which
# the server sees at the same paths.
ROOT_ENV = "GPUDOCTOR_TEST_SSHD_ROOT"


def chroot_wrap(root: str | os.PathLike) -> list[str]:
    """A command line that runs its arguments chrooted into `root`, in a private mount namespace holding the
    machine's /dev and /tmp and its own /proc (sessions run there: their commands are the rootfs's)."""
    script = ('r=$1; shift; mount --rbind /dev "$r/dev" && mount -t proc proc "$r/proc" && '
              'mount --rbind /tmp "$r/tmp" && mkdir -p "$r/run/sshd" && exec chroot "$r" "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(root)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> Path:
    """A passphrase-less key pair at path / path.pub."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "gpudoctor-test", "-f", str(path)],
                   check=True, stdout=subprocess.DEVNULL)
    return path


def pub_key_fields(pub: Path) -> tuple[str, str]:
    kind, b64 = pub.read_text().split()[:2]
    return kind, b64


@dataclass
class SSHD:
    """One running sshd. `make_host()` gives an SSHHost that trusts it; `inventory_yaml()` an inventory that does."""

    dir: Path
    port: int
    user: str
    host_key: Path
    client_key: Path
    known_hosts: Path
    log: Path
    proc: subprocess.Popen = field(repr=False)
    address: str = "127.0.0.1"

    def known_hosts_line(self, port: int | None = None) -> str:
        kind, b64 = pub_key_fields(self.host_key.with_suffix(".pub"))
        return f"[{self.address}]:{port or self.port} {kind} {b64}\n"

    def write_known_hosts(self, path: Path, port: int | None = None) -> Path:
        """A known_hosts file that trusts this server (on `port`, e.g. a proxy in front of it)."""
        path.write_text(self.known_hosts_line(port))
        return path

    def make_host(self, **kw):
        from gpudoctor.host.ssh import SSHHost

        args = dict(name="sshd-test", address=self.address, port=self.port, user=self.user,
                    identity_files=[str(self.client_key)], known_hosts=str(self.known_hosts), ssh_config="",
                    allow_agent=False, look_for_keys=False, connect_timeout=5.0)
        args.update(kw)
        return SSHHost(**args)

    def inventory_yaml(self, name: str = "ct200", *, proxmox: str | None = None, extra_host: str = "",
                       extra_proxmox: str = "", vmid: int = 200, port: int | None = None) -> str:
        """Inventory text naming this server as host `name` (and as Proxmox host `proxmox` when given)."""
        common = (f"    address: {self.address}\n    port: {port or self.port}\n    user: {self.user}\n"
                  f"    identity_file: {self.client_key}\n    known_hosts: {self.known_hosts}\n")
        text = f"hosts:\n  {name}:\n{common}{extra_host}"
        if proxmox:
            text += f"    lxc: {{vmid: {vmid}, proxmox: {proxmox}}}\n"
            text += f"proxmox:\n  {proxmox}:\n{common}{extra_proxmox}"
        return text

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children of the listener: "sshd", or "sshd-session" since 9.8)."""
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == self.proc.pid:
                    out.append(int(d.name))
        return out

    def cut_connections(self) -> int:
        """Kill every open connection's sshd processes (SIGKILL): the client sees the connection drop. Each
        connection is a monitor (a child of the listener) and its unprivileged "user@notty" child, which holds the
        socket too; when sshd runs as an ordinary user that child outlives its monitor, so both are killed."""
        pids = self.session_pids()
        for pid in [*pids, *(c for p in pids for c in _sshd_children(p))]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _sshd_children(pid: int) -> list[int]:
    """The children of `pid` that are sshd processes (SSHD_NAMES: not the commands of a session)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()
            if comm in SSHD_NAMES and int(rest[1]) == pid:
                out.append(int(d.name))
    return out


def sshd_config(*, listen: str, port: int | str, host_key: str, pid_file: str, authorized_keys: str,
                sftp: bool = True, loglevel: str = "ERROR", setenv: str = "", extra: str = "",
                penalties: str = "") -> str:
    """The sshd_config every test server uses (tests/sshd.py here, the LXC lab's node and container): key-only
    login, no PAM/DNS/motd, room for many sessions. `setenv`: " K=V ..." added to every session. `penalties`: the
    lines lab_penalty_config gives for the sshd that reads it (its version decides)."""
    return f"""\
ListenAddress {listen}
Port {port}
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
MaxStartups 200
MaxSessions 10
{"Subsystem sftp internal-sftp" if sftp else "# no sftp subsystem"}
LogLevel {loglevel}
# Keep the test machine's ~/.bashrc (pyenv init: ~150 ms) out of every command: bash sources it for
# ssh only when SHLVL < 2.
SetEnv SHLVL=1{setenv}
{penalties}{extra}
"""


def start_sshd(d: Path, *, extra_config: str = "", loglevel: str = "ERROR", start_timeout: float = 10.0,
               sftp: bool = True, setenv: dict[str, str] | None = None, wrap: list[str] | None = None) -> SSHD:
    """Start sshd -D -e on a free loopback port, serving the current user with throwaway keys in `d`.

    sftp=False serves no SFTP subsystem (like a minimal container), so file operations take the python path.
    setenv: more variables for every session (sshd_config SetEnv; values without spaces). wrap: a command line that
    ends by exec'ing its arguments (the sshd command), e.g. to start the server in a cgroup or namespaces."""
    if os.environ.get(ROOT_ENV) and wrap is None:
        sshd, wrap = "/usr/sbin/sshd", chroot_wrap(os.environ[ROOT_ENV])
    else:
        sshd = find_sshd() or need("sshd")  # missing: one skip line naming what to install (a failure under CI=true)
    need("ssh-keygen")
    d.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
    host_key = keygen(d / "host_key")
    client_key = keygen(d / "client_key")
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    import pwd

    user = pwd.getpwuid(os.geteuid()).pw_name
    penalties = lab_penalty_config(sshd_version(sshd, wrap))
    last = ""
    for _attempt in range(5):
        port = free_port()
        cfg = d / "sshd_config"
        env = "".join(f" {k}={v}" for k, v in (setenv or {}).items())
        cfg.write_text(sshd_config(listen="127.0.0.1", port=port, host_key=f"{d}/host_key", pid_file=f"{d}/sshd.pid",
                                   authorized_keys=f"{d}/authorized_keys", sftp=sftp, loglevel=loglevel,
                                   setenv=env, extra=extra_config, penalties=penalties))
        log = d / "sshd.log"
        with open(log, "ab") as logf:
            proc = subprocess.Popen([*(wrap or []), sshd, "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                    stdout=logf, stderr=logf, start_new_session=True)
        if _wait_banner(port, proc, start_timeout):
            kh = d / "known_hosts"
            server = SSHD(d, port, user, host_key, client_key, kh, log, proc)
            server.write_known_hosts(kh)
            return server
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        last = log.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"sshd did not start; its log:\n{last}")


def _wait_banner(port: int, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
                if s.recv(64).startswith(b"SSH-2.0"):
                    return True
        except OSError:
            time.sleep(0.02)
    return False


class CutProxy:
    """A loopback TCP proxy in front of a server that cuts the connection after `cut_after` bytes (both ways).

    For fault injection: sweep cut_after over a range and every phase of a remote operation gets interrupted.
    cut_after=None forwards forever. `cuts` counts connections it cut. With stay_down, every connection after the
    first cut is cut at once (the host stays unreachable: nothing can be cleaned up or retried over SSH).
    """

    def __init__(self, target_port: int, cut_after: int | None = None, stay_down: bool = False):
        self.target_port = target_port
        self.cut_after = cut_after
        self.stay_down = stay_down
        self.cuts = 0
        self.forwarded = 0  # bytes passed on, both directions, all connections
        self._srv = socket.socket()
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(64)
        self.port = self._srv.getsockname()[1]
        self._closing = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closing:
            try:
                c, _ = self._srv.accept()
            except OSError:
                return
            try:
                s = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                c.close()
                continue
            with self._lock:
                self._socks += [c, s]
            budget = [0 if self.stay_down and self.cuts else self.cut_after]
            for a, b in ((c, s), (s, c)):
                threading.Thread(target=self._pump, args=(a, b, c, s, budget), daemon=True).start()

    def _pump(self, src, dst, c, s, budget):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                cut = False
                with self._lock:
                    if budget[0] == 0:
                        break  # the other direction already cut this connection
                    if budget[0] is not None and len(data) >= budget[0]:
                        data, budget[0], cut = data[: budget[0]], 0, True
                        self.cuts += 1
                    elif budget[0] is not None:
                        budget[0] -= len(data)
                    self.forwarded += len(data)
                if data:
                    dst.sendall(data)
                if cut:
                    break
        except OSError:
            pass
        for x in (c, s):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            x.close()

    def close(self):
        self._closing = True
        self._srv.close()
        with self._lock:
            for x in self._socks:
                try:
                    x.close()
                except OSError:
                    pass
