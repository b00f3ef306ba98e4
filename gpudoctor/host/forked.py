"""A `python -I -S -c PROGRAM` probe run in a fork of this process instead: the same program, its own process and
session (killable as the spawned one is), without a second interpreter's start (#33: the cuInit probe is a live
check's critical path; its `-I -S` interpreter start was ~8 ms on the H200 and 25-50 ms on a loaded build machine).

Only where forking is safe: a process with one thread (the console script at entry, before NVML's thread starts);
elsewhere host/early.py spawns the interpreter. `Forked` offers the part of Popen's interface that LocalHost._finish,
LocalHost._kill and early.kill_unadopted use. Stdlib only: it runs before click is imported."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def can_fork() -> bool:
    import threading

    return hasattr(os, "fork") and threading.active_count() == 1


class Forked:
    def __init__(self, argv: list[str], program: str):
        self.args = list(argv)
        self.returncode = None
        for stream in (sys.stdout, sys.stderr):  # nothing buffered here may be written twice
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.setsid()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(w_out, 1)
                os.dup2(w_err, 2)
                for fd in (null, r_out, w_out, r_err, w_err):
                    os.close(fd)
                exec(compile(program, "<probe>", "exec"), {"__name__": "__main__"})
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, exit 1
                import traceback

                traceback.print_exc()
            finally:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except Exception:  # noqa: BLE001
                        pass
                os._exit(code)
        os.close(w_out)
        os.close(w_err)
        self.pid = pid
        self._fds = {r_out: bytearray(), r_err: bytearray()}
        self._order = (r_out, r_err)

    def communicate(self, input=None, timeout=None):
        """(stdout, stderr) once the child has closed both and exited; subprocess.TimeoutExpired after `timeout` s
        (what was read so far is kept for the next call, as Popen does)."""
        import selectors

        end = None if timeout is None else time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        for fd in self._fds:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while sel.get_map():
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        self._fds[key.fd] += chunk
                    else:
                        sel.unregister(key.fd)
        finally:
            sel.close()
        self.wait(None if end is None else max(end - time.monotonic(), 0.0))
        for fd in self._order:
            try:
                os.close(fd)
            except OSError:
                pass
        return bytes(self._fds[self._order[0]]), bytes(self._fds[self._order[1]])

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        return self.returncode

    def kill(self):
        if self.returncode is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass
