"""The inventory: which hosts gpudoctor looks after, how to reach them, what they should have.

    load_inventory(path=None) -> Inventory      path None: $GPUDOCTOR_INVENTORY, ./inventory.yaml,
                                                 ~/.config/gpudoctor/inventory.yaml (first that exists)
    Inventory.host(name) -> HostEntry            Inventory.select("ct*" | "@group" | name) -> [HostEntry]

Every mistake is reported as `inventory.yaml:LINE: what is wrong` (InventoryError, exit 3): the loader walks
YAML nodes, so each message carries the line of the offending key or value. Nothing here connects anywhere.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.errors import ConfigError, InventoryError
from gpudoctor.inventory_policy import parse_recovery_policy

ENV_VAR = "GPUDOCTOR_INVENTORY"
HOST_KEY_POLICIES = ("strict", "accept-new")
RESERVED_NAMES = ("local", "localhost")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
HOSTNAME_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?")
USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}\$?")
PATTERN_RE = re.compile(r"!?[A-Za-z0-9_.*?\[\]-]+")

# Keys that describe how to reach a machine; `defaults:` may set any of them.
SSH_KEYS = ("port", "user", "identity_file", "known_hosts", "host_key_policy", "python", "connect_timeout",
            "ssh_config")
HOST_KEYS = ("address", *SSH_KEYS, "lxc", "expect", "groups", "description", "serving")
SERVING_APIS = ("completions", "chat", "native")  # gpudoctor.bench.client.openai.APIS
PROXMOX_KEYS = ("address", *SSH_KEYS, "config_dir", "pct", "description")
TOP_KEYS = ("version", "example", "defaults", "hosts", "proxmox", "profiles", "policy")
POLICY_KEYS = ("auto_apply", "never_apply", "budgets", "checks", "recovery", "verify")


def default_locations() -> list[Path]:
    """Where load_inventory() looks when no path is given (after $GPUDOCTOR_INVENTORY)."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return [Path("inventory.yaml"), Path(xdg) / "gpudoctor" / "inventory.yaml"]


# --- the validated model ------------------------------------------------------------------------------

@dataclass(frozen=True)
class SSHSettings:
    """How to reach one machine. address "local" means this machine (no SSH)."""

    address: str
    port: int | None = None
    user: str | None = None
    identity_files: tuple[str, ...] = ()
    known_hosts: str | None = None
    host_key_policy: str = "strict"
    python: tuple[str, ...] = ()  # () = the backend's default (python3 over SSH, this interpreter locally)
    connect_timeout: float = 10.0
    ssh_config: str | None = None

    @property
    def is_local(self) -> bool:
        return self.address == "local"


@dataclass(frozen=True)
class ProxmoxEntry:
    """A Proxmox VE node that hosts LXC containers; gpudoctor reads (and with --apply edits) their configs."""

    name: str
    ssh: SSHSettings
    config_dir: str = "/etc/pve/lxc"
    pct: tuple[str, ...] = ("pct",)
    description: str = ""
    line: int = 0
    source: str = ""  # the inventory file, for messages
    lines: dict = field(default_factory=dict, compare=False, repr=False)

    def config_path(self, vmid: int) -> str:
        return f"{self.config_dir.rstrip('/')}/{int(vmid)}.conf"


@dataclass(frozen=True)
class LxcRef:
    """The container behind a host: its Proxmox node and (when known) its VMID; else found with `pct list`."""

    proxmox: ProxmoxEntry
    vmid: int | None = None


@dataclass(frozen=True)
class Expect:
    """What the host should have; checks compare against it."""

    gpus: int | None = None
    model_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class Serving:
    """The host's inference server: the active verification's serving smoke sends its requests there (reached from
    where gpudoctor runs)."""

    url: str  # http://127.0.0.1:30000
    model: str  # the served model name requests carry
    api: str = "completions"  # completions | chat | native (SGLang's /generate)
    user: str | None = None  # the user (name or uid) whose server may answer the smoke besides root and system units


