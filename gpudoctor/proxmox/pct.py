"""`pct` on a Proxmox host, through the Host seam: status, list, the GPU processes inside, a guarded reboot."""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpudoctor.host.base import CommandResult

PCT = ("pct",)  # the inventory's proxmox `pct:` may name another command, e.g. [sudo, pct] or a path


def status(host, vmid: int, timeout: float = 10.0, *, cmd: Sequence[str] = PCT) -> tuple[str | None, CommandResult]:
    """`pct status VMID` → ("running" | "stopped" | ..., result); None when it could not be told."""
    res = host.run([*cmd, "status", str(vmid)], timeout=timeout)
    m = re.search(r"^status:\s*(\S+)", res.stdout, re.M) if res.ok else None
    return (m.group(1) if m else None), res


@dataclass
class Guest:
    vmid: int
    status: str
    lock: str
    name: str


def parse_list(text: str) -> list[Guest]:
    """`pct list`: a header `VMID Status Lock Name`, then one row per container (Lock may be empty)."""
    out = []
    lines = text.splitlines()
    if not lines or not lines[0].split()[:1] == ["VMID"]:
        return out
    for line in lines[1:]:
        parts = line.split()
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        lock = parts[2] if len(parts) >= 4 else ""
        out.append(Guest(int(parts[0]), parts[1], lock, parts[-1]))
    return out


def find_vmid(host, name: str, timeout: float = 10.0, *, cmd: Sequence[str] = PCT) -> tuple[int | None, str]:
    """The VMID of the container named `name` (its hostname; the short name matches too) and the evidence."""
    res = host.run([*cmd, "list"], timeout=timeout)
    if not res.ok:
        return None, res.describe()
    guests = parse_list(res.stdout)
    shown = shlex.join(cmd)
    want = {name.lower(), name.split(".")[0].lower()}
    hits = [g for g in guests if g.name.lower() in want]
    if len(hits) == 1:
        return hits[0].vmid, f"$ {shown} list → {hits[0].vmid} {hits[0].status} {hits[0].name}"
    if not hits:
        names = ", ".join(f"{g.vmid} {g.name}" for g in guests) or "no containers"
        return None, f"$ {shown} list has no container named {name} ({names})"
    return None, f"$ {shown} list has {len(hits)} containers named {name}: " + ", ".join(str(g.vmid) for g in hits)


def compute_pids(host, vmid: int, timeout: float = 15.0, *,
                 cmd: Sequence[str] = PCT) -> tuple[list[str] | None, CommandResult]:
    """PIDs of GPU compute processes inside the container, asked inside it; None when that could not be told."""
    res = host.run([*cmd, "exec", str(vmid), "--", "nvidia-smi", "--query-compute-apps=pid",
                    "--format=csv,noheader"], timeout=timeout)
    if not res.ok:
        return None, res
    pids = [ln.strip() for ln in res.stdout.splitlines() if ln.strip()]
    if any(not p.isdigit() for p in pids):
        return None, res
    return pids, res


@dataclass
class RebootResult:
    done: bool
    message: str
    evidence: list[str] = field(default_factory=list)


def safe_reboot(host, vmid: int, *, wait_s: float = 120.0, timeout: float = 10.0, label: str | None = None,
                poll_s: float = 1.0, cmd: Sequence[str] = PCT) -> RebootResult:
    """`pct reboot VMID` only if it runs and no GPU compute process is inside; then wait (bounded) until it runs."""
    label = label or f"ct{vmid}"
    st, res = status(host, vmid, timeout, cmd=cmd)
    ev = [res.describe() + (f": status {st}" if st else "")]
    if st is None:
        return RebootResult(False, f"could not tell whether {label} runs: not rebooting (reboot pending: "
                                   f"pct reboot {vmid})", ev)
    if st != "running":
        return RebootResult(False, f"{label} is {st}: the change applies at its next start; nothing to reboot", ev)
    pids, res = compute_pids(host, vmid, timeout=max(timeout, 15.0), cmd=cmd)
    ev.append(res.describe())
    if pids is None:
        return RebootResult(False, f"unknown whether a GPU job runs in {label} ({res.describe()}): not rebooting "
                                   f"(reboot pending: pct reboot {vmid})", ev)
    if pids:
        return RebootResult(False, f"{len(pids)} GPU compute process(es) run in {label} (pid {', '.join(pids[:8])}): "
                                   f"not rebooting (reboot pending: pct reboot {vmid} once they finish)", ev)
    res = host.run([*cmd, "reboot", str(vmid)], timeout=max(wait_s, timeout))
    ev.append(res.describe())
    if not res.ok:
        return RebootResult(False, f"pct reboot {vmid} failed: {res.describe()}", ev)
    deadline = time.monotonic() + wait_s
    while True:
        st, res = status(host, vmid, timeout, cmd=cmd)
        if st == "running":
            ev.append(res.describe() + ": status running")
            return RebootResult(True, f"{label} rebooted and is running", ev)
        if time.monotonic() >= deadline:
            ev.append(res.describe() + (f": status {st}" if st else ""))
            return RebootResult(False, f"{label} was rebooted but is not running after {wait_s:g} s "
                                       f"(last status: {st or 'unknown'})", ev)
        time.sleep(poll_s)
