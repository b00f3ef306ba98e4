"""Audit a container's GPU device boundary: pure, over a parsed config, the host's /proc/devices and (optionally)
the running config. Every finding says which line, which major, and what the host has now.

Device-rule semantics follow LXC's cgroup2 eBPF program (src/lxc/cgroups/cgroup2_devices.c): rules are checked in
order and the first rule that matches the device and the requested access decides; a rule identical to an earlier
one flips that one's allow/deny in place; `a` alone switches the default (Proxmox's common.conf starts with
`deny = a`: an allow-list). Proxmox emits devN: rules before the raw lxc.* lines (update_lxc_config), and LXC
ignores lxc.cgroup.* (v1) settings on a pure cgroup2 host ("Ignoring legacy cgroup limits"). On a hybrid or legacy
host (cgroup v1 controllers at /sys/fs/cgroup; the host's /proc/self/mountinfo tells) it is the other way round:
LXC ignores every lxc.cgroup2.* line, devN:'s generated rules included ("Ignoring cgroup2 limits on legacy cgroup
system"), and only lxc.cgroup.devices.* rules apply.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from gpudoctor.findings import Finding, Status
from gpudoctor.proxmox.config import (ALLOW_KEY, DENY_KEY, LIVE, PENDING, V1_ALLOW_KEY, V1_DENY_KEY, Config,
                                      DeviceRule, Line)
from gpudoctor.proxmox.devices import (NVIDIA_MAJOR, NodeKind, ProcDevices, classify_node, is_dynamic_major)

REMEDY_ID = "lxc.cgroup_allow"
OPEN_ACCESS = "rw"  # what open(O_RDWR) asks the device cgroup for
V1_LAYOUTS = ("hybrid", "legacy")  # cgroup layouts where LXC applies lxc.cgroup.* and ignores lxc.cgroup2.*


def cgroup_layout(mountinfo: str | None) -> tuple[str | None, str]:
    """The host's cgroup layout from its /proc/self/mountinfo: ('unified' | 'hybrid' | 'legacy' | None, evidence).

    unified: cgroup2 is mounted at /sys/fs/cgroup (PVE 7+ default); hybrid: v1 controllers below /sys/fs/cgroup and
    cgroup2 only at /sys/fs/cgroup/unified; legacy: v1 only. The last mount at a path is the one in use."""
    if not mountinfo:
        return None, "the host's mount table was not read"
    at: dict[str, str] = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 5 and r:
            at[f[4]] = r[0]
    if at.get("/sys/fs/cgroup") == "cgroup2":
        return "unified", "cgroup2 is mounted at /sys/fs/cgroup (pure cgroup v2)"
    v1 = sorted(p for p, fs in at.items() if fs == "cgroup" and p.startswith("/sys/fs/cgroup/"))
    if not v1:
        return None, "no cgroup mount at /sys/fs/cgroup"
    if at.get("/sys/fs/cgroup/unified") == "cgroup2":
        return "hybrid", (f"cgroup v1 controllers are mounted at {', '.join(v1[:3])}{', …' if len(v1) > 3 else ''} "
                          f"and cgroup2 only at /sys/fs/cgroup/unified (hybrid layout)")
    return "legacy", f"cgroup v1 controllers are mounted at {', '.join(v1[:3])}{', …' if len(v1) > 3 else ''} (legacy layout)"



@dataclass
class RuleRef:
    """A rule in evaluation order, and where it came from (for evidence)."""

    allow: bool
    rule: DeviceRule
    origin: str
    line: Line | None = None

    def describe(self) -> str:
        if self.line is not None:
            return f"line {self.line.no} `{self.line.text.strip()}`"
        return f"{self.origin} ({'allow' if self.allow else 'deny'} {self.rule})"


@dataclass
class Need:
    """A /dev/nvidia* node the container is given, and the lines that give it."""

    node: NodeKind
    via: list[Line] = field(default_factory=list)
    passthrough: Line | None = None

    @property
    def optional(self) -> bool:
        return any(ln.mount is not None and ln.mount.optional for ln in self.via)

    @property
    def guest_path(self) -> str:
        """Where the container sees the node (the subject its own probes use): the mount target, else the path."""
        for ln in self.via:
            if ln.mount is not None:
                return "/" + ln.mount.target.strip("/")
        return self.node.path


@dataclass
class Decision:
    allowed: bool
    by: RuleRef | None  # the deciding rule (None: the default)
    partial: list[RuleRef] = field(default_factory=list)  # rules for this device that lack the access asked


def _same(a: DeviceRule, b: DeviceRule) -> bool:
    return (a.type, a.major, a.minor, a.access, a.path) == (b.type, b.major, b.minor, b.access, b.path)


def decide(rules: list[RuleRef], node: NodeKind, major: int, access: str = OPEN_ACCESS) -> Decision:
    """LXC's decision for opening `node` (char major:minor) with `access`, given rules in order."""
    default_allow = False
    eff: list[RuleRef] = []
    for r in rules:
        if r.rule.is_global:
            default_allow = r.allow
            continue
        for i, e in enumerate(eff):
            if _same(e.rule, r.rule):
                eff[i] = RuleRef(r.allow, e.rule, r.origin, r.line)
                break
        else:
            eff.append(r)
    partial = []
    for e in eff:
        if not e.rule.matches("c", major, node.minor, node.path):
            continue
        if e.rule.grants(access):
            return Decision(e.allow, e, partial)
        if e.allow:
            partial.append(e)
    return Decision(default_allow, None, partial)