@dataclass(frozen=True)
class HostEntry:
    name: str
    ssh: SSHSettings
    lxc: LxcRef | None = None
    expect: Expect = field(default_factory=Expect)
    groups: tuple[str, ...] = ()
    description: str = ""
    line: int = 0
    source: str = ""  # the inventory file, for messages
    lines: dict = field(default_factory=dict, compare=False, repr=False)  # key -> line, for later errors
    serving: Serving | None = None  # the serving endpoint and model (the verification's serving smoke)


@dataclass(frozen=True)
class Profile:
    """A gate profile: the check-id patterns (fnmatch; "!pattern" excludes) that must pass, or the mapping form's
    {require, ignore, fail_free, max_foreign_mib, free_port} (`spec`; gpudoctor.gate reads both)."""

    name: str
    patterns: tuple[str, ...]
    line: int = 0
    spec: tuple = ()  # the mapping form as (key, value) pairs; () for a list profile


@dataclass(frozen=True)
class Policy:
    """Remedy policy for the daemon and gate: what may be applied without a human, and how often."""

    auto_apply: tuple[str, ...] = ()  # remedy-id patterns the daemon may apply on its own
    never_apply: tuple[str, ...] = ()  # patterns that are never applied automatically (wins over auto_apply)
    budgets: dict = field(default_factory=dict)  # e.g. max_changes_per_hour: 3, max_reboots_per_day: 1
    checks: dict = field(default_factory=dict)  # check id -> {threshold: value}, e.g. pcie.mrrs: {expect: 512}
    recovery: dict = field(default_factory=dict)  # the recovery ladder's keys (gpudoctor.inventory_policy), validated
    verify: dict | None = None  # the active verification's section as plain values (gpudoctor.recovery.verify)
    verify_lines: dict = field(default_factory=dict)  # verify key -> its line in the file, for error messages

    def as_dict(self) -> dict:
        out = {"auto_apply": list(self.auto_apply), "never_apply": list(self.never_apply),
               "budgets": dict(self.budgets), "checks": {k: dict(v) for k, v in self.checks.items()}}
        if self.recovery:
            out["recovery"] = dict(self.recovery)
        if self.verify is not None:
            out["verify"] = self.verify
        return out


