"""The one door to files another user might control (#40, #47): one rule, and every open walked by fd.

The rule (sshd's StrictModes, stated once, docs/security.md): as root, a path is trusted when every part of it, from "/"
down, and every link on the way, is owned by root or by this process's effective user, and no one else can write it:
neither its group (any group, root's too: membership of gid 0 is not root) nor every user. Two refinements:
- A directory with the sticky bit (/tmp, /dev/shm) that root owns may be passed through though others can write it:
  nobody else can rename or remove what root owns there. The entry after it must pass the rule itself, and a regular
  file there with more than one hard link is refused (another user could have linked root's file in). A sticky
  directory another user owns is theirs: refused. A sticky directory is never trusted as the last part (to read a
  file list from, or to write into).
- A link is followed only when it is owned by root (or us) and sits in a directory nobody else can change (or a
  sticky one of ours); otherwise it is refused, never followed.

How (systemd's chase()): the path is walked from "/" one component at a time, each directory opened with
O_DIRECTORY|O_NOFOLLOW relative to its parent's fd, and judged by fstat() of the fd just opened. A file is opened
O_NOFOLLOW|O_NONBLOCK in its directory's fd (its type is checked with fstatat() first, so a FIFO or device is never
opened, and again with fstat() after), judged by fstat() of that fd, and then read from that fd: nothing is looked up
again by name, so a swap after the check changes nothing. `strict=False` walks a directory another user may own (a
model to copy from, an output directory they chose) and still follows only trusted links and reads only regular
files.

    open_dir(path, strict=, mkdir=)       the directory as an fd (mkdir(name, dir_fd) creates missing parts)
    open_file(path, strict=, flags=)      (fd, fstat) of a regular file, judged; O_NONBLOCK cleared
    open_at(dir_fd, name, shown, ...)     the same for one name in a directory fd (no "/" in it)
    read_file(path, max_bytes=)           its bytes, read from the fd judged
    refusal(path) / untrusted(path)       None, or why root may not trust `path` (a Refused / one line), no raise

Every refusal is `Refused(path, why)`; `why` is one line ("owned by eve (uid 1001), mode 0755, not root's"). Stdlib
only, python >= 3.6 and standalone (it imports nothing of this package): gather/deep_python.py and gather/model.py
send this text to the target, so an interpreter or a model found there is judged by the same code as a file here.
"""

import errno
import fcntl
import os
import stat

MAX_LINKS = 40  # like the kernel's ELOOP bound
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


class Refused(OSError):
    """A path the door does not open: `path` (the part refused), and `why` in one line. `errno` is set where the OS
    said why (ENOENT for a missing part); `rule` is True when the one rule refused it (an owner, a mode, a link or a
    hard link another user controls), False for a type or an OS error."""

    def __init__(self, path, why, err=None, rule=False):
        OSError.__init__(self, err or 0, why)
        self.path, self.why, self.errno, self.rule = path, why, err, rule

    def __str__(self):
        return "%s: %s" % (self.path, self.why)


def owner(uid):
    try:
        import pwd

        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except (ImportError, KeyError):
        return "uid %d" % uid


def kind(mode):
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a link"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _uids(uids):
    return set(uids) if uids is not None else {0, os.geteuid()}


