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
from gpudoctor.host import ops as fs  # the mutation seam (tests/crash)
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
    """Base of every remedy. Subclasses set `id`, `summary` and implement plan/apply/verify/rollback."""

    id: str = ""
    summary: str = ""

    @property
    def fixes(self) -> tuple[str, ...]:
        """The check ids this remedy addresses: those whose registration names it (@check(remedy=ID)), the one
        declaration of the link."""
        from gpudoctor.checkreg import all_checks

        return tuple(c.id for c in all_checks() if c.remedy == self.id)

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
    fs.fs_makedirs(lock_dir, 0o700)
    path = os.path.join(lock_dir, _safe_name(host_name) + ".lock")
    fd = fs.fs_open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
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
        fs.fs_ftruncate(fd, 0, path)
        fs.fs_write(fd, (json.dumps(info) + "\n").encode(), path, offset=0)
        fs.fs_fsync(fd, path)
        try:
            yield path
        finally:
            fs.fs_ftruncate(fd, 0, path)
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
    """Append-only JSONL: a "started" record before each change is applied, then one per outcome. Each record is one
    write(2) with O_APPEND under flock, then fsync, so concurrent writers never interleave and a crash never leaves
    half a line before the next record; a "started" with no outcome after it is a run killed mid-apply."""

    def __init__(self, path: str):
        self.path = path

    def append(self, record: dict) -> None:
        rec = {"when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"), **record}
        line = (json.dumps(rec, sort_keys=True, default=str) + "\n").encode()
        d = os.path.dirname(self.path)
        if d:
            fs.fs_makedirs(d, 0o700)
        fd = fs.fs_open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(fd).st_size
                if size:  # a writer killed mid-line: start ours on a fresh line
                    with open(self.path, "rb") as fh:
                        fh.seek(size - 1)
                        if fh.read(1) != b"\n":
                            line = b"\n" + line
                fs.fs_write(fd, line, self.path)
                fs.fs_fsync(fd, self.path)
                if not size:  # a new log: its name must survive a crash too
                    fs.fs_fsync_dir(d)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def records(self, started: bool = False) -> list[dict]:
        """The outcome records (with started=True also the "started" ones, in order)."""
        out = []
        try:
            with open(self.path, "rb") as fh:
                for raw in fh:
                    try:
                        rec = json.loads(raw)
                    except ValueError:
                        continue
                    if started or rec.get("result") != "started":
                        out.append(rec)
        except FileNotFoundError:
            pass
        return out


# --- the engine ---------------------------------------------------------------------------------

def plan_with(remedies: list[Remedy], facts: dict, ctx: RemedyContext, log=None) -> Plan:
    """Read-only: ask each remedy for its change (Engine.plan, and check's triage without the engine's logger,
    whose structlog import check does not pay). A crashing plan() is a refusal, not a crash of the run."""
    out = Plan()
    for r in remedies:
        r.refusal = None
        try:
            change = r.plan(facts, ctx)
        except GpudoctorError as exc:
            out.refusals.append(Refusal(r.id, exc.one_line()))
            continue
        except Exception as exc:  # noqa: BLE001 - one broken remedy must not hide the others
            out.refusals.append(Refusal(r.id, f"plan failed: {type(exc).__name__}: {exc}"))
            continue
        if change is not None:
            out.changes.append(change)
            if log is not None:
                log.info("remedy.planned", remedy=r.id, host=change.host, summary=change.summary)
        elif r.refusal:
            out.refusals.append(Refusal(r.id, r.refusal))
            if log is not None:
                log.info("remedy.refused", remedy=r.id, reason=r.refusal)
        else:
            out.nothing.append(r.id)
    return out


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
        return plan_with(self.remedies, facts, self.ctx, self.log)

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
            if self.audit_log is not None:  # before the first change: a run killed mid-apply still left its trace
                self.audit_log.append({"host": change.host, "remedy": change.remedy, "summary": change.summary,
                                       "result": "started", "user": _user(), "pid": os.getpid(),
                                       "machine": socket.gethostname()})
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



# --- the fix flow -------------------------------------------------------------------------------

