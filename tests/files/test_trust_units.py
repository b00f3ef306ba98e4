"""The door (gpudoctor/files/trust.py) at its edges (#48 item 6: bench/mutation.py found these untested): each
refusal's exact one line, the link-walk's bounds ("..", ".", 40 links, a link to "/"), the flags a file is opened
with, races between the look and the open (a swap made by patching the door's own stat or readlink, as
tests/files/test_trust.py does), the size limits, and that no call leaves an fd open.

In-process and fast (bench/mutation.py scores files/trust with it). Run as root; uid 65534 (nobody) and uid 1
(daemon) play other users through chown.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

import pytest

from gpudoctor.files import trust

from .conftest import NO_SUCH_UID, NOBODY  # and the fixture `base`


def file_in(d: Path, name: str = "f", data: bytes = b"root's\n", mode: int = 0o644) -> Path:
    p = d / name
    p.write_bytes(data)
    p.chmod(mode)
    return p


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def refused(call, *args, **kw) -> trust.Refused:
    with pytest.raises(trust.Refused) as exc:
        r = call(*args, **kw)
        os.close(r[0] if isinstance(r, tuple) else r)
    assert "\n" not in str(exc.value)
    return exc.value


def is_(e: trust.Refused, path, why: str) -> None:
    assert (e.path, e.why, str(e)) == (str(path), why, f"{path}: {why}")


# --- the rule's words ---------------------------------------------------------------------------------------------


def test_each_refusal_of_the_rule_in_its_exact_words(base):
    p = file_in(base, mode=0o664)
    is_(refused(trust.open_file, p), p, "writable by group 0 (mode 0664)")
    p.chmod(0o646)
    is_(refused(trust.open_file, p), p, "writable by every user (mode 0646)")
    p.chmod(0o644)
    os.chown(p, NOBODY, NOBODY)
    is_(refused(trust.open_file, p), p, f"owned by nobody (uid {NOBODY}), mode 0644, not root's")
    os.chown(p, NO_SUCH_UID, 0)
    is_(refused(trust.open_file, p), p, f"owned by uid {NO_SUCH_UID}, mode 0644, not root's")
    assert trust.owner(NO_SUCH_UID) == f"uid {NO_SUCH_UID}" and trust.owner(0) == "root (uid 0)"
    os.chown(p, 1, 1)  # daemon: a system user is not root
    is_(refused(trust.open_file, p), p, "owned by daemon (uid 1), mode 0644, not root's")


def test_refused_is_an_oserror_with_its_errno_and_words():
    e = trust.Refused("/p", "gone", errno.ENOENT)
    assert e.args == (errno.ENOENT, "gone") and e.strerror == "gone" and e.errno == errno.ENOENT and not e.rule
    e = trust.Refused("/p", "owned by eve", rule=True)
    assert e.args == (0, "owned by eve") and e.strerror == "owned by eve" and e.errno is None and e.rule
    assert str(e) == "/p: owned by eve"


def test_kinds_are_named(base):
    assert [trust.kind(m) for m in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK, stat.S_IFIFO, stat.S_IFCHR,
                                    stat.S_IFBLK, stat.S_IFSOCK, 0)] == [
        "a regular file", "a directory", "a link", "a FIFO", "a character device", "a block device", "a socket",
        "not a regular file"]
    blk = base / "blk"
    os.mknod(blk, stat.S_IFBLK | 0o600, os.makedev(7, 200))
    is_(refused(trust.open_file, blk), blk, "is a block device, not a regular file")


def test_the_root_directory_is_judged_first(base):
    """With another user set as the trusted one, "/" itself (root's) is the part refused, by its name."""
    p = file_in(base)
    e = refused(trust.open_file, p, uids={NOBODY})
    is_(e, "/", "owned by root (uid 0), mode 0755, not root's")
    assert e.rule
    assert trust.read_file(p, uids={NOBODY}, strict=False) == b"root's\n"  # a reader that does not judge parts


def test_strict_is_the_default_of_every_entry(base):
    eve = base / "eve"
    eve.mkdir()
    os.chown(eve, NOBODY, NOBODY)
    f = file_in(eve)
    is_(refused(trust.open_dir, eve), eve, f"owned by nobody (uid {NOBODY}), mode 0755, not root's")
    is_(refused(trust.read_file, f), eve, f"owned by nobody (uid {NOBODY}), mode 0755, not root's")
    os.chown(f, NOBODY, NOBODY)
    dfd = trust.open_dir(eve, strict=False)
    try:
        is_(refused(trust.open_at, dfd, "f", "SHOWN"), "SHOWN", f"owned by nobody (uid {NOBODY}), mode 0644, "
                                                                "not root's")
    finally:
        os.close(dfd)


# --- links ----------------------------------------------------------------------------------------------------------


def _link(at: Path, to, uid: int = 0) -> Path:
    at.symlink_to(to)
    os.lchown(at, uid, uid)
    return at


def test_a_link_refused_in_its_exact_words(base):
    (base / "real").mkdir()
    file_in(base / "real")
    lk = _link(base / "L", "real", NOBODY)
    e = refused(trust.open_file, lk / "f")
    is_(e, lk, f"is a link owned by nobody (uid {NOBODY}); gpudoctor does not follow it as root")
    assert e.rule  # the rule refused it (not a type or an OS error)
    os.lchown(lk, 0, 0)
    base.chmod(0o775)
    is_(refused(trust.open_file, lk / "f", strict=False), lk,
        "is a link in a directory others can change; gpudoctor does not follow it as root")


def test_any_link_is_only_for_a_reader_that_does_not_judge(base):
    (base / "real").mkdir()
    file_in(base / "real")
    lk = _link(base / "L", "real", NOBODY)
    refused(trust.open_file, lk / "f", strict=False)
    fd, _ = trust.open_file(lk / "f", strict=False, any_link=True)
    os.close(fd)
    refused(trust.open_file, lk / "f", strict=True, any_link=True)
    refused(trust.open_dir, lk, strict=False)  # open_dir never follows an untrusted link


@pytest.mark.parametrize("n,ok", [(40, True), (41, False)])
def test_forty_links_are_followed_the_forty_first_is_refused(base, n, ok):
    """Like the kernel's ELOOP bound: a chain of 40 links reads, 41 is one line."""
    file_in(base)
    for i in range(n):
        _link(base / f"l{i}", f"l{i + 1}" if i + 1 < n else "f")
    if ok:
        assert trust.read_file(base / "l0") == b"root's\n"
        return
    e = refused(trust.open_file, base / "l0")
    is_(e, base / f"l{n - 1}", "too many levels of links")
    assert e.errno == errno.ELOOP


def test_dot_and_dotdot_in_link_targets(base):
    """"." is skipped, ".." pops one directory and never climbs above "/": the path named in a refusal is the one
    walked."""
    (base / "a" / "b").mkdir(parents=True)
    (base / "a" / "sub").mkdir()
    file_in(base / "a" / "sub", "g", b"g\n")
    _link(base / "a" / "b" / "up", "../sub/g")
    assert trust.read_file(base / "a" / "b" / "up") == b"g\n"
    _link(base / "a" / "dl", "./sub")
    assert trust.read_file(base / "a" / "dl" / "g") == b"g\n"
    first, *rest = base.parts[1:]
    _link(base / "abs", "/../" + first + "/../" + "/".join([first, *rest]) + "/a/sub/g")
    assert trust.read_file(base / "abs") == b"g\n"
    eve = base / "a" / "eve"
    eve.mkdir()
    os.chown(eve, NOBODY, NOBODY)
    file_in(eve)
    _link(base / "a" / "b" / "toeve", "../eve/f")
    is_(refused(trust.open_file, base / "a" / "b" / "toeve"), eve,
        f"owned by nobody (uid {NOBODY}), mode 0755, not root's")
    _link(base / "a" / "doteve", "./eve/f")
    is_(refused(trust.open_file, base / "a" / "doteve"), eve,
        f"owned by nobody (uid {NOBODY}), mode 0755, not root's")


@pytest.mark.parametrize("target,why", [("/", "is a link to /, not a regular file"),
                                        (".", "is a link to a directory, not a regular file"),
                                        ("sub/..", "is a link to a directory, not a regular file")])
def test_a_link_to_a_directory_is_not_a_file(base, target, why):
    (base / "sub").mkdir()
    lk = _link(base / "lk", target)
    e = refused(trust.open_file, lk)
    is_(e, lk, why)
    assert e.errno == errno.EISDIR


def test_the_root_is_not_a_file_and_a_name_below_it_is_shown_once_slashed():
    e = refused(trust.open_file, "/")
    is_(e, "/", "is a directory, not a regular file")
    assert e.errno == errno.EISDIR and trust.refusal("/") is None
    e = refused(trust.open_file, "/gpudoctor-no-such-file")
    is_(e, "/gpudoctor-no-such-file", "No such file or directory")


def test_a_refused_path_is_named_as_walked_whatever_its_last_letter(base):
    (base / "dirX").mkdir()
    e = refused(trust.open_file, base / "dirX" / "nope")
    is_(e, base / "dirX" / "nope", "No such file or directory")


def test_open_at_names_a_link_and_a_missing_name(base):
    file_in(base)
    _link(base / "lk", "f")
    dfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        e = refused(trust.open_at, dfd, "lk", "SHOWN")
        is_(e, "SHOWN", "is a link, not a regular file")
        assert e.errno == errno.ELOOP
        e = refused(trust.open_at, dfd, "nope", "SHOWN")
        is_(e, "SHOWN", "No such file or directory")
        assert e.errno == errno.ENOENT
        os.link(base / "f", base / "f2")  # two names where only root adds names: root's doing, read
        fd, st = trust.open_at(dfd, "f2", "SHOWN")
        os.close(fd)
        assert st.st_nlink == 2
    finally:
        os.close(dfd)


def test_a_hard_link_with_one_other_name_in_a_sticky_directory_is_refused(base):
    pub = base / "pub"
    pub.mkdir()
    pub.chmod(0o1777)
    f = file_in(pub)
    os.link(f, pub / "second")
    is_(refused(trust.open_file, pub / "second"), pub / "second",
        "has 2 hard links in a directory others can write: another user could have linked it there")


# --- open_dir -------------------------------------------------------------------------------------------------------


def test_open_dir_words_for_a_missing_part_a_file_and_a_long_name(base):
    e = refused(trust.open_dir, base / "gone" / "x")
    is_(e, base / "gone", "no such file or directory")
    assert e.errno == errno.ENOENT
    file_in(base)
    e = refused(trust.open_dir, base / "f" / "z")
    is_(e, base / "f", "is a regular file, not a directory")
    assert e.errno == errno.ENOTDIR
    long = "x" * 300
    e = refused(trust.open_dir, base / long)
    is_(e, base / long, "File name too long")
    assert e.errno == errno.ENAMETOOLONG


@pytest.mark.parametrize("planted", ["link", "file", "nothing"])
def test_a_part_that_is_not_a_directory_after_mkdir_is_refused(base, planted):
    """Another user's name appearing where the door just made a directory (the mkdir callback plants it, as the race
    would): a link or a file is never followed; a name that is still missing says so."""
    def mkdir(name, dfd):
        if planted == "link":
            os.symlink("/etc", name, dir_fd=dfd)
        elif planted == "file":
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=dfd))

    e = refused(trust.open_dir, base / "new" / "deeper", mkdir=mkdir)
    if planted == "nothing":
        is_(e, base / "new", "No such file or directory")
        assert e.errno == errno.ENOENT
    else:
        is_(e, base / "new", "appeared as a link or file while gpudoctor created it; not followed")
        assert e.errno == errno.ENOTDIR  # O_DIRECTORY|O_NOFOLLOW: ENOTDIR for a link too
        assert not (Path("/etc") / "deeper").exists()


