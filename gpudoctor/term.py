"""The one rule for what reaches a terminal: no byte of input is ever written raw.

A host name, a config line, a snapshot field or a model file name can hold ESC sequences (clear the screen, move the
cursor up and overwrite a FAIL line, set the window title, write the clipboard), carriage returns, backspaces or bidi
overrides. Every character that is not printable is shown as a Python-style escape (`\\x1b`, `\\u202e`):

    printable(s)              a value as one line: newlines and tabs escaped too (use for every interpolated value)
    markup(s)                 printable() and rich-markup escaped, for text given to rich
    console(stderr=False)     a rich Console whose every string is made printable (newlines kept) before rendering
    RawWriter(safe)           what that Console writes to: the raw stream, a closed pipe still told to `safe`
    SafeStream(stream)        what cli.main puts on sys.stdout/sys.stderr: every write keeps only \\n and \\t

report.py renders with these; cli.main installs SafeStream so a line that forgot printable() is still safe.
"""

from __future__ import annotations

import re

_UNSAFE_LINE = re.compile(r"[^\x20-\x7e]")
_UNSAFE_TEXT = re.compile(r"[^\n\t\x20-\x7e]")


_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}  # as Python writes them


def _esc(m: re.Match) -> str:
    ch = m.group()
    if ch.isprintable():
        return ch
    if ch in _SHORT:
        return _SHORT[ch]
    o = ord(ch)
    return f"\\x{o:02x}" if o < 0x100 else (f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")


def printable(s, *, keep_newlines: bool = False) -> str:
    """`s` (any value: str() is taken) with every non-printable character escaped; one line unless keep_newlines."""
    s = s if isinstance(s, str) else str(s)
    if s.isascii() and s.isprintable():
        return s
    return (_UNSAFE_TEXT if keep_newlines else _UNSAFE_LINE).sub(_esc, s)


def markup(s) -> str:
    """A value for rich markup: printable, and '[' escaped so input cannot open a style."""
    from rich.markup import escape

    return escape(printable(s))


def console(*, stderr: bool = False, **kw):
    """A rich Console for gpudoctor's output: writes to the real stream (its own colours pass), input is escaped."""
    import sys

    from rich.console import Console

    class _SafeConsole(Console):
        def render_str(self, text, **kwargs):
            return super().render_str(printable(text, keep_newlines=True), **kwargs)

    stream = sys.stderr if stderr else sys.stdout
    return _SafeConsole(file=RawWriter(stream) if isinstance(stream, SafeStream) else stream, **kw)


class SafeStream:
    """A text stream wrapper that escapes every non-printable character except newline and tab."""

    def __init__(self, inner):
        self.raw_stream = inner

    def write(self, s) -> int:
        if isinstance(s, str):
            s = printable(s, keep_newlines=True)
        return self.raw_stream.write(s)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def broken_pipe(self) -> None:
        """A writer that bypasses this wrapper (RawWriter) met a closed pipe; cli.main's wrapper remembers it."""

    def __getattr__(self, name):  # flush, fileno, isatty, encoding, errors, ...
        if name == "buffer":  # no way around the rule: click then writes text through write()
            raise AttributeError(name)
        return getattr(self.raw_stream, name)


class RawWriter:
    """The stream under a SafeStream, for a writer that escapes its own text (console()'s rich Console, whose colour
    codes must pass): a write or flush to a closed pipe is told to the SafeStream, so that `gpudoctor check | head`
    ends with cli.main's exit 141 as every other command does."""

    def __init__(self, safe: SafeStream):
        self._safe = safe

    def write(self, s) -> int:
        try:
            return self._safe.raw_stream.write(s)
        except BrokenPipeError:
            self._safe.broken_pipe()
            raise

    def flush(self) -> None:
        try:
            self._safe.raw_stream.flush()
        except BrokenPipeError:
            self._safe.broken_pipe()
            raise

    def __getattr__(self, name):  # fileno, isatty, encoding, ...
        return getattr(self._safe.raw_stream, name)
