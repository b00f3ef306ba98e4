"""The Proxmox LXC config (/etc/pve/lxc/<vmid>.conf), parsed line by line so that it round-trips byte-for-byte.

The grammar follows pve-container's `parse_pct_config` (src/PVE/LXC/Config.pm), line by line:
blank lines are skipped; `[pve:pending]` starts the pending section and `[name]` a snapshot section (everything
after a header belongs to it: a line appended at end-of-file lands in the LAST section, not the live config);
`#...` is description; `lxc.key: v` / `lxc.key = v` are raw LXC keys; `key: value` is a Proxmox key; anything
else is a line Proxmox itself warns about and ignores ("unable to parse config"). We keep every line, its
number and its exact bytes (line ending included), and parse the values gpudoctor reasons about:
`lxc.cgroup2.devices.allow|deny` rules, `lxc.mount.entry`, `devN:` passthrough, `lock:`, `parent:`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpudoctor.errors import ConfigError

LIVE = ""  # the section name of the live config (before the first header)
PENDING = "pve:pending"

_RE_PENDING = re.compile(r"^\[pve:pending\]\s*$", re.I)
_RE_SNAPSHOT = re.compile(r"^\[([a-z][a-z0-9_\-]+)\]\s*$", re.I)
_RE_COMMENT = re.compile(r"^#(.*)$", re.S)
_RE_LXC = re.compile(r"^(lxc\.[a-z0-9_\-\.]+)(:|\s*=)\s*(.*?)\s*$", re.S)
_RE_DESCRIPTION = re.compile(r"^(description):\s*(.*\S)\s*$", re.S)
_RE_SNAPSTATE = re.compile(r"snapstate:\s*(prepare|delete)\s*$")
_RE_DELETE = re.compile(r"^delete:\s*(.*\S)\s*$", re.S)
_RE_KEY = re.compile(r"^([a-z][a-z_]*\d*):\s*(.+?)\s*$", re.S)
# A line that is exactly a device rule with no key: the hand fix `echo 'c 511:* rwm' >> 200.conf`.
_RE_BARE_RULE = re.compile(r"^\s*([abc])\s+(\d+|\*):(\d+|\*)\s+([rwm]+)\s*$")

ALLOW_KEY = "lxc.cgroup2.devices.allow"
DENY_KEY = "lxc.cgroup2.devices.deny"
V1_ALLOW_KEY = "lxc.cgroup.devices.allow"
V1_DENY_KEY = "lxc.cgroup.devices.deny"
MOUNT_KEY = "lxc.mount.entry"
# lxc.cgroup.* keys that configure LXC itself rather than a cgroup v1 controller (pve-container 722a077).
_CGROUP_CONFIG_KEYS = re.compile(r"^lxc\.cgroup\.(dir(\..*)?|relative)$")
_DEV_KEY = re.compile(r"^dev(\d+)$")
_MAX_DEVICES = 256


@dataclass(frozen=True)
class DeviceRule:
    """One device cgroup rule: `c 195:* rwm`. major/minor None mean `*`; type `a` alone means all devices."""

    type: str
    major: int | None = None
    minor: int | None = None
    access: str = "rwm"
    path: str | None = None  # `allow = /dev/x rw`: LXC stats the path at start and allows its major:minor

    @classmethod
    def parse(cls, value: str, allow_path: bool = False) -> "DeviceRule":
        """Parse `TYPE MAJOR:MINOR ACCESS` (kernel devices.txt grammar as LXC accepts it); ValueError says why.

        With allow_path, `/dev/x ACCESS` is accepted too (LXC's device_cgroup_rule_parse_devpath).
        """
        v = value.strip()
        if v == "a":
            return cls("a", None, None, "rwm")
        if allow_path and v.startswith("/"):
            parts = v.split()
            if len(parts) < 2 or not set(parts[1]) <= set("rwm"):
                raise ValueError(f"'{v}' is not PATH ACCESS (e.g. '/dev/nvidia-uvm rwm')")
            return cls("", None, None, parts[1], parts[0])
        m = re.fullmatch(r"([abc])\s+(\d+|\*):(\d+|\*)(?:\s+(\S+))?", v)
        if not m:
            raise ValueError(f"'{v}' is not TYPE MAJOR:MINOR ACCESS (e.g. 'c 195:* rwm')")
        access = m.group(4) or "rwm"
        if not set(access) <= set("rwm") or len(set(access)) != len(access):
            raise ValueError(f"access '{access}' is not a subset of rwm")
        num = lambda s: None if s == "*" else int(s)  # noqa: E731
        return cls(m.group(1), num(m.group(2)), num(m.group(3)), access)

    def matches(self, dtype: str, major: int, minor: int | None, path: str | None = None) -> bool:
        """Whether this rule is about that device (type, major, minor; minor None: a whole driver), not access."""
        if self.path is not None:
            return path is not None and self.path == path
        return ((self.type == "a" or self.type == dtype)
                and (self.major is None or self.major == major)
                and (self.minor is None or (minor is not None and self.minor == minor)))

    def grants(self, access: str) -> bool:
        return set(access) <= set(self.access)

    @property
    def is_global(self) -> bool:
        """`a` alone switches LXC's default (allow a: allow everything; deny a: allowlist mode)."""
        return self.type == "a" and self.major is None and self.minor is None and self.path is None

    def __str__(self) -> str:
        if self.path is not None:
            return f"{self.path} {self.access}"
        if self.is_global:
            return "a"
        star = lambda n: "*" if n is None else str(n)  # noqa: E731
        return f"{self.type} {star(self.major)}:{star(self.minor)} {self.access}"


@dataclass(frozen=True)
class MountEntry:
    """`lxc.mount.entry: SOURCE TARGET FSTYPE OPTIONS [DUMP PASS]` (fstab fields)."""

    source: str
    target: str
    fstype: str
    options: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: str) -> "MountEntry":
        f = value.split()
        if len(f) < 3:
            raise ValueError(f"'{value.strip()}' needs at least SOURCE TARGET FSTYPE [OPTIONS]")
        return cls(f[0], f[1], f[2], tuple(f[3].split(",")) if len(f) > 3 else ())

    @property
    def optional(self) -> bool:
        """`optional` makes LXC skip a missing source silently: the node just is not there."""
        return "optional" in self.options