# --- the open itself ------------------------------------------------------------------------------------------------


def test_the_fd_is_close_on_exec_and_blocking(base):
    fd, st = trust.open_file(file_in(base))
    try:
        assert stat.S_ISREG(st.st_mode)
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    finally:
        os.close(fd)


def _after_look(monkeypatch, name, then):
    """Run then() right after the door's last look (fstatat) at `name` before its open (open_file looks once for a
    link, open_at once for the type), once: the race a local user would run."""
    real_stat = os.stat
    done = []
    looks = []

    def stat_then(p, *a, **kw):
        st = real_stat(p, *a, **kw)
        if p == name:
            looks.append(1)
            if len(looks) == 2 and not done:
                done.append(1)
                then()
        return st

    monkeypatch.setattr(trust.os, "stat", stat_then)
    return done


def test_a_link_swapped_in_after_the_look_is_not_opened(base, monkeypatch):
    target = file_in(base)
    file_in(base, "other", b"other\n")

    def swap():
        os.unlink(target)
        os.symlink(base / "other", target)

    done = _after_look(monkeypatch, "f", swap)
    e = refused(trust.open_file, target)
    assert done and e.errno == errno.ELOOP
    is_(e, target, "Too many levels of symbolic links")


def test_roots_own_file_swapped_in_after_the_look_is_refused(base, monkeypatch):
    target = file_in(base)
    file_in(base, "other", b"other\n")
    done = _after_look(monkeypatch, "f", lambda: os.rename(base / "other", target))
    is_(refused(trust.open_file, target), target, "was replaced while gpudoctor opened it (now a regular file)")
    assert done