def needed_nodes(cfg: Config, section: str = LIVE) -> list[Need]:
    """The NVIDIA nodes a section hands the container: lxc.mount.entry sources and devN: paths."""
    needs: dict[str, Need] = {}
    for ln in cfg.section(section):
        path = ln.mount.source if ln.mount is not None else ln.device.path if ln.device is not None else None
        kind = classify_node(path) if path else None
        if kind is None:
            continue
        need = needs.setdefault(kind.path, Need(kind))
        need.via.append(ln)
        if ln.device is not None:
            need.passthrough = ln
    return list(needs.values())


def live_rules(cfg: Config, layout: str | None = None) -> list[RuleRef]:
    """The live section's device rules as LXC applies them: on a cgroup2 host the lxc.cgroup2 rules (devN: rules
    first, then raw lines in order); on a hybrid/legacy host only the lxc.cgroup.devices.* (v1) lines."""
    if layout in V1_LAYOUTS:
        return [RuleRef(ln.key == V1_ALLOW_KEY, ln.rule, f"line {ln.no}", ln) for ln in cfg.rules()
                if ln.key in (V1_ALLOW_KEY, V1_DENY_KEY) and not ln.error]
    out = []
    for ln in cfg.passthrough():
        dev = ln.device
        out.append(RuleRef(True, DeviceRule("", access="r" if dev.deny_write else "rw", path=dev.path),
                           f"line {ln.no} {ln.key}: {dev.path}", ln))
        if dev.deny_write:
            out.append(RuleRef(False, DeviceRule("", access="w", path=dev.path), f"line {ln.no} {ln.key}", ln))
    for ln in cfg.rules():
        if ln.key in (ALLOW_KEY, DENY_KEY) and not ln.error:
            out.append(RuleRef(ln.key == ALLOW_KEY, ln.rule, f"line {ln.no}", ln))
    return out


_RUN_RULE = re.compile(r"^\s*(lxc\.cgroup2\.devices\.(allow|deny))\s*=\s*(.*?)\s*$")
_RUN_RULE_V1 = re.compile(r"^\s*(lxc\.cgroup\.devices\.(allow|deny))\s*=\s*(.*?)\s*$")


def running_rules(text: str, layout: str | None = None) -> list[RuleRef]:
    """Device rules of a running config (/var/lib/lxc/<vmid>/config, `key = value`) that LXC applies on the
    host's layout: cgroup2 rules, or the v1 ones on a hybrid/legacy host."""
    out = []
    rx = _RUN_RULE_V1 if layout in V1_LAYOUTS else _RUN_RULE
    for no, line in enumerate(text.splitlines(), 1):
        m = rx.match(line)
        if not m:
            continue
        try:
            rule = DeviceRule.parse(m.group(3), allow_path=m.group(2) == "allow")
        except ValueError:
            continue
        out.append(RuleRef(m.group(2) == "allow", rule, f"running config line {no}"))
    return out


def allow_list_majors(cfg: Config, key: str = ALLOW_KEY) -> list[str]:
    """The majors the live section allows, in file order: '195, 509, 226, 234' (allow lines of `key` only)."""
    seen: list[str] = []
    for ln in cfg.rules():
        if ln.key != key or ln.error or ln.rule is None:
            continue
        r = ln.rule
        item = r.path if r.path else ("*" if r.major is None else str(r.major))
        if item not in seen:
            seen.append(item)
    return seen


def ct_label(vmid: int | None, name: str | None, path: str | None) -> str:
    if name:
        return name
    if vmid is not None:
        return f"ct{vmid}"
    return os.path.basename(path or "container")


