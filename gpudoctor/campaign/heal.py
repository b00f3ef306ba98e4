"""A campaign that loses its target heals and resumes by itself — or stops with one line saying what a human must do.

When a server crashes or the target stops answering (a container reboot, SSH dropped), the runner asks the Healer:

    wait      the target must answer again within `heal.wait_s` (a countdown is shown every few seconds);
    judge     the target is checked through the one pipeline (gpudoctor.target + pipeline.check_host) and judged by the
              campaign's gate profile (gpudoctor.gate, "benchmark" by default: driver, nodes, CUDA, the model);
    heal      while it is not ready, the daemon's own machinery acts (gpudoctor.daemon.loop.Daemon with the
              PipelineEngine): only remedies `heal.allow` (or the inventory's policy.auto_apply) names, within the
              daemon's budgets and circuit breaker, its state kept in DIR/heal/state.json so budgets hold across
              --resume; a remedy that restarts the container waits for the target again; never while this
              machine's recovery ladder holds the target in needs-inspection (docs/recovery.md);
    verdict   an Incident: healed (the runner retracts the records the broken target produced and reruns them), or
              not, with the root cause and the command to run.

A target that is healthy after a crash means the crash was the method's own: it stays a `crashed` result.
Every incident is appended to DIR/heals.jsonl; report.md shows them.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from gpudoctor.daemon.clock import SystemClock
from gpudoctor.daemon.engine import EngineConfig, PipelineEngine
from gpudoctor.daemon.loop import Daemon, DaemonConfig
from gpudoctor.daemon.state import StateStore
from gpudoctor.errors import GpudoctorError, HostError
from gpudoctor.recovery.ladder import may_heal
from gpudoctor.recovery.store import RecoveryStore

COUNTDOWN_EVERY_S = 5.0


@dataclass(frozen=True)
class HealSpec:
    """The campaign's `heal:` section."""

    allow: tuple[str, ...] = ()  # remedy-id patterns, as the daemon's --heal / policy.auto_apply ("x.reboot" too)
    wait_s: float = 300.0  # how long a lost target may take to answer again
    rounds: int = 3  # heal cycles per incident at most
    profile: str = "benchmark"  # the gate profile that says "ready"


@dataclass
class Incident:
    """One loss of the target and what was done about it."""

    n: int
    reason: str  # what the runner saw: "the server crashed during …", "lost ct200 while running …"
    at: str
    healthy: bool = False  # the target is ready now (healed, or it was never broken)
    broken: bool = False  # the target was found not ready (so the crash was not the method's own)
    root_cause: str | None = None  # the gate's first blocker, as one line
    actions: list[dict] = field(default_factory=list)  # remedies applied: {"remedy", "finding", "ok", "message"}
    command: str | None = None  # what a human runs when it could not be healed
    retracted: list[list] = field(default_factory=list)  # record keys the broken target produced (rerun after)

    @property
    def healed(self) -> bool:
        return self.healthy and self.broken

    def line(self) -> str:
        """One line for a stop: the root cause and the command."""
        what = self.root_cause or "the target did not become ready"
        cmd = f"; run: {self.command}" if self.command else ""
        tried = ""
        if self.actions:
            tried = "; tried: " + ", ".join(f"{a['remedy']} ({'ok' if a['ok'] else 'failed'})" for a in self.actions)
        return f"{self.reason}: {what}{tried}{cmd}"

    def stamp(self) -> dict:
        """What every record written after this heal carries."""
        return {"n": self.n, "at": self.at, "after": self.reason, "root_cause": self.root_cause,
                "actions": [a["remedy"] for a in self.actions if a["ok"]]}


def _roots(gate) -> list:
    """The gate's blockers that are no symptom of another (all of them when each is)."""
    return [b for b in gate.blockers if not b.symptom_of] or gate.blockers


