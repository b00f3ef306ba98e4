"""Writing as root where others can write, on the fds of the one door (files/trust.py): create files
O_EXCL|O_NOFOLLOW, replace by rename, never open an existing path for writing through a link (issues #40, #47).

Which paths root may trust, and how a path is walked, is files/trust.py's alone (its rule, its openat walk); this
module adds what a writer needs on top, every step through the mutation seam (host/ops.py):
- `open_dir(path)`: trust.open_dir — the directory as an fd, walked from "/" one component at a time
  (O_NOFOLLOW|O_DIRECTORY, then openat), a link followed only when trusted (/dev/shm -> /run/shm is fine, /tmp/x ->
  /etc planted by a user is refused). Every later operation goes through the fd (dir_fd=), so a directory swapped
  after the walk changes nothing.
- `owned_dir(path)`: the same, strict, and the directory itself must pass the rule as the last part (ours, writable
  by nobody else, sticky or not); else one line naming the owner or mode (`Unsafe`, exit 3). Created 0755 if absent.
- `create_excl(dirfd, name)`: a new file, O_CREAT|O_EXCL|O_NOFOLLOW: never an existing file, never through a link.
- `write_file(path, data)`: an output file, atomically: a fresh temp file beside it, fsync, rename over the name (a
  link planted at the name is replaced, not followed), directory fsynced. Its mode comes from `output_mode`.
- `output_mode(public)`: the one rule for what gpudoctor writes: 0600 (outputs may carry host detail), 0644 only
  for what others must read (a Prometheus textfile, a staged model).
- `staged_mode(mode)`: a staged copy keeps its permission bits minus setuid/setgid/sticky and group/other write.
"""

from __future__ import annotations

import errno
import os
import stat

from gpudoctor.errors import InputError
from gpudoctor.files import trust  # the one rule and the fd walk: nothing here judges a path by itself
from gpudoctor.host import ops as fs  # the mutation seam: every write below is recorded there (tests/crash)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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


def _error(exc: trust.Refused) -> Exception:
    """The door's refusal as a writer reports it: a missing part is FileNotFoundError, anything else Unsafe."""
    if exc.errno == errno.ENOENT:
        return FileNotFoundError(errno.ENOENT, exc.why, exc.path)
    return Unsafe(exc.why, path=exc.path)


def open_dir(path: str, *, create: bool = False, mode: int = 0o755, strict: bool = False) -> int:
    """The directory at `path` as an O_DIRECTORY fd, walked by files/trust.py's door (openat, O_NOFOLLOW on every
    part; a link followed only when trusted). `create` makes the missing parts (mode `mode`, through the mutation
    seam). `strict`: every directory on the way must pass the one rule (trust.judge), so that what root writes below
    it lands where the walk did. Raises Unsafe, or FileNotFoundError for a missing part."""
    mkdir = (lambda name, dfd: fs.fs_mkdir(name, mode, dir_fd=dfd)) if create else None
    try:
        return trust.open_dir(os.path.abspath(path), strict=strict, mkdir=mkdir)
    except trust.Refused as exc:
        raise _error(exc) from None


def check_owned(fd: int, path: str) -> None:
    """Refuse to write into a directory that fails the one rule as the last part (another user's, or writable by
    others, sticky or not): what root puts there could be swapped under it."""
    why = trust.judge(os.fstat(fd))
    if why:
        raise Unsafe(f"is {why}: gpudoctor does not write into it as root (give it to root and chmod go-w, or "
                     "choose another path)", path=path)


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
    except FileNotFoundError:
        return  # the caller's own checks name that
    try:
        if near == path:
            check_owned(fd, path)
    finally:
        os.close(fd)


def _open_sub(fd: int, name: str, here: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Unsafe("appeared as a link or file while gpudoctor created it; not followed", path=here) from None
        raise


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
        fd = fs.fs_open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unsafe("is a link; gpudoctor does not open it as root", path=path or name) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or trust.judge(st) or st.st_nlink > 1:
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
