"""Debian 13's OpenSSH 10 sshd, run for real with ITS default configuration (issue #34).

`start(d)` unpacks the cached trixie minbase of .ci/rootfs (openssh-server, openssh-client, python3: the one builder
CI uses too; a cold build takes a minute or two, cached after) into `d/rootfs`, puts a throwaway client key in its
/root/.ssh/authorized_keys and runs its /usr/sbin/sshd -D -e under chroot in a private mount namespace (its own
/proc, the host's /dev and /tmp: tests/sshd.chroot_wrap), on 127.0.0.1:PORT. The configuration is
/etc/ssh/sshd_config exactly as trixie ships it
(PerSourcePenalties on by default, a per-connection sshd-session and sshd-auth, UsePAM); the command line adds only
the port, the listen address and LogLevel VERBOSE, so that a penalty below the 15 s threshold is logged too
("deferred penalty") and a test can say none was given. Its host key is the one the rootfs was built with.

The server is ready when its log says "Server listening": a probe connection would itself earn a noauth penalty.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from tests.needs import need
from tests.sshd import SSHD, chroot_wrap, free_port, keygen

PACKAGES = "openssh-server,openssh-client,python3"
ROOTFS_BUILDER = Path(__file__).resolve().parents[1] / ".ci/rootfs"
ROOT_ENV_10 = "GPUDOCTOR_TEST_OPENSSH10_ROOT"


def rootfs(dest: Path) -> Path:
    """The trixie rootfs with its OpenSSH 10, unpacked into `dest` (made). Also what GPUDOCTOR_TEST_SSHD_ROOT
    wants, to run the whole SSH lab (tests/sshd.py) on OpenSSH 10: python -m tests.openssh10 DIR.
    $GPUDOCTOR_TEST_OPENSSH10_ROOT names one already unpacked (e.g. where the suite itself runs inside a rootfs
    without mmdebstrap): it is used as it is (the test adds its client key to root's authorized_keys)."""
    given = os.environ.get(ROOT_ENV_10)
    if given:
        if not os.path.isfile(os.path.join(given, "usr/sbin/sshd")):
            raise RuntimeError(f"{ROOT_ENV_10}={given}: no usr/sbin/sshd there")
        return Path(given)
    need("mmdebstrap")
    need("unshare")
    r = subprocess.run([str(ROOTFS_BUILDER), "--unpack", str(dest), "trixie", PACKAGES], capture_output=True,
                       text=True, timeout=1200)
    if r.returncode != 0:
        raise RuntimeError(f".ci/rootfs trixie {PACKAGES} failed: {r.stderr[-2000:]}")
    return dest


def penalty_lines(log: Path) -> list[str]:
    """sshd's lines about PerSourcePenalties: a penalty given (deferred or active) or a connection dropped for one."""
    return [line for line in log.read_text(errors="replace").splitlines()
            if "penalty" in line or "drop connection" in line]


def settled_penalty_lines(server: SSHD, *, expect: bool, timeout: float = 30.0) -> list[str]:
    """penalty_lines once the listener has reaped every connection: it logs a connection's penalty when it reaps it,
    which on a loaded machine can come well after the client has gone. `expect`: also wait for a first line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = penalty_lines(server.log)
        if not server.session_pids() and (lines or not expect):
            return lines
        time.sleep(0.05)
    return penalty_lines(server.log)


def start(d: Path, root: Path | None = None, *, timeout: float = 15.0) -> SSHD:
    """Run the rootfs's sshd as trixie configures it (see the module's text); `root`: an unpacked rootfs to reuse."""
    d.mkdir(parents=True, exist_ok=True)
    root = root or rootfs(d / "rootfs")
    client_key = keygen(d / "client_key")
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    with open(ssh_dir / "authorized_keys", "a") as f:
        f.write((d / "client_key.pub").read_text())
    port = free_port()
    log = d / "sshd.log"
    argv = [*chroot_wrap(root), "/usr/sbin/sshd", "-D", "-e", "-p", str(port), "-o", "ListenAddress=127.0.0.1",
            "-o", "LogLevel=VERBOSE"]
    with open(log, "ab") as logf:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True)
    deadline = time.monotonic() + timeout
    while "Server listening on 127.0.0.1" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            raise RuntimeError(f"trixie's sshd did not start; its log:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.02)
    server = SSHD(d, port, "root", root / "etc/ssh/ssh_host_ed25519_key", client_key, d / "known_hosts", log, proc)
    server.write_known_hosts(server.known_hosts)
    return server


def version(root: Path) -> str:
    """`sshd -V` of the rootfs's sshd, e.g. "OpenSSH_10.0p2 Debian-7+deb13u4, OpenSSL 3.5.9 ..."."""
    r = subprocess.run(["chroot", str(root), "/usr/sbin/sshd", "-V"], capture_output=True, text=True, timeout=10)
    return (r.stdout + r.stderr).strip()


def stop(server: SSHD) -> None:
    sessions = server.session_pids()  # they outlive the listener; ended too, so the mount namespace goes
    server.stop()
    for pid in sessions:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


if __name__ == "__main__":  # python -m tests.openssh10 DIR: unpack the rootfs there, print its sshd's version
    import sys

    root = rootfs(Path(sys.argv[1]))
    print(f"{version(root)}\nexport GPUDOCTOR_TEST_SSHD_ROOT={root}")
