"""Record every Host operation during a gather, and replay it later: the snapshot backend."""

from __future__ import annotations

import errno
import json
import threading
from dataclasses import dataclass, field

from gpudoctor.errors import InputError
from gpudoctor.host.base import CommandResult, FileRead, Host, StatResult
from gpudoctor.host.environ import is_environ, scrub_raw


def _key(op: str, *args) -> str:
    return json.dumps([op, *args], separators=(",", ":"))


def _open_key(path: str, access: str = "rw") -> str:
    """An O_RDWR open keeps the key snapshots always had; a read-only open says so."""
    return _key("open", path) if access == "rw" else _key("open", path, access)


# What a replayed command answers when the snapshot never recorded it (older gpudoctor, or another probe set).
NOT_RECORDED = "not in snapshot"


NOT_RECORDED_OPEN = "NOT_RECORDED"


def not_recorded(res: CommandResult) -> bool:
    """True when `res` is a replay's answer for a command its snapshot does not hold (not a real failure)."""
    return res.rc == 127 and res.stderr.endswith(NOT_RECORDED) and not res.stdout


def _is_python(arg0: str) -> bool:
    """An interpreter's argv[0]: <python> (the target's own, normalised) or a python by its file name."""
    base = arg0.rsplit("/", 1)[-1]
    return arg0 == "<python>" or base.startswith("python")


def _strip_flags(rest: list) -> list:
    """Interpreter flags (and "-", the program on stdin) do not change an answer: _run_key drops them too."""
    while rest and isinstance(rest[0], str) and rest[0].startswith("-") and rest[0] != "-c":
        rest = rest[1:]
    return rest


def _rdv(args: list) -> list:
    """The deep tier's NCCL rendezvous by its name alone: it lies in a private scratch directory now, a fixed
    path in /tmp before, and the directory does not change the answer."""
    return [a.rsplit("/", 1)[-1].lstrip(".") if isinstance(a, str) and "gpudoctor-nccl-" in a else a for a in args]


def _program_role(rest: list) -> list:
    """A `-c PROGRAM ARGS` probe by its program's first line (a module's docstring: what the probe is) and its
    arguments: a snapshot recorded before an edit of the program's body (the model probe sends
    gpudoctor/model/probe.py's whole text) still answers it, and today's parsers read what it recorded."""
    if len(rest) >= 2 and rest[0] == "-c" and isinstance(rest[1], str):
        return ["-c", "first line: " + rest[1].lstrip().split("\n", 1)[0], *rest[2:]]
    return rest


def _run_key(host: Host, argv) -> str:
    """Key of a command; the target's python interpreter path is normalised so replays match anywhere."""
    argv = list(argv)
    n = len(host.python)
    if argv[:n] == list(host.python):
        rest = argv[n:]
        while rest and rest[0].startswith("-") and rest[0] != "-c":  # interpreter flags do not change the answer
            rest = rest[1:]
        argv = ["<python>", *rest]
    return _key("run", argv)


def _kept(res: FileRead) -> dict:
    """A read as the transcript keeps it: a process's environment only as host/environ.py allows."""
    if res.data is not None and is_environ(res.path):
        res = FileRead(res.path, scrub_raw(res.data), res.error)
    return res.to_json()


@dataclass
class RecordingHost(Host):
    """Wraps a live host and keeps a transcript of every answer (secrets are never read, so none are kept)."""

    inner: Host | None = None
    transcript: dict = field(default_factory=dict)

    def __post_init__(self):
        self.name = self.inner.name
        self.python = self.inner.python
        self._lock = threading.Lock()

    def _keep(self, key, value):
        with self._lock:
            self.transcript[key] = value

    def run(self, argv, timeout=None, input=None, env=None):
        res = self.inner.run(argv, timeout=timeout, input=input, env=env)
        self._keep(_run_key(self, argv), res.to_json())
        return res

    def nvml(self, timeout):
        res = self.inner.nvml(timeout)
        if res is not None:
            self._keep(_key("nvml", "in-process"), res)
        return res

    def read_file(self, path, timeout=3.0, max_bytes=4 << 20):
        res = self.inner.read_file(path, timeout, max_bytes)
        self._keep(_key("read", path), _kept(res))
        return res

    def stat_many(self, paths, timeout=3.0):
        res = self.inner.stat_many(paths, timeout)
        for p, r in res.items():
            self._keep(_key("stat", p), r.to_json())
        return res

    def try_open_many(self, paths, timeout=5.0, access="rw"):
        res = self.inner.try_open_many(paths, timeout, access)
        for p, r in res.items():
            self._keep(_open_key(p, access), r)
        return res

    def listdir(self, path, timeout=3.0):
        res = self.inner.listdir(path, timeout)
        self._keep(_key("listdir", path), res)
        return res

    def statvfs(self, path, timeout=3.0):
        res = self.inner.statvfs(path, timeout)
        self._keep(_key("statvfs", path), res)
        return res

    def batch(self, ops, timeout=3.0):
        res = self.inner.batch(ops, timeout)  # one round trip where the inner host can; kept as single operations
        for op, r in zip(ops, res):
            kind = op[0]
            if kind == "read":
                self._keep(_key("read", op[1]), _kept(r))
            elif kind in ("listdir", "statvfs"):
                self._keep(_key(kind, op[1]), r)
            elif kind == "stat":
                for p, st in r.items():
                    self._keep(_key("stat", p), st.to_json())
            elif kind == "open":
                for p, v in r.items():
                    self._keep(_open_key(p, *op[2:3]), v)
        return res

    def write_file(self, path, data, **kw):
        return self.inner.write_file(path, data, **kw)

    def rename(self, src, dst, timeout=10.0):
        return self.inner.rename(src, dst, timeout)

    def unlink(self, path, timeout=10.0):
        return self.inner.unlink(path, timeout)

    def makedirs(self, path, mode=0o700, timeout=10.0):
        return self.inner.makedirs(path, mode, timeout)

    def mknod(self, path, major, minor, mode=0o666, timeout=10.0):
        return self.inner.mknod(path, major, minor, mode, timeout)

    def chmod(self, path, mode, timeout=10.0):
        return self.inner.chmod(path, mode, timeout)

    def close(self):
        self.inner.close()


