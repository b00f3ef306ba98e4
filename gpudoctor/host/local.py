"""The local backend: subprocesses with deadlines, reads done in-process under a deadline."""

from __future__ import annotations

import errno
import os
import signal
import stat as statmod
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from gpudoctor.atomic import fsync_dir
from gpudoctor.host.base import CommandResult, FileRead, Host, StatResult, check_access, read_capped


def _errname(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


_PRESTARTED: dict = {}  # argv tuple -> (Popen, start time): probes started before the CLI finished loading


def prestart(argv: list[str]) -> None:
    """Start a probe now; the LocalHost.run() that asks for the same argv adopts it (its deadline counts from now).

    The cuInit probe dominates a check's wall time, so the CLI starts it before importing the rest of gpudoctor.
    A process nobody adopts is killed at exit.
    """
    import atexit

    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError:
        return
    _PRESTARTED[tuple(argv)] = (proc, time.perf_counter())
    if len(_PRESTARTED) == 1:
        atexit.register(_reap_prestarted)


def _reap_prestarted() -> None:
    for proc, _ in _PRESTARTED.values():
        LocalHost._kill(proc)
    _PRESTARTED.clear()


def with_deadline(fn, timeout: float, default):
    """Run fn() in a daemon thread; return `default` if it does not finish in time (the thread is abandoned)."""
    box: list = []

    def target():
        try:
            box.append(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box.append(("err", exc))

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        return default
    kind, val = box[0]
    if kind == "err":
        raise val
    return val


@dataclass
class LocalHost(Host):
    """This machine. `root` prefixes every absolute path (tests point it at a temp tree)."""

    name: str = "localhost"
    python: list[str] = field(default_factory=lambda: [sys.executable])
    root: str = ""
    path_prepend: list[str] = field(default_factory=list)  # extra PATH entries (tests: fake tools)

    def _p(self, path: str) -> str:
        return self.root + path if self.root and path.startswith("/") else path

    def run(self, argv, timeout=None, input=None, env=None) -> CommandResult:
        timeout = self.default_timeout if timeout is None else timeout
        early = _PRESTARTED.pop(tuple(argv), None) if not (input or env or self.path_prepend or self.root) else None
        if early is not None:  # started at CLI entry (see prestart); its clock started then too
            proc, t0 = early
            return self._finish(proc, argv, timeout - (time.perf_counter() - t0), t0, None, timeout)
        full_env = dict(os.environ)
        if self.path_prepend:
            full_env["PATH"] = os.pathsep.join([*self.path_prepend, full_env.get("PATH", "")])
        if env:
            full_env.update(env)
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env,
                                    start_new_session=True)
        except FileNotFoundError:
            return CommandResult(list(argv), 127, "", f"{argv[0]}: command not found", time.perf_counter() - t0)
        except PermissionError:
            return CommandResult(list(argv), 126, "", f"{argv[0]}: permission denied", time.perf_counter() - t0)
        return self._finish(proc, argv, timeout, t0, input, timeout)

    def _finish(self, proc, argv, wait, t0, input, asked) -> CommandResult:
        """Collect a started process: wait at most `wait` s; report the deadline the caller `asked` for."""
        try:
            out, err = proc.communicate(input=input, timeout=max(wait, 0.0))
        except subprocess.TimeoutExpired:
            self._kill(proc)
            return CommandResult(list(argv), None, "", "", time.perf_counter() - t0, timed_out=True, timeout_s=asked)
        return CommandResult(list(argv), proc.returncode, out.decode("utf-8", "replace"),
                             err.decode("utf-8", "replace"), time.perf_counter() - t0, timeout_s=asked)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        # A process stuck in the kernel (D state) may not die: do not wait on it forever.
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass

    def read_file(self, path, timeout=3.0, max_bytes=4 << 20) -> FileRead:
        def read():
            try:
                with open(self._p(path), "rb", buffering=0) as fh:
                    return FileRead(path, read_capped(fh, max_bytes))
            except OSError as exc:
                return FileRead(path, error=_errname(exc))

        return with_deadline(read, timeout, FileRead(path, error="TIMEOUT"))

    def stat_many(self, paths, timeout=3.0):
        def one(p):
            try:
                st = os.lstat(self._p(p))
            except OSError as exc:
                return StatResult(p, False, error=_errname(exc))
            m = st.st_mode
            kind = ("char" if statmod.S_ISCHR(m) else "block" if statmod.S_ISBLK(m) else "dir" if statmod.S_ISDIR(m)
                    else "link" if statmod.S_ISLNK(m) else "file" if statmod.S_ISREG(m) else "other")
            r = StatResult(p, True, kind, statmod.S_IMODE(m), st.st_uid, st.st_gid, size=st.st_size, mtime=st.st_mtime)
            if kind in ("char", "block"):
                r.major, r.minor = os.major(st.st_rdev), os.minor(st.st_rdev)
            if kind == "link":
                r.target = os.readlink(self._p(p))
            return r

        fallback = {p: StatResult(p, False, error="TIMEOUT") for p in paths}
        return with_deadline(lambda: {p: one(p) for p in paths}, timeout, fallback)

    def try_open_many(self, paths, timeout=5.0, access="rw"):
        acc = os.O_RDONLY if check_access(access) == "r" else os.O_RDWR

        def one(p):
            try:
                fd = os.open(self._p(p), acc | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
                os.close(fd)
                return "OK"
            except OSError as exc:
                return _errname(exc)

        out: dict[str, str] = {}

        def all_():
            for p in paths:
                out[p] = one(p)
            return out

        res = with_deadline(all_, timeout, None)
        if res is None:  # the nodes that did not answer are the finding
            return {p: out.get(p, "TIMEOUT") for p in paths}
        return res

    def listdir(self, path, timeout=3.0):
        def ls():
            try:
                return sorted(os.listdir(self._p(path)))
            except OSError as exc:
                return _errname(exc)

        return with_deadline(ls, timeout, "TIMEOUT")

    def statvfs(self, path, timeout=3.0):
        def sv():
            try:
                s = os.statvfs(self._p(path))
            except OSError as exc:
                return {"error": _errname(exc)}
            return {"total": s.f_blocks * s.f_frsize, "free": s.f_bfree * s.f_frsize, "avail": s.f_bavail * s.f_frsize,
                    "readonly": bool(s.f_flag & os.ST_RDONLY)}

        return with_deadline(sv, timeout, {"error": "TIMEOUT"})

    # --- writes (see Host for the contract) -------------------------------------------------
    def _deadline(self, what: str, fn, timeout: float):
        from gpudoctor.errors import CommandTimeout

        box = with_deadline(lambda: ("done", fn()), timeout, None)
        if box is None:
            raise CommandTimeout(what, timeout)
        return box[1]

    def write_file(self, path, data, *, mode=None, owner=None, exclusive=False, timeout=10.0):
        real = self._p(path)

        def write():
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
            fd = os.open(real, flags, 0o666 if mode is None else mode)
            try:
                view = memoryview(bytes(data))
                while view:
                    view = view[os.write(fd, view):]
                st = os.fstat(fd)
                if mode is not None and statmod.S_IMODE(st.st_mode) != mode:
                    os.fchmod(fd, mode)
                if owner is not None and (st.st_uid, st.st_gid) != tuple(owner):
                    os.fchown(fd, owner[0], owner[1])
                os.fsync(fd)
            finally:
                os.close(fd)

        self._deadline(f"write {path}", write, timeout)

    def rename(self, src, dst, timeout=10.0):
        def ren():
            os.rename(self._p(src), self._p(dst))
            fsync_dir(os.path.dirname(self._p(dst)))

        self._deadline(f"rename {src}", ren, timeout)

    def unlink(self, path, timeout=10.0):
        self._deadline(f"unlink {path}", lambda: os.unlink(self._p(path)), timeout)

    def makedirs(self, path, mode=0o700, timeout=10.0):
        self._deadline(f"mkdir {path}", lambda: os.makedirs(self._p(path), mode, exist_ok=True), timeout)

    def mknod(self, path, major, minor, mode=0o666, timeout=10.0):
        real = self._p(path)

        def mk():
            os.mknod(real, statmod.S_IFCHR | mode, os.makedev(major, minor))
            try:
                if statmod.S_IMODE(os.lstat(real).st_mode) != mode:
                    os.chmod(real, mode)  # mknod's mode was cut by the umask
            except OSError:
                os.unlink(real)
                raise

        self._deadline(f"mknod {path}", mk, timeout)

    def chmod(self, path, mode, timeout=10.0):
        self._deadline(f"chmod {path}", lambda: os.chmod(self._p(path), mode), timeout)