def _load_hint(driver: str) -> str:
    """How the Proxmox host comes to register the driver a node needs."""
    how = {"nvidia-uvm": "load nvidia_uvm and create its nodes: `nvidia-modprobe -u -c 0`",
           "nvidia-caps": "the nvidia module registers nvidia-caps when it loads: `modprobe nvidia` "
                          "(`nvidia-modprobe -f /proc/driver/nvidia/capabilities/mig/config -f "
                          "/proc/driver/nvidia/capabilities/mig/monitor` creates the nodes)",
           "nvidia-nvswitch": "NVSwitch nodes come with the nvidia module on NVSwitch systems: `modprobe nvidia`"}
    return (how.get(driver) or f"load the NVIDIA driver that registers {driver}: `modprobe nvidia`") + \
        " on the Proxmox host, then re-run"


def restart_cmd(vmid: int | None) -> str:
    """How to restart the container: the exact command when its VMID is known, in words when it is not."""
    return f"pct reboot {vmid}" if vmid is not None else "`pct reboot` with the container's VMID"


def vmid_from_path(path: str | None) -> int | None:
    m = re.search(r"(?:^|/)(\d+)\.conf$", path or "")
    return int(m.group(1)) if m else None


def allow_line(cfg: Config, major: int, key: str = ALLOW_KEY) -> str:
    """The line to add, in the file's own style for allow lines (': ' unless it uses ' = ')."""
    seps = [ln.sep for ln in cfg.rules() if ln.key == key] or [ln.sep for ln in cfg.rules() if ln.is_allow]
    sep = " = " if seps and seps[-1] == "=" else ": "
    return f"{key}{sep}c {major}:* rwm"


@dataclass
class AuditInput:
    cfg: Config
    procdev: ProcDevices
    running: str | None = None  # /var/lib/lxc/<vmid>/config text, None when not read
    status: str | None = None  # "running" | "stopped" | None (unknown)
    vmid: int | None = None
    name: str | None = None
    host_nodes: dict | None = None  # path -> StatResult JSON on the Proxmox host, when gathered
    offline: dict | None = None  # {"config", "devices"} as given to `lxc audit/fix --config` (devices None: this
    #                              machine's /proc/devices, which need not be the Proxmox node's)
    layout: str | None = None  # the host's cgroup layout (cgroup_layout): None = unknown, read as cgroup v2
    layout_evidence: str = ""
    node: str | None = None  # the Proxmox node the facts were read on (facts["boundary"]["proxmox"])

    @property
    def v1(self) -> bool:
        """LXC on this host applies lxc.cgroup.* (v1) device rules and ignores lxc.cgroup2.*."""
        return self.layout in V1_LAYOUTS

    @property
    def label(self) -> str:
        return ct_label(self.vmid, self.name, self.cfg.path)

    @property
    def config_label(self) -> str:
        """"ct200's config" when the container is known by name or VMID; else the file's name ("h200.conf")."""
        if self.name or self.vmid is not None:
            return f"{self.label}'s config"
        return os.path.basename(self.cfg.path or "the container config")

    @property
    def devices_unsure(self) -> bool:
        """Offline without --devices: the majors come from this machine, which may not be the Proxmox node."""
        return self.offline is not None and not self.offline.get("devices")

    def fix_cmd(self, *extra: str) -> str:
        """The `gpudoctor lxc fix` command for this container: the audit's own files offline, else by VMID."""
        if self.offline is not None:
            dev = self.offline.get("devices") or "<a copy of the Proxmox node's /proc/devices>"
            target = f"--config {self.offline.get('config') or self.cfg.path} --devices {dev}"
        else:
            target = str(self.vmid) if self.vmid is not None else f"--config {self.cfg.path}"
        return " ".join(["gpudoctor lxc fix", target, *extra])

    @property
    def running_applies(self) -> bool:
        """The running config describes the container now only while it runs."""
        return self.running is not None and self.status != "stopped"


# --- boundary.lxc.cgroup_allow -----------------------------------------------------------------

