"""The remedy engine shared by every remedy: plan → show → apply (only when asked) → verify → roll back on failure.

A Remedy is a small class (see remedies/): `plan(facts, ctx)` is read-only and returns a Change, or None — with
`self.refusal` set when it will not act (ambiguous facts, a locked config, a read-only filesystem) and left None when
there is nothing to do. `apply(host, change)` is idempotent, `verify(host, change)` re-runs the check and returns a
Finding, `rollback(host, change)` undoes an applied change. The Engine plans every remedy, applies only with
apply=True, holds a per-host lock while it edits (LockHeld says who holds it), verifies each change and rolls it back
when verification fails, and appends one JSON line per outcome to the audit log. Dry run is the default.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import getpass
import json
import os
import re
import socket
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from gpudoctor.errors import GpudoctorError, HostUnreachable, LockHeld, RemedyError
from gpudoctor.findings import Finding, Status
from gpudoctor.log import get_logger

STATE_DIR = os.environ.get("GPUDOCTOR_STATE_DIR", "/var/lib/gpudoctor")
RISKS = ("low", "medium", "high")


def default_paths(state_dir: str | None = None) -> dict[str, str]:
    """Where the engine keeps its state on the machine gpudoctor runs on (backups live on the edited host)."""
    base = state_dir or os.environ.get("GPUDOCTOR_STATE_DIR") or STATE_DIR
    return {"state_dir": base, "audit_log": os.path.join(base, "audit.jsonl"),
            "lock_dir": os.path.join(base, "locks"), "backup_dir": os.path.join(base, "backups")}


@dataclass
class Change:
    """One planned change on one host: what, why, the diff, the commands, the risk, and whether it needs a reboot."""

    remedy: str
    host: str
    summary: str
    diff: str = ""
    commands: list[str] = field(default_factory=list)
    risk: str = "low"
    needs_reboot: bool = False
    fixes: list[str] = field(default_factory=list)  # keys of the findings it addresses
    data: dict = field(default_factory=dict)  # remedy-private, JSON-serialisable (paths, digests, before/after)

    def __post_init__(self) -> None:
        if self.risk not in RISKS:
            raise ValueError(f"risk must be one of {RISKS}, not {self.risk!r}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Change":
        return cls(**d)


@dataclass
class RemedyContext:
    """What remedies need beyond the facts: hosts by name, where backups go, and what the user allowed."""

    hosts: dict[str, Any] = field(default_factory=dict)  # name -> Host
    backup_dir: str = field(default_factory=lambda: default_paths()["backup_dir"])
    reboot: bool = False  # the user allows a reboot/restart (pct reboot) when the remedy deems it safe
    reboot_wait_s: float = 120.0
    timeout: float = 10.0
    options: dict = field(default_factory=dict)

    def host(self, name: str):
        try:
            return self.hosts[name]
        except KeyError:
            raise RemedyError(f"no connection to host {name!r} for this change") from None


class Remedy:
    """Base of every remedy. Subclasses set `id`, `fixes`, `summary` and implement plan/apply/verify/rollback."""

    id: str = ""
    fixes: tuple[str, ...] = ()  # finding ids (fnmatch patterns) this remedy addresses
    summary: str = ""

    def __init__(self) -> None:
        self.refusal: str | None = None

    def refuse(self, reason: str) -> None:
        """Record why plan() will not act, and return None for `return self.refuse(...)`."""
        self.refusal = reason
        return None

    def plan(self, facts: dict, ctx: RemedyContext) -> Change | None:
        raise NotImplementedError

    def apply(self, host, change: Change, ctx: RemedyContext) -> dict:
        """Make the change; return what was done (e.g. {"changed": True, "backup": PATH}). Idempotent."""
        raise NotImplementedError

    def verify(self, host, change: Change, ctx: RemedyContext) -> Finding:
        raise NotImplementedError

    def rollback(self, host, change: Change, ctx: RemedyContext, applied: dict) -> dict:
        raise NotImplementedError

    def reboot(self, host, change: Change, ctx: RemedyContext) -> "RebootOutcome":
        """Restart what must restart for the change to take effect; default: leave it to the user."""
        return RebootOutcome(False, f"{self.id} cannot restart anything itself; restart by hand")


@dataclass
class RebootOutcome:
    done: bool
    message: str
    data: dict = field(default_factory=dict)


@dataclass
class Refusal:
    remedy: str
    reason: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Plan:
    """Everything plan() produced: changes to make, remedies that refused (and why), remedies with nothing to do."""

    changes: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    nothing: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"changes": [c.to_json() for c in self.changes], "refusals": [r.to_json() for r in self.refusals],
                "nothing_to_do": list(self.nothing)}


@dataclass
class Outcome:
    """What happened to one change. result: applied | unchanged | failed | rolled_back | rollback_failed."""

    change: Change
    result: str
    detail: str = ""
    verify: Finding | None = None
    applied: dict = field(default_factory=dict)
    reboot: RebootOutcome | None = None

    @property
    def ok(self) -> bool:
        return self.result in ("applied", "unchanged")

    def to_json(self) -> dict:
        return {"change": self.change.to_json(), "result": self.result, "detail": self.detail,
                "verify": self.verify.to_json() if self.verify else None, "applied": self.applied,
                "reboot": asdict(self.reboot) if self.reboot else None}


# --- the per-host lock --------------------------------------------------------------------------

def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", name) or "_"


@contextmanager
def host_lock(lock_dir: str, host_name: str, purpose: str = "") -> Iterator[str]:
    """flock(LOCK_EX|LOCK_NB) on <lock_dir>/<host>.lock; LockHeld names the holder (pid, user, machine, since, what)."""
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    path = os.path.join(lock_dir, _safe_name(host_name) + ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            holder = _read_holder(fd)
            raise LockHeld(f"another gpudoctor run is changing {host_name}: {holder} (lock file {path})") from None
        info = {"pid": os.getpid(), "user": _user(), "machine": socket.gethostname(),
                "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "what": purpose or " ".join(["gpudoctor", *sys.argv[1:]])[:300]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        os.fsync(fd)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _read_holder(fd: int) -> str:
    try:
        raw = os.pread(fd, 4096, 0)
        d = json.loads(raw.decode() or "{}")
    except (OSError, ValueError):
        d = {}
    if not d:
        return "holder unknown (it is just starting)"
    return f"pid {d.get('pid')} of {d.get('user')} on {d.get('machine')} since {d.get('since')} ({d.get('what')})"


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return str(os.getuid())


# --- the audit log ------------------------------------------------------------------------------

class AuditLog:
    """Append-only JSONL: one record per outcome. Each record is one write(2) with O_APPEND under flock, then fsync,
    so concurrent writers never interleave and a crash never leaves half a line before the next record."""

    def __init__(self, path: str):
        self.path = path

    def append(self, record: dict) -> None:
        rec = {"when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"), **record}
        line = (json.dumps(rec, sort_keys=True, default=str) + "\n").encode()
        d = os.path.dirname(self.path)
        if d:
            os.makedirs(d, mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(fd).st_size
                if size:  # a writer killed mid-line: start ours on a fresh line
                    with open(self.path, "rb") as fh:
                        fh.seek(size - 1)
                        if fh.read(1) != b"\n":
                            line = b"\n" + line
                os.write(fd, line)
                os.fsync(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def records(self) -> list[dict]:
        out = []
        try:
            with open(self.path, "rb") as fh:
                for raw in fh:
                    try:
                        out.append(json.loads(raw))
                    except ValueError:
                        continue
        except FileNotFoundError:
            pass
        return out


# --- the engine ---------------------------------------------------------------------------------

class Engine:
    """Plans with every remedy; applies, verifies and rolls back only when asked."""

    def __init__(self, remedies: list[Remedy], ctx: RemedyContext, *, audit_log: AuditLog | None = None,
                 lock_dir: str | None = None):
        self.remedies = remedies
        self.ctx = ctx
        self.audit_log = audit_log
        self.lock_dir = lock_dir or default_paths()["lock_dir"]
        self.log = get_logger("gpudoctor.remedy")
        self._by_id = {r.id: r for r in remedies}

    def plan(self, facts: dict) -> Plan:
        """Read-only: ask every remedy for its change. A crashing plan() is a refusal, not a crash of the run."""
        out = Plan()
        for r in self.remedies:
            r.refusal = None
            try:
                change = r.plan(facts, self.ctx)
            except GpudoctorError as exc:
                out.refusals.append(Refusal(r.id, exc.one_line()))
                continue
            except Exception as exc:  # noqa: BLE001 - one broken remedy must not hide the others
                out.refusals.append(Refusal(r.id, f"plan failed: {type(exc).__name__}: {exc}"))
                continue
            if change is not None:
                out.changes.append(change)
                self.log.info("remedy.planned", remedy=r.id, host=change.host, summary=change.summary)
            elif r.refusal:
                out.refusals.append(Refusal(r.id, r.refusal))
                self.log.info("remedy.refused", remedy=r.id, reason=r.refusal)
            else:
                out.nothing.append(r.id)
        return out

    def apply(self, plan: Plan) -> list[Outcome]:
        """Apply each change under its host's lock, verify it, roll it back if verification fails, log it."""
        outcomes = []
        for change in plan.changes:
            outcomes.append(self._apply_one(change))
        return outcomes

    def _apply_one(self, change: Change) -> Outcome:
        remedy = self._by_id[change.remedy]
        try:
            host = self.ctx.host(change.host)
        except RemedyError as exc:
            return self._record(Outcome(change, "failed", exc.one_line()))
        with host_lock(self.lock_dir, change.host, f"gpudoctor {change.remedy}: {change.summary}"):
            try:
                applied = remedy.apply(host, change, self.ctx) or {}
            except Exception as exc:  # noqa: BLE001 - reported, logged, never half-silent
                detail = exc.one_line() if isinstance(exc, GpudoctorError) else f"{type(exc).__name__}: {exc}"
                return self._record(Outcome(change, "failed", detail))
            finding = self._verify(remedy, host, change)
            if finding is None:  # the host went away twice: a change that may well be in place is not undone blindly
                return self._record(Outcome(change, "failed", f"applied, but {change.host} could not be reached to "
                                            f"verify it; nothing was rolled back: run again to verify or finish it",
                                            None, applied))
            if finding.status in (Status.OK, Status.INFO):
                out = Outcome(change, "applied" if applied.get("changed", True) else "unchanged",
                              finding.summary, finding, applied)
                if self.ctx.reboot and change.needs_reboot:
                    try:
                        out.reboot = remedy.reboot(host, change, self.ctx)
                    except Exception as exc:  # noqa: BLE001
                        out.reboot = RebootOutcome(False, f"reboot failed: {type(exc).__name__}: {exc}")
                return self._record(out)
            try:
                undone = remedy.rollback(host, change, self.ctx, applied)
                return self._record(Outcome(change, "rolled_back",
                                            f"verification failed ({finding.summary}); rolled back", finding,
                                            {**applied, "rollback": undone}))
            except Exception as exc:  # noqa: BLE001
                detail = exc.one_line() if isinstance(exc, GpudoctorError) else f"{type(exc).__name__}: {exc}"
                return self._record(Outcome(change, "rollback_failed",
                                            f"verification failed ({finding.summary}) and the rollback failed: "
                                            f"{detail}", finding, applied))

    def _verify(self, remedy: Remedy, host, change: Change) -> Finding | None:
        """verify(), asked again once when the connection dropped (the Host reconnects); None if it drops again.
        A lost connection says nothing about the change, so it must not trigger a rollback by itself."""
        for attempt in (1, 2):
            try:
                return remedy.verify(host, change, self.ctx)
            except HostUnreachable as exc:
                self.log.warning("remedy.verify.unreachable", remedy=change.remedy, host=change.host,
                                 attempt=attempt, detail=exc.one_line())
            except Exception as exc:  # noqa: BLE001
                return Finding(f"{change.remedy}.verify", Status.UNKNOWN, f"verification crashed: {exc}")
        return None

    def _record(self, out: Outcome) -> Outcome:
        c = out.change
        event = {"applied": "remedy.applied", "unchanged": "remedy.unchanged"}.get(out.result, "remedy.failed")
        self.log.info(event, remedy=c.remedy, host=c.host, result=out.result, detail=out.detail)
        if self.audit_log is not None:
            self.audit_log.append({
                "host": c.host, "remedy": c.remedy, "summary": c.summary, "diff": c.diff, "commands": c.commands,
                "risk": c.risk, "result": out.result, "detail": out.detail,
                "verify": out.verify.status.value if out.verify else None,
                "backup": out.applied.get("backup"), "reboot": asdict(out.reboot) if out.reboot else None,
                "user": _user(), "pid": os.getpid(), "machine": socket.gethostname(),
            })
        return out