@dataclass
class FixRun:
    """One fix run: the diagnosis before, the plan, what was applied, the re-check after, and its exit code."""

    apply: bool
    plan: Plan
    before: Any = None  # Diagnosis; None when planned from facts alone (`lxc fix`)
    outcomes: list[Outcome] = field(default_factory=list)
    after: Any = None  # the re-checked Diagnosis; None in a dry run or when planned from a snapshot
    declined: bool = False  # --apply, but the confirmation said no
    chosen: tuple[str, ...] = ()  # the remedy ids this run considered (--only)
    human: list = field(default_factory=list)  # failing root causes no planned change addresses: a human must act

    @property
    def exit_code(self) -> int:
        """Dry run: 0 nothing to do, 1 changes planned, 2 a refusal, or a failing host with no change planned.
        --apply: the re-checked verdict (at least 2 when a change failed or was rolled back); without a re-check
        (a snapshot, `lxc fix`): 0 applied and verified, 1 a restart pending, 2 a failure, refusal or human cause."""
        from gpudoctor.errors import EXIT_FAIL, EXIT_OK, EXIT_WARN

        if self.declined:
            return EXIT_WARN
        if self.apply and self.after is not None:
            code = self.after.exit_code
            return EXIT_FAIL if any(not o.ok for o in self.outcomes) and code < EXIT_FAIL else code
        if self.plan.refusals or any(not o.ok for o in self.outcomes) or (self.human and not self.plan.changes):
            return EXIT_FAIL  # a failing host with nothing gpudoctor can change: a human must act
        if not self.apply:
            return EXIT_WARN if self.plan.changes else EXIT_OK
        if any(o.change.needs_reboot and not (o.reboot and o.reboot.done) for o in self.outcomes):
            return EXIT_WARN
        return EXIT_OK


def fix(target, remedies: list[Remedy], ctx: RemedyContext, *, apply: bool, facts: dict | None = None,
        confirm=None, on_plan=None, audit_log: AuditLog | None = None, lock_dir: str | None = None) -> FixRun:
    """The whole fix flow on one Target: check → plan → (on_plan) → confirm → apply/verify → re-check.

    `facts` plans from given facts instead of checking the target (`lxc fix`: the boundary alone). `confirm(plan)`
    decides whether planned changes are made (None: yes); `on_plan(run)` sees the plan before that question."""
    from gpudoctor.errors import InputError
    from gpudoctor.pipeline import check_host
    from gpudoctor.target import live

    if apply:  # the door: changes follow only a live target's facts (a replay is refused before anything runs)
        target = live(target, "apply fixes", "drop --apply to see its plan, or drop --snapshot to plan and apply from "
                                             "this machine's own facts")
    before = None
    if facts is None:
        before = check_host(target)
        facts = before.facts
        if not before.judged:  # a diagnosis of nothing: "nothing to fix" would be a lie
            from gpudoctor.errors import CannotJudge

            raise CannotJudge(f"{before.host}: no check could judge these facts, so there is nothing to plan from")
    hosts = plan_hosts(target, facts, ctx.hosts)
    ctx.hosts = hosts
    engine = Engine(remedies, ctx, audit_log=audit_log, lock_dir=lock_dir)
    run = FixRun(apply, engine.plan(facts), before, chosen=tuple(r.id for r in remedies))
    if before is not None:
        run.human = _human_causes(before, run.plan, set(run.chosen))
    if on_plan is not None:
        on_plan(run)
    live = before is not None and target.snapshot is None
    if apply and run.plan.changes:
        missing = sorted({c.host for c in run.plan.changes if c.host not in hosts})
        if missing:
            raise InputError(f"the plan changes {', '.join(missing)}, which this run cannot reach (a snapshot of "
                             f"another machine?): re-run with --host {missing[0]}; nothing was changed")
        if confirm is not None and not confirm(run.plan):
            run.declined = True
            return run
        run.outcomes = engine.apply(run.plan)
        if live:
            run.after = check_host(target)
    elif apply and live:
        run.after = before  # nothing to change: the verdict stands
    return run


def _human_causes(before, plan: Plan, chosen: set[str]) -> list:
    """Failing (or unjudgeable) root causes that no planned change addresses and no left-out remedy would."""
    t = triage(before, plan, chosen)
    return [f for f in t.causes if f.status in (Status.FAIL, Status.UNKNOWN) and t.state[f.key] in
            ("human", "refused", "no_change")]