def _other_places(inp: AuditInput, major: int, node: NodeKind) -> list[str]:
    """Lines that look like they were meant to allow this major but do not count: snapshot/pending, v1, keyless."""
    notes = []
    cfg = inp.cfg
    for ln in cfg.lines:
        r = ln.rule or ln.bare_rule
        if r is None or not r.matches("c", major, node.minor):
            continue
        if ln.section != LIVE and (ln.is_allow or ln.bare_rule):
            where = "[pve:pending]" if ln.section == PENDING else f"snapshot [{ln.section}]"
            notes.append(f"line {ln.no} `{ln.text.strip()}` sits in {where}, not in the live config: it does not "
                         f"apply (a line appended at the end of the file lands in the last section)")
        elif ln.section == LIVE and ln.bare_rule is not None:
            notes.append(f"line {ln.no} `{ln.text.strip()}` has no key: Proxmox ignores it")
        elif ln.section == LIVE and ln.cgroup_v1 and ln.is_allow and not inp.v1:
            notes.append(f"line {ln.no} allows it with the cgroup v1 key {ln.key}, which a cgroup v2 host ignores")
        elif ln.section == LIVE and ln.key == ALLOW_KEY and ln.is_allow and inp.v1:
            notes.append(f"line {ln.no} `{ln.text.strip()}` is a cgroup2 rule: LXC ignores it on this host's "
                         f"{inp.layout} cgroup layout")
    if inp.v1:
        for ln in cfg.passthrough():
            if ln.device is not None and ln.device.path == node.path:
                notes.append(f"line {ln.no} {ln.key}: Proxmox turns it into a lxc.cgroup2 rule, which LXC ignores on "
                             f"this host's {inp.layout} cgroup layout")
    return notes


def check_cgroup_allow(inp: AuditInput) -> list[Finding]:
    cfg, procdev, label = inp.cfg, inp.procdev, inp.label
    needs = needed_nodes(cfg)
    if not needs:
        return []
    rules = live_rules(cfg, inp.layout)
    run_rules = running_rules(inp.running, inp.layout) if inp.running_applies else None
    key = V1_ALLOW_KEY if inp.v1 else ALLOW_KEY
    have = ", ".join(allow_list_majors(cfg, key)) or "none"
    out = []
    for need in needs:
        node = need.node
        major = node.live_major(procdev)
        via = ", ".join(f"line {ln.no} {ln.key}" for ln in need.via)
        base = {"config": cfg.path, "driver": node.driver, "minor": node.minor, "vmid": inp.vmid, "via": via,
                "host_path": node.path, "layout": inp.layout}
        bad = Status.FAIL if node.critical else Status.WARN
        if major is None:
            out.append(Finding(
                "boundary.lxc.cgroup_allow", Status.UNKNOWN,
                f"{node.path}: {node.driver} is not in the host's /proc/devices, so its major is unknown",
                subject=need.guest_path,
                evidence=[f"host /proc/devices has no '{node.driver}' entry"
                          + ("" if procdev.text_ok else " (could not read /proc/devices)"),
                          f"{cfg.path}: {via} passes {node.path}"],
                hint=(("this machine's /proc/devices was read (no --devices): off the Proxmox node, pass a copy of "
                       "the node's /proc/devices with --devices" if inp.devices_unsure else
                       _load_hint(node.driver))
                      if procdev.text_ok else "read the Proxmox host's /proc/devices"),
                data={**base, "critical": node.critical}, explained_by=_NO_DRIVER))
            continue
        base["major"] = major
        minor_s = "*" if node.minor is None else str(node.minor)
        if need.passthrough is not None and run_rules is None and not inp.v1:
            ln = need.passthrough
            out.append(Finding("boundary.lxc.cgroup_allow", Status.OK,
                               f"{node.path} is passed through by {ln.key}: Proxmox allows its live "
                               f"{major}:{minor_s} at every start", subject=need.guest_path,
                               evidence=[f"{cfg.path}:{ln.no}: {ln.text.strip()}"], data=base))
            continue
        live = decide(rules, node, major)
        if live.allowed:
            by = live.by.describe() if live.by else "the default rule (allow a)"
            if run_rules is not None and not decide(run_rules, node, major).allowed:
                out.append(Finding(
                    "boundary.lxc.cgroup_allow", bad,
                    f"{node.path}: the config allows major {major} but the running container does not "
                    f"(edited, not restarted)", subject=need.guest_path,
                    evidence=[f"{cfg.path}: {by} allows {major}:{minor_s}",
                              f"the running config has no rule allowing {major}:{minor_s} {OPEN_ACCESS}"],
                    hint=f"restart the container so LXC rebuilds its device cgroup: {restart_cmd(inp.vmid)} "
                         f"({inp.fix_cmd('--apply', '--reboot')} checks no GPU job runs first)",
                    data={**base, "restart_needed": True}))
                continue
            out.append(Finding("boundary.lxc.cgroup_allow", Status.OK,
                               f"{node.path} ({node.driver} {major}:{minor_s}) is allowed in {inp.config_label}",
                               subject=need.guest_path, evidence=[f"{cfg.path}: {by}"], data=base))
            continue
        fix = allow_line(cfg, major, key)
        owner = f"{label}'s allow-list" if (inp.name or inp.vmid is not None) else f"the allow-list of {inp.config_label}"
        evidence = [f"major {major} ({node.driver}) is not in {owner} (has {have})"]
        if inp.v1:
            evidence = [f"major {major} ({node.driver}) is not in {label}'s {key} list (has {have})",
                        f"the Proxmox host's {inp.layout} cgroup layout: {inp.layout_evidence}; LXC applies only "
                        f"lxc.cgroup.devices.* there and ignores every lxc.cgroup2.* line"]
        if live.by is not None:
            evidence = [f"{cfg.path}: {live.by.describe()} denies {major}:{minor_s} before any allow"]
        for p in live.partial:
            evidence.append(f"{cfg.path}: {p.describe()} grants only '{p.rule.access}'; open() needs '{OPEN_ACCESS}'")
        evidence.append(f"host /proc/devices: {major} {procdev.holder(major)}; {cfg.path}: {via} passes {node.path}")
        evidence += _other_places(inp, major, node)
        first = cfg.first_header
        where = f" (before line {first.no} `{first.text.strip()}`)" if first else ""
        if inp.v1:
            out.append(Finding(
                "boundary.lxc.cgroup_allow", bad,
                f"{node.path}: major {major} ({node.driver}) is not allowed by {inp.config_label} on this "
                f"{inp.layout} cgroup host (its lxc.cgroup2 rules are ignored there); opening it in the container "
                f"fails with EPERM", subject=need.guest_path, evidence=evidence,
                hint=(f"add `{fix}` to the live section of {cfg.path}{where} (the key LXC applies on a "
                      f"{inp.layout} host; keep the lxc.cgroup2 line for when it runs cgroup v2), then "
                      f"{restart_cmd(inp.vmid)}; or boot the host with the unified cgroup layout (the PVE 7+ default), "
                      f"where the lxc.cgroup2 rules and devN: apply"),
                remediable=live.by is None,
                data={**base, "fix_line": fix, "denied_by": live.by.origin if live.by else None}))
            continue
        out.append(Finding(
            "boundary.lxc.cgroup_allow", bad,
            f"{node.path}: major {major} ({node.driver}) is not allowed by {inp.config_label}; opening it in the "
            f"container fails with EPERM", subject=need.guest_path, evidence=evidence,
            hint=(f"add `{fix}` to the live section of {cfg.path}{where}, then {restart_cmd(inp.vmid)}; "
                  f"`{inp.fix_cmd('--apply')}` does this safely. Durable alternative: pass the node as `devN: {node.path}` (PVE >= 8.1): Proxmox then "
                  f"allows its live major at every start, so a driver update cannot break it again"),
            remediable=live.by is None,  # an explicit deny is not fixed by adding a line
            data={**base, "fix_line": fix, "denied_by": live.by.origin if live.by else None}))
    return out


