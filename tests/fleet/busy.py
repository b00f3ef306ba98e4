"""Busy loops beside a test: a machine more loaded than the suite alone makes it (#28: a CI run at load average ~10
left agent login shells on the target). Each loop is a shell spinning on a core, bounded in time (`timeout`), in its own
session, and killed when the block ends, also when the test fails."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

from tests.procs import alive

BUSY_LOOPS = 8  # on the 2-core CI machine: 4 runnable spinners per core beside the fleet run
BUSY_MAX_S = 600  # a loop never outlives this, whatever happens to the test process


@contextlib.contextmanager
def busy_loops(n: int = BUSY_LOOPS, max_s: int = BUSY_MAX_S):
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen(["timeout", "-s", "KILL", str(max_s), "sh", "-c", "while :; do :; done"],
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait(timeout=10)
        assert not any(alive(p.pid) for p in procs)
