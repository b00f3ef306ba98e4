"""Progress while gpudoctor waits on many hosts (`check --all`, `inventory ping`): on a terminal, one line on stderr
that says how many answered and which are still awaited, redrawn each second and erased at the end; to a pipe or a
file nothing (logs and JSON stay clean). Stdlib only; the line is made printable (host names come from an inventory)."""

from __future__ import annotations

import sys
import threading
import time


class Waiting:
    """with Waiting("check --all", names) as w: ... w.done(name) as each host answers."""

    def __init__(self, what: str, names, *, stream=None, interval: float = 1.0, tty: bool | None = None):
        self.what = what
        self.pending = list(dict.fromkeys(names))
        self.total = len(self.pending)
        self.stream = stream if stream is not None else sys.stderr
        from gpudoctor.term import RawWriter, SafeStream

        if isinstance(self.stream, SafeStream):  # the line is printable already; its \r must reach the terminal
            self.stream = RawWriter(self.stream)
        self.interval = interval
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty and isatty())
        self.tty = tty
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()
        self._drawn = 0

    def done(self, name: str) -> None:
        with self._lock:
            if name in self.pending:
                self.pending.remove(name)

    def line(self) -> str:
        from gpudoctor.term import printable

        with self._lock:
            left = list(self.pending)
        answered = self.total - len(left)
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        wait = f"; waiting on {shown}" if left else ""
        return printable(f"{self.what}: {answered} of {self.total} hosts answered{wait} "
                         f"({time.monotonic() - self._t0:.0f} s)")

    def _draw(self) -> None:
        text = self.line()
        width = 0
        try:
            import shutil

            width = shutil.get_terminal_size((100, 24)).columns - 1
        except (OSError, ValueError):
            pass
        if width > 10 and len(text) > width:
            text = text[: width - 1] + "…"
        self.stream.write("\r" + text + " " * max(0, self._drawn - len(text)))
        self.stream.flush()
        self._drawn = len(text)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._draw()
            except (OSError, ValueError):  # a closed terminal: progress is not worth an error
                return

    def __enter__(self) -> "Waiting":
        if self.tty and self.total > 1:
            self._thread = threading.Thread(target=self._run, name="gpudoctor-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
            if self._drawn:
                try:
                    self.stream.write("\r" + " " * self._drawn + "\r")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass
