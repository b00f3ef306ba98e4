"""Shared fixtures: a real OpenSSH server on 127.0.0.1, SSH hosts that trust it, fake remote roots.

    sshd            session: the running server (tests.sshd.SSHD): .port .user .client_key .known_hosts,
                    .make_host(**SSHHost kwargs), .inventory_yaml(...), .write_known_hosts(path, port)
    sshd_factory    session: start_extra(**kw) -> another SSHD (own keys; e.g. to cut its connections)
    sshd_nosftp     session: an SSHD without an SFTP subsystem
    ssh_host        function: an SSHHost on `sshd`, closed after the test
    ssh_fake_root   function: FakeRoot(root: Path, host: SSHHost) — the host maps every absolute path of a file
                    operation under `root` and puts root/usr/local/bin first on the remote PATH, so
                    `fake.write("/etc/pve/lxc/200.conf", text)` then `fake.host.read_file("/etc/pve/lxc/200.conf")`
    cut_proxy       function: factory cut_proxy(cut_after=N) -> CutProxy in front of `sshd` (fault injection)
    unused_major    session: a character-device major absent from /proc/devices (open() gives ENXIO)
    dev_tmp_path    function: like tmp_path, but where mknod'ed nodes open as on /dev (a tmpfs without nodev, as root;
                    tests/devmount.py). A module that makes device nodes overrides its tmp_path with it.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# The tests run against the INSTALLED gpudoctor (README: pip install '.[test]'), never the source tree, whose layout
# is not the installed one. pytest put this checkout on sys.path to import tests/; gpudoctor is imported here, with the
# checkout off sys.path, so the installed package is the one in sys.modules for the whole run. Child processes
# started with cwd=checkout must not import the source tree either (PYTHONSAFEPATH; tests/childenv.py).
CHECKOUT = Path(__file__).resolve().parents[1]
_saved = list(sys.path)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != CHECKOUT]
try:
    import gpudoctor  # noqa: F401
    import gpudoctor.checks  # noqa: F401
except ImportError as e:
    pytest.exit(f"gpudoctor is not installed ({e}): run ./install.sh --extras test first (README line 2)", returncode=4)
finally:
    sys.path[:] = _saved
os.environ["PYTHONSAFEPATH"] = "1"

# A shell starts a background job (`cmd &`, as .ci/run starts the Debian stages) with SIGINT ignored, and an ignored
# signal stays ignored across exec: every process the tests start would then be deaf to Ctrl-C, and the tests that
# send it one (exit 130, a campaign's cancel) could not pass. Give them the default back, as a terminal would.
import signal as _signal  # noqa: E402

if _signal.getsignal(_signal.SIGINT) is _signal.SIG_IGN:
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)

from tests import needs  # noqa: E402
from tests.devmount import DevMount, remove  # noqa: E402
from tests.sshd import SSHD, CutProxy, start_sshd  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A missing real component is reported at tests/needs.py, not at each test, so pytest's summary folds every
    skip it causes into ONE line naming the component and what installs it."""
    report = (yield).get_result()
    if report.skipped and isinstance(report.longrepr, tuple) and needs.MARK in str(report.longrepr[2]):
        report.longrepr = (needs.__file__, needs.missing.__code__.co_firstlineno, report.longrepr[2])


@pytest.fixture(scope="session")
def sshd_factory(tmp_path_factory):
    started: list[SSHD] = []

    class Factory:
        @staticmethod
        def start_extra(**kw) -> SSHD:
            server = start_sshd(tmp_path_factory.mktemp("sshd"), **kw)
            started.append(server)
            return server

    yield Factory()
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def sshd(sshd_factory) -> SSHD:
    return sshd_factory.start_extra()


@pytest.fixture(scope="session")
def sshd_nosftp(sshd_factory) -> SSHD:
    """A server without an SFTP subsystem: SSHHost falls back to its python programs for files."""
    return sshd_factory.start_extra(sftp=False)


@pytest.fixture
def ssh_host(sshd):
    host = sshd.make_host()
    yield host
    host.close()


@dataclass
class FakeRoot:
    """A temp directory standing in for a remote machine's filesystem, served over real SSH."""

    root: Path
    host: object  # SSHHost with root=self.root

    @property
    def bin(self) -> Path:
        return self.root / "usr/local/bin"

    def path(self, remote: str) -> Path:
        return self.root / remote.lstrip("/")

    def write(self, remote: str, data: str | bytes, mode: int | None = None) -> Path:
        p = self.path(remote)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        if mode is not None:
            os.chmod(p, mode)
        return p

    def tool(self, name: str, script: str) -> Path:
        """An executable stand-in (e.g. `pct`) first on the remote PATH."""
        return self.write(f"/usr/local/bin/{name}", script, 0o755)


@pytest.fixture
def ssh_fake_root(sshd, tmp_path):
    root = tmp_path / "remote"
    (root / "usr/local/bin").mkdir(parents=True)
    host = sshd.make_host(name="fake-remote", root=str(root), path_prepend=[str(root / "usr/local/bin")])
    yield FakeRoot(root, host)
    host.close()


@pytest.fixture
def cut_proxy(sshd):
    proxies: list[CutProxy] = []

    def make(cut_after: int | None = None) -> CutProxy:
        p = CutProxy(sshd.port, cut_after)
        proxies.append(p)
        return p

    yield make
    for p in proxies:
        p.close()


@pytest.fixture(scope="session")
def unused_major() -> int:
    used = set()
    section = None
    for line in Path("/proc/devices").read_text().splitlines():
        if line.endswith(":"):
            section = line
            continue
        if section and section.startswith("Character") and line.strip():
            used.add(int(line.split()[0]))
    return next(m for m in range(240, 255) if m not in used)


@pytest.fixture(scope="session")
def _dev_mount(tmp_path_factory):
    mount = DevMount(tmp_path_factory.getbasetemp() / "dev-capable")
    yield mount
    mount.close()


@pytest.fixture
def dev_tmp_path(request, _dev_mount, tmp_path_factory):
    """A fresh directory where device nodes work whatever /tmp's mount options (tests/devmount.py)."""
    if os.geteuid() != 0:  # no mknod anyway: those tests skip through needs.root()
        yield tmp_path_factory.mktemp(re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:30], numbered=True)
        return
    d = _dev_mount.directory(request.node.name)
    yield d
    remove(d)