# --- boundary.lxc.node_driver -------------------------------------------------------------------

NODE_DRIVER = "boundary.lxc.node_driver"
# What a node without the NVIDIA driver explains: the majors it cannot name, the nodes it has not made, and (checks/
# host.py) the guest's own "no driver": a container shares the node's kernel.
_NO_DRIVER = ("boundary.lxc.config", NODE_DRIVER)


def check_node_driver(inp: AuditInput) -> list[Finding]:
    """The Proxmox node has the NVIDIA driver loaded: its /proc/devices lists an NVIDIA char device. Without it the
    container's GPU nodes cannot work whatever its config says, and the majors its allow-list needs are unknown."""
    procdev = inp.procdev
    if not procdev.text_ok or inp.devices_unsure or not needed_nodes(inp.cfg):
        return []  # unreadable (boundary.lxc.config says so), or this machine's file, which need not be the node's
    devices = (inp.offline or {}).get("devices") or "/proc/devices"
    where = f"the Proxmox node {inp.node}" if inp.node and inp.offline is None else "the Proxmox node"
    if procdev.nvidia_loaded:
        have = ", ".join(f"{n} {m}" for m, names in sorted(procdev.char.items()) for n in names
                         if n in ("nvidia", "nvidiactl", "nvidia-frontend", "nvidia-uvm"))
        return [Finding(NODE_DRIVER, Status.OK, f"the NVIDIA driver is loaded on {where}",
                        evidence=[f"{devices}: {have or 'NVIDIA char devices'}"])]
    missing = []
    for need in needed_nodes(inp.cfg):
        st = (inp.host_nodes or {}).get(need.node.path)
        if st is not None and not st.get("exists", False) and st.get("error") in (None, "ENOENT"):
            missing.append(need.node.path)
    evidence = [f"{devices}: no NVIDIA character device (no nvidia, nvidia-uvm or nvidia-caps entry)"]
    if missing:
        evidence.append(f"host stat {', '.join(missing)} → ENOENT")
    return [Finding(
        NODE_DRIVER, Status.FAIL,
        f"the NVIDIA driver is not loaded on {where}: its /proc/devices has no NVIDIA device, so no GPU node can work "
        f"in {inp.label if inp.name or inp.vmid is not None else 'the container'}", evidence=evidence,
        hint=("load the driver on the Proxmox node (`modprobe nvidia nvidia_uvm`, then `nvidia-modprobe -u -c 0` "
              "for the /dev/nvidia-uvm* nodes; if modprobe fails, install the NVIDIA driver built for the running "
              "kernel, or boot the kernel it was built for), then re-run: the allow-list is judged against the "
              "majors the driver registers"),
        data={"devices": devices, "missing_nodes": missing})]