class _Recording:
    """The daemon's engine, remembering what it applied (the daemon keeps only counts)."""

    def __init__(self, engine):
        self.engine = engine
        self.applied: list[dict] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def apply(self, host, action):
        out = self.engine.apply(host, action)
        self.applied.append({"remedy": action.remedy, "finding": action.finding, "ok": bool(out.ok),
                             "message": out.message, "reboot": bool(action.reboot)})
        return out


class Healer:
    """Judges and heals one campaign target (see the module docstring)."""

    def __init__(self, spec: HealSpec, *, target: str | None, inventory: str | None, models: tuple[str, ...],
                 out_dir: str | Path, emit: Callable[..., None], resume_hint: str, timeout: float = 30.0,
                 engine_factory=None, sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic, recovery_path=None):
        from gpudoctor.gate import resolve_profile

        self.spec, self.emit, self.sleep, self.monotonic = spec, emit, sleep, monotonic
        self.dir = Path(out_dir)
        self.remote = target is not None
        self.resume_hint = resume_hint
        self.recovery_path = recovery_path  # the machine's ladder (recovery.store.default_path() when None)
        cfg = EngineConfig(inventory=inventory, hosts=(target,) if target else (), timeout=timeout,
                           state_dir=str(self.dir / "heal"), models=models)
        self.engine = _Recording((engine_factory or PipelineEngine)(cfg))
        self.name = self.engine.hosts[0]
        self.daemon = Daemon(DaemonConfig(engine=cfg, heal=spec.allow, once=True),
                             engine_factory=lambda _cfg: self.engine, clock=SystemClock(),
                             store=StateStore(self.dir / "heal" / "state.json"))
        self.daemon.load()
        inv = getattr(self.engine, "inventory", None)
        self.profile = resolve_profile(spec.profile, getattr(inv, "profiles", None) or {})
        self.incidents = self._load()

    # ---- the parts ------------------------------------------------------------------------------------------------
    def _load(self) -> list[Incident]:
        try:
            lines = (self.dir / "heals.jsonl").read_text().splitlines()
        except OSError:
            return []
        out = []
        for ln in lines:
            try:
                d = json.loads(ln)
                out.append(Incident(**{k: d[k] for k in Incident.__dataclass_fields__ if k in d}))
            except (ValueError, TypeError, KeyError):
                continue
        return out

    def save(self, inc: Incident) -> None:
        """Append the incident to DIR/heals.jsonl (after the runner has noted what it retracted)."""
        from gpudoctor.files.atomic import append_jsonl_atomic
        from gpudoctor.files.safe import output_mode

        append_jsonl_atomic(self.dir / "heals.jsonl", [asdict(inc)], mode=output_mode())

    def judge(self):
        """(diagnosis, gate result) of the target now; a transport failure raises HostError."""
        from gpudoctor.gate import evaluate

        diag = self.engine.check(self.name)
        return diag, evaluate(diag, self.profile)

    def wait_for_target(self, why: str):
        """Judge the target as soon as it answers, counting down `wait_s`; (diagnosis, gate) or None on time out."""
        deadline = self.monotonic() + self.spec.wait_s
        next_note = 0.0
        last = why
        while True:
            try:
                return self.judge()
            except HostError as exc:
                last = exc.one_line()
            left = deadline - self.monotonic()
            if left <= 0:
                self.emit("note", text=f"{self.name} did not answer within {self.spec.wait_s:g} s: {last}")
                return None
            if self.monotonic() >= next_note:
                self.emit("note", text=f"waiting for {self.name} to answer: {left:.0f} s left ({last})")
                next_note = self.monotonic() + COUNTDOWN_EVERY_S
            self.sleep(min(1.0, max(0.05, left)))

    def _command(self, diag, gate) -> str:
        """What a human runs: the root cause's remedy as a `gpudoctor fix` command (what healing would have applied,
        with --reboot when it restarts something), else its hint, else `gpudoctor check`; then the resume."""
        roots = _roots(gate)
        where = f"--host {self.name} " if self.remote else ""
        by_key = {f.key: f for f in getattr(diag, "findings", None) or []}
        remedy = next((by_key[b.key].remedy for b in roots if b.key in by_key and by_key[b.key].remedy), None)
        if remedy:
            reboot = False
            try:
                reboot = any(a.reboot for a in self.engine.plan(self.name, diag) if a.remedy == remedy)
            except GpudoctorError:
                pass
            allow = ", ".join([remedy, f"{remedy}.reboot"] if reboot else [remedy])
            from gpudoctor.report import Scope, remedy_command  # the one place a remedy becomes a command line

            cmd = remedy_command(remedy, Scope(host=self.name if self.remote else None))
            return (f"{cmd} --apply{' --reboot' if reboot else ''} (or let the "
                    f"campaign heal it: heal: {{allow: [{allow}]}}), then {self.resume_hint}")
        hint = next((b.hint for b in roots if b.hint), None)
        if hint:
            return f"{' '.join(hint.split())}, then {self.resume_hint}"
        return f"{f'gpudoctor check {where}'.rstrip()}, fix what it names, then {self.resume_hint}"

    # ---- one incident ---------------------------------------------------------------------------------------------
    def recover(self, reason: str) -> Incident:
        """Wait, judge, heal within budgets, judge again. The incident says whether the campaign can go on; the
        caller saves it (save()) once it has noted what it retracted."""
        inc = Incident(n=len(self.incidents) + 1, reason=reason, at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self.emit("note", text=f"{reason}: judging {self.name} (gate profile {self.profile.name})")
        judged = self.wait_for_target(reason)
        for rnd in range(self.spec.rounds + 1):
            if judged is None:
                inc.broken, inc.root_cause = True, f"{self.name} did not answer within {self.spec.wait_s:g} s"
                inc.command = f"gpudoctor check --host {self.name} (is it up?), then {self.resume_hint}"
                break
            diag, gate = judged
            if gate.passed:
                inc.healthy = True
                break
            inc.broken = True
            roots = _roots(gate)
            inc.root_cause = " ".join(f"{roots[0].key}: {roots[0].summary}".split()) if roots else gate.headline
            inc.command = self._command(diag, gate)
            if rnd == self.spec.rounds or not self.daemon.policy.allow:
                break
            held = self._inspection()
            if held:  # the recovery ladder holds the host for a person: no unattended heal, here either
                self.emit("note", text=f"{self.name} {held}")
                inc.command = (f"inspect {self.name}, then `gpudoctor release {self.name}` (it verifies first), "
                               f"then {self.resume_hint}")
                break
            before = len(self.engine.applied)
            self.emit("note", text=f"{self.name} is not ready: {inc.root_cause}; healing (round {rnd + 1})")
            try:
                self.daemon.run_cycle()
            except GpudoctorError as exc:
                self.emit("note", text=f"healing {self.name} failed: {exc.one_line()}")
                break
            new = self.engine.applied[before:]
            inc.actions += new
            if not new:  # nothing the policy and budgets allow can act on it
                self.emit("note", text=f"no allowed remedy acts on {self.name} now (policy, budget or breaker)")
                break
            for a in new:
                self.emit("note", text=f"heal: {a['remedy']} for {a['finding']}: {'ok' if a['ok'] else 'failed'}"
                                       f" ({a['message']})")
            judged = self.wait_for_target("after healing" if not any(a["reboot"] for a in new)
                                          else "the container is restarting")
        self.incidents.append(inc)
        if inc.healed:
            self.emit("note", text=f"{self.name} healed ({', '.join(a['remedy'] for a in inc.actions if a['ok'])}); "
                                   "the campaign goes on")
        return inc

    def _inspection(self) -> str | None:
        """The ladder's reason when this machine's recovery ladder (docs/recovery.md) holds the target in
        needs-inspection, else None; read only, and a missing or unreadable ladder holds nothing here."""

        try:
            h = RecoveryStore(self.recovery_path).get(self.name)
        except (OSError, ValueError):
            return None
        return None if h is None or may_heal(h) else h.reason

    def close(self) -> None:
        self.engine.close()
