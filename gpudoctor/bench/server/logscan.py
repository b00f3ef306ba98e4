"""Read a server's log the way an expert would: name the known failure (cause and fix), else show the lines that matter.

The knowledge is data: gpudoctor/data/server_failures.yaml (SGLang 0.5.23's, vLLM's, PyTorch's, NCCL's and
transformers' real messages, in priority order, each with a real-format example the tests run). Used by the
benchmark's crash records and by `gpudoctor sglang explain LOG`.
"""

from __future__ import annotations

import importlib.resources
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import yaml

# Lines that say something failed even when no known failure names it (they go into excerpts and unknown reports).
GENERIC: list[tuple[str, re.Pattern]] = [(n, re.compile(p)) for n, p in [
    ("traceback", r"Traceback \(most recent call last\)"),
    ("exception", r"^\S*(?:Error|Exception): |\] \w+(?:Error|Exception): |^\s*(?:AssertionError|Exception)\s*$"),
    ("cuda-error", r"CUDA error: "),
]]


@dataclass(frozen=True)
class Known:
    """One known failure (an entry of server_failures.yaml)."""

    id: str
    match: re.Pattern
    cause: str
    fix: str
    source: str
    example: str
    engines: tuple[str, ...] = ("sglang", "vllm")
    near: re.Pattern | None = None
    within: int = 8
    also: re.Pattern | None = None


@dataclass
class Failure:
    """What a log says went wrong: a known failure (id, cause, fix) or, when none applies, the first error line."""

    id: str  # a Known id, or "unknown"
    line_no: int
    line: str
    cause: str
    fix: str | None = None
    source: str | None = None
    lines: list[tuple[int, str]] = field(default_factory=list)  # the lines that matter (numbered excerpt)

    @property
    def known(self) -> bool:
        return self.id != "unknown"

    def to_json(self) -> dict:
        return {"id": self.id, "known": self.known, "line_no": self.line_no, "line": self.line, "cause": self.cause,
                "fix": self.fix, "source": self.source, "lines": [{"no": n, "text": t} for n, t in self.lines]}


@lru_cache(maxsize=1)
def _load() -> tuple[tuple[re.Pattern, ...], tuple[Known, ...]]:
    raw = yaml.safe_load(importlib.resources.files("gpudoctor").joinpath("data/server_failures.yaml").read_text())
    entries = []
    for e in raw["failures"]:
        entries.append(Known(id=e["id"], match=re.compile(e["match"]), cause=e["cause"], fix=e["fix"],
                             source=e["source"], example=e["example"],
                             engines=tuple(e.get("engines") or ("sglang", "vllm")),
                             near=re.compile(e["near"]) if e.get("near") else None, within=int(e.get("within", 8)),
                             also=re.compile(e["also"]) if e.get("also") else None))
    return tuple(re.compile(p) for p in raw["prefixes"]), tuple(entries)


def knowledge() -> tuple[Known, ...]:
    """The knowledge base, in priority order."""
    return _load()[1]


def message(line: str) -> str:
    """A log line without its logger's prefix (SGLang's timestamp, journald's, vLLM's, torch.distributed's)."""
    for p in _load()[0]:
        line = p.sub("", line, count=1)
    return line


FRAME = re.compile(r'^\s*File "[^"]*", line \d+')


def messages(lines: list[str]) -> list[str]:
    """Each line's message; a traceback's source-code lines (the line after `File "…", line N`) become empty: the
    code `assert x > 0, "max_running_request is zero"` quotes the message, the error line below it says it."""
    out = [message(ln) for ln in lines]
    for i in range(1, len(lines)):
        if FRAME.match(lines[i - 1]) and not FRAME.match(lines[i]):
            out[i] = ""
    return out


def _fill(template: str, groups: dict) -> str:
    values = {k: v for k, v in groups.items() if v is not None}
    if "module" in values:
        values.setdefault("package", values["module"].split(".")[0].replace("_", "-"))

    def sub(m: re.Match) -> str:
        return values.get(m.group(1), m.group(0))
    return re.sub(r"\{(\w+)\}", sub, template)


