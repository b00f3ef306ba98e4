"""The local backend: subprocesses with deadlines; file operations (host/ops.py) served in process under a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from gpudoctor.log import command_finished
from gpudoctor.host.base import CommandResult, Host
from gpudoctor.host.childpy import CWD


from gpudoctor.host.early import EARLY as _PRESTARTED  # argv tuple -> (Popen, start): probes started at CLI entry


def read_boot_id() -> str | None:
    """This machine's boot id (/proc/sys/kernel/random/boot_id), None where it cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return None


def prestart(argv: list[str]) -> None:
    """Start a probe now; the LocalHost.run() that asks for the same argv adopts it (its deadline counts from now).

    The cuInit probe dominates a check's wall time, so the console script starts it before importing the rest of
    gpudoctor (gpudoctor/entry.py, gpudoctor/host/early.py). A process nobody adopts is killed at exit.
    """
    from gpudoctor.host.early import spawn

    spawn(argv)


def _reap_prestarted() -> None:
    from gpudoctor.host.early import kill_unadopted

    kill_unadopted()


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
    # Every command starts here, never in the caller's working directory (another user's, perhaps): a child python
    # is `-I` anyway (host/childpy.py), and no command gpudoctor runs names a file relative to where root stood.
    cwd: str = CWD

    def _path(self, path: str) -> str:
        return self.root + path if self.root and path.startswith("/") else path

    def nvml(self, timeout: float) -> dict | None:
        """NVML in this process (the read the console script started at entry, when there is one), under `timeout`.
        A test tree (root) or stood-in tools (path_prepend) describe another machine: nvidia-smi answers there."""
        if self.root or self.path_prepend:
            return None
        from gpudoctor.host.nvml import read_within

        return read_within(timeout)

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
                                    start_new_session=True, cwd=self.cwd)
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
        res = CommandResult(list(argv), proc.returncode, out.decode("utf-8", "replace"),
                            err.decode("utf-8", "replace"), time.perf_counter() - t0, timeout_s=asked)
        command_finished(list(argv)[:8], res.rc, round(res.duration_s, 4))  # -vv only
        return res

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

    def _call(self, req, timeout):
        """In process: host/ops.py serves the request here, under the deadline (a read stuck in the kernel is
        abandoned in its thread)."""
        from gpudoctor.host import ops

        return with_deadline(lambda: ops.serve(req), timeout, None)
