"""The one rule for what reaches a terminal: no byte of input is ever written raw.

A host name, a config line, a snapshot field or a model file name can hold ESC sequences (clear the screen, move the
cursor up and overwrite a FAIL line, set the window title, write the clipboard), carriage returns, backspaces or bidi
overrides. Every character that is not printable is shown as a Python-style escape (`\\x1b`, `\\u202e`):

    printable(s)              a value as one line: newlines and tabs escaped too (use for every interpolated value)
    markup(s)                 printable() and rich-markup escaped, for text given to rich
    console(stderr=False)     a rich Console whose every string is made printable (newlines kept) before rendering
    Styled(...)               the writer of every findings command (no rich): styled segments, folded on a terminal
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
    """A text stream wrapper that escapes every non-printable character except newline and tab; to a terminal it
    also folds a line longer than the terminal's width at spaces (never inside a token, docs/cli.md (Rendering)), so
    every command's long lines read as the findings' do. A pipe or file gets every line as written; so do JSON (a
    write that starts with '{' or '[') and a write that ends no line (a prompt, a progress line redrawn in place)."""

    def __init__(self, inner):
        self.raw_stream = inner
        self._width: int | None = -1  # -1: not decided yet; None: never fold
        self._mid = False  # the last write ended inside a line

    def _fold_width(self) -> int | None:
        if self._width == -1:
            import os

            self._width = None
            try:
                if self.raw_stream.isatty():
                    cols = os.environ.get("COLUMNS", "")
                    self._width = int(cols) if cols.isdigit() and int(cols) > 0 else \
                        (os.get_terminal_size(self.raw_stream.fileno()).columns or 80)
            except (AttributeError, ValueError, OSError):
                self._width = None
        return self._width

    def _fold(self, s: str, width: int) -> str:
        out = []
        for n, part in enumerate(s.split("\n")):
            if (n == 0 and self._mid) or cell_len(part) <= width:
                out.append(part)
                continue
            hang = len(part) - len(part.lstrip(" ")) + 4
            out.append("\n".join("".join(t for t, _ in ln) for ln in wrap([(part, "")], width, hang)))
        return "\n".join(out)

    def write(self, s) -> int:
        if isinstance(s, str):
            s = printable(s, keep_newlines=True)
            width = self._fold_width()
            # only whole lines: a write without a newline is a prompt or a line redrawn in place; JSON stays as is
            if width and "\n" in s and s.lstrip()[:1] not in ("{", "["):
                s = self._fold(s, max(width, 10))
            if s:
                self._mid = not s.endswith("\n")
        return self.raw_stream.write(s)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def broken_pipe(self) -> None:
        """A writer that bypasses this wrapper (RawWriter) met a closed pipe; cli.main's wrapper remembers it."""

    def write_failed(self, exc: OSError) -> None:
        """A writer that bypasses this wrapper (RawWriter) could not write (a full disk, /dev/full, a closed
        descriptor); cli.main's wrapper turns it into one line and exit 3."""

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
        except OSError as exc:
            self._safe.write_failed(exc)
            raise

    def flush(self) -> None:
        try:
            self._safe.raw_stream.flush()
        except BrokenPipeError:
            self._safe.broken_pipe()
            raise
        except OSError as exc:
            self._safe.write_failed(exc)
            raise

    def __getattr__(self, name):  # fileno, isatty, encoding, ...
        return getattr(self._safe.raw_stream, name)


# --- Styled: check's text report without rich ------------------------------------------------------------------

_SGR = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35",
        "cyan": "36"}


def cell_len(s: str) -> int:
    """Terminal cells of `s`: wide East Asian characters take two, combining marks none."""
    if s.isascii():
        return len(s)
    import unicodedata

    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def fold(text: str, width: int, hang: int = 0) -> list[tuple[int, int]]:
    """Where one line of `text` breaks to fit `width` cells: (start, end) spans of it, broken at spaces only. A token
    (an id, a path, a number: anything without a space) is never split: one longer than the width stays whole on a
    line of its own, wider than the width. The spaces at a break are dropped (a first line keeps its indent);
    `hang`: the cells a caller puts before each continuation line."""
    width = max(width, 1)
    if cell_len(text) <= width:
        return [(0, len(text.rstrip(" ")))]
    spans: list[tuple[int, int]] = []
    start = end = used = 0  # the line being filled is text[start:end], `used` cells, `worded` once it has a word
    worded = False
    i, n = 0, len(text)
    while i < n:
        j = i
        while j < n and text[j] == " ":
            j += 1
        k = j
        while k < n and text[k] != " ":
            k += 1
        if j == k:  # trailing spaces
            break
        gap, w = j - i, cell_len(text[j:k])
        if worded and used + gap + w > width:  # the word starts the next line
            spans.append((start, end))
            start, used, gap = j, hang, 0
        elif not worded and spans:  # a continuation line does not start with spaces
            start, gap = j, 0
        used += gap + w
        end, worded, i = k, True, k
    if worded or not spans:
        spans.append((start, end))
    return spans


