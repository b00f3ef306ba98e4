"""Input hygiene in one place: the one reader for input files, value ranges, output paths, and short messages.

    read_bytes(path, what=..., max_bytes=...)   a regular file only (a FIFO or device is refused before it can
    read_text(path, ...)                        block), at most max_bytes, UTF-8 with the line of a bad byte
    number(value, what, lo=, hi=, integer=)     finite, in range, not a bool; else InputError
    output_file(path, what)                     its directory exists and it is not a directory (checked first)
    output_dir(path, what)                      missing or a directory, never a file, never another user's (safe.py)
    http_url(url, what)                         http(s)://host[:port][/path]
    brief(value)                                a value for a message: at most ~80 characters, with the count cut
    read_bytes(path, obeyed=True)               as root: the file is root's and only root can change it (#40),
                                                judged on the fd that is read (files/trust.py, #47)

Every refusal is an InputError (or the subclass the caller names): one line, exit 3, nothing started.
"""

from __future__ import annotations

import errno
import math
import os

from gpudoctor.errors import InputError
from gpudoctor.files import trust

MiB = 1024 * 1024
DEFAULT_MAX_BYTES = 16 * MiB


def read_bytes(path, *, what: str = "file", max_bytes: int = DEFAULT_MAX_BYTES, error=InputError,
               tail: bool = False, obeyed: bool = False, missing_ok: bool = False) -> bytes | None:
    """The bytes of a regular file, at most max_bytes (tail: its last max_bytes, e.g. of a long log); anything
    else is `error(message, path=)`.

    Opened once through the one door (files/trust.py): every part walked by fd, a link followed only when root's, a
    FIFO, socket or device refused from its fstatat() before any open (opening a FIFO blocks) and again from the fd,
    and the bytes read from the fd that was judged. `obeyed`: a file whose content root obeys (an inventory names
    programs it runs and hosts it marks ready; a campaign the servers it starts) — as root it must pass the rule
    (sshd's StrictModes: it and every directory above it root's and writable by no one else), else one line naming
    the part, its owner and its mode. An ordinary user's gpudoctor reads what that user chooses. `missing_ok`: None
    for a missing file instead of an error."""
    p = os.fspath(path)
    strict = obeyed and os.geteuid() == 0
    try:
        fd, st = trust.open_file(p, strict=strict)
    except trust.Refused as exc:
        if exc.errno == errno.ENOENT:
            if missing_ok:
                return None
            raise error(f"no such {what}", path=p) from None
        if exc.rule and strict:
            raise error(f"refusing this {what} as root: {exc}: another user could change what root does "
                        "(give it to root, chmod go-w, or keep it in a directory only root can write)", path=p) from None
        where = "" if exc.path == os.path.abspath(p) else f"{exc.path} "
        raise error(f"cannot read {what}: {where}{_it(exc.why)}", path=p) from None
    try:
        if st.st_size > max_bytes:
            if not tail:
                raise error(f"{what} is {_size(st.st_size)}, larger than the {_size(max_bytes)} gpudoctor reads",
                            path=p)
            os.lseek(fd, st.st_size - max_bytes, os.SEEK_SET)
        data = trust.read_fd(fd, max_bytes)
        if len(data) > max_bytes:  # it grew while we read
            if tail:
                return data[-max_bytes:]
            raise error(f"{what} is larger than the {_size(max_bytes)} gpudoctor reads", path=p)
        return data
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror}", path=p) from None
    finally:
        os.close(fd)


def read_config(path, *, what: str = "ssh config", error=InputError) -> str | None:
    """A configuration file gpudoctor obeys (an ssh config: its ProxyCommand runs as root), or None when it is absent:
    opened once through the door, and as root refused unless root's by the one rule."""
    raw = read_bytes(path, what=what, max_bytes=MiB, error=error, obeyed=True, missing_ok=True)
    return None if raw is None else decode(raw, os.fspath(path), what=what, error=error)


def _it(why: str) -> str:
    """"is a FIFO, not a regular file" -> "it is a FIFO, not a regular file" (the door speaks of the part)."""
    return "it " + why if why.startswith("is ") else why