# --- check and fix: one account of the root causes ----------------------------------------------------------------

@dataclass
class Triage:
    """What `gpudoctor fix` does about each root cause of a diagnosis (Diagnosis.root_causes: every bad finding that
    is no other's symptom): the one account `check` and `fix` both print, so they count root causes the same way and
    check's remedy line is what fix would do.

    state[key]: planned (a planned change addresses it), refused (its remedy refuses: refused[key] says why),
    no_change (its remedy planned nothing), left_out (--only left its remedy out), unavailable (named, not in this
    build), unjudged (only the live host can tell: check of a snapshot), human (no remedy: a person must act)."""

    causes: list = field(default_factory=list)
    state: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)

    def of(self, state: str) -> list:
        return [f for f in self.causes if self.state[f.key] == state]

    @property
    def human(self) -> list:
        return self.of("human")

    def refusal_for(self, f) -> str | None:
        """Why `gpudoctor fix` would not act on root cause `f`, in a clause; None where it would (or cannot tell)."""
        st = self.state.get(f.key)
        if st == "refused":
            return f"`gpudoctor fix --only {f.remedy}` refuses: {self.refused[f.key]}"
        if st == "no_change":
            return f"`gpudoctor fix --only {f.remedy}` plans no change for it: a human must act"
        if st == "unavailable":
            return f"{f.remedy} is named by the check but not available in this build"
        return None

    def human_line(self) -> str:
        """The sentence check and fix both print for the root causes no remedy covers."""
        keys = [f.key for f in self.human]
        return (f"no remedy: {len(keys)} of {len(self.causes)} root cause(s) need a human: " + ", ".join(keys[:6])
                + (" ..." if len(keys) > 6 else ""))


def triage(d, plan: Plan, chosen, unjudged=()) -> Triage:
    """Each root cause of `d` against `plan` (planned with the remedies `chosen`; `unjudged`: remedies whose plan
    only the live host can make)."""
    from gpudoctor import remedies

    addressed = {k for c in plan.changes for k in c.fixes}
    refusals = {r.remedy: r.reason for r in plan.refusals}
    t = Triage(causes=list(d.root_causes))
    for f in t.causes:
        if f.key in addressed:
            st = "planned"
        elif not f.remedy:
            st = "human"
        elif f.remedy not in remedies.REMEDIES:
            st = "unavailable"
        elif f.remedy not in chosen:
            st = "left_out"
        elif f.remedy in unjudged:
            st = "unjudged"
        elif f.remedy in refusals:
            st = "refused"
            t.refused[f.key] = refusals[f.remedy]
        else:
            st = "no_change"
        t.state[f.key] = st
    return t


def plan_hosts(target, facts: dict, extra: dict | None = None) -> dict:
    """Name -> Host the remedies of a run on `target` may act on: the target under its names, its Proxmox node (also
    under the name the boundary facts give it)."""
    hosts = {**target.hosts(), **(extra or {})}
    px = (facts.get("boundary") or {}).get("proxmox")
    if px and target.proxmox is not None and target.snapshot is None:
        hosts.setdefault(px, target.proxmox)  # lxc.cgroup_allow edits under the name the boundary facts give
    return hosts


def check_triage(d, target=None, *, timeout: float = 10.0) -> Triage:
    """Read-only: the plan `gpudoctor fix` would make on `target` for the remedies `d`'s root causes name, triaged
    as fix triages it, so `check` prints what fix would do. A snapshot has no live host to plan against: a remedy
    that must ask the host (not only the facts) is then not judged here (it stays planned, to run on the live host)."""
    from gpudoctor import remedies

    named = {f.remedy for f in d.root_causes if f.remedy}
    ids = [i for i in remedies.REMEDIES if i in named]
    live = target is not None and target.snapshot is None
    hosts = plan_hosts(target, d.facts) if live else {}
    plan = plan_with([remedies.get(i) for i in ids], d.facts, RemedyContext(hosts=hosts, timeout=timeout))
    unjudged = set()
    if not live:  # "no connection to host X": a question only the live host answers
        unjudged = {r.remedy for r in plan.refusals if r.reason.startswith("no connection to host")}
        plan.refusals = [r for r in plan.refusals if r.remedy not in unjudged]
    return triage(d, plan, tuple(remedies.REMEDIES), unjudged)
