"""Clocks for the daemon: wall time for budgets that survive restarts, and a file-driven clock for tests.

Budgets (attempts per hour, backoff, breaker cool-down) are kept in wall-clock seconds because they are
written to the state file and must still mean something after a restart. Tests drive a `FileClock`: the
daemon reads "now" from a file the test rewrites, so an hour of backoff passes in a millisecond.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, until: float) -> bool:
        """Sleep until clock time `until` or until `event` is set; True when the event woke us."""
        while True:
            left = until - self.now()
            if left <= 0:
                return event.is_set()
            # Re-read the clock at least once a minute so a wall-clock jump does not strand us.
            if event.wait(min(left, 60.0)):
                return True


class FileClock:
    """A clock whose time is the float in a file; tests advance it by rewriting the file.

    A missing or unreadable file keeps the last time read (so a test's non-atomic rewrite never makes time
    jump to zero). Time never runs backwards.
    """

    def __init__(self, path: str | Path, poll_s: float = 0.02):
        self.path = Path(path)
        self.poll_s = poll_s
        self._last = 0.0
        self.now()

    def now(self) -> float:
        try:
            value = float(self.path.read_text().strip())
        except (OSError, ValueError):
            return self._last
        self._last = max(self._last, value)
        return self._last

    def wait(self, event: threading.Event, until: float) -> bool:
        while self.now() < until:
            if event.wait(self.poll_s):
                return True
        return event.is_set()


def make_clock(clock_file: str | None):
    """The system clock, or a FileClock when a clock file is given (tests)."""
    return FileClock(clock_file) if clock_file else SystemClock()
