"""The Host API shared by every backend (local, ssh, replay). Every operation has a deadline.

Contract: a transport failure raises HostUnreachable; a command's non-zero exit, a missing file or an
errno is a *result*, never an exception. A deadline that passes is a result with timed_out=True.
"""

from __future__ import annotations

import base64
import json
import shlex
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from gpudoctor.host.childpy import python_argv


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
    """Base of every backend. Subclasses implement `run`; every file operation is one host/ops.py request carried
    by `_call` (default: one-shot over `run`)."""

    name: str = "localhost"
    python: list[str] = field(default_factory=lambda: ["python3"])
    default_timeout: float = 10.0

    # --- the one primitive every backend must implement -------------------------------------
    def run(self, argv: list[str], timeout: float | None = None, input: bytes | None = None,
            env: dict[str, str] | None = None) -> CommandResult:
        raise NotImplementedError

    def nvml(self, timeout: float) -> dict | None:
        """NVML's raw answers read in this process (host/nvml.py), or None where this backend does not read NVML
        itself: the driver gather then asks `nvidia-smi -q -x` (remote hosts, tests that stand nvidia-smi in)."""
        return None

    # --- file operations: each one request of host/ops.py, carried to the target by _call -----------
    def _call(self, req: dict, timeout: float) -> dict | None:
        """Carry one host/ops.py request to the target: its answer, or None when `timeout` passed first.

        This default is the one-shot carrier over run(): `python -I -S -c OPS REQUEST` (a process per request).
        Backends override it to carry requests better (LocalHost: in process; SSHHost: its probe agent)."""
        data = json.dumps(req, separators=(",", ":")).encode()
        big = "data" in req or len(data) > 32 << 10  # writes and long path lists travel on stdin
        tail = ["-", str(len(data))] if big else [data.decode()]
        res = self.run(python_argv(self.python, "-c", program("oneshot"), *tail, site=False), timeout=timeout,
                       input=data if big else None)
        if res.timed_out:
            return None
        try:
            ans = json.loads(res.stdout)
        except ValueError:
            ans = None
        if not isinstance(ans, dict):
            return {"failed": f"PROBE_FAILED rc={res.rc}", "detail": (res.stderr or res.stdout).strip()[:200]}
        return ans

    def _path(self, path: str) -> str:
        """Where a path of a request lives on the target (tests map the target under a temp root here)."""
        return path

    def read_file(self, path: str, timeout: float = 3.0, max_bytes: int = 4 << 20) -> FileRead:
        """Read up to max_bytes of a file on the target."""
        return self._answer(("read", path, max_bytes), timeout)

    def stat_many(self, paths: list[str], timeout: float = 3.0) -> dict[str, StatResult]:
        """lstat() each path; a missing path is a result with exists=False."""
        return self._answer(("stat", list(paths)), timeout) if paths else {}

    def stat(self, path: str, timeout: float = 3.0) -> StatResult:
        return self.stat_many([path], timeout)[path]

    def try_open_many(self, paths: list[str], timeout: float = 5.0, access: str = "rw") -> dict[str, str]:
        """open(O_RDWR|O_NONBLOCK) each path as the target's user — O_RDONLY with access="r", the way a
        capability node's consumer opens it; "OK" or the errno name ("TIMEOUT": it hung)."""
        return self._answer(("open", list(paths), check_access(access)), timeout) if paths else {}

    def listdir(self, path: str, timeout: float = 3.0) -> list[str] | str:
        """Sorted entries, or the errno name."""
        return self._answer(("listdir", path), timeout)

    def statvfs(self, path: str, timeout: float = 3.0) -> dict:
        """Filesystem sizes in bytes: total, free, avail, and readonly (ST_RDONLY) — or {"error": ...}."""
        return self._answer(("statvfs", path), timeout)

    def batch(self, ops: list[tuple], timeout: float = 3.0) -> list:
        """Independent read-only operations in one request (one round trip over SSH), side by side, each under
        `timeout`; answers in order, each what the single operation returns:

            ("read", path[, max_bytes]) -> FileRead        ("listdir", path) -> list | errno name
            ("stat", [paths]) -> {path: StatResult}       ("open", [paths][, "r"]) -> {path: "OK" | errno name}
            ("statvfs", path) -> dict"""
        ops = [tuple(op) for op in ops]
        if not ops:
            return []
        ans = self._call({"op": "batch", "ops": [self._request(op, timeout) for op in ops], "timeout": timeout},
                         timeout + BATCH_GRACE)
        answers = ans.get("r") if isinstance(ans, dict) and isinstance(ans.get("r"), list) else None
        if answers is None:  # the carrier failed as a whole: every operation says so
            return [decode(op, ans, self._path) for op in ops]
        return [decode(op, a, self._path) for op, a in zip(ops, answers)]

    def batch_each(self, ops: list[tuple], timeout: float = 3.0) -> list:
        """batch() as the single operations, one after another (for backends that answer them one by one)."""
        single = {"read": lambda op: self.read_file(op[1], timeout, *op[2:3]),
                  "listdir": lambda op: self.listdir(op[1], timeout), "statvfs": lambda op: self.statvfs(op[1], timeout),
                  "stat": lambda op: self.stat_many(list(op[1]), timeout),
                  "open": lambda op: self.try_open_many(list(op[1]), timeout, *op[2:3])}
        out = []
        for op in ops:
            if op[0] not in single:
                raise ValueError(f"unknown batch operation {op[0]!r}")
            out.append(single[op[0]](op))
        return out

    def _request(self, op: tuple, timeout: float) -> dict:
        """The host/ops.py request of one read operation (paths through _path)."""
        kind = op[0]
        if kind == "read":
            return {"op": "read", "path": self._path(op[1]), "max": int(op[2]) if len(op) > 2 else 4 << 20}
        if kind in ("listdir", "statvfs"):
            return {"op": kind, "path": self._path(op[1])}
        if kind == "stat":
            return {"op": kind, "paths": [self._path(p) for p in op[1]], "timeout": timeout}
        if kind == "open":
            return {"op": kind, "paths": [self._path(p) for p in op[1]], "timeout": timeout,
                    "access": check_access(op[2] if len(op) > 2 else "rw")}
        raise ValueError(f"unknown batch operation {kind!r}")

    def _answer(self, op: tuple, timeout: float):
        return decode(op, self._call(self._request(op, timeout), timeout), self._path)

    # --- writes: used only by remedies, through gpudoctor.files.edit ------------------------------
    # Contract: success returns None; a refused operation raises OSError(errno, strerror, path)
    # (EROFS, EACCES, EEXIST, ENOENT...); a transport failure raises HostUnreachable; a deadline
    # that passes raises CommandTimeout.

    def write_file(self, path: str, data: bytes, *, mode: int | None = None,
                   owner: tuple[int, int] | None = None, exclusive: bool = False,
                   timeout: float = 10.0) -> None:
        """Write `data` to `path` (create; truncate unless `exclusive`, which fails with EEXIST), then fsync.

        `mode`/`owner` are set only when the created file differs from them (pmxcfs refuses needless chmod).
        This is a plain write, not atomic: gpudoctor.files.edit writes a temp file with it and then calls rename().
        """
        self._write({"op": "write", "path": self._path(path), "data": base64.b64encode(bytes(data)).decode(),
                     "mode": mode, "owner": list(owner) if owner is not None else None, "exclusive": exclusive},
                    f"write {path}", path, timeout)

    def rename(self, src: str, dst: str, timeout: float = 10.0) -> None:
        """rename(2) src over dst (atomic within one filesystem), then fsync dst's directory."""
        self._write({"op": "rename", "src": self._path(src), "dst": self._path(dst)}, f"rename {src}", src, timeout)

    def unlink(self, path: str, timeout: float = 10.0) -> None:
        """Remove a file (FileNotFoundError when it is not there)."""
        self._write({"op": "unlink", "path": self._path(path)}, f"unlink {path}", path, timeout)

    def makedirs(self, path: str, mode: int = 0o700, timeout: float = 10.0) -> None:
        """mkdir -p with `mode` for the directories it creates."""
        self._write({"op": "makedirs", "path": self._path(path), "mode": mode}, f"mkdir {path}", path, timeout)

    def chmod(self, path: str, mode: int, timeout: float = 10.0) -> None:
        """chmod(2) `path` (follows a bind mount to the inode it shows, as chmod does)."""
        self._write({"op": "chmod", "path": self._path(path), "mode": mode}, f"chmod {path}", path, timeout)

    def mknod(self, path: str, major: int, minor: int, mode: int = 0o666, timeout: float = 10.0) -> None:
        """Create a character device node with exactly `mode` (not cut by the umask); EEXIST when `path` exists.

        Owned by the caller (root). Remedies create nodes under a temp name and rename() them into place.
        """
        self._write({"op": "mknod", "path": self._path(path), "mode": mode, "major": int(major), "minor": int(minor)},
                    f"mknod {path}", path, timeout)

    def _write(self, req: dict, what: str, path: str, timeout: float) -> None:
        from gpudoctor.errors import CommandTimeout

        ans = self._call(req, timeout)
        if ans is None:
            raise CommandTimeout(what, timeout)
        if "errno" in ans:
            raise OSError(ans["errno"], ans.get("msg") or "", path)
        if "ok" not in ans:
            raise OSError(0, f"file operation failed on the target: {ans.get('failed') or ans.get('bad')}"
                             + (f": {ans['detail']}" if ans.get("detail") else ""), path)

    def close(self) -> None:
        """Release the transport (no-op for local)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_access(access: str) -> str:
    """The access of an open probe: "rw" (O_RDWR, what CUDA does to its nodes) or "r" (O_RDONLY)."""
    if access not in ("rw", "r"):
        raise ValueError(f"open access must be 'rw' or 'r', not {access!r}")
    return access


def quote_argv(argv: list[str]) -> str:
    """The one place arguments are quoted for a remote shell: every argument, always."""
    return " ".join(shlex.quote(str(a)) for a in argv)



BATCH_GRACE = 1.0  # a batch answers at its deadline with what finished; the carrier waits this much longer


@lru_cache(maxsize=None)
def program(kind: str) -> str:
    """The text sent to the target: host/ops.py, then the agent's loop ("agent") or the one-shot entry ("oneshot")."""
    here = Path(__file__).parent
    ops = (here / "ops.py").read_text()
    return ops + ("\n" + (here / "agent_prog.py").read_text() if kind == "agent" else "\n_oneshot()\n")


def decode(op: tuple, a: dict | None, where=lambda p: p):
    """A host/ops.py answer as the operation returns it. No answer (None, a batch's {"timeout": 1}): TIMEOUT;
    a carrier that failed ({"failed": "PROBE_FAILED rc=N"}, {"bad": ...}): that, as the error."""
    kind = op[0]
    err = "TIMEOUT" if a is None or "timeout" in a else a.get("failed") or (
        f"PROBE_FAILED: {a['bad']}" if "bad" in a else None)
    if kind == "read":
        if err:
            return FileRead(op[1], error=err)
        return FileRead(op[1], error=a["e"]) if "e" in a else FileRead(op[1], base64.b64decode(a["b"]))
    if kind == "listdir":
        return err or (a["entries"] if "entries" in a else a["error"])
    if kind == "statvfs":
        return {"error": err} if err else {k: v for k, v in a.items() if k != "id"}
    paths = list(op[1])
    got = {} if err else a.get("r") or {}
    if kind == "stat":
        return {p: StatResult(p, **got[where(p)]) if where(p) in got else StatResult(p, False, error=err or "TIMEOUT")
                for p in paths}
    return {p: got.get(where(p), err or "TIMEOUT") for p in paths}