@dataclass(frozen=True)
class Passthrough:
    """`devN: [path=]/dev/x[,gid=N][,uid=N][,mode=0NNN][,deny-write=1]` (pve-container >= 5.0.7, PVE 8.1)."""

    key: str
    path: str
    gid: int | None = None
    uid: int | None = None
    mode: str | None = None
    deny_write: bool = False

    @classmethod
    def parse(cls, key: str, value: str) -> "Passthrough":
        opts: dict[str, str] = {}
        for i, part in enumerate(value.split(",")):
            if "=" in part:
                k, v = part.split("=", 1)
            elif i == 0:
                k, v = "path", part
            else:
                raise ValueError(f"'{part}' is not KEY=VALUE")
            if k not in ("path", "gid", "uid", "mode", "deny-write"):
                raise ValueError(f"unknown option '{k}'")
            if k in opts:
                raise ValueError(f"option '{k}' given twice")
            opts[k] = v
        path = opts.get("path")
        if not path:
            raise ValueError("path has to be defined")
        if not path.startswith("/dev/") or re.search(r"/\.\.?(?:/|$)", path):
            raise ValueError(f"{path} is not a valid device path (must start with /dev/)")
        ids = {}
        for k in ("gid", "uid"):
            if k in opts:
                if not opts[k].isdigit():
                    raise ValueError(f"{k} '{opts[k]}' is not a non-negative integer")
                ids[k] = int(opts[k])
        mode = opts.get("mode")
        if mode is not None and not re.fullmatch(r"0[0-7]{3}", mode):
            raise ValueError(f"mode '{mode}' is not octal 0NNN")
        dw = opts.get("deny-write", "0").lower()
        if dw not in ("0", "1", "yes", "no", "on", "off", "true", "false"):
            raise ValueError(f"deny-write '{dw}' is not a boolean")
        return cls(key, path, ids.get("gid"), ids.get("uid"), mode, dw in ("1", "yes", "on", "true"))


