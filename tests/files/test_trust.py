"""The one rule and the one door (gpudoctor/files/trust.py, #47): what root may trust, judged on the fd it opened.

Run as root; uid 65534 (nobody) plays the other user (files chowned to it, or made by a forked child that dropped to
it). Each case has its positive control beside it: the same shape owned by root is read.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest

from gpudoctor.files import safe, trust
from tests import needs
from tests.hostile.planted import as_attacker

NOBODY = 65534


@pytest.fixture
def base(tmp_path):
    needs.root()
    d = tmp_path / "base"
    d.mkdir(mode=0o755)
    return d


def file_in(d: Path, name: str = "f", data: bytes = b"root's\n", mode: int = 0o644) -> Path:
    p = d / name
    p.write_bytes(data)
    p.chmod(mode)
    return p


def refused(path, *words, strict=True):
    with pytest.raises(trust.Refused) as exc:
        fd, _ = trust.open_file(path, strict=strict)
        os.close(fd)
    for w in words:
        assert w in str(exc.value), str(exc.value)
    assert "\n" not in str(exc.value)
    return exc.value


def test_roots_file_in_roots_directories_is_read(base):
    assert trust.read_file(file_in(base)) == b"root's\n"
    assert trust.untrusted(base / "f") is None


@pytest.mark.parametrize("gid", [0, 100])
def test_a_group_writable_file_is_refused_whatever_its_group(base, gid):
    """Decided (docs/security.md): root's group is a group like any other — a member of gid 0 is not root."""
    p = file_in(base, mode=0o664)
    os.chown(p, 0, gid)
    refused(p, f"writable by group {gid} (mode 0664)")
    d = base / "d"
    d.mkdir()
    os.chown(d, 0, gid)
    d.chmod(0o775)
    refused(file_in(d), str(d), f"writable by group {gid} (mode 0775)")
    with pytest.raises(safe.Unsafe, match=f"writable by group {gid}"):  # the writers' rule is the same one
        os.close(safe.owned_dir(str(d), create=False))


def test_a_world_writable_file_and_another_users_file_are_refused(base):
    p = file_in(base, mode=0o666)
    refused(p, "writable by every user (mode 0666)")
    p.chmod(0o644)
    os.chown(p, NOBODY, NOBODY)
    e = refused(p, f"owned by nobody (uid {NOBODY}), mode 0644, not root's")
    assert e.rule and e.path == str(p)
    assert trust.read_file(p, strict=False) == b"root's\n"  # a reader that does not obey it may read it


def test_a_directory_another_user_owns_is_refused_at_its_depth(base):
    eve = base / "eve"
    (eve / "sub").mkdir(parents=True)
    os.chown(eve, NOBODY, NOBODY)
    e = refused(file_in(eve / "sub"), str(eve), "owned by nobody")
    assert e.path == str(eve)


def test_a_sticky_directory_root_owns_is_passed_through(base):
    """/tmp-like: 1777 and root's. Root's file in it is read; the attacker's file is not; the directory itself is not
    trusted as the last part (nor written into)."""
    pub = base / "pub"
    pub.mkdir()
    pub.chmod(0o1777)
    assert trust.read_file(file_in(pub)) == b"root's\n"
    theirs = file_in(pub, "theirs")
    os.chown(theirs, NOBODY, NOBODY)
    refused(theirs, "owned by nobody")
    assert "writable by every user (mode 1777)" in trust.untrusted(pub)
    with pytest.raises(safe.Unsafe, match="writable by every user"):
        os.close(safe.owned_dir(str(pub), create=False))
    pub.chmod(0o0777)  # the same directory without the sticky bit: anyone may rename root's file away
    refused(pub / "f", str(pub), "writable by every user (mode 0777)")


def test_a_sticky_directory_another_user_owns_is_theirs(base):
    pub = base / "pub"
    pub.mkdir()
    pub.chmod(0o1777)
    os.chown(pub, NOBODY, NOBODY)
    refused(file_in(pub), str(pub), "owned by nobody")


def _link(at: Path, to, uid: int = 0) -> Path:
    at.symlink_to(to)
    os.lchown(at, uid, uid)
    return at


@pytest.mark.parametrize("depth", ["first", "middle", "last"])
def test_links_at_every_depth(base, depth):
    """base/L/m/f, base/a/L/f, base/a/m/L: root's link in root's directory is followed; the same link owned by
    another user, or root's link in a directory another user can write, is refused; never followed silently."""
    real = base / "real"
    (real / "m").mkdir(parents=True)
    file_in(real / "m")
    (base / "a" / "m").mkdir(parents=True)
    (base / "a" / "real").mkdir()
    file_in(base / "a" / "real", "g", b"g\n")
    (base / "a" / "m" / "t").write_bytes(b"t\n")
    at, path, want = {
        "first": (base / "L", base / "L" / "m" / "f", b"root's\n"),
        "middle": (base / "a" / "L", base / "a" / "L" / "g", b"g\n"),
        "last": (base / "a" / "m" / "L", base / "a" / "m" / "L", b"t\n"),
    }[depth]
    to = {"first": "real", "middle": str(base / "a" / "real"), "last": "t"}[depth]
    _link(at, to)
    assert trust.read_file(path) == want
    os.lchown(at, NOBODY, NOBODY)
    refused(path, str(at), f"is a link owned by nobody (uid {NOBODY})")
    refused(path, str(at), "link owned by nobody", strict=False)  # not even a reader that does not obey it
    os.lchown(at, 0, 0)
    at.parent.chmod(0o777)  # root's link, but anyone may replace it
    refused(path, strict=False, *("a link in a directory others can change",))