@dataclass
class Inventory:
    path: str
    hosts: dict[str, HostEntry] = field(default_factory=dict)
    proxmox: dict[str, ProxmoxEntry] = field(default_factory=dict)
    profiles: dict[str, Profile] = field(default_factory=dict)
    policy: Policy = field(default_factory=Policy)
    example: bool = False  # `example: true`: a sample (placeholder hosts), used only when named (find_inventory)

    def host(self, name: str) -> HostEntry:
        """The named host, or InventoryError listing the names that exist."""
        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(sorted(self.hosts)) or "none"
            raise InventoryError(f"no host named {name!r} (hosts: {known})", path=self.path) from None

    def proxmox_host(self, name: str) -> ProxmoxEntry:
        try:
            return self.proxmox[name]
        except KeyError:
            known = ", ".join(sorted(self.proxmox)) or "none"
            raise InventoryError(f"no proxmox host named {name!r} (proxmox: {known})", path=self.path) from None

    def profile(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.profiles)) or "none"
            raise InventoryError(f"no profile named {name!r} (profiles: {known})", path=self.path) from None

    def select(self, spec: str) -> list[HostEntry]:
        """Hosts by name, fnmatch pattern ("ct2*"), group ("@h200") or "all"; comma-separated lists combine."""
        import fnmatch

        out: dict[str, HostEntry] = {}
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            if part == "all":
                hit = list(self.hosts.values())
            elif part.startswith("@"):
                hit = [h for h in self.hosts.values() if part[1:] in h.groups]
                if not hit:
                    raise InventoryError(f"no host is in group {part[1:]!r}", path=self.path)
            elif any(c in part for c in "*?["):
                hit = [h for n, h in self.hosts.items() if fnmatch.fnmatchcase(n, part)]
                if not hit:
                    raise InventoryError(f"no host matches {part!r}", path=self.path)
            else:
                hit = [self.host(part)]
            for h in hit:
                out.setdefault(h.name, h)
        return list(out.values())

    def to_json(self) -> dict:
        def ssh(s: SSHSettings) -> dict:
            return {"address": s.address, "port": s.port, "user": s.user, "identity_files": list(s.identity_files),
                    "known_hosts": s.known_hosts, "host_key_policy": s.host_key_policy, "python": list(s.python),
                    "connect_timeout": s.connect_timeout}

        return {
            "path": self.path,
            "hosts": {n: {**ssh(h.ssh), "groups": list(h.groups), "description": h.description,
                          "lxc": None if h.lxc is None else {"proxmox": h.lxc.proxmox.name, "vmid": h.lxc.vmid},
                          "expect": {"gpus": h.expect.gpus, "model_paths": list(h.expect.model_paths)},
                          "serving": None if h.serving is None else {"url": h.serving.url, "model": h.serving.model,
                                                                     "api": h.serving.api, "user": h.serving.user}}
                      for n, h in self.hosts.items()},
            "proxmox": {n: {**ssh(p.ssh), "config_dir": p.config_dir, "pct": list(p.pct), "description": p.description}
                        for n, p in self.proxmox.items()},
            "profiles": {n: dict(p.spec) if p.spec else list(p.patterns) for n, p in self.profiles.items()},
            "policy": self.policy.as_dict(),
        }


# --- finding and loading -------------------------------------------------------------------------------

def find_inventory(path: str | os.PathLike | None = None) -> Path:
    """The inventory file to use: `path` (--inventory), else $GPUDOCTOR_INVENTORY, else the default locations."""
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise InventoryError("no such inventory file" if not p.exists() else "not a file", path=str(p))
        return p
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env)
        if not p.is_file():
            raise InventoryError(f"${ENV_VAR} names this file, which does not exist", path=env)
        return p
    samples = []
    for p in default_locations():
        if p.is_file():
            if not is_example(p):
                return p
            samples.append(p)
    looked = ", ".join(str(p) for p in default_locations())
    skipped = "".join(f"; {p} is an example inventory (example: true), used only when named: --inventory {p}"
                      for p in samples)
    raise InventoryError(f"no inventory found: pass --inventory FILE, set ${ENV_VAR}, or create one of: "
                         f"{looked}{skipped}")


def is_example(path: Path) -> bool:
    """The file says `example: true` at its top level: a sample (like the checkout's inventory.yaml), which the
    search passes over, so that running gpudoctor inside a checkout never picks up its placeholder hosts, profiles
    and policy silently."""
    from gpudoctor.files.inputs import read_text
    from gpudoctor.files.yamlload import MAX_BYTES

    try:
        text = read_text(path, what="inventory", max_bytes=MAX_BYTES, error=InventoryError)
    except InventoryError:
        return False  # unreadable: load_inventory reports it, at its path
    return re.search(r"(?m)^example:[ \t]*true[ \t]*(#.*)?$", text) is not None


def source_line(inv: Inventory) -> str:
    """What every command that read an inventory says about it: which file, and whether it is the example."""
    return f"inventory: {inv.path}" + (" (an example inventory: its hosts are placeholders)" if inv.example else "")


def load_inventory(path: str | os.PathLike | None = None) -> Inventory:
    """Read and validate an inventory file; every problem is an InventoryError naming file and line."""
    from gpudoctor.files.inputs import read_text
    from gpudoctor.files.yamlload import MAX_BYTES

    p = find_inventory(path)
    # root obeys only root's inventory (#40): opened once, judged on that fd, and that fd's bytes parsed (#47)
    text = read_text(p, what="inventory", max_bytes=MAX_BYTES, error=InventoryError, obeyed=True)
    return parse_inventory(text, str(p), base_dir=str(p.parent))


