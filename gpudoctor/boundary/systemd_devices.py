"""systemd's device policy for a unit, as the kernel will enforce it: DevicePolicy= and DeviceAllow= (systemd.resource-
control(5)) resolved against the live /proc/devices and the nodes on disk, and the drop-in that fixes a gap.

DevicePolicy=auto (the default) restricts nothing until a DeviceAllow= appears, then acts like closed; closed adds the
standard pseudo devices (/dev/null, zero, full, random, urandom, tty, ptmx, pts); strict allows only what is listed.
A DeviceAllow= specifier is a /dev path (stat'ed when the unit starts, so it follows the node then), /dev/char/M:N
(literal numbers), or char-NAME / block-NAME: every /proc/devices group whose name matches the glob NAME, all minors,
resolved at start. systemd compiles the result into a cgroup2 device program (or v1 devices.allow): a node left out
opens with EPERM whatever its mode — cuInit 999 for nvidia-uvm, "Failed to initialize NVML" for 195. Pure.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

DROPIN_NAME = "50-gpudoctor-devices.conf"


@dataclass(frozen=True)
class Rule:
    spec: str  # as systemctl shows it
    access: str
    major: int | None  # None: every major of the group did not resolve (a char- glob naming nothing live)
    minor: int | None  # None: every minor
    why: str  # how it resolved


def parse_rule(value: str) -> tuple[str, str]:
    parts = value.split()
    return (parts[0], parts[1] if len(parts) > 1 else "rwm") if parts else ("", "")


def resolve(value: str, live: dict, nodes: dict) -> list[Rule]:
    """One DeviceAllow= value → the (major, minor) rules it becomes now. nodes: path → stat JSON."""
    spec, acc = parse_rule(value)
    if m := re.fullmatch(r"/dev/char/(\d+):(\d+)", spec):
        return [Rule(spec, acc, int(m.group(1)), int(m.group(2)), f"c {m.group(1)}:{m.group(2)}")]
    if spec.startswith("char-"):
        pat = spec[5:]
        hits = sorted({maj for name, maj in live.items() if fnmatch.fnmatchcase(name, pat)})
        if not hits:
            return [Rule(spec, acc, None, None, f"no /proc/devices group matches {pat!r}: allows nothing")]
        return [Rule(spec, acc, maj, None, f"c {maj}:* ({', '.join(n for n, v in live.items() if v == maj)})")
                for maj in hits]
    if spec.startswith("/dev/"):
        st = nodes.get(spec) or {}
        if st.get("kind") == "char":
            return [Rule(spec, acc, st["major"], st["minor"], f"c {st['major']}:{st['minor']} (the node now)")]
        return [Rule(spec, acc, None, None, f"{spec} is not a character node now" if st else f"{spec} not stat'ed")]
    return []


def allowed(policy: str, values: list[str], major: int, minor: int, live: dict, nodes: dict) -> tuple[bool, list[Rule]]:
    """Whether c major:minor opens read-write under this policy; the rules that say so (or every rule considered)."""
    policy = policy or "auto"
    if policy == "auto" and not values:
        return True, []
    rules = [r for v in values for r in resolve(v, live, nodes)]
    hit = [r for r in rules if r.major == major and r.minor in (None, minor) and "r" in r.access and "w" in r.access]
    return bool(hit), hit or rules


def restricted(show: dict) -> bool:
    return (show.get("DevicePolicy") or "auto") != "auto" or bool(show.get("DeviceAllow"))


def dropin_path(unit: str) -> str:
    return f"/etc/systemd/system/{unit}.d/{DROPIN_NAME}"


def dropin_text(unit: str, names: list[str]) -> str:
    """The drop-in that allows each /proc/devices group by name (it follows a new major at the next start)."""
    lines = [f"# Written by gpudoctor (fix --only systemd.device_allow): let {unit} open its NVIDIA device nodes.",
             "# By /proc/devices group name, so a driver reload that moves a major is still allowed at the next start.",
             "[Service]"]
    lines += [f"DeviceAllow=char-{n} rw" for n in names]
    return "\n".join(lines) + "\n"


def verify_problems(stderr: str, dropin: str) -> list[str]:
    """systemd-analyze verify's complaints about the drop-in (it warns, exit 0, about keys it ignores)."""
    return [ln.strip() for ln in (stderr or "").splitlines() if dropin in ln or DROPIN_NAME in ln]