def test_a_file_removed_after_the_look_is_enoent(base, monkeypatch):
    target = file_in(base)
    done = _after_look(monkeypatch, "f", lambda: os.unlink(target))
    e = refused(trust.open_file, target)
    assert done and e.errno == errno.ENOENT
    is_(e, target, "No such file or directory")


def test_a_link_removed_while_it_is_followed_is_one_refusal(base, monkeypatch):
    file_in(base)
    lk = _link(base / "lk", "f")
    real = os.readlink

    def gone(name, *a, **kw):
        os.unlink(lk)
        return real(name, *a, **kw)

    monkeypatch.setattr(trust.os, "readlink", gone)
    r = trust.refusal(lk)
    is_(r, lk, "No such file or directory")
    assert r.errno == errno.ENOENT


# --- sizes ----------------------------------------------------------------------------------------------------------


def test_read_fd_reads_one_byte_more_than_allowed_and_no_more(base):
    data = bytes(range(256)) * (3 << 12)  # 3 MiB: more than one 1 MiB chunk
    p = file_in(base, data=data)
    fd = os.open(p, os.O_RDONLY)
    try:
        for limit in (10, 1 << 20, 3 << 19, len(data) - 1, len(data), 4 << 20):
            os.lseek(fd, 0, os.SEEK_SET)
            assert trust.read_fd(fd, limit) == data[:limit + 1], limit
    finally:
        os.close(fd)