def parse_inventory(text: str, path: str = "inventory.yaml", base_dir: str = ".") -> Inventory:
    """Validate inventory text (path is used in messages; relative file paths resolve against base_dir)."""
    from gpudoctor.files.yamlload import compose

    return _Loader(path, base_dir).inventory(compose(text, path, error=InventoryError))


# --- the node walker ------------------------------------------------------------------------------------

_MISSING = object()


class _Loader:
    def __init__(self, path: str, base_dir: str):
        import yaml

        self.yaml = yaml
        self.path = path
        self.base_dir = base_dir

    # primitives
    def err(self, node, message: str) -> InventoryError:
        return InventoryError(message, path=self.path, line=node.start_mark.line + 1 if node is not None else None)

    def value(self, node):
        from gpudoctor.files.yamlload import scalar

        if not isinstance(node, self.yaml.ScalarNode):
            return _MISSING
        return scalar(node)

    def kind(self, node) -> str:
        if isinstance(node, self.yaml.MappingNode):
            return "a mapping"
        if isinstance(node, self.yaml.SequenceNode):
            return "a list"
        v = self.value(node)
        from gpudoctor.files.inputs import brief

        return "empty (null)" if v is None else f"{type(v).__name__} {brief(v)}"

    def mapping(self, node, what: str) -> dict[str, tuple]:
        """{key: (key_node, value_node)} with duplicate and non-string keys rejected."""
        if not isinstance(node, self.yaml.MappingNode):
            raise self.err(node, f"{what} must be a mapping, got {self.kind(node)}")
        out: dict[str, tuple] = {}
        for k, v in node.value:
            key = self.value(k)
            if not isinstance(key, str):
                raise self.err(k, f"{what}: keys must be names, got {self.kind(k)}")
            if key in out:
                first = out[key][0].start_mark.line + 1
                noun = {"hosts": "host name", "proxmox": "proxmox name", "profiles": "profile name"}.get(what, "key")
                raise self.err(k, f"duplicate {noun} {key!r} in {what} (first at line {first})")
            out[key] = (k, v)
        return out

    def check_keys(self, items: dict, allowed: tuple[str, ...], what: str) -> None:
        for key, (k, _v) in items.items():
            if key not in allowed:
                import difflib

                near = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else f" (allowed: {', '.join(allowed)})"
                raise self.err(k, f"unknown key {key!r} in {what}{hint}")

    def string(self, node, what: str, *, allow_empty: bool = False) -> str:
        v = self.value(node)
        if not isinstance(v, str) or (not v and not allow_empty):
            raise self.err(node, f"{what} must be a non-empty string, got {self.kind(node)}")
        if "\0" in v:
            raise self.err(node, f"{what} contains a NUL byte")
        return v

    def integer(self, node, what: str, lo: int, hi: int) -> int:
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.err(node, f"{what} must be an integer {lo}..{hi}, got {self.kind(node)}")
        if not lo <= v <= hi:
            want = f"{lo}" if lo == hi else f"an integer {lo}..{hi}"
            raise self.err(node, f"{what} must be {want}, got {v}")
        return v

    def number(self, node, what: str) -> float:
        v = self.value(node)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 3600:  # NaN and inf fail too
            raise self.err(node, f"{what} must be a positive number of seconds, got {self.kind(node)} (at most 3600)")
        return float(v)

    def strings(self, node, what: str, *, single_ok: bool = True) -> tuple[str, ...]:
        """A list of non-empty strings (or one string, when single_ok)."""
        if single_ok and isinstance(node, self.yaml.ScalarNode) and isinstance(self.value(node), str):
            return (self.string(node, what),)
        if not isinstance(node, self.yaml.SequenceNode):
            raise self.err(node, f"{what} must be a list of strings, got {self.kind(node)}")
        if not node.value:
            raise self.err(node, f"{what} must not be empty")
        return tuple(self.string(n, f"{what} item") for n in node.value)

    def local_path(self, node, what: str) -> str:
        p = os.path.expanduser(self.string(node, what))
        return p if os.path.isabs(p) else os.path.normpath(os.path.join(self.base_dir, p))

    def remote_path(self, node, what: str) -> str:
        p = self.string(node, what)
        if not p.startswith("/"):
            raise self.err(node, f"{what} must be an absolute path, got {p!r}")
        return p

    def name(self, node, what: str) -> str:
        v = self.value(node)
        if not isinstance(v, str) or not NAME_RE.fullmatch(v):
            shown = v if isinstance(v, str) else self.kind(node)
            raise self.err(node, f"{what} {shown!r} is not a valid name (letters, digits, '.', '_', '-'; "
                                 f"at most 63; starting with a letter or digit)")
        return v

    # sections
    def inventory(self, root) -> Inventory:
        if root is None:
            raise InventoryError("the inventory is empty; it needs at least a hosts: section", path=self.path, line=1)
        top = self.mapping(root, "the inventory")
        top = {k: v for k, v in top.items() if not k.startswith("x-")}  # x-*: free, e.g. to hold YAML anchors
        self.check_keys(top, TOP_KEYS, "the inventory")
        if "version" in top:
            self.integer(top["version"][1], "version", 1, 1)
        example = False
        if "example" in top:
            example = self.value(top["example"][1])
            if not isinstance(example, bool):
                raise self.err(top["example"][1], "example must be true or false")
        defaults = {}
        if "defaults" in top:
            d = self.mapping(top["defaults"][1], "defaults")
            self.check_keys(d, SSH_KEYS, "defaults")
            defaults = d
        inv = Inventory(self.path, example=example)
        if "proxmox" in top:
            for pname, (k, v) in self.mapping(top["proxmox"][1], "proxmox").items():
                self.name(k, "proxmox name")
                inv.proxmox[pname] = self.proxmox(pname, k, v, defaults)
        if "hosts" in top:
            for hname, (k, v) in self.mapping(top["hosts"][1], "hosts").items():
                self.name(k, "host name")
                if hname in RESERVED_NAMES:
                    raise self.err(k, f"host name {hname!r} is reserved for this machine (--host local)")
                inv.hosts[hname] = self.host(hname, k, v, defaults, inv.proxmox)
        if "profiles" in top:
            for pname, (k, v) in self.mapping(top["profiles"][1], "profiles").items():
                self.name(k, "profile name")
                inv.profiles[pname] = self.profile(pname, k, v)
        if "policy" in top:
            inv.policy = self.policy(top["policy"][1])
        if not inv.hosts and not inv.proxmox:
            node = top["hosts"][1] if "hosts" in top else root
            raise self.err(node, "the inventory names no hosts: add a hosts: section")
        return inv

    def ssh(self, items: dict, defaults: dict, what: str) -> tuple[SSHSettings, dict]:
        if "address" not in items:
            raise InventoryError(f"{what} has no address", path=self.path,
                                 line=min(k.start_mark.line for k, _ in items.values()) + 1 if items else None)
        merged = {**defaults, **items}  # the entry's own keys win
        lines = {key: v.start_mark.line + 1 for key, (_k, v) in merged.items()}
        an = merged["address"][1]
        address = self.string(an, f"{what}: address")
        if address != "local" and not _valid_address(address):
            raise self.err(an, f"{what}: address {address!r} is not a host name or IP address")
        kw: dict = {"address": address}
        for key, (_k, v) in merged.items():
            label = f"{what}: {key}"
            if key == "port":
                kw["port"] = self.integer(v, label, 1, 65535)
            elif key == "user":
                user = self.string(v, label)
                if not USER_RE.fullmatch(user):
                    raise self.err(v, f"{label} {user!r} is not a valid user name")
                kw["user"] = user
            elif key == "identity_file":
                items_ = v.value if isinstance(v, self.yaml.SequenceNode) else [v]
                if not items_:
                    raise self.err(v, f"{label} must not be empty")
                kw["identity_files"] = tuple(self.local_path(n, label) for n in items_)
            elif key == "known_hosts":
                kw["known_hosts"] = self.local_path(v, label)
            elif key == "ssh_config":  # "" reads no ssh config at all
                kw["ssh_config"] = "" if self.value(v) == "" else self.local_path(v, label)
            elif key == "host_key_policy":
                pol = self.value(v)
                if pol not in HOST_KEY_POLICIES:
                    raise self.err(v, f"{label} must be one of {', '.join(HOST_KEY_POLICIES)}, got {self.kind(v)} "
                                      f"(turning host-key checking off is not supported)")
                kw["host_key_policy"] = pol
            elif key == "python":
                kw["python"] = self.strings(v, label)
            elif key == "connect_timeout":
                kw["connect_timeout"] = self.number(v, label)
        return SSHSettings(**kw), lines

    def patterns(self, node, what: str) -> tuple[str, ...]:
        patterns = self.strings(node, what, single_ok=False)
        for n, pat in zip(node.value, patterns):
            if not PATTERN_RE.fullmatch(pat):
                raise self.err(n, f"{what}: {pat!r} is not a check id pattern (like 'devices.*' or '!bench.*')")
        return patterns

    def profile(self, name: str, knode, node) -> Profile:
        """A list of check-id patterns, or {require, ignore, fail_free, max_foreign_mib, free_port}: the gate's own
        rules judge the values (gpudoctor.gate.profile_from), the error at the line of the key."""
        line = knode.start_mark.line + 1
        if not isinstance(node, self.yaml.MappingNode):
            return Profile(name, self.patterns(node, f"profile {name}"), line)
        from gpudoctor.errors import ConfigError
        from gpudoctor.gate import PROFILE_KEYS, profile_from

        items = self.mapping(node, f"profile {name}")
        self.check_keys(items, PROFILE_KEYS, f"profile {name}")
        spec = {}
        for key, (kn, vn) in items.items():
            if key in ("require", "ignore"):
                spec[key] = list(self.patterns(vn, f"profile {name}: {key}"))
            else:
                spec[key] = self.value(vn)
                try:
                    profile_from(name, {key: spec[key]}, self.path)
                except ConfigError as exc:
                    raise self.err(vn, exc.message) from None
        pats = (*spec.get("require", ()), *(f"!{p}" for p in spec.get("ignore", ())))
        return Profile(name, tuple(pats), line, tuple(spec.items()))

    def proxmox(self, name: str, knode, node, defaults: dict) -> ProxmoxEntry:
        what = f"proxmox {name}"
        items = self.mapping(node, what)
        self.check_keys(items, PROXMOX_KEYS, what)
        ssh, lines = self.ssh(items, defaults, what)
        kw: dict = {}
        if "config_dir" in items:
            kw["config_dir"] = self.remote_path(items["config_dir"][1], f"{what}: config_dir")
        if "pct" in items:
            kw["pct"] = self.strings(items["pct"][1], f"{what}: pct")
        if "description" in items:
            kw["description"] = self.string(items["description"][1], f"{what}: description", allow_empty=True)
        return ProxmoxEntry(name, ssh, line=knode.start_mark.line + 1, source=self.path, lines=lines, **kw)

    def host(self, name: str, knode, node, defaults: dict, proxmox: dict) -> HostEntry:
        what = f"host {name}"
        items = self.mapping(node, what)
        self.check_keys(items, HOST_KEYS, what)
        ssh, lines = self.ssh(items, defaults, what)
        kw: dict = {}
        if "lxc" in items:
            kw["lxc"] = self.lxc(items["lxc"][1], what, proxmox)
        if "expect" in items:
            kw["expect"] = self.expect(items["expect"][1], what)
        if "groups" in items:
            gnode = items["groups"][1]
            kw["groups"] = tuple(self.name(n, f"{what}: group") for n in
                                 (gnode.value if isinstance(gnode, self.yaml.SequenceNode) else [gnode]))
        if "description" in items:
            kw["description"] = self.string(items["description"][1], f"{what}: description", allow_empty=True)
        if "serving" in items:
            kw["serving"] = self.serving(items["serving"][1], what)
        return HostEntry(name, ssh, line=knode.start_mark.line + 1, source=self.path, lines=lines, **kw)

    def serving(self, node, what: str) -> Serving:
        from gpudoctor.files.inputs import http_url

        items = self.mapping(node, f"{what}: serving")
        self.check_keys(items, ("url", "model", "api", "user"), f"{what}: serving")
        for key in ("url", "model"):
            if key not in items:
                raise self.err(node, f"{what}: serving needs {key}: (the server's URL and the served model's name, "
                                     "e.g. {url: http://127.0.0.1:30000, model: Qwen/Qwen3-8B})")
        unode = items["url"][1]
        url = http_url(self.string(unode, f"{what}: serving.url"), f"{what}: serving.url",
                       error=lambda message: self.err(unode, message))
        kw = {}
        if "api" in items:
            anode = items["api"][1]
            api = self.string(anode, f"{what}: serving.api")
            if api not in SERVING_APIS:
                raise self.err(anode, f"{what}: serving.api must be one of {', '.join(SERVING_APIS)}, got {api!r}")
            kw["api"] = api
        if "user" in items:  # a name or a uid: the listener's owner on the host (gpudoctor/recovery/listener.py)
            unode = items["user"][1]
            uid = self.value(unode)
            kw["user"] = (str(self.integer(unode, f"{what}: serving.user", 0, 2**32 - 2)) if isinstance(uid, int)
                          else self.string(unode, f"{what}: serving.user"))
        return Serving(url.rstrip("/"), self.string(items["model"][1], f"{what}: serving.model"), **kw)

    def lxc(self, node, what: str, proxmox: dict) -> LxcRef:
        items = self.mapping(node, f"{what}: lxc")
        self.check_keys(items, ("vmid", "proxmox"), f"{what}: lxc")
        if "proxmox" not in items:
            raise self.err(node, f"{what}: lxc needs proxmox: NAME (the Proxmox host that runs the container)")
        pnode = items["proxmox"][1]
        pname = self.string(pnode, f"{what}: lxc.proxmox")
        if pname not in proxmox:
            known = ", ".join(sorted(proxmox)) or "none: add a proxmox: section"
            raise self.err(pnode, f"{what}: lxc.proxmox names {pname!r}, which is not in proxmox: (known: {known})")
        vmid = None
        if "vmid" in items:
            vmid = self.integer(items["vmid"][1], f"{what}: lxc.vmid", 100, 999_999_999)
        return LxcRef(proxmox[pname], vmid)

    def expect(self, node, what: str) -> Expect:
        items = self.mapping(node, f"{what}: expect")
        self.check_keys(items, ("gpus", "model_path", "model_paths"), f"{what}: expect")
        gpus = None
        if "gpus" in items:
            gpus = self.integer(items["gpus"][1], f"{what}: expect.gpus", 0, 1024)
        if "model_path" in items and "model_paths" in items:
            raise self.err(items["model_paths"][0], f"{what}: use expect.model_path or expect.model_paths, not both")
        paths: tuple[str, ...] = ()
        if "model_path" in items:
            paths = (self.remote_path(items["model_path"][1], f"{what}: expect.model_path"),)
        if "model_paths" in items:
            n = items["model_paths"][1]
            nodes = n.value if isinstance(n, self.yaml.SequenceNode) else [n]
            if not nodes:
                raise self.err(n, f"{what}: expect.model_paths must not be empty")
            paths = tuple(self.remote_path(x, f"{what}: expect.model_paths item") for x in nodes)
        return Expect(gpus, paths)

    def policy(self, node) -> Policy:
        items = self.mapping(node, "policy")
        self.check_keys(items, POLICY_KEYS, "policy")
        kw: dict = {}
        for key in ("auto_apply", "never_apply"):
            if key in items:
                n = items[key][1]
                if isinstance(n, self.yaml.SequenceNode) and not n.value:
                    kw[key] = ()
                    continue
                pats = self.strings(n, f"policy.{key}", single_ok=False)
                for x, pat in zip(n.value, pats):
                    if not PATTERN_RE.fullmatch(pat) or pat.startswith("!"):
                        raise self.err(x, f"policy.{key}: {pat!r} is not a remedy id pattern (like 'lxc.*')")
                kw[key] = pats
        if "budgets" in items:
            budgets = {}
            for bname, (k, v) in self.mapping(items["budgets"][1], "policy.budgets").items():
                if not re.fullmatch(r"[a-z][a-z0-9_]*", bname):
                    raise self.err(k, f"policy.budgets: {bname!r} is not a budget name (snake_case)")
                val = self.value(v)
                if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 <= val < float("inf"):
                    raise self.err(v, f"policy.budgets.{bname} must be a number >= 0, got {self.kind(v)}")
                budgets[bname] = val
            kw["budgets"] = budgets
        if "checks" in items:
            checks = {}
            for cid, (k, v) in self.mapping(items["checks"][1], "policy.checks").items():
                if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", cid):
                    raise self.err(k, f"policy.checks: {cid!r} is not a check id (like 'fabric.pcie.mrrs')")
                settings = {}
                for sname, (sk, sv) in self.mapping(v, f"policy.checks.{cid}").items():
                    val = self.value(sv)
                    if val is _MISSING:
                        if isinstance(sv, self.yaml.SequenceNode):
                            val = [self.value(x) for x in sv.value]
                            if any(x is _MISSING or isinstance(x, (dict, list)) for x in val):
                                raise self.err(sv, f"policy.checks.{cid}.{sname}: a list of plain values only")
                        else:
                            raise self.err(sv, f"policy.checks.{cid}.{sname} must be a value or a list of values")
                    settings[sname] = val
                checks[cid] = settings
            kw["checks"] = checks
        if "recovery" in items:
            rec = {}
            for rname, (k, v) in self.mapping(items["recovery"][1], "policy.recovery").items():
                val = self.value(v)
                try:
                    parse_recovery_policy({rname: val})
                except ConfigError as exc:
                    raise self.err(v if exc.message.startswith(f"policy.recovery.{rname} ") else k, exc.message) from None
                rec[rname] = val
            kw["recovery"] = rec
        if "verify" in items:
            node = items["verify"][1]
            kw["verify"] = self.plain(node)
            if isinstance(node, self.yaml.MappingNode):
                kw["verify_lines"] = {k: kn.start_mark.line + 1
                                      for k, (kn, _) in self.mapping(node, "policy.verify").items()}
        return Policy(**kw)

    def plain(self, node):
        """A YAML node as plain values (mappings, lists, scalars), for a section another module validates."""
        if isinstance(node, self.yaml.MappingNode):
            return {k: self.plain(v) for k, (_, v) in self.mapping(node, "policy").items()}
        if isinstance(node, self.yaml.SequenceNode):
            return [self.plain(x) for x in node.value]
        return self.value(node)


def _valid_address(address: str) -> bool:
    """A DNS name, an IPv4/IPv6 address or an ~/.ssh/config alias — never anything a shell would read."""
    try:
        ipaddress.ip_address(address)
        return True
    except ValueError:
        return bool(HOSTNAME_RE.fullmatch(address))