def wrap(segments, width: int, hang: int = 0) -> list[list[tuple[str, str]]]:
    """Styled segments [(text, style)] (their text printable, newlines allowed) as lines of at most `width` cells
    (a token longer than that stays whole), each a list of segments; a newline starts a new line. `hang`: spaces
    before each continuation line of a folded line."""
    lines: list[list[tuple[str, str]]] = []
    para: list[tuple[str, str]] = []
    paras = [para]
    for text, style in segments:
        parts = text.split("\n")
        for k, part in enumerate(parts):
            if k:
                para = []
                paras.append(para)
            if part:
                para.append((part, style))
    for para in paras:
        plain = "".join(t for t, _ in para)
        for n, (a, b) in enumerate(fold(plain, width, hang)):
            line, pos = ([(" " * hang, "")] if n and hang else []), 0
            for t, st in para:
                lo, hi = max(a - pos, 0), min(b - pos, len(t))
                if lo < hi:
                    line.append((t[lo:hi], st))
                pos += len(t)
            lines.append(line)
    return lines


class Styled:
    """The writer of every findings command's text (report.py: check, gate, fix, daemon --once, lxc audit): segments
    of text with a style ("bold", "dim", "bold red", ...), folded to a terminal's width, styles as ANSI codes only
    on a colour terminal. Without rich: importing rich.console was 72 ms on the H200, more than a fifth of a whole
    check (docs/h200/check_latency-2026-12-04.txt). As console() does: every text is made printable (newlines kept), and it writes beneath cli.main's SafeStream (RawWriter), so
    its own colour codes pass and a closed pipe still ends the command with 141.

    The one rule for every command's findings (docs/cli.md (Rendering)): to a terminal, lines fold at its width, at
    spaces only (a token is never split); to a pipe or file, nothing folds: one line stays one line, so `grep ID`
    finds it whole.

    width: cells per line; None: on a terminal $COLUMNS, else the terminal's width; to a pipe or file no folding
    (self.width is None). color: None decides as rich does (FORCE_COLOR set: yes; NO_COLOR set or TERM dumb: no;
    else whether the stream is a terminal)."""

    def __init__(self, file=None, *, stderr: bool = False, width: int | None = None, color: bool | None = None):
        import os
        import sys

        stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
        self.file = RawWriter(stream) if isinstance(stream, SafeStream) else stream
        env = os.environ
        try:
            tty = bool(stream.isatty())
        except (AttributeError, ValueError):
            tty = False
        if color is None:
            if env.get("FORCE_COLOR"):
                color = True
            elif env.get("NO_COLOR") or env.get("TERM", "").lower() in ("dumb", "unknown"):
                color = False
            else:
                color = tty
        self.color = bool(color)
        if width is None and tty:
            cols = env.get("COLUMNS", "")
            if cols.isdigit() and int(cols) > 0:
                width = int(cols)
            else:
                try:
                    width = os.get_terminal_size(stream.fileno()).columns or 80  # a pty nobody sized says 0
                except (AttributeError, ValueError, OSError):
                    width = 80
        self.width = None if width is None else max(int(width), 10)

    def styled(self, segments) -> str:
        """One line's segments as text, with their styles' ANSI codes on a colour terminal."""
        if not self.color:
            return "".join(t for t, _ in segments)
        out = []
        for t, st in segments:
            codes = ";".join(_SGR[w] for w in (st or "").split() if w in _SGR)
            out.append(f"\x1b[{codes}m{t}\x1b[0m" if codes and t else t)
        return "".join(out)

    def print(self, *parts, wrap_lines: bool = True, hang: int | None = None) -> None:
        """One line (on a terminal folded into several) of `parts`: each a text or (text, style). wrap_lines=False:
        as one line whatever its length (a command to copy). `hang`: the indent of continuation lines (default: the
        line's own indent plus four)."""
        segs = [(printable(p, keep_newlines=True), "") if isinstance(p, str)
                else (printable(p[0], keep_newlines=True), p[1] or "") for p in parts]
        if hang is None:
            first = "".join(t for t, _ in segs)
            hang = len(first) - len(first.lstrip(" ")) + 4
        width = self.width if wrap_lines and self.width else 1 << 30
        lines = wrap(segs, width, hang if width < (1 << 30) else 0)
        self.write("".join(self.styled(ln) + "\n" for ln in lines))

    def write(self, text: str) -> None:
        self.file.write(text)
        try:
            self.file.flush()
        except (AttributeError, ValueError):
            pass
