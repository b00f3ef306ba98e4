"""The writers' layer (gpudoctor/files/safe.py) function by function, on its own fds (#48 item 6: bench/mutation.py
found its subdirectory walk, its lock-file refusals, its temp-file names and its fd hygiene untested): each refusal
and its one line, the modes it creates, the fds it leaves open, and the order of its steps through the mutation seam.

In-process and fast (bench/mutation.py scores files/safe with it). Run as root; uid 65534 (nobody) plays the other
user through chown. The umask is 022 in each test (the modes asserted are what gpudoctor asks for under it).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from gpudoctor.errors import InputError
from gpudoctor.files import safe
from gpudoctor.host import ops

from .conftest import NO_SUCH_UID, NOBODY  # and the fixture `base`


@pytest.fixture
def dfd(base):
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def mode_of(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def same_inode(fd: int, p: Path) -> bool:
    a, b = os.fstat(fd), os.stat(p)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def line(exc: pytest.ExceptionInfo) -> str:
    s = str(exc.value)
    assert "\n" not in s
    return s


NOT_AS_ROOT = ": gpudoctor does not write into it as root (give it to root and chmod go-w, or choose another path)"


# --- open_dir, owned_dir, check_out_dir -------------------------------------------------------------------------


def test_open_dir_creates_only_when_asked_and_0755(base):
    n = open_fds()
    with pytest.raises(FileNotFoundError):
        safe.open_dir(str(base / "new" / "sub"))
    assert not (base / "new").exists()
    fd = safe.open_dir(str(base / "new" / "sub"), create=True)
    try:
        assert same_inode(fd, base / "new" / "sub")
        assert mode_of(base / "new") == 0o755 and mode_of(base / "new" / "sub") == 0o755
    finally:
        os.close(fd)
    assert open_fds() == n


def test_open_dir_walks_another_users_directory_unless_strict(base):
    """An output directory a user chose may be theirs (write_file writes into it by rename); owned_dir and
    check_out_dir, strict, refuse it."""
    eve = base / "eve"
    eve.mkdir()
    os.chown(eve, NOBODY, NOBODY)
    n = open_fds()
    os.close(safe.open_dir(str(eve)))
    with pytest.raises(safe.Unsafe) as e:
        safe.open_dir(str(eve), strict=True)
    assert line(e) == f"{eve}: owned by nobody (uid {NOBODY}), mode 0755, not root's"
    safe.write_file(eve / "out.json", "{}\n")
    assert (eve / "out.json").read_text() == "{}\n" and open_fds() == n


def test_owned_dir_creates_0755_by_default_and_refuses_without_leaking(base):
    n = open_fds()
    fd = safe.owned_dir(str(base / "out" / "d"))
    try:
        assert same_inode(fd, base / "out" / "d") and mode_of(base / "out" / "d") == 0o755
    finally:
        os.close(fd)
    bad = base / "shared"
    bad.mkdir()
    bad.chmod(0o775)
    with pytest.raises(safe.Unsafe) as e:  # refused by the strict walk, as a part
        safe.owned_dir(str(bad))
    assert line(e) == f"{bad}: writable by group 0 (mode 0775)"
    bad.chmod(0o1777)  # passed through as a part (sticky, root's), refused as the directory written into
    with pytest.raises(safe.Unsafe) as e:
        safe.owned_dir(str(bad))
    assert line(e) == f"{bad}: is writable by every user (mode 1777){NOT_AS_ROOT}"
    assert open_fds() == n


def test_check_out_dir_judges_an_existing_directory_itself(base):
    n = open_fds()
    safe.check_out_dir(str(base))  # ours, 0755
    bad = base / "bad"
    bad.mkdir()
    bad.chmod(0o1777)  # /tmp-like: passed through, never written into
    with pytest.raises(safe.Unsafe) as e:
        safe.check_out_dir(str(bad))
    assert line(e) == f"{bad}: is writable by every user (mode 1777){NOT_AS_ROOT}"
    safe.check_out_dir(str(bad / "new"))  # a new directory below it is judged when made
    assert open_fds() == n


def test_check_out_dir_of_a_missing_directory_walks_its_nearest_ancestor_strictly(base):
    n = open_fds()
    safe.check_out_dir(str(base / "a" / "b" / "out"))
    assert not (base / "a").exists()  # creates nothing
    eve = base / "eve"
    eve.mkdir()
    os.chown(eve, NOBODY, NOBODY)
    with pytest.raises(safe.Unsafe) as e:
        safe.check_out_dir(str(eve / "new" / "out"))
    assert line(e) == f"{eve}: owned by nobody (uid {NOBODY}), mode 0755, not root's"
    assert not (eve / "new").exists() and open_fds() == n


# --- subdir -------------------------------------------------------------------------------------------------------


def test_subdir_creates_each_part_0755_and_returns_its_fd(base, dfd):
    n = open_fds()
    fd = safe.subdir(dfd, "a/./b//c", root=str(base))
    try:
        assert same_inode(fd, base / "a" / "b" / "c")
        assert [mode_of(base / p) for p in ("a", "a/b", "a/b/c")] == [0o755] * 3
    finally:
        os.close(fd)
    fd = safe.subdir(dfd, "a/b", create=False, root=str(base))  # existing: opened, nothing made
    try:
        assert same_inode(fd, base / "a" / "b")
    finally:
        os.close(fd)
    assert open_fds() == n


def test_subdir_without_create_makes_nothing(base, dfd):
    n = open_fds()
    with pytest.raises(FileNotFoundError):
        safe.subdir(dfd, "x/y", create=False, root=str(base))
    assert not (base / "x").exists() and open_fds() == n


def test_subdir_never_leaves_its_directory(base, dfd):
    n = open_fds()
    with pytest.raises(safe.Unsafe) as e:
        safe.subdir(dfd, "../up", root=str(base))
    assert line(e) == f"{base}/../up: leaves its directory"
    assert not (base.parent / "up").exists() and open_fds() == n


def test_subdir_refuses_a_part_another_user_owns_naming_it(base, dfd):
    eve = base / "a"
    eve.mkdir()
    os.chown(eve, NOBODY, NOBODY)
    n = open_fds()
    with pytest.raises(safe.Unsafe) as e:
        safe.subdir(dfd, "./a/b", root=str(base))
    assert line(e) == f"{eve}: is owned by nobody (uid {NOBODY}), mode 0755, not root's{NOT_AS_ROOT}"
    assert e.value.path == str(eve)
    assert not (eve / "b").exists() and open_fds() == n


@pytest.mark.parametrize("what", ["file", "link"])
def test_subdir_never_enters_a_file_or_a_link(base, dfd, what):
    """A name that is a file, or a link (to root's own directory), where a directory is made: refused, nothing
    created through it."""
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    if what == "file":
        (base / "p").write_text("")
    else:
        (base / "p").symlink_to(elsewhere)
    n = open_fds()
    with pytest.raises(safe.Unsafe) as e:
        safe.subdir(dfd, "p/x", root=str(base))
    assert line(e) == f"{base}/p: appeared as a link or file while gpudoctor created it; not followed"
    assert list(elsewhere.iterdir()) == [] and open_fds() == n


# --- create_excl, open_regular ------------------------------------------------------------------------------------


def test_create_excl_makes_a_new_0600_file_never_an_existing_name(base, dfd):
    os.close(safe.create_excl(dfd, "new"))
    assert mode_of(base / "new") == 0o600
    with pytest.raises(FileExistsError):
        safe.create_excl(dfd, "new")
    (base / "dangling").symlink_to(base / "target")
    with pytest.raises(FileExistsError):
        safe.create_excl(dfd, "dangling")
    assert not (base / "target").exists()


def test_open_regular_creates_0600_and_reopens_its_own_file(base, dfd):
    n = open_fds()
    os.close(safe.open_regular(dfd, "lock", os.O_WRONLY | os.O_CREAT))
    assert mode_of(base / "lock") == 0o600
    os.close(safe.open_regular(dfd, "lock", os.O_RDONLY))
    with pytest.raises(FileNotFoundError):
        safe.open_regular(dfd, "absent", os.O_RDONLY)
    assert open_fds() == n


def test_open_regular_refuses_a_link_naming_the_path_or_the_name(base, dfd):
    (base / "lk").symlink_to(base / "target")
    with pytest.raises(safe.Unsafe) as e:
        safe.open_regular(dfd, "lk", os.O_WRONLY | os.O_CREAT, path=str(base / "lk"))
    assert line(e) == f"{base}/lk: is a link; gpudoctor does not open it as root"
    with pytest.raises(safe.Unsafe) as e:
        safe.open_regular(dfd, "lk", os.O_WRONLY | os.O_CREAT)
    assert e.value.path == "lk"
    assert not (base / "target").exists()


def test_open_regular_refuses_a_hard_link_or_another_owner_without_leaking(base, dfd):
    (base / "precious").write_text("keep\n")
    os.link(base / "precious", base / "lock")
    n = open_fds()
    with pytest.raises(safe.Unsafe) as e:
        safe.open_regular(dfd, "lock", os.O_WRONLY, path=str(base / "lock"))
    assert line(e) == f"{base}/lock: is not a regular file of ours (owner root, 2 link(s)); not opened"
    with pytest.raises(safe.Unsafe) as e:
        safe.open_regular(dfd, "lock", os.O_WRONLY)
    assert e.value.path == "lock"
    assert open_fds() == n
    os.unlink(base / "lock")
    (base / "lock").write_text("")
    os.chown(base / "lock", NO_SUCH_UID, 0)  # an owner with no name is named by uid
    with pytest.raises(safe.Unsafe, match=rf"\(owner uid {NO_SUCH_UID}, 1 link\(s\)\)"):
        safe.open_regular(dfd, "lock", os.O_WRONLY)
    assert safe.owner_name(NO_SUCH_UID) == f"uid {NO_SUCH_UID}" and safe.owner_name(0) == "root"
    assert open_fds() == n


# --- write_at, write_file -----------------------------------------------------------------------------------------


def test_write_at_writes_a_private_temp_file_fsynced_before_the_rename(base, dfd, monkeypatch):
    """Through the mutation seam: create the temp file, write while it is still 0600 (others never read a secret
    meant for 0600, nor a public file half-written), chmod, fsync, rename over the name, fsync the directory."""
    steps = []

    def record(op, path, *detail):
        p = Path(path)
        steps.append((op, p.name if p.parent == base else path,
                      mode_of(p) if op == "write" else None))

    monkeypatch.setattr(ops, "RECORDER", record)
    safe.write_at(dfd, "out", b"data\n", 0o644)
    monkeypatch.setattr(ops, "RECORDER", None)
    tmp = steps[0][1]
    assert tmp.startswith(".out.") and tmp.endswith(".tmp")
    assert steps == [("create", tmp, None), ("write", tmp, 0o600), ("chmod", tmp, None), ("fsync", tmp, None),
                     ("rename", tmp, None), ("fsync-dir", str(base), None)]
    assert (base / "out").read_bytes() == b"data\n" and mode_of(base / "out") == 0o644
    assert sorted(p.name for p in base.iterdir()) == ["out"]


def test_write_at_that_fails_leaves_no_temp_file(base, dfd):
    (base / "adir").mkdir()
    (base / "adir" / "kept").write_text("")
    n = open_fds()
    with pytest.raises(OSError) as e:
        safe.write_at(dfd, "adir", b"x", 0o600)  # rename(2) of a file over a directory: EISDIR
    assert e.value.errno == errno.EISDIR
    assert sorted(p.name for p in base.iterdir()) == ["adir"] and (base / "adir" / "kept").exists()
    assert open_fds() == n


def test_a_planted_temp_name_is_skipped_never_written_through(base, dfd, monkeypatch):
    """The temp name's token comes from os.urandom; one already there (a link another user guessed) is passed over
    for the next token, and never followed. When no name is free, it says so."""
    tokens = iter([b"\0\0\0\0", b"\1\1\1\1"])
    planted = base / ".out.00000000.tmp"
    planted.symlink_to(base / "victim")
    monkeypatch.setattr(safe.os, "urandom", lambda n: next(tokens))
    safe.write_at(dfd, "out", "text\n", 0o600)
    assert (base / "out").read_text() == "text\n" and not (base / "victim").exists() and planted.is_symlink()
    assert sorted(p.name for p in base.iterdir()) == [".out.00000000.tmp", "out"]
    monkeypatch.setattr(safe.os, "urandom", lambda n: b"\0\0\0\0")
    with pytest.raises(OSError) as e:
        safe.write_at(dfd, "out", "again\n", 0o600)
    assert e.value.errno == errno.EEXIST and str(e.value) == "[Errno 17] no temporary name free: 'out'"
    assert (base / "out").read_text() == "text\n"


def test_write_file_refuses_the_root_and_a_directory_and_replaces_a_link_to_one(base):
    n = open_fds()
    with pytest.raises(safe.Unsafe) as e:
        safe.write_file("/", "x")
    assert line(e) == "/: is a directory, not a file name"
    (base / "adir").mkdir()
    with pytest.raises(safe.Unsafe) as e:
        safe.write_file(base / "adir", "x")
    assert line(e) == f"{base}/adir: is a directory"
    (base / "out").symlink_to(base / "adir")  # a link to a directory at the name: replaced like any link
    safe.write_file(base / "out", "x\n")
    assert not (base / "out").is_symlink() and (base / "out").read_text() == "x\n"
    assert list((base / "adir").iterdir()) == []
    with pytest.raises(InputError) as e:
        safe.write_file(base / "none" / "f", "x")
    assert line(e) == f"{base}/none/f: cannot write: no such file or directory"
    assert open_fds() == n