def others_write(st):
    """Writable by its group or by every user (whatever the group)."""
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def judge(st, uids=None, passing=False):
    """The rule for one part: None when root may trust it, else why not (one line). `passing`: a directory walked
    through on the way (a sticky one of ours may be writable by others), not the last part."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in _uids(uids):
        return "owned by %s, mode %04o, not root's" % (owner(st.st_uid), mode)
    if stat.S_ISLNK(st.st_mode) or (passing and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return None
    if st.st_mode & stat.S_IWOTH:
        return "writable by every user (mode %04o)" % mode
    if st.st_mode & stat.S_IWGRP:
        return "writable by group %d (mode %04o)" % (st.st_gid, mode)
    return None


def held(st, uids=None):
    """A directory whose entries nobody else can replace: ours, and writable by no one else unless sticky."""
    return st.st_uid in _uids(uids) and (not others_write(st) or bool(st.st_mode & stat.S_ISVTX))


def _link_refused(lst, parent, uids):
    if lst.st_uid not in _uids(uids):
        return "is a link owned by %s; gpudoctor does not follow it as root" % owner(lst.st_uid)
    if not held(parent, uids):
        return "is a link in a directory others can change; gpudoctor does not follow it as root"
    return None


def _hard_link_refused(st, parent, uids):
    """A regular file with other names, in a directory another user can add names to: they could have linked it."""
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and (parent.st_uid not in _uids(uids) or others_write(parent)):
        return ("has %d hard links in a directory others can write: another user could have linked it there"
                % st.st_nlink)
    return None


def _join(shown, name):
    return (shown.rstrip("/") or "") + "/" + name


class _Walk:
    """A stack of (fd, shown path, fstat) from "/" down; ".." pops it (never above "/")."""

    def __init__(self, uids, strict, any_link=False):
        self.uids, self.strict, self.hops, self.any_link = uids, strict, 0, any_link
        fd = os.open("/", _DIR)
        self.stack = [(fd, "/", os.fstat(fd))]
        if strict:
            self._judge(self.stack[0][2], "/", True)

    def close(self, keep=None):
        for fd, _, _ in self.stack:
            if fd != keep:
                os.close(fd)
        self.stack = []

    def top(self):
        return self.stack[-1]

    def _judge(self, st, shown, passing):
        why = judge(st, self.uids, passing)
        if why:
            raise Refused(shown, why, rule=True)

    def follow(self, lst, name, shown):
        """A link met on the way: judged, then its target's parts to walk next (returned, in order)."""
        dfd, _, dst = self.top()
        why = None if self.any_link else _link_refused(lst, dst, self.uids)
        if why:
            raise Refused(shown, why, rule=True)
        self.hops += 1
        if self.hops > MAX_LINKS:
            raise Refused(shown, "too many levels of links", errno.ELOOP)
        target = os.readlink(name, dir_fd=dfd)
        if target.startswith("/"):
            while len(self.stack) > 1:
                os.close(self.stack.pop()[0])
        return [c for c in target.split("/") if c]

    def down(self, name, mkdir=None):
        """Enter directory `name` of the top fd; returns False when it was a link (the caller walks its target)."""
        dfd, shown, _ = self.top()
        here = _join(shown, name)
        try:
            nfd = os.open(name, _DIR, dir_fd=dfd)
        except FileNotFoundError:
            if mkdir is None:
                raise Refused(here, "no such file or directory", errno.ENOENT) from None
            try:
                mkdir(name, dfd)
            except FileExistsError:
                pass
            try:
                nfd = os.open(name, _DIR, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(here, "appeared as a link or file while gpudoctor created it; not followed",
                                  exc.errno) from None
                raise Refused(here, exc.strerror or str(exc), exc.errno) from None
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(here, exc.strerror or str(exc), exc.errno) from None
            lst = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(lst.st_mode):
                return lst
            raise Refused(here, "is %s, not a directory" % kind(lst.st_mode), errno.ENOTDIR) from None
        st = os.fstat(nfd)
        self.stack.append((nfd, here, st))
        if self.strict:
            self._judge(st, here, True)
        return None

    def up(self):
        if len(self.stack) > 1:
            os.close(self.stack.pop()[0])

    def walk(self, parts, mkdir=None):
        todo = list(reversed(parts))
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                self.up()
                continue
            lst = self.down(name, mkdir)
            if lst is not None:
                todo.extend(reversed(self.follow(lst, name, _join(self.top()[1], name))))


def _parts(path):
    return [c for c in os.path.abspath(os.fspath(path)).split("/") if c]


def open_dir(path, uids=None, strict=True, mkdir=None):
    """The directory at `path` as an O_DIRECTORY fd, walked by fds from "/" (links followed only when trusted).
    strict: every directory on the way and the directory itself pass the rule (as parts passed through: whether a
    sticky one may be written into is the writer's question, files/safe.py's check_owned).
    mkdir(name, dir_fd): called for a missing part (the caller's mutation seam). Raises Refused."""
    w = _Walk(uids, strict)
    try:
        w.walk(_parts(path), mkdir)
        fd = w.top()[0]
        w.close(keep=fd)
        return fd
    except BaseException:
        w.close()
        raise


def open_at(dfd, name, shown, uids=None, strict=True, flags=os.O_RDONLY, parent=None):
    """(fd, fstat) of the regular file `name` in directory fd `dfd` (`shown`: its path, for messages), judged by the
    fd. A link there is refused (open_file follows trusted ones). Opened O_NONBLOCK|O_NOFOLLOW after an fstatat()
    that says it is a regular file (a FIFO or device is never opened), then fstat()ed: not a regular file, another
    inode than the one looked at, or (strict) failing the rule is Refused. O_NONBLOCK is cleared before returning."""
    try:
        lst = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError as exc:
        raise Refused(shown, exc.strerror or str(exc), exc.errno) from None
    if not stat.S_ISREG(lst.st_mode):
        raise Refused(shown, "is %s, not a regular file" % kind(lst.st_mode),
                      errno.ELOOP if stat.S_ISLNK(lst.st_mode) else
                      errno.EISDIR if stat.S_ISDIR(lst.st_mode) else errno.EINVAL)
    try:
        fd = os.open(name, flags | _FILE, dir_fd=dfd)
    except OSError as exc:
        raise Refused(shown, exc.strerror or str(exc), exc.errno) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (lst.st_dev, lst.st_ino):
            raise Refused(shown, "was replaced while gpudoctor opened it (now %s)" % kind(st.st_mode))
        pst = parent if parent is not None else os.fstat(dfd)
        why = (judge(st, uids) if strict else None) or _hard_link_refused(st, pst, uids)
        if why:
            raise Refused(shown, why, rule=True)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def open_file(path, uids=None, strict=True, flags=os.O_RDONLY, any_link=False):
    """(fd, fstat) of the regular file at `path`, every part walked and judged by fd (see the module's note); a
    trusted link at any depth is followed, any other link refused. Raises Refused (errno ENOENT when missing).
    any_link (with strict=False only): every link is followed — for reading what root only reports on and never
    obeys (a model's files in a user's cache, whose links are that user's): still a regular file, judged on its fd,
    never a FIFO or device."""
    parts = _parts(path)
    if not parts:
        raise Refused("/", "is a directory, not a regular file", errno.EISDIR)
    w = _Walk(uids, strict, any_link and not strict)
    try:
        w.walk(parts[:-1])
        name = parts[-1]
        while True:
            dfd, shown, dst = w.top()
            here = _join(shown, name)
            try:
                lst = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                lst = None
            if lst is None or not stat.S_ISLNK(lst.st_mode):
                return open_at(dfd, name, here, uids, strict, flags, parent=dst)
            more = w.follow(lst, name, here)
            if not more:
                raise Refused(here, "is a link to /, not a regular file", errno.EISDIR)
            w.walk(more[:-1])
            name = more[-1]
            if name in (".", ".."):
                raise Refused(here, "is a link to a directory, not a regular file", errno.EISDIR)
    finally:
        w.close()


def read_fd(fd, max_bytes):
    """At most max_bytes + 1 bytes of fd from its position (one more than allowed tells the caller it is too big)."""
    chunks, total = [], 0
    while total <= max_bytes:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def read_file(path, uids=None, strict=True, max_bytes=16 << 20):
    """The bytes of the regular file at `path` (open_file), read from the fd judged; Refused when it holds more than
    max_bytes."""
    fd, st = open_file(path, uids, strict)
    try:
        if st.st_size > max_bytes:
            raise Refused(os.fspath(path), "is %d bytes, more than the %d gpudoctor reads" % (st.st_size, max_bytes))
        data = read_fd(fd, max_bytes)
        if len(data) > max_bytes:
            raise Refused(os.fspath(path), "grew past the %d bytes gpudoctor reads" % max_bytes)
        return data
    finally:
        os.close(fd)


def refusal(path, uids=None):
    """None when root may trust `path` (a file or a directory: it, every part above it and every link on the way;
    a directory as the last part writable by no one else, sticky or not — what `model stage` writes into and what the
    per-start gate passes), else the Refused that says why. The one function both apply."""
    try:
        try:
            fd, _ = open_file(path, uids)
        except Refused as exc:
            if exc.errno != errno.EISDIR:
                raise
            fd = open_dir(path, uids)
            try:
                why = judge(os.fstat(fd), uids)
            finally:
                os.close(fd)
            return Refused(os.path.abspath(os.fspath(path)), why, rule=True) if why else None
        os.close(fd)
    except Refused as exc:
        return exc
    except OSError as exc:
        return Refused(os.fspath(path), exc.strerror or str(exc), exc.errno)
    return None


def untrusted(path, uids=None):
    """None when root may trust `path` (refusal()); else why not, in one line ("/home/eve/python3: owned by eve
    (uid 1001), mode 0755, not root's")."""
    r = refusal(path, uids)
    return None if r is None else str(r)