@dataclass
class ReplayHost(Host):
    """Answers from a transcript. An operation that was never recorded answers like a missing thing."""

    transcript: dict = field(default_factory=dict)

    def run(self, argv, timeout=None, input=None, env=None):
        rec = self.transcript.get(_run_key(self, argv))
        if rec is None and _is_python(argv[0] if argv else ""):
            rec = self._by_role(argv)
        if rec is None:
            return CommandResult(list(argv), 127, "", f"{argv[0]}: {NOT_RECORDED}")
        return CommandResult(**rec)

    def _by_role(self, argv) -> dict | None:
        """A Python probe recorded under another interpreter than the one asked for now: the interpreter does
        not change what was recorded, its program and arguments say what the probe is. A deep child run under
        `--deep-python python3` on a host whose own python was a venv's is kept under `python3`; a replay whose own
        python is also called python3 (or that names another --deep-python) looks it up by its role."""
        if getattr(self, "_roles", None) is None:
            roles: dict = {}
            for key in list(self.transcript):
                if not key.startswith('["run",'):
                    continue
                try:
                    op, args = json.loads(key)
                except ValueError:
                    continue
                if isinstance(args, list) and args and isinstance(args[0], str) and _is_python(args[0]):
                    rest = _rdv(_strip_flags(args[1:]))
                    roles.setdefault(json.dumps(rest), key)
                    roles.setdefault(json.dumps(_program_role(rest)), key)
            self._roles = roles
        rest = _rdv(_strip_flags(list(argv[1:])))
        key = self._roles.get(json.dumps(rest)) or self._roles.get(json.dumps(_program_role(rest)))
        return self.transcript.get(key) if key is not None else None

    def nvml(self, timeout):
        # A snapshot from before #33 holds nvidia-smi's XML instead: None makes the driver gather ask for that.
        return self.transcript.get(_key("nvml", "in-process"))

    def read_file(self, path, timeout=3.0, max_bytes=4 << 20):
        rec = self.transcript.get(_key("read", path))
        return FileRead.from_json(rec) if rec else FileRead(path, error="ENOENT")

    def stat_many(self, paths, timeout=3.0):
        out = {}
        for p in paths:
            rec = self.transcript.get(_key("stat", p))
            out[p] = StatResult(**rec) if rec else StatResult(p, False, error="ENOENT")
        return out

    def try_open_many(self, paths, timeout=5.0, access="rw"):
        # A read-only open an older snapshot never made answers NOT_RECORDED (its gather then asks the O_RDWR record).
        miss = "ENOENT" if access == "rw" else NOT_RECORDED_OPEN
        return {p: self.transcript.get(_open_key(p, access), miss) for p in paths}

    def listdir(self, path, timeout=3.0):
        return self.transcript.get(_key("listdir", path), "ENOENT")

    def statvfs(self, path, timeout=3.0):
        return self.transcript.get(_key("statvfs", path), {"error": "ENOENT"})

    def batch(self, ops, timeout=3.0):
        return self.batch_each(ops, timeout)  # the transcript holds the single operations

    def write_file(self, path, data, **kw):
        raise OSError(errno.EROFS, "a snapshot is read-only", path)

    def unlink(self, path, timeout=10.0):
        raise OSError(errno.EROFS, "a snapshot is read-only", path)

    def makedirs(self, path, mode=0o700, timeout=10.0):
        raise OSError(errno.EROFS, "a snapshot is read-only", path)

    def mknod(self, path, major, minor, mode=0o666, timeout=10.0):
        raise OSError(errno.EROFS, "a snapshot is read-only", path)

    def chmod(self, path, mode, timeout=10.0):
        raise OSError(errno.EROFS, "a snapshot is read-only", path)

    def rename(self, src, dst, timeout=10.0):
        raise OSError(errno.EROFS, "a snapshot is read-only", src)


class Answers(dict):
    """A transcript that counts how many of the replay's questions it answered (a snapshot replays through it)."""

    hits = 0

    def get(self, key, default=None):
        if key in self:
            self.hits += 1
            return self[key]
        return default

    def require_hits(self, doc: dict) -> None:
        """A transcript that answered nothing cannot be judged: every read would look like a missing thing."""
        if not self.hits:
            raise InputError("the snapshot's transcript answers none of the reads gpudoctor makes: cannot judge",
                             path=doc.get("_path"))