def test_link_targets_with_dotdot_absolute_and_loops(base):
    (base / "a" / "b").mkdir(parents=True)
    file_in(base / "a")
    _link(base / "a" / "b" / "up", "../f")
    assert trust.read_file(base / "a" / "b" / "up") == b"root's\n"
    _link(base / "abs", str(base / "a" / "f"))
    assert trust.read_file(base / "abs") == b"root's\n"
    _link(base / "loop", "loop")
    e = refused(base / "loop", "too many levels of links")
    assert e.errno == errno.ELOOP


def test_a_hard_link_another_user_could_have_made_is_refused(base):
    """Root's file with a second name in a directory others can add names to (a sticky /tmp, another user's
    directory) is refused; with a second name where only root adds names, it is root's doing and read."""
    f = file_in(base)
    os.link(f, base / "second")
    assert trust.read_file(base / "second") == b"root's\n"
    pub = base / "pub"
    pub.mkdir()
    pub.chmod(0o1777)
    os.link(f, pub / "linked")
    refused(pub / "linked", "has 3 hard links in a directory others can write")
    eve = base / "eve"
    eve.mkdir()
    os.chown(eve, NOBODY, NOBODY)
    os.link(f, eve / "linked")
    refused(eve / "linked", "hard links", strict=False)


@pytest.fixture
def no_hang():
    """SIGALRM after 10 s: a read that blocks fails the test instead of hanging the suite."""
    import signal

    def boom(*_):
        raise AssertionError("blocked")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_fifo_socket_and_device_are_one_line_never_a_hang(base, no_hang):
    """A FIFO is never opened (it would block until a writer comes): its type is read first, then the fd's again."""
    fifo = base / "fifo"
    os.mkfifo(fifo)
    refused(fifo, "is a FIFO, not a regular file")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(base / "sock"))
    try:
        refused(base / "sock", "is a socket, not a regular file")
    finally:
        s.close()
    refused("/dev/null", "is a character device, not a regular file")
    refused(base, "is a directory, not a regular file")


def test_a_missing_file_is_enoent_and_a_missing_directory_names_the_part(base):
    e = refused(base / "nope", "o such file")
    assert e.errno == errno.ENOENT and not e.rule
    e = refused(base / "gone" / "f", str(base / "gone"))
    assert e.errno == errno.ENOENT


def test_a_file_swapped_after_its_check_is_not_read(base, monkeypatch):
    """The door looks (fstatat) and then opens; whatever appears between the two is judged on the fd, not on the
    look: the attacker's file renamed over root's is refused, never read."""
    target = file_in(base)
    theirs = file_in(base, "theirs", b"eve's\n")
    os.chown(theirs, NOBODY, NOBODY)
    real_stat = os.stat
    calls = []

    def stat_then_swap(name, *a, **kw):
        st = real_stat(name, *a, **kw)
        if name == "f" and not calls:
            calls.append(1)
            os.rename(theirs, target)
        return st

    monkeypatch.setattr(trust.os, "stat", stat_then_swap)
    e = refused(target)
    assert calls and ("replaced" in e.why or "owned by nobody" in e.why), e.why


def test_a_file_appearing_after_a_missing_look_is_judged_on_its_fd(base):
    """No check passes a missing file to a later open by name: the one open is the check."""
    p = base / "appears"
    with pytest.raises(trust.Refused) as exc:
        trust.open_file(p)
    assert exc.value.errno == errno.ENOENT
    as_attacker(lambda: None)  # the attacker exists
    file_in(base, "appears")
    os.chown(p, NOBODY, NOBODY)
    refused(p, "owned by nobody")


def test_open_dir_walks_by_fd_and_creates_through_the_callback(base):
    made = []
    fd = trust.open_dir(base / "x" / "y", mkdir=lambda name, dfd: (made.append(name), os.mkdir(name, 0o755,
                                                                                               dir_fd=dfd)))
    try:
        assert made == ["x", "y"] and stat.S_ISDIR(os.fstat(fd).st_mode)
        assert os.fstat(fd).st_ino == os.stat(base / "x" / "y").st_ino
    finally:
        os.close(fd)
    (base / "file").write_text("")
    with pytest.raises(trust.Refused, match="is a regular file, not a directory"):
        trust.open_dir(base / "file" / "z")


def test_the_text_runs_standalone():
    """gather/deep_python.py sends this file's text to the target: it must run with no gpudoctor importable."""
    import subprocess
    import sys

    src = Path(trust.__file__).read_text() + "\nimport sys\nprint(untrusted(sys.argv[1]))\n"
    r = subprocess.run([sys.executable, "-I", "-S", "-c", src, "/etc/passwd"], capture_output=True, text=True,
                       cwd="/", timeout=30)
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr
