"""Writing as root where others can write: walk directories without following links another user controls, create
files O_EXCL|O_NOFOLLOW, replace by rename, never open an existing path for writing through a link (issue #40).

The rules, one place each:
- `open_dir(path)`: the directory as an fd, walked from "/" one component at a time (O_NOFOLLOW|O_DIRECTORY, then
  openat). A link on the way is followed only when it is trusted: owned by root (or us) in a directory nobody else
  can write — /dev/shm -> /run/shm is fine, /tmp/x -> /etc planted by a user is refused. Every later operation goes
  through the fd (dir_fd=), so a directory swapped after the walk changes nothing.
- `owned_dir(path)`: the same, and the directory must belong to us (root) and be writable by nobody else; a
  directory another user owns is refused with one line naming the owner (`Unsafe`, exit 3). Created 0755 if absent.
- `create_excl(dirfd, name)`: a new file, O_CREAT|O_EXCL|O_NOFOLLOW: never an existing file, never through a link.
- `write_file(path, data)`: an output file, atomically: a fresh temp file beside it, fsync, rename over the name (a
  link planted at the name is replaced, not followed), directory fsynced. Its mode comes from `output_mode`.
- `output_mode(public)`: the one rule for what gpudoctor writes: 0600 (outputs may carry host detail), 0644 only
  for what others must read (a Prometheus textfile, a staged model).
- `staged_mode(mode)`: a staged copy keeps its permission bits minus setuid/setgid/sticky and group/other write.
- `scratch(prefix)`: private scratch, tempfile.mkdtemp (0700); no fixed name under /tmp.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile

from gpudoctor.errors import InputError
from gpudoctor.host import ops as fs  # the mutation seam: every write below is recorded there (tests/crash)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # like the kernel's ELOOP bound


class Unsafe(InputError):
    """A path gpudoctor will not write through as root: one line naming the path and why (exit 3)."""


def output_mode(public: bool = False) -> int:
    """The mode of a file gpudoctor writes: 0600, or 0644 when others must read it (public)."""
    return 0o644 if public else 0o600


def staged_mode(mode: int, is_dir: bool = False) -> int:
    """A staged copy's mode: the source's permission bits without setuid/setgid/sticky or group/other write."""
    return (mode & 0o755) | (0o700 if is_dir else 0o600)


def owner_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def _trusted_uid(uid: int) -> bool:
    return uid in (0, os.geteuid())


def _others_can_write(st: os.stat_result) -> bool:
    """Writable by every user, or by a group other than root's (files/trust.py's rule, for paths read or run)."""
    return bool(st.st_mode & stat.S_IWOTH or st.st_mode & stat.S_IWGRP and st.st_gid != 0)


def _trusted_link(link: os.stat_result, parent: os.stat_result) -> bool:
    """A link root may follow: ours, in a directory of ours that nobody else can write, or that is sticky (where
    nobody else can replace our link)."""
    return (_trusted_uid(link.st_uid) and _trusted_uid(parent.st_uid)
            and (not _others_can_write(parent) or bool(parent.st_mode & stat.S_ISVTX)))


def open_dir(path: str, *, create: bool = False, mode: int = 0o755, strict: bool = False) -> int:
    """The directory at `path` as an O_DIRECTORY fd, walked without following untrusted links. `create` makes the
    missing components (mode `mode`). `strict`: every directory on the way must be one nobody but root (or us) can
    change (sshd's StrictModes: owned by root or us, not writable by others unless sticky), so that later path-based
    writes below it land where the walk did. Raises Unsafe (a refused link, not a directory, a directory another
    user controls) or OSError (ENOENT...)."""
    path = os.path.abspath(path)
    fd = os.open("/", _DIR)
    try:
        todo = [c for c in path.split("/") if c]
        shown = ""  # the path walked so far, for messages
        hops = 0
        while todo:
            name = todo.pop(0)
            if name == ".":
                continue
            if name == "..":
                nfd = os.open("..", _DIR, dir_fd=fd)
                os.close(fd)
                fd, shown = nfd, os.path.dirname(shown)
                continue
            here = shown + "/" + name
            try:
                nfd = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    fs.fs_mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = _open_sub(fd, name, here)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise Unsafe("not a directory", path=here) from None
                if not _trusted_link(st, os.fstat(fd)):
                    raise Unsafe(f"is a link owned by {owner_name(st.st_uid)} in a directory others can write; "
                                 "gpudoctor does not follow it as root", path=here) from None
                hops += 1
                if hops > MAX_LINKS:
                    raise Unsafe("too many levels of links", path=here) from None
                target = os.readlink(name, dir_fd=fd)
                todo = [c for c in target.split("/") if c] + todo
                if target.startswith("/"):
                    os.close(fd)
                    fd, shown = os.open("/", _DIR), ""
                continue
            if strict:
                _check_ancestor(nfd, here)
            os.close(fd)
            fd, shown = nfd, here
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check_ancestor(fd: int, here: str) -> None:
    st = os.fstat(fd)
    if not _trusted_uid(st.st_uid):
        os.close(fd)
        raise Unsafe(f"is owned by {owner_name(st.st_uid)}: gpudoctor does not write in or below another "
                     "user's directory as root", path=here)
    if _others_can_write(st) and not st.st_mode & stat.S_ISVTX:
        os.close(fd)
        raise Unsafe(f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): gpudoctor does not write in or "
                     "below it as root", path=here)


def _open_sub(fd: int, name: str, here: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Unsafe("appeared as a link or file while gpudoctor created it; not followed", path=here) from None
        raise


def check_owned(fd: int, path: str) -> None:
    """Refuse a directory another user owns or can write: what root puts there could be swapped under it."""
    st = os.fstat(fd)
    if not _trusted_uid(st.st_uid):
        raise Unsafe(f"is owned by {owner_name(st.st_uid)}: gpudoctor does not write into another user's directory "
                     "as root (remove it, or choose another path)", path=path)
    if _others_can_write(st):
        raise Unsafe(f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o}): gpudoctor does not write into "
                     "it as root (chmod go-w, or choose another path)", path=path)


def owned_dir(path: str, *, create: bool = True, mode: int = 0o755, strict: bool = True) -> int:
    """open_dir (strict: every directory above it too), created if absent, and refused unless it belongs to us and
    nobody else can write it."""
    fd = open_dir(path, create=create, mode=mode, strict=strict)
    try:
        check_owned(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_out_dir(path: str) -> None:
    """Before anything runs: an output directory owned_dir would accept (when it exists), or whose nearest existing
    ancestor the strict walk accepts (when it does not). Creates nothing; raises Unsafe."""
    path = os.path.abspath(path)
    near = path
    while not os.path.lexists(near):
        near = os.path.dirname(near)
    try:
        fd = open_dir(near, strict=True)
    except (FileNotFoundError, NotADirectoryError):
        return  # the caller's own checks name that
    try:
        if near == path:
            check_owned(fd, path)
    finally:
        os.close(fd)


def subdir(dirfd: int, rel: str, *, create: bool = True, mode: int = 0o755, root: str = "") -> int:
    """A directory below dirfd (relative, no "..", no links), created if absent, owned by us: an fd."""
    fd = os.dup(dirfd)
    try:
        shown = root
        for name in [c for c in rel.split("/") if c and c != "."]:
            if name == "..":
                raise Unsafe("leaves its directory", path=os.path.join(root, rel))
            shown = shown + "/" + name
            if create:
                try:
                    fs.fs_mkdir(name, mode, dir_fd=fd)
                except FileExistsError:
                    pass
            nfd = _open_sub(fd, name, shown)
            os.close(fd)
            fd = nfd
            check_owned(fd, shown)
        return fd
    except BaseException:
        os.close(fd)
        raise


def create_excl(dirfd: int, name: str, mode: int = 0o600, flags: int = os.O_WRONLY) -> int:
    """A new file `name` in dirfd: O_CREAT|O_EXCL|O_NOFOLLOW, so never an existing file or a link's target."""
    return fs.fs_open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dirfd)


def open_regular(dirfd: int, name: str, flags: int, mode: int = 0o600, path: str = "") -> int:
    """Open (or create) `name` in dirfd without following a link, and only if it is a regular file we own: for a
    lock file that is kept between runs."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unsafe("is a link; gpudoctor does not open it as root", path=path or name) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not _trusted_uid(st.st_uid) or st.st_nlink > 1:
        os.close(fd)
        raise Unsafe(f"is not a regular file of ours (owner {owner_name(st.st_uid)}, {st.st_nlink} link(s)); not "
                     "opened", path=path or name)
    return fd


def reopen(fd: int, flags: int) -> int:
    """A second open file description of the same inode (its own offset), without a path anyone can swap."""
    return os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC)


def unlink_at(dirfd: int, name: str) -> None:
    """Remove `name` from dirfd (a link is removed, never followed); absent is fine."""
    fs.fs_unlink(name, missing_ok=True, dir_fd=dirfd)


def rename_at(dirfd: int, src: str, dst: str) -> None:
    """Rename within dirfd: a link at dst is replaced, never followed; the directory fsynced after."""
    fs.fs_rename(src, dst, dir_fd=dirfd)


def fsync_fd(dirfd: int) -> None:
    fs.fs_fsync_dir("", dirfd)


def write_at(dirfd: int, name: str, data: bytes | str, mode: int) -> None:
    """Replace `name` in dirfd with data atomically: temp O_EXCL|O_NOFOLLOW, fsync, fchmod, rename, fsync dir."""
    if isinstance(data, str):
        data = data.encode()
    for _ in range(100):
        tmp = f".{name}.{os.urandom(4).hex()}.tmp"
        try:
            fd = create_excl(dirfd, tmp, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise OSError(errno.EEXIST, "no temporary name free", name)
    try:
        try:
            fs.fs_write(fd, data, tmp)
            fs.fs_chmod(tmp, mode, fd)
            fs.fs_fsync(fd, tmp)
        finally:
            os.close(fd)
        rename_at(dirfd, tmp, name)  # and fsyncs the directory
    except BaseException:
        unlink_at(dirfd, tmp)
        raise


def write_file(path: str | os.PathLike, data: bytes | str, *, public: bool = False) -> None:
    """Write an output file atomically without following links (its directory walked by open_dir); mode by
    output_mode(public). A link at the name is replaced, never written through."""
    path = os.path.abspath(os.fspath(path))
    d, name = os.path.split(path)
    if not name:
        raise Unsafe("is a directory, not a file name", path=path)
    try:
        dfd = open_dir(d)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise InputError(f"cannot write: {exc.strerror}", path=path) from None
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise Unsafe("is a directory", path=path)
        except FileNotFoundError:
            pass
        write_at(dfd, name, data, output_mode(public))
    finally:
        os.close(dfd)


def scratch(prefix: str = "gpudoctor-") -> str:
    """A private scratch directory (tempfile.mkdtemp: a fresh name, mode 0700); the caller removes it."""
    return tempfile.mkdtemp(prefix=prefix)
