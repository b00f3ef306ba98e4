"""The Host API shared by every backend (local, ssh, replay). Every operation has a deadline.

Contract: a transport failure raises HostUnreachable; a command's non-zero exit, a missing file or an
errno is a *result*, never an exception. A deadline that passes is a result with timed_out=True.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import shlex
from dataclasses import asdict, dataclass, field

# Small python programs that backends without in-process access run on the target (ssh).
_PY_STAT = r"""
import json, os, stat, sys
out = {}
for p in sys.argv[1:]:
    try:
        st = os.lstat(p)
    except OSError as e:
        import errno
        out[p] = {"exists": False, "error": errno.errorcode.get(e.errno, str(e.errno))}
        continue
    m = st.st_mode
    kind = ("char" if stat.S_ISCHR(m) else "block" if stat.S_ISBLK(m) else "dir" if stat.S_ISDIR(m)
            else "link" if stat.S_ISLNK(m) else "file" if stat.S_ISREG(m) else "other")
    d = {"exists": True, "kind": kind, "mode": stat.S_IMODE(m), "uid": st.st_uid, "gid": st.st_gid, "size": st.st_size,
         "mtime": st.st_mtime}
    if kind in ("char", "block"):
        d["major"], d["minor"] = os.major(st.st_rdev), os.minor(st.st_rdev)
    if kind == "link":
        d["target"] = os.readlink(p)
    out[p] = d
print(json.dumps(out))
"""

_PY_OPEN = r"""
import errno, json, os, sys
out = {}
acc = os.O_RDONLY if sys.argv[1] == "r" else os.O_RDWR
for p in sys.argv[2:]:
    try:
        fd = os.open(p, acc | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        os.close(fd)
        out[p] = "OK"
    except OSError as e:
        out[p] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"""

_PY_LISTDIR = r"""
import errno, json, os, sys
try:
    print(json.dumps({"entries": sorted(os.listdir(sys.argv[1]))}))
except OSError as e:
    print(json.dumps({"error": errno.errorcode.get(e.errno, str(e.errno))}))
"""

_PY_STATVFS = r"""
import errno, json, os, sys
try:
    s = os.statvfs(sys.argv[1])
    print(json.dumps({"total": s.f_blocks * s.f_frsize, "free": s.f_bfree * s.f_frsize, "avail": s.f_bavail * s.f_frsize,
                      "readonly": bool(s.f_flag & os.ST_RDONLY)}))
except OSError as e:
    print(json.dumps({"error": errno.errorcode.get(e.errno, str(e.errno))}))
"""


# File writes for backends without in-process access (remedies only, through gpudoctor.edit).
# Each prints {"ok": 1} or {"errno": N, "msg": "..."}; the caller raises OSError from the latter.
_PY_WRITE = r"""
import json, os, sys
path, mode, uid, gid, excl = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1"
data = sys.stdin.buffer.read()
if len(sys.argv) > 6 and len(data) != int(sys.argv[6]):  # stdin cut short (connection lost): write nothing
    print(json.dumps({"errno": 5, "msg": "short input: %d of %s bytes" % (len(data), sys.argv[6])}))
    sys.exit(0)
try:
    m = 0o666 if mode == "-" else int(mode, 8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if excl else os.O_TRUNC), m)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        st = os.fstat(fd)
        if mode != "-" and (st.st_mode & 0o7777) != m:
            os.fchmod(fd, m)
        if uid != "-" and (st.st_uid, st.st_gid) != (int(uid), int(gid)):
            os.fchown(fd, int(uid), int(gid))
        os.fsync(fd)
    finally:
        os.close(fd)
    print(json.dumps({"ok": 1}))
except OSError as e:
    print(json.dumps({"errno": e.errno, "msg": e.strerror}))
"""

_PY_FILEOP = r"""
import json, os, sys
op, a = sys.argv[1], sys.argv[2]
try:
    if op == "rename":
        os.rename(a, sys.argv[3])
        try:
            fd = os.open(os.path.dirname(sys.argv[3]) or ".", os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            pass
    elif op == "unlink":
        os.unlink(a)
    elif op == "makedirs":
        os.makedirs(a, int(sys.argv[3], 8), exist_ok=True)
    elif op == "chmod":
        os.chmod(a, int(sys.argv[3], 8))
    elif op == "mknod":
        import stat
        mode, major, minor = int(sys.argv[3], 8), int(sys.argv[4]), int(sys.argv[5])
        os.mknod(a, stat.S_IFCHR | mode, os.makedev(major, minor))
        try:
            if stat.S_IMODE(os.lstat(a).st_mode) != mode:
                os.chmod(a, mode)  # mknod's mode was cut by the umask
        except OSError:
            os.unlink(a)
            raise
    print(json.dumps({"ok": 1}))
except OSError as e:
    print(json.dumps({"errno": e.errno, "msg": e.strerror}))
"""


@dataclass
class CommandResult:
    """What a command did. rc None means it did not finish (timed out) or could not start."""

    argv: list[str]
    rc: int | None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    timeout_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out

    @property
    def cmdline(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv)

    def describe(self) -> str:
        """One line of evidence: `$ cmd → rc N` or `did not answer in N s`."""
        if self.timed_out:
            return f"$ {self.cmdline} → did not answer in {self.timeout_s:g} s"
        first = (self.stderr.strip() or self.stdout.strip()).splitlines()
        tail = f": {first[0][:200]}" if first and self.rc else ""
        return f"$ {self.cmdline} → rc {self.rc}{tail}"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class FileRead:
    """A file's content, or the errno name (ENOENT, EACCES, TIMEOUT) that stopped the read."""

    path: str
    data: bytes | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.data is not None

    @property
    def text(self) -> str | None:
        return None if self.data is None else self.data.decode("utf-8", "replace")

    def to_json(self) -> dict:
        return {"path": self.path, "error": self.error,
                "data_b64": None if self.data is None else base64.b64encode(self.data).decode()}

    @classmethod
    def from_json(cls, d: dict) -> "FileRead":
        raw = d.get("data_b64")
        return cls(d["path"], None if raw is None else base64.b64decode(raw), d.get("error"))


@dataclass
class StatResult:
    """lstat() of a path: kind char|block|dir|file|link|other, mode bits, device numbers for nodes."""

    path: str
    exists: bool
    kind: str | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    major: int | None = None
    minor: int | None = None
    size: int | None = None
    mtime: float | None = None
    target: str | None = None
    error: str | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Host:
    """Base of every backend. Subclasses implement `run`; the rest has portable defaults built on it."""

    name: str = "localhost"
    python: list[str] = field(default_factory=lambda: ["python3"])
    default_timeout: float = 10.0

    # --- the one primitive every backend must implement -------------------------------------
    def run(self, argv: list[str], timeout: float | None = None, input: bytes | None = None,
            env: dict[str, str] | None = None) -> CommandResult:
        raise NotImplementedError

    # --- operations with portable defaults (backends may do them in-process) ---------------
    def read_file(self, path: str, timeout: float = 3.0, max_bytes: int = 4 << 20) -> FileRead:
        """Read up to max_bytes of a file on the target."""
        # Read in 64 KiB steps: one huge read() of a /proc/sys file fails with ENOMEM.
        prog = ("import base64,errno,json,sys\n"
                "try:\n"
                " f=open(sys.argv[1],'rb',buffering=0);d=b'';n=" + str(int(max_bytes)) + "\n"
                " while len(d)<n:\n"
                "  c=f.read(min(65536,n-len(d)))\n"
                "  if not c: break\n"
                "  d+=c\n"
                " print(json.dumps({'b':base64.b64encode(d).decode()}))\n"
                "except OSError as e:\n"
                " print(json.dumps({'e':errno.errorcode.get(e.errno,str(e.errno))}))\n")
        res = self.run([*self.python, "-c", prog, path], timeout=timeout)
        if res.timed_out:
            return FileRead(path, error="TIMEOUT")
        try:
            d = json.loads(res.stdout)
        except ValueError:
            return FileRead(path, error=f"PROBE_FAILED rc={res.rc}")
        return FileRead(path, error=d["e"]) if "e" in d else FileRead(path, base64.b64decode(d["b"]))

    def stat_many(self, paths: list[str], timeout: float = 3.0) -> dict[str, StatResult]:
        """lstat() each path; a missing path is a result with exists=False."""
        if not paths:
            return {}
        res = self.run([*self.python, "-c", _PY_STAT, *paths], timeout=timeout)
        data = self._json_or_none(res)
        if data is None:
            err = "TIMEOUT" if res.timed_out else f"PROBE_FAILED rc={res.rc}"
            return {p: StatResult(p, False, error=err) for p in paths}
        return {p: StatResult(p, **data[p]) for p in paths}

    def stat(self, path: str, timeout: float = 3.0) -> StatResult:
        return self.stat_many([path], timeout)[path]

    def try_open_many(self, paths: list[str], timeout: float = 5.0, access: str = "rw") -> dict[str, str]:
        """open(O_RDWR|O_NONBLOCK) each path as the target's user — O_RDONLY with access="r", the way a
        capability node's consumer opens it; "OK" or the errno name."""
        if not paths:
            return {}
        res = self.run([*self.python, "-c", _PY_OPEN, check_access(access), *paths], timeout=timeout)
        data = self._json_or_none(res)
        if data is None:
            err = "TIMEOUT" if res.timed_out else f"PROBE_FAILED rc={res.rc}"
            return {p: err for p in paths}
        return data

    def listdir(self, path: str, timeout: float = 3.0) -> list[str] | str:
        """Sorted entries, or the errno name."""
        data = self._json_or_none(self.run([*self.python, "-c", _PY_LISTDIR, path], timeout=timeout))
        if data is None:
            return "TIMEOUT"
        return data.get("entries", data.get("error"))

    def statvfs(self, path: str, timeout: float = 3.0) -> dict:
        """Filesystem sizes in bytes: total, free, avail, and readonly (ST_RDONLY) — or {"error": ...}."""
        data = self._json_or_none(self.run([*self.python, "-c", _PY_STATVFS, path], timeout=timeout))
        return data if data is not None else {"error": "TIMEOUT"}

    def batch(self, ops: list[tuple], timeout: float = 3.0) -> list:
        """Independent read-only operations in one go (one round trip over SSH), each under `timeout`; answers in
        order, each what the single operation returns:

            ("read", path[, max_bytes]) -> FileRead        ("listdir", path) -> list | errno name
            ("stat", [paths]) -> {path: StatResult}       ("open", [paths][, "r"]) -> {path: "OK" | errno name}
            ("statvfs", path) -> dict

        This default calls the single operations one after another, so recording and replay see exactly them."""
        out: list = []
        for op in ops:
            kind = op[0]
            if kind == "read":
                out.append(self.read_file(op[1], timeout, *op[2:3]))
            elif kind == "listdir":
                out.append(self.listdir(op[1], timeout))
            elif kind == "stat":
                out.append(self.stat_many(list(op[1]), timeout))
            elif kind == "open":
                out.append(self.try_open_many(list(op[1]), timeout, *op[2:3]))
            elif kind == "statvfs":
                out.append(self.statvfs(op[1], timeout))
            else:
                raise ValueError(f"unknown batch operation {kind!r}")
        return out

    # --- writes: used only by remedies, through gpudoctor.edit ------------------------------
    # Contract: success returns None; a refused operation raises OSError(errno, strerror, path)
    # (EROFS, EACCES, EEXIST, ENOENT...); a transport failure raises HostUnreachable; a deadline
    # that passes raises CommandTimeout. Backends may do these in-process (local) or over SFTP (ssh).

    def write_file(self, path: str, data: bytes, *, mode: int | None = None,
                   owner: tuple[int, int] | None = None, exclusive: bool = False,
                   timeout: float = 10.0) -> None:
        """Write `data` to `path` (create; truncate unless `exclusive`, which fails with EEXIST), then fsync.

        `mode`/`owner` are set only when the created file differs from them (pmxcfs refuses needless chmod).
        This is a plain write, not atomic: gpudoctor.edit writes a temp file with it and then calls rename().
        """
        argv = [*self.python, "-c", _PY_WRITE, path, "-" if mode is None else format(mode, "o"),
                "-" if owner is None else str(owner[0]), "-" if owner is None else str(owner[1]),
                "1" if exclusive else "0", str(len(data))]
        self._fileop(argv, "write", path, timeout, input=bytes(data))

    def rename(self, src: str, dst: str, timeout: float = 10.0) -> None:
        """rename(2) src over dst (atomic within one filesystem), then fsync dst's directory."""
        self._fileop([*self.python, "-c", _PY_FILEOP, "rename", src, dst], "rename", src, timeout)

    def unlink(self, path: str, timeout: float = 10.0) -> None:
        """Remove a file (FileNotFoundError when it is not there)."""
        self._fileop([*self.python, "-c", _PY_FILEOP, "unlink", path], "unlink", path, timeout)

    def makedirs(self, path: str, mode: int = 0o700, timeout: float = 10.0) -> None:
        """mkdir -p with `mode` for the directories it creates."""
        self._fileop([*self.python, "-c", _PY_FILEOP, "makedirs", path, format(mode, "o")], "makedirs", path, timeout)

    def chmod(self, path: str, mode: int, timeout: float = 10.0) -> None:
        """chmod(2) `path` (follows a bind mount to the inode it shows, as chmod does)."""
        self._fileop([*self.python, "-c", _PY_FILEOP, "chmod", path, format(mode, "o")], "chmod", path, timeout)

    def mknod(self, path: str, major: int, minor: int, mode: int = 0o666, timeout: float = 10.0) -> None:
        """Create a character device node with exactly `mode` (not cut by the umask); EEXIST when `path` exists.

        Owned by the caller (root). Remedies create nodes under a temp name and rename() them into place.
        """
        self._fileop([*self.python, "-c", _PY_FILEOP, "mknod", path, format(mode, "o"), str(int(major)),
                      str(int(minor))], "mknod", path, timeout)

    def _fileop(self, argv: list[str], what: str, path: str, timeout: float, input: bytes | None = None) -> None:
        from gpudoctor.errors import CommandTimeout

        res = self.run(argv, timeout=timeout, input=input)
        if res.timed_out:
            raise CommandTimeout(f"{what} {path}", timeout)
        try:
            d = json.loads(res.stdout)
        except ValueError:
            raise OSError(0, f"file operation failed on the target (rc {res.rc}): "
                             f"{(res.stderr or res.stdout).strip()[:200]}", path) from None
        if "errno" in d:
            raise OSError(d["errno"], d.get("msg") or "", path)

    def close(self) -> None:
        """Release the transport (no-op for local)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def _json_or_none(res: CommandResult):
        if not res.ok:
            return None
        try:
            return json.loads(res.stdout)
        except ValueError:
            return None


def check_access(access: str) -> str:
    """The access of an open probe: "rw" (O_RDWR, what CUDA does to its nodes) or "r" (O_RDONLY)."""
    if access not in ("rw", "r"):
        raise ValueError(f"open access must be 'rw' or 'r', not {access!r}")
    return access


def quote_argv(argv: list[str]) -> str:
    """The one place arguments are quoted for a remote shell: every argument, always."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def raise_errno(name: str, path: str) -> None:
    """Raise OSError for an errno name seen on the target ("EROFS") so callers can test exc.errno."""
    code = getattr(errno, name, None)
    if not isinstance(code, int):
        raise OSError(errno.EIO, f"{name} on the target", path)
    raise OSError(code, os.strerror(code), path)


def read_capped(fh, max_bytes: int, step: int = 65536) -> bytes:
    """Read up to max_bytes in modest steps (one huge read() of a /proc/sys file fails with ENOMEM)."""
    chunks, left = [], max_bytes
    while left > 0:
        chunk = fh.read(min(step, left))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