# --- boundary.lxc.stale_allow ------------------------------------------------------------------

def check_stale(inp: AuditInput) -> list[Finding]:
    """Allow rules for a dynamic major that no NVIDIA driver holds now: leftovers that may grant another device."""
    cfg, procdev, label = inp.cfg, inp.procdev, inp.label
    if not procdev.text_ok or not procdev.nvidia_loaded:
        return []  # no NVIDIA driver on the node: its majors are unknown, so no rule can be called stale
    current = {d: procdev.major(d) for d in ("nvidia-uvm", "nvidia-caps")}
    now = ", ".join(f"{d} is {m}" for d, m in current.items() if m is not None)
    out = []
    for ln in cfg.rules():
        r = ln.rule
        if ln.key != ALLOW_KEY or ln.error or r.path or r.major is None or r.type == "b":
            continue
        if procdev.is_nvidia(r.major) or not is_dynamic_major(r.major):
            continue
        holder = procdev.holder(r.major)
        if holder == "nothing":
            what = f"major {r.major} belongs to no device on the host now (a leftover: {now or 'nvidia majors moved'})"
        else:
            what = f"major {r.major} is now held by {holder}: this rule grants {label} that device"
        out.append(Finding(
            "boundary.lxc.stale_allow", Status.WARN,
            f"{cfg.path}:{ln.no} allows c {r.major}, which is no NVIDIA device's major any more", subject=f"c {r.major}",
            evidence=[f"{cfg.path}:{ln.no}: {ln.text.strip()}", what],
            hint="remove the line if nothing in the container needs it (dynamic majors move with driver updates; "
                 "devN: passthrough avoids hard-coded majors)",
            data={"config": cfg.path, "line": ln.no, "major": r.major, "holder": holder}))
    return out


# --- boundary.lxc.malformed --------------------------------------------------------------------

def check_malformed(inp: AuditInput) -> list[Finding]:
    cfg = inp.cfg
    out = []
    for ln in cfg.invalid:
        if ln.bare_rule is not None:
            status, remedy = Status.WARN, (REMEDY_ID if ln.section == LIVE else None)
            hint = ("a hand fix lost its key; remove the line and add the keyed rule "
                    "(gpudoctor lxc fix does both)" if ln.section == LIVE else
                    "remove the line by hand: gpudoctor never edits snapshot sections")
        elif ln.kind == "invalid" or ln.key == "delete":
            status, remedy, hint = Status.WARN, None, "Proxmox ignores this line with a warning; fix or remove it"
        else:  # a known key with a value LXC or Proxmox rejects at start
            status, remedy = (Status.FAIL if ln.section == LIVE else Status.WARN), None
            hint = "the container will not start with this value; correct it"
        where = "" if ln.section == LIVE else f" (in [{ln.section}])"
        out.append(Finding("boundary.lxc.malformed", status, f"{cfg.path}:{ln.no}: {ln.error}{where}",
                           subject=f"{cfg.path}:{ln.no}", evidence=[f"{cfg.path}:{ln.no}: {ln.text!r}"],
                           hint=hint, remediable=remedy is not None,
                           data={"config": cfg.path, "line": ln.no, "section": ln.section,
                                 "bare_rule": str(ln.bare_rule) if ln.bare_rule else None}))
    return out


# --- boundary.lxc.misplaced --------------------------------------------------------------------