def decode(raw: bytes, path: str, *, what: str = "file", error=InputError) -> str:
    """UTF-8 text (a BOM is dropped); a bad byte is reported with its line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(f"{what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})", path=path,
                    line=line) from None
    return text[1:] if text.startswith("\ufeff") else text


def read_text(path, *, what: str = "file", max_bytes: int = DEFAULT_MAX_BYTES, error=InputError,
              obeyed: bool = False) -> str:
    return decode(read_bytes(path, what=what, max_bytes=max_bytes, error=error, obeyed=obeyed), os.fspath(path),
                  what=what, error=error)


def read_json(path, *, what: str = "file", max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = 64,
              error=InputError, obeyed: bool = False):
    """A JSON document: syntax errors with their line, nesting deeper than max_depth refused (no RecursionError)."""
    text = read_text(path, what=what, max_bytes=max_bytes, error=error, obeyed=obeyed)
    return parse_json(text, os.fspath(path), what=what, max_depth=max_depth, error=error)


def read_jsonl(path, *, what: str = "file", item: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
               objects: bool = True, error=InputError):
    """The non-blank lines of a JSONL file as (line number, value): each line parsed like parse_json (its line named in
    errors; `item` names one line in messages), and with `objects` each one a JSON object."""
    path = os.fspath(path)
    text = read_text(path, what=what, max_bytes=max_bytes, error=error)
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        value = parse_json(line, path, what=item or f"a line of the {what}", line=no, error=error)
        if objects and not isinstance(value, dict):
            raise error("each line must be a JSON object", path=path, line=no)
        out.append((no, value))
    return out


def parse_json(text: str, path: str, *, what: str = "file", max_depth: int = 64, line: int | None = None,
               error=InputError):
    """Parse one JSON value; `line` (for one line of a JSONL file) is the line named in errors."""
    import json

    deep = json_depth_exceeds(text, max_depth)
    if deep is not None:
        raise error(f"{what} nests deeper than {max_depth} levels", path=path,
                    line=line or text[:deep].count("\n") + 1)
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON: {exc.msg} (column {exc.colno})", path=path,
                    line=line or exc.lineno) from None
    except ValueError as exc:  # NaN/Infinity, which JSON does not have
        raise error(f"{what} is not valid JSON: {exc}", path=path, line=line) from None
    except RecursionError:
        raise error(f"{what} nests too deeply", path=path, line=line) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def json_depth_exceeds(text: str, max_depth: int) -> int | None:
    """The offset where brackets nest deeper than max_depth (strings skipped), or None. Linear, no recursion."""
    if text.count("[") + text.count("{") <= max_depth:
        return None
    depth, in_str, esc = 0, False, False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return i
        elif ch in "]}":
            depth -= 1
    return None


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


# --- values ------------------------------------------------------------------------------------------------------

def brief(value, limit: int = 80) -> str:
    """repr() of a value for a message, cut to about `limit` characters with a count of what was left out."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def number(value, what: str, *, lo: float | None = None, hi: float | None = None, integer: bool = False,
           lo_open: bool = False, path: str | None = None, line: int | None = None, error=InputError):
    """`value` if it is a finite number (an int when `integer`) within [lo, hi] (lo excluded with lo_open)."""
    def fmt(x) -> str:
        return str(int(x)) if float(x).is_integer() else f"{x:g}"

    kind = "an integer" if integer else "a number"
    rng = ""
    if lo is not None:
        rng += f" > {fmt(lo)}" if lo_open else f" >= {fmt(lo)}"
    if hi is not None:
        rng += (" and" if rng else "") + f" <= {fmt(hi)}"
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if ok and not integer:
        ok = math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        raise error(f"{what} must be {kind}{rng}, got {brief(value)}", path=path, line=line)
    return value


def http_url(url: str, what: str, *, error=InputError) -> str:
    """An http:// or https:// URL with a host (a server to talk to); anything else is refused."""
    from urllib.parse import urlsplit

    if not isinstance(url, str) or not url:
        raise error(f"{what} must be an http:// or https:// URL, got {brief(url)}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise error(f"{what} {brief(url)} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() or not c.isprintable()
                                                                           for c in url):
        raise error(f"{what} must be an http:// or https:// URL with a host, got {brief(url)}")
    del port
    return url


# --- paths -------------------------------------------------------------------------------------------------------

def output_file(path, what: str = "output file", *, error=InputError) -> str:
    """A file gpudoctor will write: checked before any work starts (its directory exists, it is not a directory)."""
    p = os.fspath(path)
    if p in ("", "-"):
        return p
    parent = os.path.dirname(os.path.abspath(p))
    if os.path.isdir(p):
        raise error(f"{what} is a directory", path=p)
    if not os.path.isdir(parent):
        raise error(f"cannot write {what}: its directory {parent} does not exist", path=p)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise error(f"cannot write {what}: its directory {parent} is not writable", path=p)
    if os.path.lexists(p) and not os.path.isfile(p):
        raise error(f"cannot write {what}: it exists and is not a regular file", path=p)
    from gpudoctor.files import safe  # a link on the way that another user controls: refused now, not after the work

    os.close(safe.open_dir(parent))
    return p


def output_dir(path, what: str = "output directory", *, error=InputError) -> str:
    """A directory gpudoctor will create or write into: refused when it exists as anything but a directory."""
    p = os.fspath(path)
    if not p:
        raise error(f"{what} must not be empty")
    if os.path.lexists(p) and not os.path.isdir(p):
        raise error(f"{what} exists and is not a directory", path=p)
    parent = os.path.dirname(os.path.abspath(p))
    probe = parent
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise error(f"cannot create {what}: {probe} is not a directory", path=p)
    from gpudoctor.files import safe  # ours, or refused before anything runs (#40): nothing is created here

    safe.check_out_dir(p)
    return p
