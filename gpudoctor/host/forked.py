"""A `python -I -S -c PROGRAM` probe run in a fork of this process instead: the same program, its own process and
session (killable as the spawned one is), without a second interpreter's start (#33: the cuInit probe is a live
check's critical path; its `-I -S` interpreter start was ~8 ms on the H200 and 25-50 ms on a loaded build machine).

Its answer is collected when it is complete, not when the process is gone: once the program has run, the child writes
its exit status on a third pipe and closes all three, then exits. A process that has run cuInit spends tens of
milliseconds in its own exit (the driver's state is torn down, its address space reservations unmapped); nobody
waits for that (it is reaped when next polled, or by init once this process has exited).

Only where forking is safe: a process with one thread (the console script at entry, before NVML's thread starts);
elsewhere host/early.py spawns the interpreter. `Forked` offers the part of Popen's interface that LocalHost._finish,
LocalHost._kill and early.kill_unadopted use. Stdlib only: it runs before click is imported."""

from __future__ import annotations

import os
import sys
import time


def can_fork() -> bool:
    """One thread here: threading not imported yet (the console script at entry), or only the main thread."""
    threading = sys.modules.get("threading")
    return hasattr(os, "fork") and (threading is None or threading.active_count() == 1)


class Forked:
    def __init__(self, argv: list[str], program: str):
        self.args = list(argv)
        self.returncode = None
        self._reaped = False
        for stream in (sys.stdout, sys.stderr):  # nothing buffered here may be written twice
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        r_st, w_st = os.pipe()  # the exit status, written once the program has run
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.setsid()
                os.chdir("/")  # as host/childpy.CWD: nothing of the working directory is imported (#40)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(w_out, 1)
                os.dup2(w_err, 2)
                for fd in (null, r_out, w_out, r_err, w_err, r_st):
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
                try:  # the answer is complete: say how it ended, and let the reader go before this exit's teardown
                    os.write(w_st, str(code).encode())
                    for fd in (1, 2, w_st):
                        os.close(fd)
                except OSError:
                    pass
                os._exit(code)
        os.close(w_out)
        os.close(w_err)
        os.close(w_st)
        self.pid = pid
        self._fds = {r_out: bytearray(), r_err: bytearray(), r_st: bytearray()}
        self._order = (r_out, r_err, r_st)

    def communicate(self, input=None, timeout=None):
        """(stdout, stderr) once the child has closed them and said its exit status (else: once it has exited);
        subprocess.TimeoutExpired after `timeout` s (what was read so far is kept for the next call, as Popen does)."""
        import selectors
        import subprocess

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
        status = bytes(self._fds[self._order[2]])
        if self.returncode is None and status.lstrip(b"-").isdigit():
            self.returncode = int(status)  # said by the child: its exit (and teardown) is not waited for
            self.poll()  # reaped now if it is already gone
        else:  # killed, or it died before it could say: its real exit status
            self.wait(None if end is None else max(end - time.monotonic(), 0.0))
        for fd in self._order:
            try:
                os.close(fd)
            except OSError:
                pass
        return bytes(self._fds[self._order[0]]), bytes(self._fds[self._order[1]])

    def poll(self):
        if not self._reaped:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self._reaped = True
                return self.returncode
            if pid:
                self._reaped = True
                if self.returncode is None:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        import subprocess

        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        return self.returncode

    def kill(self):
        if not self._reaped:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass
