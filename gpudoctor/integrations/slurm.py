"""Slurm mode of the gate: drain the node on failure, resume only what gpudoctor drained — an admin's state is sacred.

Used as a Prolog or HealthCheckProgram on the compute node. gpudoctor changes a node only when it is in service
(IDLE, MIXED or ALLOCATED with no admin flag) or drained by gpudoctor itself (reason prefix "gpudoctor:") and still
in the state gpudoctor left it in. A node that is DOWN, FAIL, in MAINTENANCE (a flag, or an active MAINT reservation),
REBOOT_REQUESTED/REBOOT_ISSUED, powered down, in a state this module does not know, or drained by anyone else is left
exactly as it is — never drained over, never resumed (mej/nhc#134 is the class of bug this avoids). The gate's verdict
(its exit code) is the same either way. This module is the only place gpudoctor runs `scontrol`.

States are scontrol's words (`scontrol show node`: BASE+FLAG+FLAG, e.g. IDLE+COMPLETING+DRAIN,
DOWN+DRAIN+NOT_RESPONDING); sinfo's DRAINED/DRNG/DRAINING never appear there and are treated as unknown.

Every write is bracketed by reads (#42; NHC's #134 is the race): the node is read again right before the write
and the write is skipped when anything changed since the decision (an admin's drain set meanwhile wins), and read
right after it to verify. Two things the verification mends:
- Slurm 24.11 keeps a resumed node's Reason where no accounting storage is configured (its node_up hook, which
  clears the reason, is a no-op under accounting_storage/none; 22.05 cleared it there too), and scontrol has no
  way to clear a reason (an empty Reason= is ignored). A node gpudoctor resumed would stay IDLE with
  "gpudoctor: …", and a later drain by slurmctld itself (which keeps an existing reason) would look like
  gpudoctor's own and be resumed by the next passing check. So gpudoctor replaces its own kept reason by a
  past-tense note that is not a drain reason (RESUMED_NOTE), and never touches a reason that is not its own.
- An admin's drain that landed between the re-read and the resume is undone by the resume; where Slurm keeps
  reasons, the verification sees that reason on a node that is no longer drained and drains it again with the
  admin's words. Under Slurm 22.05 such a drain leaves no trace after the resume (the window is the few
  milliseconds between a read and a write).
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field

from gpudoctor.target import live_verdict

PREFIX = "gpudoctor:"
MAX_REASON = 200  # ours, for sinfo's columns; Slurm itself keeps 5000+ characters verbatim

IN_SERVICE = frozenset({"IDLE", "MIXED", "ALLOCATED"})  # base states of a node that runs (or may run) jobs
# flags that do not take a node out of service: a job ending, a ping late by a second after a resume, a
# reservation for users (a MAINT reservation adds MAINTENANCE), scheduler bookkeeping
HARMLESS = frozenset({"COMPLETING", "NOT_RESPONDING", "RESERVED", "PLANNED", "CLOUD", "DYNAMIC_NORM"})
# The Slurm releases whose drain and resume gpudoctor is written and tested against (the labs: Debian 12's 22.05,
# Debian 13's 24.11). Outside them a node is left as it is, and the one line says which version was read where.
KNOWN_SLURM = ((22, 5), (24, 11))


def node_name(env: dict | None = None) -> str:
    """$SLURMD_NODENAME when slurmd runs us, else the short host name (`hostname -s`)."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _short(text: str, limit: int = MAX_REASON) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def make_reason(headline: str) -> str:
    return _short(" ".join(f"{PREFIX} {headline}".split()))


@dataclass
class NodeInfo:
    state: str | None  # scontrol's State=, e.g. "IDLE+COMPLETING+DRAIN"
    reason: str | None  # without the trailing "[user@time]"
    maintenance: tuple[str, ...] = field(default_factory=tuple)  # active MAINT reservations that hold the node
    version: str | None = None  # the node's Version= (its slurmd's release), as scontrol showed it

    @property
    def base(self) -> str:
        return (self.state or "").upper().split("+")[0]

    @property
    def flags(self) -> frozenset[str]:
        return frozenset((self.state or "").upper().split("+")[1:])

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def ours(self) -> bool:
        return bool(self.reason) and self.reason.startswith(PREFIX)

    def foreign(self) -> str | None:
        """Why gpudoctor must leave the node alone (someone else's state), or None: in service, or drained by
        gpudoctor and still as gpudoctor left it."""
        if not self.state:
            return "its state could not be read"
        why = [] if self.base in IN_SERVICE else [self.base or self.state]
        why += sorted(self.flags - HARMLESS - {"DRAIN"})
        if self.maintenance:
            why.append(f"in maintenance reservation {', '.join(self.maintenance)}")
        if self.drained and not self.ours:
            why.append("drained by someone else")
        return ", ".join(why) or None

    def evidence(self) -> str:
        """State= and Reason= as scontrol showed them (a long reason shortened)."""
        return f"State={self.state}" + (f", Reason={_short(self.reason)}" if self.reason else "")


_REASON_TAIL = re.compile(r"\s*\[[^\]]*@[^\]]*\]\s*$")


def parse_show_node(text: str) -> NodeInfo:
    """State and Reason from `scontrol show node NAME` (Reason runs to the end of its line, any length)."""
    state = reason = version = None
    for line in text.splitlines():
        m = re.search(r"(?:^|\s)State=(\S+)", line)
        if m and state is None:
            state = m.group(1)
        free_text = line.lstrip().startswith(("Reason=", "Comment=", "Extra="))  # anyone's words: not the version
        if version is None and not free_text and (v := re.search(r"(?:^|\s)Version=(\S+)", line)):
            version = v.group(1)
        idx = line.find("Reason=")
        if reason is None and idx >= 0 and line[:idx].strip() == "":
            reason = _REASON_TAIL.sub("", line[idx + len("Reason="):]).strip() or None
            if reason == "(null)":
                reason = None
    return NodeInfo(state, reason, version=version)


def version_problem(version: str | None, node: str) -> str | None:
    """Why the node's Slurm is not one gpudoctor knows (KNOWN_SLURM), in one line with what was read where; None
    when it is one."""
    where = f"`scontrol show node {node}`"
    lo, hi = (f"{a}.{b:02d}" for a, b in KNOWN_SLURM)
    m = re.match(r"^(\d+)\.(\d+)(?:\.\S+)?$", version or "")
    if not m:
        said = f"Version={_short(version, 40)}" if version else "no Version="
        return (f"the Slurm version is unknown ({where} shows {said}); gpudoctor drains and resumes only on the "
                f"releases it knows ({lo} to {hi})")
    v = (int(m.group(1)), int(m.group(2)))
    if KNOWN_SLURM[0] <= v <= KNOWN_SLURM[1]:
        return None
    rel = "older" if v < KNOWN_SLURM[0] else "newer"
    return (f"Slurm {version} (Version= of {where}) is {rel} than the releases gpudoctor knows ({lo} to {hi}): how "
            "it keeps a drain and its reason across a resume is not guessed")


def parse_reservations(text: str) -> list[dict]:
    """`scontrol show reservation`: one dict per reservation (ReservationName, Flags, State, Nodes, …)."""
    out: list[dict] = []
    for line in text.splitlines():
        for key, val in re.findall(r"(?:^|\s)(\w+)=(\S*)", line):
            if key == "ReservationName":
                out.append({})
            if out:
                out[-1].setdefault(key, val)
    return out


@dataclass
class SlurmAction:
    action: str  # drained | resumed | kept | none | failed
    detail: str
    argv: list[str] | None = None

    def to_json(self) -> dict:
        return {"action": self.action, "detail": self.detail, "argv": self.argv}


def decide(info: NodeInfo, passed: bool, node: str, headline: str = "") -> SlurmAction:
    """What the gate does to the node (pure): the argv to run, or why nothing."""
    foreign = info.foreign()
    if foreign is not None:
        return SlurmAction("kept", f"{node} left as is: {foreign} ({info.evidence()}); gpudoctor changes only a "
                                   f"node in service or one it drained itself")
    if passed:
        if not info.drained:
            return SlurmAction("none", f"{node} is in service")
        if "NOT_RESPONDING" in info.flags:
            return SlurmAction("kept", f"{node} stays drained ({_short(info.reason)}): slurmctld does not hear from "
                                       f"it yet (NOT_RESPONDING); the next passing check resumes it")
        return SlurmAction("resumed", f"{node} resumed (gpudoctor had drained it: {_short(info.reason)})",
                           ["scontrol", "update", f"nodename={node}", "state=resume"])
    reason = make_reason(headline)
    if info.drained and info.reason == reason:
        return SlurmAction("kept", f"{node} already drained by gpudoctor for this reason")
    return SlurmAction("drained", f"{node} drained: {reason}",
                       ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"])


def read_node(host, node: str, *, timeout: float = 15.0) -> NodeInfo | str:
    """The node's state, reason and active maintenance reservations; a string saying what failed otherwise."""
    show = host.run(["scontrol", "show", "node", node], timeout=timeout)
    if not show.ok:
        return f"`scontrol show node {node}` failed: {show.describe()}"
    info = parse_show_node(show.stdout)
    resv = host.run(["scontrol", "show", "reservation"], timeout=timeout)
    if not resv.ok:
        return f"`scontrol show reservation` failed: {resv.describe()}"
    maint = []
    for r in parse_reservations(resv.stdout):
        if r.get("State") != "ACTIVE" or "MAINT" not in r.get("Flags", "").split(",") or not r.get("Nodes"):
            continue
        names = host.run(["scontrol", "show", "hostnames", r["Nodes"]], timeout=timeout)
        if not names.ok:
            return f"`scontrol show hostnames {r['Nodes']}` failed: {names.describe()}"
        if node in names.stdout.split():
            maint.append(r["ReservationName"])
    info.maintenance = tuple(maint)
    return info


RESUMED_NOTE = "resumed by gpudoctor"  # our past-tense note where Slurm kept our drain reason: not a drain reason


def read_show(host, node: str, *, timeout: float = 15.0) -> NodeInfo | str:
    """State and Reason only (`scontrol show node`): the re-read right before a write and the read right after."""
    show = host.run(["scontrol", "show", "node", node], timeout=timeout)
    if not show.ok:
        return f"`scontrol show node {node}` failed: {show.describe()}"
    return parse_show_node(show.stdout)


def dry(result, node: str | None = None, *, passed: bool | None = None) -> SlurmAction:
    """What `gate --slurm` would do to the node for a verdict on a replayed snapshot, which acts on no node (pure:
    not even scontrol's read runs). `passed`: whether the snapshot's own checks passed (default: the verdict's)."""
    node = node or node_name()
    if result.passed if passed is None else passed:
        return SlurmAction("dry", f"a replay changes no node: on a live check that passes, {node} would be resumed "
                                  f"if gpudoctor had drained it (once the recovery ladder says ready)")
    return SlurmAction("dry", f"a replay changes no node: would drain {node}: {make_reason(result.headline)}")


def apply(result, host, *, node: str | None = None, timeout: float = 15.0) -> SlurmAction:
    """Drain or resume the node for a GateResult, through `host.run` (a LocalHost on the compute node): read,
    decide, read again right before writing (skip if anything changed), write, read right after (verify). A verdict
    on a replayed snapshot is refused here, before scontrol runs (gpudoctor.target.live_verdict; `dry` says what
    would be done)."""
    live_verdict(result, "drain or resume a Slurm node", "gate --snapshot --slurm only says what it would do")
    node = node or node_name()
    info = read_node(host, node, timeout=timeout)
    if isinstance(info, str):
        return SlurmAction("failed", f"{node} left as is: its state could not be read ({info})")
    unknown = version_problem(info.version, node)
    if unknown:
        return SlurmAction("kept", f"{node} left as is: {unknown}")
    act = decide(info, result.passed, node, result.headline)
    if act.argv is None:
        return act
    again = read_show(host, node, timeout=timeout)
    if isinstance(again, str):
        return SlurmAction("failed", f"{node} left as is: its state could not be read again before the write "
                                     f"({again})")
    if (again.state, again.reason) != (info.state, info.reason):
        return SlurmAction("kept", f"{node} left as is: it changed while gpudoctor decided ({info.evidence()} → "
                                   f"{again.evidence()}); the next check decides again")
    res = host.run(act.argv, timeout=timeout)
    if not res.ok:
        verb = "resume" if act.action == "resumed" else "drain"
        return SlurmAction("failed", f"could not {verb} {node}: {res.describe()}", act.argv)
    after = read_show(host, node, timeout=timeout)
    if isinstance(after, str):
        return SlurmAction(act.action, f"{act.detail}; not verified: {after}", act.argv)
    if act.action == "resumed":
        return _verify_resume(host, node, info, after, act, timeout)
    if not (after.drained and after.reason == make_reason(result.headline)):
        return SlurmAction(act.action, f"{act.detail}; then found {after.evidence()}: left as is", act.argv)
    return act


def _verify_resume(host, node: str, before: NodeInfo, after: NodeInfo, act: SlurmAction,
                   timeout: float) -> SlurmAction:
    if after.drained:  # drained again right after our write: whoever did it, it stays
        return SlurmAction(act.action, f"{act.detail}; then drained again ({after.evidence()}): left as is",
                           act.argv)
    if not after.reason:
        return act
    if after.reason == before.reason:  # Slurm kept our own drain reason (24.11 without accounting storage)
        note = f"{RESUMED_NOTE} {_now()}: its checks passed (was: {_short(before.reason, 120)})"
        last = read_show(host, node, timeout=timeout)
        if isinstance(last, str) or last.drained or last.reason != before.reason:
            return SlurmAction(act.action, f"{act.detail}; Slurm kept the reason and the node changed before "
                                           f"gpudoctor could replace it: left as is", act.argv)
        res = host.run(["scontrol", "update", f"nodename={node}", f"reason={note}"], timeout=timeout)
        if not res.ok:
            return SlurmAction(act.action, f"{act.detail}; Slurm kept gpudoctor's reason and replacing it "
                                           f"failed: {res.describe()}", act.argv)
        return SlurmAction(act.action, f"{act.detail}; Slurm kept the drain reason: replaced by \"{note}\"",
                           act.argv)
    # someone else's reason on a node that is no longer drained: their drain landed between our re-read and our
    # resume, which undid it. Put it back in their words.
    argv = ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={after.reason}"]
    res = host.run(argv, timeout=timeout)
    if not res.ok:
        return SlurmAction("failed", f"{node}: a drain by someone else ({after.reason}) landed during gpudoctor's "
                                     f"resume and putting it back failed: {res.describe()}", argv)
    return SlurmAction("kept", f"{node} left drained: a drain by someone else ({_short(after.reason)}) landed "
                               f"during gpudoctor's resume, which undid it; drained again in its words", argv)


def _now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())


def show_job(host, job_id: str, *, timeout: float = 30.0):
    """`scontrol show job ID` (a CommandResult): how a job of `bench run --slurm` ended, while slurmctld still
    holds it (MinJobAge); parsed by gpudoctor.integrations.slurmjobs.ended."""
    return host.run(["scontrol", "show", "job", job_id], timeout=timeout)