def check_misplaced(inp: AuditInput) -> list[Finding]:
    """GPU lines that sit only in a snapshot or pending section, where they do not apply."""
    cfg, procdev = inp.cfg, inp.procdev
    live_text = {ln.text.strip() for ln in cfg.live}
    live_majors = {ln.rule.major for ln in cfg.rules() if ln.key == ALLOW_KEY and ln.rule and not ln.error}
    gpu_majors = {m for m in procdev.char if procdev.is_nvidia(m)} | {NVIDIA_MAJOR}
    rules, denied = live_rules(cfg), {}
    for need in needed_nodes(cfg):
        m = need.node.live_major(procdev)
        if m is not None and need.passthrough is None:
            dec = decide(rules, need.node, m)
            if not dec.allowed and dec.by is None:  # missing, not explicitly denied: the remedy would add it
                denied.setdefault(m, []).append(need.guest_path)
    out = []
    for section in cfg.sections[1:]:
        lines = []
        for ln in cfg.section(section):
            r = ln.rule if ln.is_allow else ln.bare_rule
            gpu = (r is not None and r.major in gpu_majors and r.major not in live_majors) or (
                (ln.mount is not None and classify_node(ln.mount.source)) or
                (ln.device is not None and classify_node(ln.device.path)))
            if gpu and ln.text.strip() not in live_text:
                lines.append(ln)
        if not lines:
            continue
        # Allow rules stranded here for majors the live section lacks: adding them to the live section (the
        # lxc.cgroup_allow remedy) clears this finding too, so it is context of those nodes' allow-list findings.
        strays = [(ln.rule if ln.is_allow else ln.bare_rule) for ln in lines]
        fixable = all(r is not None and r.major in denied for r in strays)
        explained = tuple(f"boundary.lxc.cgroup_allow@{p}" for r in strays if fixable for p in denied[r.major])
        last = cfg.lines[-1].no if cfg.lines else 0
        name = "[pve:pending]" if section == PENDING else f"snapshot [{section}]"
        ev = [f"{cfg.path}:{ln.no} in {name}: {ln.text.strip()}" for ln in lines]
        if any(ln.no >= last - 1 for ln in lines):
            ev.append("it is at the end of the file: a line appended with `>>` lands in the last section, "
                      "not in the live config")
        out.append(Finding("boundary.lxc.misplaced", Status.WARN,
                           f"{len(lines)} GPU line(s) sit only in {name}, where they do not apply to the container",
                           subject=section, evidence=ev,
                           hint="live settings go before the first [section] header; gpudoctor lxc fix inserts "
                                "missing allow rules there and never edits snapshot sections",
                           remediable=fixable, explained_by=explained or None,
                           data={"config": cfg.path, "section": section, "lines": [ln.no for ln in lines]}))
    return out


# --- boundary.lxc.cgroup_v1, boundary.lxc.lock -------------------------------------------------

def check_cgroup_v1(inp: AuditInput) -> list[Finding]:
    cfg = inp.cfg
    if inp.v1:  # on a hybrid/legacy host the v1 keys are the ones LXC applies: nothing to rename yet
        return []
    return [Finding("boundary.lxc.cgroup_v1", Status.WARN, f"{cfg.path}:{ln.no}: {ln.key} is a cgroup v1 key",
                    subject=f"{cfg.path}:{ln.no}", evidence=[f"{cfg.path}:{ln.no}: {ln.text.strip()}", ln.deprecated],
                    hint=f"rename it to lxc.cgroup2.{ln.key[len('lxc.cgroup.'):]}; PVE 9 hosts run cgroup v2 only",
                    data={"config": cfg.path, "line": ln.no, "key": ln.key})
            for ln in cfg.live if ln.deprecated]


def check_lock(inp: AuditInput) -> list[Finding]:
    cfg = inp.cfg
    lock = cfg.lock
    if lock is None:
        return []
    ln = next(ln for ln in reversed(cfg.live) if ln.key == "lock")
    return [Finding("boundary.lxc.lock", Status.WARN,
                    f"{inp.label} is locked ({lock}): an operation is running or was interrupted",
                    subject=inp.label, evidence=[f"{cfg.path}:{ln.no}: {ln.text.strip()}"],
                    hint=f"wait for the {lock} to finish; if it was interrupted, "
                         + (f"`pct unlock {inp.vmid}`. " if inp.vmid is not None else "`pct unlock` with its VMID. ")
                         + "gpudoctor will not edit a locked config",
                    data={"config": cfg.path, "lock": lock})]


# --- boundary.lxc.restart_pending --------------------------------------------------------------