@dataclass
class Line:
    """One physical line: its number (1-based), exact text (line ending included) and what it means."""

    no: int
    raw: str
    section: str = LIVE
    kind: str = "blank"  # blank | comment | header | key | lxc | invalid
    key: str | None = None
    value: str | None = None
    sep: str | None = None  # ":" or "=" for lxc keys, ":" for Proxmox keys
    rule: DeviceRule | None = None  # allow/deny lines (cgroup v2 and v1)
    mount: MountEntry | None = None
    device: Passthrough | None = None
    bare_rule: DeviceRule | None = None  # an invalid line that is exactly a device rule without its key
    error: str | None = None  # why the line (or its value) is unusable
    deprecated: str | None = None

    @property
    def text(self) -> str:
        """The line without its line ending."""
        return self.raw[:-len(self.eol)] if self.eol else self.raw

    @property
    def eol(self) -> str:
        return "\r\n" if self.raw.endswith("\r\n") else "\n" if self.raw.endswith("\n") else ""

    @property
    def is_allow(self) -> bool:
        return self.key in (ALLOW_KEY, V1_ALLOW_KEY) and self.rule is not None

    @property
    def is_deny(self) -> bool:
        return self.key in (DENY_KEY, V1_DENY_KEY) and self.rule is not None

    @property
    def cgroup_v1(self) -> bool:
        return bool(self.key and self.key.startswith("lxc.cgroup.") and not _CGROUP_CONFIG_KEYS.match(self.key))

    def where(self, path: str | None = None) -> str:
        return f"{path}:{self.no}" if path else f"line {self.no}"


@dataclass
class Config:
    """A parsed container config. `data` is byte-identical to what was parsed."""

    path: str
    lines: list[Line] = field(default_factory=list)

    # --- round trip -----------------------------------------------------------------------
    @property
    def text(self) -> str:
        return "".join(ln.raw for ln in self.lines)

    @property
    def data(self) -> bytes:
        return self.text.encode("utf-8", "surrogateescape")

    # --- sections -------------------------------------------------------------------------
    @property
    def sections(self) -> list[str]:
        """Section names in file order: "" (live) first, then pending/snapshots as they appear."""
        out = [LIVE]
        for ln in self.lines:
            if ln.kind == "header":
                out.append(ln.section)
        return out

    def section(self, name: str = LIVE) -> list[Line]:
        return [ln for ln in self.lines if ln.section == name and ln.kind != "header"]

    @property
    def live(self) -> list[Line]:
        return self.section(LIVE)

    @property
    def snapshots(self) -> list[str]:
        return [s for s in self.sections if s not in (LIVE, PENDING)]

    @property
    def first_header(self) -> Line | None:
        return next((ln for ln in self.lines if ln.kind == "header"), None)

    # --- values ---------------------------------------------------------------------------
    def get(self, key: str, section: str = LIVE) -> str | None:
        """The value of a Proxmox key in a section (the last one wins, as in parse_pct_config)."""
        val = None
        for ln in self.section(section):
            if ln.kind == "key" and ln.key == key:
                val = ln.value
        return val

    @property
    def lock(self) -> str | None:
        return self.get("lock")

    @property
    def parent(self) -> str | None:
        return self.get("parent")

    def rules(self, section: str = LIVE) -> list[Line]:
        """Allow and deny lines (cgroup v2 and deprecated v1) of a section, in file order."""
        return [ln for ln in self.section(section) if ln.is_allow or ln.is_deny]

    def mounts(self, section: str = LIVE) -> list[Line]:
        return [ln for ln in self.section(section) if ln.mount is not None]

    def passthrough(self, section: str = LIVE) -> list[Line]:
        return [ln for ln in self.section(section) if ln.device is not None]

    @property
    def invalid(self) -> list[Line]:
        """Every line Proxmox would warn about or LXC would reject, in any section."""
        return [ln for ln in self.lines if ln.error]

    @property
    def eol(self) -> str:
        """The file's line ending: CRLF when most lines use it."""
        crlf = sum(1 for ln in self.lines if ln.raw.endswith("\r\n"))
        return "\r\n" if crlf and crlf * 2 >= len(self.lines) else "\n"


def split_lines(text: str) -> list[str]:
    """Split on \\n only (as Perl's split /\\n/ does), keeping each line's ending; the last may have none."""
    out, start = [], 0
    while True:
        i = text.find("\n", start)
        if i < 0:
            if start < len(text):
                out.append(text[start:])
            return out
        out.append(text[start:i + 1])
        start = i + 1


