"""Contract of the Host write operations used by gpudoctor.files.edit: in-process (LocalHost) and the portable
defaults that run small python programs through `run` (what a remote backend without SFTP gets)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

import pytest

from gpudoctor.host.base import Host
from gpudoctor.host.local import LocalHost
from tests import needs


@pytest.fixture
def tmp_path(dev_tmp_path):
    """Device nodes are made here: a directory where they open as on /dev, whatever /tmp's mount (tests/devmount.py)."""
    return dev_tmp_path


@dataclass
class RunOnlyHost(Host):
    """A backend that implements only `run`: every write goes through the base class's programs."""

    name: str = "runonly"

    def __post_init__(self):
        self._local = LocalHost()
        self.python = self._local.python

    def run(self, argv, timeout=None, input=None, env=None):
        return self._local.run(argv, timeout=timeout, input=input, env=env)


@pytest.fixture(params=["local", "run-only"])
def host(request, tmp_path):
    if request.param == "local":
        return LocalHost(root=str(tmp_path)), "/"
    return RunOnlyHost(), str(tmp_path) + "/"


def test_write_create_truncate_exclusive(host):
    h, base = host
    p = base + "f.txt"
    h.write_file(p, b"one\n", mode=0o640)
    assert h.read_file(p).data == b"one\n"
    assert h.stat(p).mode == 0o640
    h.write_file(p, b"two")  # truncates
    assert h.read_file(p).data == b"two"
    with pytest.raises(OSError) as exc:
        h.write_file(p, b"three", exclusive=True)
    assert exc.value.errno == errno.EEXIST
    assert h.read_file(p).data == b"two"


def test_mode_is_exact_despite_umask(host):
    h, base = host
    old = os.umask(0o077)
    try:
        h.write_file(base + "m", b"x", mode=0o644)
    finally:
        os.umask(old)
    assert h.stat(base + "m").mode == 0o644


def test_rename_replaces_and_unlink(host):
    h, base = host
    h.write_file(base + "a", b"new")
    h.write_file(base + "b", b"old")
    h.rename(base + "a", base + "b")
    assert h.read_file(base + "b").data == b"new"
    assert h.read_file(base + "a").error == "ENOENT"
    h.unlink(base + "b")
    with pytest.raises(FileNotFoundError):
        h.unlink(base + "b")


def test_makedirs_and_errors_carry_errno(host):
    h, base = host
    h.makedirs(base + "x/y/z", 0o700)
    assert h.stat(base + "x/y/z").kind == "dir"
    h.makedirs(base + "x/y/z")  # exists: fine
    with pytest.raises(OSError) as exc:
        h.write_file(base + "nope/f", b"x")
    assert exc.value.errno == errno.ENOENT


def test_readonly_filesystem_is_refused_with_erofs(host, tmp_path):
    """A real read-only bind mount: the write raises EROFS and statvfs says readonly."""
    needs.root()  # mount
    import subprocess

    h, base = host
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "keep").write_bytes(b"k")
    subprocess.run(["mount", "--bind", str(ro), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        assert h.statvfs(base + "ro")["readonly"] is True
        with pytest.raises(OSError) as exc:
            h.write_file(base + "ro/new", b"x")
        assert exc.value.errno == errno.EROFS
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    assert h.statvfs(base + "ro")["readonly"] is False
    assert stat.S_ISREG(os.stat(ro / "keep").st_mode)


def test_mknod_makes_a_char_node_with_exact_mode_and_refuses_an_existing_path(host, unused_major):
    needs.root()  # mknod
    h, base = host
    old = os.umask(0o077)
    try:
        h.mknod(base + "nvidia-uvm", unused_major, 0, 0o666)
    finally:
        os.umask(old)
    st = h.stat(base + "nvidia-uvm")
    assert (st.kind, st.major, st.minor, st.mode) == ("char", unused_major, 0, 0o666)
    assert h.try_open_many([base + "nvidia-uvm"])[base + "nvidia-uvm"] == "ENXIO"  # a real node: no driver behind it
    with pytest.raises(FileExistsError):
        h.mknod(base + "nvidia-uvm", unused_major, 1, 0o666)
    assert h.stat(base + "nvidia-uvm").minor == 0  # untouched
    with pytest.raises(OSError) as exc:
        h.mknod(base + "no-dir/x", unused_major, 0)
    assert exc.value.errno == errno.ENOENT


def test_mknod_over_ssh_maps_under_the_fake_root(ssh_fake_root, unused_major):
    needs.root()  # mknod
    fake = ssh_fake_root
    fake.write("/dev/.keep", b"")
    fake.host.mknod("/dev/nvidia-uvm-tools", unused_major, 1, 0o600)
    st = os.lstat(fake.path("/dev/nvidia-uvm-tools"))
    assert stat.S_ISCHR(st.st_mode) and os.minor(st.st_rdev) == 1 and stat.S_IMODE(st.st_mode) == 0o600
    with pytest.raises(FileExistsError):
        fake.host.mknod("/dev/nvidia-uvm-tools", unused_major, 1)


def test_chmod_sets_the_mode_of_a_node_and_carries_errno(host, unused_major):
    needs.root()  # mknod
    h, base = host
    h.mknod(base + "tools", unused_major, 1, 0o000)
    h.chmod(base + "tools", 0o666)
    assert h.stat(base + "tools").mode == 0o666
    with pytest.raises(FileNotFoundError):
        h.chmod(base + "missing", 0o666)


def test_chmod_over_ssh_maps_under_the_fake_root(ssh_fake_root):
    fake = ssh_fake_root
    p = fake.write("/etc/x.conf", b"x", mode=0o600)
    fake.host.chmod("/etc/x.conf", 0o644)
    assert stat.S_IMODE(os.lstat(p).st_mode) == 0o644


def test_snapshot_refuses_mknod_and_chmod():
    from gpudoctor.host.replay import ReplayHost

    for op in (lambda h: h.mknod("/dev/x", 1, 3), lambda h: h.chmod("/dev/x", 0o666)):
        with pytest.raises(OSError) as e:
            op(ReplayHost(transcript={}))
        assert e.value.errno == errno.EROFS