def check_restart_pending(inp: AuditInput) -> list[Finding]:
    """The config's device rules and GPU mounts differ from what the running container started with."""
    if not inp.running_applies:
        return []
    cfg = inp.cfg
    run_lines = {" ".join(s.split()) for s in _running_values(inp.running)}
    missing = []
    for ln in cfg.live:
        if ln.error or ln.kind != "lxc":
            continue
        gpu_mount = ln.mount is not None and classify_node(ln.mount.source)
        if ln.key in (ALLOW_KEY, DENY_KEY, V1_ALLOW_KEY, V1_DENY_KEY) or gpu_mount:
            want = " ".join(f"{ln.key} = {ln.value}".split())
            if want not in run_lines:
                missing.append(ln)
    if not missing:
        return []
    return [Finding("boundary.lxc.restart_pending", Status.WARN,
                    f"{inp.config_label} was edited after the container started: {len(missing)} device line(s) not "
                    f"in force",
                    subject=inp.label,
                    evidence=[f"{cfg.path}:{ln.no}: {ln.text.strip()} — not in the running config" for ln in missing],
                    hint=f"{restart_cmd(inp.vmid)} applies them ({inp.fix_cmd('--apply', '--reboot')} reboots only "
                         f"when no GPU process runs)",
                    data={"config": cfg.path, "lines": [ln.no for ln in missing]})]


def _running_values(text: str | None) -> list[str]:
    out = []
    for line in (text or "").splitlines():
        m = re.match(r"^\s*(lxc\.[^\s=]+)\s*=\s*(.*?)\s*$", line)
        if m:
            out.append(f"{m.group(1)} = {m.group(2)}")
    return out


# --- boundary.lxc.mount_entry -----------------------------------------------------------------

def check_mount_sources(inp: AuditInput) -> list[Finding]:
    """A GPU node the config passes must exist on the host: `optional` mounts skip a missing one silently."""
    if not needed_nodes(inp.cfg):
        return _no_gpu_nodes(inp)
    if inp.host_nodes is None:
        return []
    out = []
    for need in needed_nodes(inp.cfg):
        st = inp.host_nodes.get(need.node.path)
        if st is None or st.get("exists", False) or st.get("error") not in (None, "ENOENT"):
            continue
        bad = Status.FAIL if need.node.critical else Status.WARN
        if need.passthrough is not None:
            effect = f"{need.passthrough.key}: a missing path makes the container fail to start"
        elif need.optional:
            effect = "the mount is `optional`: LXC skips it silently and the node is simply absent in the container"
        else:
            effect = "the bind mount fails and the container does not start"
        out.append(Finding("boundary.lxc.mount_entry", bad, f"{need.node.path} does not exist on the Proxmox host",
                           subject=need.guest_path,
                           evidence=[f"host stat {need.node.path} → ENOENT", effect],
                           hint=("create it on the host: nvidia-modprobe -u -c 0 (uvm nodes) or nvidia-smi (others); "
                                 "nvidia-persistenced at boot keeps them"),
                           data={"path": need.node.path}, explained_by=_NO_DRIVER))
    return out


def input_from_facts(b: dict) -> AuditInput:
    """An AuditInput from facts["boundary"] (gather/boundary.py). ConfigError when the config is unusable."""
    from gpudoctor.errors import ConfigError
    from gpudoctor.proxmox.config import parse as parse_config

    conf = b.get("config") or {}
    path = conf.get("path") or "<config>"
    if conf.get("text") is None:
        raise ConfigError(f"cannot read it on {b.get('proxmox') or 'the Proxmox host'} ({conf.get('error')})",
                          path=path)
    cfg = parse_config(conf["text"], path)
    pd = b.get("proc_devices") or {}
    run = b.get("running") or {}
    st = (b.get("status") or {}).get("status")
    cg = b.get("cgroup") or {}
    return AuditInput(cfg, ProcDevices.parse(pd.get("text")), running=run.get("text"), status=st,
                      vmid=b.get("vmid") if b.get("vmid") is not None else vmid_from_path(path),
                      name=b.get("name"), host_nodes=b.get("host_nodes"), offline=b.get("offline"),
                      layout=cg.get("layout"), layout_evidence=cg.get("evidence") or "", node=b.get("proxmox"))


def _no_gpu_nodes(inp: AuditInput) -> list[Finding]:
    cfg, label = inp.cfg, inp.label
    return [Finding("boundary.lxc.mount_entry", Status.WARN,
                    f"{inp.config_label} passes no /dev/nvidia* node to the container", subject=None,
                    evidence=[f"{cfg.path}: no lxc.mount.entry or devN: names /dev/nvidia* in the live section"],
                    hint="pass the nodes with devN: entries (dev0: /dev/nvidia0, dev1: /dev/nvidiactl, "
                         "dev2: /dev/nvidia-uvm, dev3: /dev/nvidia-uvm-tools) or bind mounts plus allow rules",
                    data={"config": cfg.path})]