def parse_line(no: int, raw: str, section: str) -> Line:
    """Classify one line of a section the way parse_pct_config does, and parse the values we use."""
    ln = Line(no, raw, section)
    body = raw[:-1] if raw.endswith("\n") else raw
    if not body.strip():
        return ln
    if _RE_PENDING.match(body):
        ln.kind, ln.section = "header", PENDING
        return ln
    m = _RE_SNAPSHOT.match(body)
    if m:
        ln.kind, ln.section = "header", m.group(1)
        return ln
    if _RE_COMMENT.match(body):
        ln.kind = "comment"
        return ln
    m = _RE_LXC.match(body)
    if m:
        ln.kind, ln.key, ln.sep, ln.value = "lxc", m.group(1), m.group(2).strip(), m.group(3)
        _parse_lxc_value(ln)
        return ln
    m = _RE_DESCRIPTION.match(body)
    if m:
        ln.kind, ln.key, ln.sep, ln.value = "key", "description", ":", m.group(2)
        return ln
    m = _RE_SNAPSTATE.search(body)
    if m:
        ln.kind, ln.key, ln.sep, ln.value = "key", "snapstate", ":", m.group(1)
        return ln
    m = _RE_DELETE.match(body)
    if m:
        ln.kind, ln.key, ln.sep, ln.value = "key", "delete", ":", m.group(1)
        if section != PENDING:
            ln.error = "property 'delete' is only allowed in [pve:pending]"
        return ln
    m = _RE_KEY.match(body)
    if m:
        ln.kind, ln.key, ln.sep, ln.value = "key", m.group(1), ":", m.group(2)
        dm = _DEV_KEY.match(ln.key)
        if dm:
            if int(dm.group(1)) >= _MAX_DEVICES:
                ln.error = f"{ln.key}: only dev0..dev{_MAX_DEVICES - 1} exist"
            else:
                try:
                    ln.device = Passthrough.parse(ln.key, ln.value)
                except ValueError as exc:
                    ln.error = f"{ln.key}: {exc}"
        return ln
    ln.kind = "invalid"
    bm = _RE_BARE_RULE.match(body)
    if bm:
        ln.bare_rule = DeviceRule.parse(" ".join(body.split()))
        ln.error = (f"'{body.strip()}' is a device rule without its key (Proxmox ignores it); "
                    f"meant: {ALLOW_KEY}: {ln.bare_rule}")
    else:
        ln.error = f"unable to parse config: {body.strip()[:120]}"
    return ln


def _parse_lxc_value(ln: Line) -> None:
    key, value = ln.key or "", ln.value or ""
    if key in (ALLOW_KEY, DENY_KEY, V1_ALLOW_KEY, V1_DENY_KEY):
        try:
            ln.rule = DeviceRule.parse(value, allow_path=key in (ALLOW_KEY, V1_ALLOW_KEY))
        except ValueError as exc:
            ln.error = f"{key}: {exc}"
    elif key == MOUNT_KEY:
        try:
            ln.mount = MountEntry.parse(value)
        except ValueError as exc:
            ln.error = f"{key}: {exc}"
    if ln.cgroup_v1:
        ln.deprecated = (f"{key} is a cgroup v1 key: pve-container warns 'deprecated, this will be a hard error' "
                         f"and a PVE 9 host (pure cgroup v2) ignores it; use lxc.cgroup2.{key[len('lxc.cgroup.'):]}")


def parse(data: bytes | str, path: str = "<config>") -> Config:
    """Parse a container config. Never fails on content: unusable lines are kept and carry `error`."""
    if isinstance(data, bytes):
        if b"\x00" in data:
            raise ConfigError("contains NUL bytes: not a text config file", path=path,
                              line=data[:data.index(b"\x00")].count(b"\n") + 1)
        text = data.decode("utf-8", "surrogateescape")
    else:
        text = data
    cfg = Config(path)
    section = LIVE
    for no, raw in enumerate(split_lines(text), 1):
        ln = parse_line(no, raw, section)
        if ln.kind == "header":
            section = ln.section
        cfg.lines.append(ln)
    return cfg


def read(path: str, data: bytes | None) -> Config:
    """Parse a config file's bytes; refuse what cannot be a container config (one line: PATH:LINE: why)."""
    if data is None:
        raise ConfigError("cannot read the file", path=path)
    if len(data) > 1 << 20:
        raise ConfigError(f"{len(data)} bytes: larger than pmxcfs allows for a file (1 MiB)", path=path)
    cfg = parse(data, path)
    if not any(ln.kind in ("key", "lxc") for ln in cfg.lines):
        first = next((ln for ln in cfg.lines if ln.kind == "invalid"), None)
        if first is not None:
            raise ConfigError(f"not a Proxmox container config: {first.error}", path=path, line=first.no)
        raise ConfigError("empty: no settings at all", path=path, line=1)
    return cfg