def _applies(k: Known, lines: list[str], i: int, text: str, also: dict) -> re.Match | None:
    """k's match on line i, when its `near` lines and its `also` (searched in the whole log once: `also` caches it) hold."""
    m = k.match.search(lines[i])
    if m is None:
        return None
    if k.near is not None and not any(k.near.search(ln) for ln in lines[max(0, i - k.within):i + 1]):
        return None
    if k.also is not None:
        if k.id not in also:
            also[k.id] = k.also.search(text) is not None
        if not also[k.id]:
            return None
    return m


def diagnose(text: str, engine: str | None = None) -> Failure | None:
    """The failure a log shows: the highest-priority known failure found (earliest line of it), else the first
    error line as an unknown failure, else None (nothing in the log looks like a failure)."""
    lines = text.splitlines()
    msgs = messages(lines)
    also: dict[str, bool] = {}
    for k in knowledge():
        if engine and engine not in k.engines:
            continue
        for i in range(len(msgs)):
            m = _applies(k, msgs, i, text, also)
            if m:
                return Failure(k.id, i + 1, lines[i].strip(), _fill(k.cause, m.groupdict()), _fill(k.fix, m.groupdict()),
                               k.source, numbered(text))
    for i, msg in enumerate(msgs):
        if any(p.search(msg) for n, p in GENERIC if n != "traceback"):
            return Failure("unknown", i + 1, lines[i].strip(), "an error no known failure explains: " + msg.strip(),
                           lines=numbered(text))
    return None


def scan(text: str) -> list[tuple[int, str, str]]:
    """(line number, name, line) for every line that matches a known failure or a generic error pattern."""
    hits = []
    kb = knowledge()
    lines = text.splitlines()
    for no, (line, msg) in enumerate(zip(lines, messages(lines)), 1):
        name = next((k.id for k in kb if k.match.search(msg)), None) or \
            next((n for n, p in GENERIC if p.search(msg)), None)
        if name:
            hits.append((no, name, line.rstrip()))
    return hits


def reason(text: str) -> str | None:
    """The most telling failure line in the log, or None when nothing matches."""
    found = diagnose(text)
    return found.line if found else None


def read_log(path: str, limit: int = 8 << 20) -> str:
    """The last `limit` bytes of a log file (or "-": standard input), decoded leniently. A missing file, a directory,
    a FIFO or a device is refused with one line (InputError), never waited on."""
    import sys

    from gpudoctor.files.inputs import read_bytes

    if path == "-":
        data = sys.stdin.buffer.read()
        return data[-limit:].decode("utf-8", "replace")
    return read_bytes(path, what="log", max_bytes=limit, tail=True).decode("utf-8", "replace")


def record_fields(text: str) -> dict:
    """What a failed result record carries from the server's log: the named cause (its id), the diagnosis in words,
    the fix, and the numbered excerpt. All None for an empty log."""
    found = diagnose(text) if text else None
    return {"cause": found.id if found else None, "diagnosis": found.cause if found else None,
            "fix": found.fix if found else None, "log_excerpt": excerpt(text) if text else None}


def numbered(text: str, *, tail: int = 15, max_lines: int = 40) -> list[tuple[int, str]]:
    """The lines that matter: every matching line plus the log's last lines, deduplicated, in file order."""
    lines = text.splitlines()
    keep = {no for no, _, _ in scan(text)}
    keep.update(range(max(1, len(lines) - tail + 1), len(lines) + 1))
    chosen = sorted(keep)
    if len(chosen) > max_lines:  # keep the first matches (the cause) and the tail (the end)
        chosen = chosen[: max_lines - tail] + chosen[-tail:]
    return [(no, lines[no - 1]) for no in chosen]


def excerpt(text: str, *, tail: int = 15, max_lines: int = 40) -> str:
    """numbered() as text, one `N: line` per line."""
    return "\n".join(f"{no}: {line}" for no, line in numbered(text, tail=tail, max_lines=max_lines))


class LogWatch:
    """A log file read from a start offset, so a level only blames lines written while it ran.

    `sync` (optional) brings the file up to date before every look: a remote server's log is a local mirror that
    its launcher appends to (gpudoctor.bench.server.remote.HostLauncher.sync_log).
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
