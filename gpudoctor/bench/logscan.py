"""Find the lines in a server log that say why it failed (CUDA errors, assertions, memory, tracebacks)."""

from __future__ import annotations

import os
import re
from typing import Callable

# (name, pattern). Order is priority: the first one found names the reason.
PATTERNS: list[tuple[str, re.Pattern]] = [(n, re.compile(p)) for n, p in [
    ("cuda-illegal-instruction", r"illegal instruction"),
    ("cuda-illegal-memory-access", r"illegal memory access"),
    ("cuda-unknown-error", r"CUDA unknown error"),
    ("cuda-oom", r"CUDA out of memory|OutOfMemoryError"),
    ("cuda-error", r"CUDA error"),
    ("nccl-error", r"NCCL (?:error|WARN .*failed)|ncclInternalError|ncclSystemError"),
    ("max-running-zero", r"max_running_request is zero"),
    ("not-enough-memory", r"Not enough memory"),
    ("memory-pool-too-small", r"Memory pool size is too small"),
    ("mamba-cache-too-small", r"state cache is too small"),
    ("cuda-graph-failed", r"Capture cuda graph failed"),
    ("assertion", r"AssertionError"),
    ("health-check-failed", r"Health check failed"),
    ("warmup-failed", r"Initialization failed"),
    ("killed", r"\bKilled\b|Received sigquit"),
    ("traceback", r"Traceback \(most recent call last\)"),
    ("exception", r"^\S*(?:Error|Exception): |\] \w+(?:Error|Exception): "),
]]


def scan(text: str) -> list[tuple[int, str, str]]:
    """(line number, reason name, line) for every line that matches a failure pattern."""
    hits = []
    for no, line in enumerate(text.splitlines(), 1):
        for name, pat in PATTERNS:
            if pat.search(line):
                hits.append((no, name, line.rstrip()))
                break
    return hits


def reason(text: str) -> str | None:
    """The most telling failure line in the log, or None when nothing matches."""
    hits = scan(text)
    if not hits:
        return None
    rank = {name: i for i, (name, _) in enumerate(PATTERNS)}
    best = min(hits, key=lambda h: (rank[h[1]], h[0]))
    return best[2].strip()


def excerpt(text: str, *, tail: int = 15, max_lines: int = 40) -> str:
    """The matching lines plus the log's last lines, numbered, deduplicated, in file order."""
    lines = text.splitlines()
    keep = {no for no, _, _ in scan(text)}
    keep.update(range(max(1, len(lines) - tail + 1), len(lines) + 1))
    chosen = sorted(keep)
    if len(chosen) > max_lines:  # keep the first matches (the cause) and the tail (the end)
        chosen = chosen[: max_lines - tail] + chosen[-tail:]
    return "\n".join(f"{no}: {lines[no - 1]}" for no in chosen)


class LogWatch:
    """A log file read from a start offset, so a level only blames lines written while it ran.

    `sync` (optional) brings the file up to date before every look: a remote server's log is a local mirror that
    its launcher appends to (gpudoctor.bench.remote.HostLauncher.sync_log).
    """

    def __init__(self, path: str | None, sync: Callable[[], None] | None = None):
        self.path, self.sync = path, sync
        self.offset = self._size()

    def _size(self) -> int:
        if self.sync is not None:
            self.sync()
        try:
            return os.path.getsize(self.path) if self.path else 0
        except OSError:
            return 0

    def mark(self) -> None:
        self.offset = self._size()

    def read_new(self, limit: int = 1 << 20) -> str:
        if not self.path:
            return ""
        if self.sync is not None:
            self.sync()
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                start = max(self.offset, size - limit)
                fh.seek(start)
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def read_all(self, limit: int = 1 << 20) -> str:
        saved, self.offset = self.offset, 0
        try:
            return self.read_new(limit)
        finally:
            self.offset = saved
