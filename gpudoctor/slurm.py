"""Slurm mode of the gate: drain the node on failure, undrain only what gpudoctor drained.

Used as a prolog or HealthCheckProgram on the compute node. The drain reason is always prefixed "gpudoctor:";
on success the node is resumed only if its current reason starts with that prefix — a drain an admin (or another
tool) set is never undone, and never overwritten (mej/nhc#134 is the complaint this avoids).
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

PREFIX = "gpudoctor:"
MAX_REASON = 200


def node_name(env: dict | None = None) -> str:
    """$SLURMD_NODENAME when slurmd runs us, else the short host name (`hostname -s`)."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def make_reason(headline: str) -> str:
    text = " ".join(f"{PREFIX} {headline}".split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


@dataclass
class NodeInfo:
    state: str | None
    reason: str | None  # without the trailing "[user@time]"

    @property
    def drained(self) -> bool:
        return bool(self.state) and any(s in self.state.upper() for s in ("DRAIN", "DRNG"))

    @property
    def ours(self) -> bool:
        return bool(self.reason) and self.reason.startswith(PREFIX)


_REASON_TAIL = re.compile(r"\s*\[[^\]]*@[^\]]*\]\s*$")


def parse_show_node(text: str) -> NodeInfo:
    """State and Reason from `scontrol show node NAME` (Reason runs to the end of its line)."""
    state = reason = None
    for line in text.splitlines():
        m = re.search(r"(?:^|\s)State=(\S+)", line)
        if m and state is None:
            state = m.group(1)
        idx = line.find("Reason=")
        if idx >= 0 and (idx == 0 or line[idx - 1].isspace()):
            reason = _REASON_TAIL.sub("", line[idx + len("Reason="):]).strip() or None
            if reason == "(null)":
                reason = None
    return NodeInfo(state, reason)


@dataclass
class SlurmAction:
    action: str  # drained | resumed | kept | none | failed
    detail: str
    argv: list[str] | None = None

    def to_json(self) -> dict:
        return {"action": self.action, "detail": self.detail, "argv": self.argv}


def apply(result, host, *, node: str | None = None, timeout: float = 15.0) -> SlurmAction:
    """Drain or resume the node for a GateResult, through `host.run` (a LocalHost on the compute node)."""
    node = node or node_name()
    show = host.run(["scontrol", "show", "node", node], timeout=timeout)
    info = parse_show_node(show.stdout) if show.ok else NodeInfo(None, None)
    if result.passed:
        if info.drained and info.ours:
            argv = ["scontrol", "update", f"nodename={node}", "state=resume"]
            res = host.run(argv, timeout=timeout)
            if not res.ok:
                return SlurmAction("failed", f"could not resume {node}: {res.describe()}", argv)
            return SlurmAction("resumed", f"{node} resumed (gpudoctor had drained it: {info.reason})", argv)
        if info.drained:
            return SlurmAction("kept", f"{node} stays drained: its reason was not set by gpudoctor ({info.reason})")
        return SlurmAction("none", f"{node} is not drained")
    reason = make_reason(result.headline)
    if info.drained and not info.ours:
        return SlurmAction("kept", f"{node} is already drained by someone else ({info.reason}); reason left as is")
    if info.drained and info.reason == reason:
        return SlurmAction("kept", f"{node} already drained by gpudoctor for this reason")
    argv = ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]
    res = host.run(argv, timeout=timeout)
    if not res.ok:
        return SlurmAction("failed", f"could not drain {node}: {res.describe()}", argv)
    return SlurmAction("drained", f"{node} drained: {reason}", argv)