def test_read_file_size_limits_in_exact_words(base):
    p = file_in(base, data=b"x" * 11)
    assert trust.read_file(p, max_bytes=11) == b"x" * 11
    is_(refused(trust.read_file, p, max_bytes=10), p, "is 11 bytes, more than the 10 gpudoctor reads")
    big = base / "big"
    with open(big, "wb") as fh:
        fh.truncate((16 << 20) + 1)  # sparse
    is_(refused(trust.read_file, big), big, "is 16777217 bytes, more than the 16777216 gpudoctor reads")
    with open(big, "wb") as fh:
        fh.truncate(16 << 20)
    assert len(trust.read_file(big)) == 16 << 20


def test_a_file_that_grows_after_its_size_was_checked_is_refused(base, monkeypatch):
    p = file_in(base, data=b"x" * 10)
    real = trust.open_file

    def then_grow(*a, **kw):
        fd, st = real(*a, **kw)
        with open(p, "ab") as fh:
            fh.write(b"y" * 10)
        return fd, st

    monkeypatch.setattr(trust, "open_file", then_grow)
    is_(refused(trust.read_file, p, max_bytes=15), p, "grew past the 15 bytes gpudoctor reads")


# --- refusal() and fds ----------------------------------------------------------------------------------------------


def test_refusal_names_the_rules_reason_for_a_file_and_a_directory(base):
    f = file_in(base)
    os.chown(f, NOBODY, NOBODY)
    is_(trust.refusal(f), f, f"owned by nobody (uid {NOBODY}), mode 0644, not root's")
    d = base / "d"
    d.mkdir()
    d.chmod(0o1777)
    r = trust.refusal(d)
    is_(r, d, "writable by every user (mode 1777)")
    assert r.rule
    assert trust.refusal(base) is None


def test_no_call_leaves_an_fd_open(base):
    f = file_in(base)
    eve = base / "eve"
    eve.mkdir()
    file_in(eve)
    os.chown(eve, NOBODY, NOBODY)
    pub = base / "pub"
    pub.mkdir()
    pub.chmod(0o1777)
    n = open_fds()
    os.close(trust.open_dir(base / "new", mkdir=lambda name, dfd: os.mkdir(name, dir_fd=dfd)))
    refused(trust.open_dir, eve)
    fd, _ = trust.open_file(f)
    os.close(fd)
    refused(trust.open_file, eve / "f")
    os.link(f, pub / "hl")
    refused(trust.open_file, pub / "hl")  # refused after its open
    assert trust.read_file(f) == b"root's\n"
    refused(trust.read_file, f, max_bytes=1)
    assert trust.refusal(f) is None and trust.refusal(base) is None and trust.refusal(pub) is not None
    assert trust.refusal(eve / "f") is not None
    assert open_fds() == n
