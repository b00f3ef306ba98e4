"""The daemon loop: check every host at start and every interval, heal within budgets, report everywhere.

Signals: SIGTERM stops cleanly; SIGINT (Ctrl-C) is the CLI's, as for every command: it stops within 1 s, whatever the
cycle waits on, and exits 130; SIGHUP reloads the inventory and policy (a bad file keeps the old one);
SIGUSR1 runs a cycle now; SIGUSR2 closes every circuit breaker.

A remedy is credited as a success only when the next check shows its finding cleared; a remedy that reports
success while the fault persists counts as a failure ("ineffective") for backoff and for the breaker.

Every cycle moves each host's recovery ladder (gpudoctor.recovery, docs/recovery.md): the passive check, then the
heals (none in needs-inspection), then — once the checks have been clean for the policy's window — the active
verification. Only a passing verification makes a host ready; /metrics and /healthz show the ladder.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace

from gpudoctor.daemon.budget import HALF_OPEN, OPEN
from gpudoctor.daemon.engine import Action, EngineConfig, Outcome
from gpudoctor.daemon.policy import HealPolicy, parse_policy
from gpudoctor.daemon.sdnotify import Notifier, WatchdogPinger
from gpudoctor.daemon.state import DaemonState, StateStore
from gpudoctor.daemon.xid import XidEvent, xid_findings
from gpudoctor.errors import EXIT_UNKNOWN, GpudoctorError, HostError
from gpudoctor.findings import Status, exit_code, worst
from gpudoctor.host.local import read_boot_id
from gpudoctor.log import get_logger
from gpudoctor.recovery import advance as recovery
from gpudoctor.recovery.ladder import RecoveryPolicy, may_heal, view

BAD = {"fail", "warn", "unknown"}


@dataclass
class DaemonConfig:
    interval: float = 120.0
    engine: EngineConfig = field(default_factory=EngineConfig)
    heal: tuple[str, ...] = ()  # extra allowed remedy patterns from the command line
    observe_only: bool = False
    once: bool = False
    stall_s: float = 900.0


class Daemon:
    """One daemon: engine + policy + state + metrics + notifier, driven by a clock."""

    def __init__(self, config: DaemonConfig, *, engine_factory, clock, store: StateStore,
                 notifier: Notifier | None = None, metrics=None, xid_watcher_factory=None, recovery_store=None,
                 verifier=None):
        self.config = config
        self.engine_factory = engine_factory
        self.clock = clock
        self.store = store
        self.notifier = notifier or Notifier({})
        self.pinger = WatchdogPinger(self.notifier, stall_s=config.stall_s)
        self.metrics = metrics
        self.xid_watcher_factory = xid_watcher_factory
        self.xid_watcher = None
        self.recovery_store = recovery_store  # gpudoctor.recovery.store.RecoveryStore; None: no ladder (tests only)
        self.verifier = verifier  # (host name) -> Verification; None: the engine's verify()
        self.recovery_policy = RecoveryPolicy()
        self.ladders: dict = {}  # host -> HostLadder as last moved by this daemon (for /healthz and the status)
        self.log = get_logger("gpudoctor.daemon")
        self.state: DaemonState = store.load()
        self.engine = None
        self.policy = HealPolicy()
        self.reload_error: str | None = None
        self.found: dict[str, dict] = {}  # the last cycle, per host: verdict, root causes, error, remedy actions
        self._lock = threading.RLock()  # state is touched by the XID thread and the HTTP thread too
        self._wake = threading.Event()
        self._stop = False
        self._reload = False
        self._reset = False
        self._run_now = False

    # --- configuration ------------------------------------------------------------------------------
    def load(self) -> None:
        """Build the engine and policy; raises GpudoctorError on bad input (the first load must succeed)."""
        engine = self.engine_factory(self.config.engine)
        policy = parse_policy(getattr(engine, "policy", None) or {}, path=self.config.engine.inventory)
        from gpudoctor.inventory_policy import from_policy
        from gpudoctor.recovery.verify import verify_policy_of

        self.recovery_policy = from_policy(getattr(engine, "policy", None), path=self.config.engine.inventory)
        verify_policy_of(getattr(engine, "policy", None) or None, path=self.config.engine.inventory)  # bad: fail now
        policy = policy.with_allowed(self.config.heal)
        if self.config.observe_only:
            policy = replace(policy, allow=())
        old, self.engine, self.policy = self.engine, engine, policy
        if old is not None:
            old.close()
        self.log.info("daemon.loaded", hosts=list(engine.hosts), heal=list(policy.allow))

    def reload(self) -> None:
        self.notifier.reloading()
        try:
            self.load()
            self.reload_error = None
            self.log.info("daemon.reloaded")
        except GpudoctorError as exc:
            self.reload_error = exc.one_line()
            self.log.error("daemon.reload_failed", error=self.reload_error)
        self.notifier.ready(self._status_line(None))

    # --- signals ---------------------------------------------------------------------------------------
    def install_signals(self) -> None:
        def stop(signum, frame):
            self._stop = True
            self._wake.set()

        def hup(signum, frame):
            self._reload = True
            self._wake.set()

        def usr1(signum, frame):
            self._run_now = True
            self._wake.set()

        def usr2(signum, frame):
            self._reset = True
            self._wake.set()

        signal.signal(signal.SIGTERM, stop)  # SIGINT stays the CLI's: KeyboardInterrupt, exit 130 (gpudoctor/cli.py)
        signal.signal(signal.SIGHUP, hup)
        signal.signal(signal.SIGUSR1, usr1)
        signal.signal(signal.SIGUSR2, usr2)

    # --- XID -------------------------------------------------------------------------------------------
    def on_xid(self, ev: XidEvent) -> None:
        if self.metrics is not None:
            self.metrics.xid.labels(str(ev.gpu), str(ev.xid)).inc()
        if not ev.critical:
            return
        with self._lock:
            self.state.xid.append(ev.to_json())
            self.state.xid = self.state.xid[-256:]
            self.store.save(self.state)
        self._run_now = True
        self._wake.set()  # show it at once: run a cycle now

    def _start_xid(self) -> None:
        if self.xid_watcher_factory is None or self.engine.local_host is None:
            return
        self.xid_watcher = self.xid_watcher_factory(self.on_xid)
        self.xid_watcher.start()

    # --- one cycle -----------------------------------------------------------------------------------
    def run_cycle(self, after=None) -> int:
        """Check (and heal) every host once; the worst host's exit code.

        `after` runs before the cycle is counted and saved: the loop reads the clock for its next run there, so a
        test that advances its clock once it sees the cycle counted never races the schedule.
        """
        codes = []
        for name in list(self.engine.hosts):
            if self._stop:
                break
            self.pinger.beat()
            codes.append(self._cycle_host(name))
        if after is not None:
            after()
        with self._lock:
            self.state.cycles += 1
            self.store.save(self.state)
        if self.metrics is not None:
            self.metrics.cycles.inc()
            self.metrics.xid_watch.set(1 if self.xid_watcher is not None and self.xid_watcher.running else 0)
        return max(codes, default=0)

    def _cycle_host(self, name: str) -> int:
        hs = self.state.host(name)
        now = self.clock.now()
        t0 = time.monotonic()
        log = self.log.bind(host=name)
        try:
            diag = self.engine.check(name)
        except HostError as exc:
            return self._unreachable(name, "unreachable", exc, now, t0)
        except GpudoctorError as exc:
            return self._unreachable(name, "error", exc, now, t0)
        except Exception as exc:  # a bug in a probe must not kill the daemon
            log.exception("daemon.check_crashed")
            return self._unreachable(name, "error", exc, now, t0)
        duration = time.monotonic() - t0
        findings = list(getattr(diag, "findings", []))
        root = list(getattr(diag, "root_causes", []))
        if name == self.engine.local_host:
            with self._lock:
                xf = xid_findings(self.state.xid)
            findings += xf
            root += xf
        verdict = worst(f.status for f in findings).value
        with self._lock:
            hs.last_run, hs.verdict = now, verdict
            hs.root_cause = root[0].summary if root else None
            hs.findings = {f.key: f.status.value for f in findings}
            self._settle_pending(name, hs, now)
        if self.metrics is not None:
            self.metrics.observe_host(name, verdict, findings, now, duration)
        log.info("daemon.checked", verdict=verdict, root_cause=hs.root_cause, duration_s=round(duration, 3))
        self.found[name] = {"verdict": verdict, "root_causes": [f for f in root if f.bad], "error": None,
                            "actions": []}
        boot, driver = recovery.identity(getattr(diag, "facts", None))
        if boot is None and name == self.engine.local_host:
            boot = read_boot_id()
        # the ladder's passive check is the default gate's rule: a failure blocks, an unknown beside checks that
        # judged does not (the verification is the strong evidence); nothing judged at all is not a pass
        judged = any(f.status.value in ("ok", "info", "warn") for f in findings)
        passed = verdict != "fail" and judged
        bad_roots = [f for f in root if f.bad] or [f for f in findings if f.status.value in ("fail", "unknown")]
        self._ladder_check(name, now, passed, [f.key for f in bad_roots],
                           bad_roots[0].summary if bad_roots else f"verdict {verdict}", boot, driver)
        if verdict in BAD and self.policy.allow:
            if self._may_heal(name):
                self._heal(name, hs, diag, now)
            else:
                for action in self._plan(name, diag):
                    self._skip(name, action, "needs_inspection")
        if self.metrics is not None:
            self.metrics.observe_breaker(name, hs.breaker.state, hs.breaker.times_opened)
        self._verify(name)
        self.found[name]["ladder"] = self.ladders.get(name)
        return exit_code(Status(verdict))

    # --- the recovery ladder ------------------------------------------------------------------------------
    def _observe_ladder(self, name, h, boot=None) -> None:
        with self._lock:
            self.ladders[name] = h
        if self.metrics is not None:
            self.metrics.observe_ladder(name, h, boot if boot is not None else h.boot_id)

    def _ladder_check(self, name, now, passed, roots, summary, boot, driver) -> None:
        """Record the passive check on the ladder (no verification yet: heals come first)."""
        if self.recovery_store is None:
            return
        adv = recovery.advance(self.recovery_store, name, self.recovery_policy, now, passed=passed, roots=roots,
                               summary=summary, boot_id=boot, driver=driver)
        step = adv.steps[0]
        if step.between_failures_s is not None and self.metrics is not None:
            self.metrics.between_failures.labels(name).observe(step.between_failures_s)
        if step.moved:
            self.log.warning("recovery.moved", host=name, before=step.before, after=step.after, reason=step.reason)
        self._observe_ladder(name, adv.ladder)

    def _may_heal(self, name) -> bool:
        h = self.ladders.get(name)
        return h is None or may_heal(h)

    def _plan(self, name, diag) -> list:
        try:
            return self.engine.plan(name, diag)
        except Exception as exc:
            self.log.error("remedy.plan_failed", host=name, error=repr(exc))
            return []

    def _verifier(self, name):
        if self.verifier is not None:
            return lambda: self.verifier(name)
        verify = getattr(self.engine, "verify", None)
        return (lambda: verify(name)) if verify is not None else None

    def _verify(self, name) -> None:
        """The active verification, when the ladder says it is due (clean window passed, no backoff pending)."""
        if self.recovery_store is None or self._stop:
            return
        self.pinger.beat()
        verify = self._verifier(name)
        if verify is None:
            from gpudoctor.recovery.advance import Crashed

            verify = lambda: Crashed("this engine cannot verify a host (no verify())")  # noqa: E731
        adv = recovery.verify_if_due(self.recovery_store, name, self.recovery_policy, verify, clock=self.clock.now)
        self.pinger.beat()
        for step in adv.steps:
            if step.moved:
                self.log.warning("recovery.moved", host=name, before=step.before, after=step.after, reason=step.reason)
        if adv.verification is not None:
            v = adv.verification
            self.log.warning("recovery.verified" if v.passed else "recovery.verification_failed", host=name,
                             reason=v.reason, state=adv.ladder.state)
            self.found.get(name, {})["verification"] = "passed" if v.passed else f"failed: {v.reason}"
        elif adv.busy:
            self.log.info("recovery.verification_busy", host=name)
        self._observe_ladder(name, adv.ladder)

    def _unreachable(self, name, status, exc, now, t0) -> int:
        hs = self.state.host(name)
        msg = exc.one_line() if isinstance(exc, GpudoctorError) else f"{type(exc).__name__}: {exc}"
        with self._lock:
            hs.last_run, hs.verdict, hs.root_cause = now, status, msg
        self._ladder_check(name, now, False, [f"host.{status}"], f"could not check: {msg}", None, None)
        if self.metrics is not None:
            self.metrics.observe_host(name, status, [], now, time.monotonic() - t0)
            self.metrics.observe_breaker(name, hs.breaker.state, hs.breaker.times_opened)
        self.log.warning("daemon.host_" + status, host=name, error=msg)
        self.found[name] = {"verdict": status, "root_causes": [], "error": msg, "actions": []}
        return EXIT_UNKNOWN

    def _settle_pending(self, name, hs, now) -> None:
        """Credit or debit remedies that claimed success last cycle, by what this check shows."""
        for rid, fkey in list(hs.pending_verify.items()):
            still_bad = hs.findings.get(fkey) in BAD
            ledger = hs.ledger(rid)
            ledger.record_result(not still_bad, now, "ineffective" if still_bad else "ok")
            opened = hs.breaker.record(not still_bad, now, self.policy.breaker_threshold)
            del hs.pending_verify[rid]
            self.log.info("remedy.confirmed" if not still_bad else "remedy.ineffective", host=name, remedy=rid,
                          finding=fkey)
            if opened:
                self.log.error("daemon.breaker_opened", host=name, failures=hs.breaker.consecutive_failures)

    def _skip(self, name, action: Action, reason: str, **kw) -> None:
        if self.metrics is not None:
            self.metrics.skipped.labels(name, action.remedy, reason).inc()
        self.log.info("remedy.skipped", host=name, remedy=action.remedy, reason=reason, **kw)
        self.found.get(name, {}).setdefault("actions", []).append((action.remedy, f"skipped ({reason})"))

    def _heal(self, name, hs, diag, now) -> None:
        actions = self._plan(name, diag)
        p = self.policy
        for action in actions:
            if self._stop:
                return
            self.pinger.beat()
            if "refused" in action.data:  # its plan refused (another user's model directory, a locked config, ...)
                self.log.warning("remedy.refused", host=name, remedy=action.remedy, reason=action.data["refused"])
                self.found.get(name, {}).setdefault("actions", []).append(
                    (action.remedy, "refused: " + action.data["refused"]))
                continue
            if not p.allows(action.remedy):
                self._skip(name, action, "policy")
                continue
            if action.remedy in hs.pending_verify:
                continue  # applied last cycle; awaiting proof
            if not hs.breaker.allows(now, p.breaker_cooldown_s) or (hs.breaker.state == HALF_OPEN and hs.pending_verify):
                self._skip(name, action, "breaker", reopens_at=hs.breaker.reopens_at(p.breaker_cooldown_s))
                continue
            if action.reboot and not p.allows(f"{action.remedy}.reboot"):
                # a change that only takes effect after a restart waits for a human unless restarts are allowed
                self._skip(name, action, "reboot_not_allowed", allow=f"{action.remedy}.reboot")
                continue
            ledger = hs.ledger(action.remedy)
            budget = p.budget_for(action.remedy, action.reboot)
            allowed, reason, retry_at = ledger.decide(budget, now)
            if not allowed:
                self._skip(name, action, reason, retry_at=retry_at)
                continue
            with self._lock:
                ledger.record_attempt(now)
                self.store.save(self.state)  # before applying: a crash or reboot must not forget the attempt
            self.log.warning("remedy.applying", host=name, remedy=action.remedy, finding=action.finding,
                             reboot=action.reboot, attempt=len(ledger.attempts))
            try:
                out = self.engine.apply(name, action)
            except Exception as exc:
                out = Outcome(False, exc.one_line() if isinstance(exc, GpudoctorError) else repr(exc))
            if out.ok and self.recovery_store is not None:
                step = recovery.record_heal(self.recovery_store, name, now, action.remedy)
                if step.moved:
                    self.log.warning("recovery.moved", host=name, before=step.before, after=step.after,
                                     reason=step.reason)
            with self._lock:
                if out.ok:
                    hs.pending_verify[action.remedy] = action.finding
                else:
                    ledger.record_result(False, now)
                    if hs.breaker.record(False, now, p.breaker_threshold):
                        self.log.error("daemon.breaker_opened", host=name, failures=hs.breaker.consecutive_failures)
                self.store.save(self.state)
            if self.metrics is not None:
                self.metrics.applied.labels(name, action.remedy, "ok" if out.ok else "failed").inc()
            self.log.warning("remedy.applied" if out.ok else "remedy.failed", host=name, remedy=action.remedy,
                             message=out.message)
            self.found.get(name, {}).setdefault("actions", []).append(
                (action.remedy, ("applied: " if out.ok else "failed: ") + out.message))
            if action.reboot and out.ok:
                return  # the host is rebooting: judge it at the next check
            if hs.breaker.state == OPEN:
                return

    # --- health and status ---------------------------------------------------------------------------
    def health(self) -> tuple[bool, dict]:
        """(healthy, body) for /healthz: healthy while the loop is not stuck and config loaded."""
        with self._lock:
            hosts = {n: {"verdict": h.verdict, "last_run": h.last_run, "breaker": h.breaker.state}
                     for n, h in self.state.hosts.items()}
            for n, lad in self.ladders.items():
                state, reason, ready = view(lad, lad.boot_id)
                hosts.setdefault(n, {})["recovery"] = {"state": state, "ready": ready, "since": lad.since,
                                                       "reason": reason}
            cycles = self.state.cycles
        stalled = self.pinger.stalled
        body = {"status": "stalled" if stalled else "ok", "cycles": cycles, "hosts": hosts,
                "reload_error": self.reload_error, "pid": os.getpid()}
        if self.xid_watcher is not None:
            body["xid_watcher"] = "running" if self.xid_watcher.running else (self.xid_watcher.reason or "starting")
        return not stalled, body

    def _status_line(self, next_in: float | None) -> str:
        parts = []
        with self._lock:
            for n, h in self.state.hosts.items():
                s = f"{n} {h.verdict or 'pending'}"
                if h.verdict in BAD | {"unreachable", "error"} and h.root_cause:
                    s += f" ({h.root_cause[:80]})"
                lad = self.ladders.get(n)
                if lad is not None:
                    s += f", {lad.state}" + (f" ({lad.reason[:80]})" if lad.reason and h.verdict not in BAD else "")
                if h.breaker.state != "closed":
                    s += f" breaker {h.breaker.state}"
                parts.append(s)
        line = "; ".join(parts) or "starting"
        if self.reload_error:
            line += f"; reload failed: {self.reload_error[:80]}"
        if next_in is not None:
            line += f"; next check in {int(next_in)} s"
        return line

    # --- main ----------------------------------------------------------------------------------------
    def _reset_breakers(self) -> None:
        with self._lock:
            for n, h in self.state.hosts.items():
                h.breaker.reset()
                if self.metrics is not None:
                    self.metrics.observe_breaker(n, h.breaker.state, h.breaker.times_opened)
            self.store.save(self.state)
        self.log.warning("daemon.breaker_reset")

    def prepare(self, metrics_addr: str | None = None) -> None:
        """Mark this run in the state (pid, boot, metrics address); clear XIDs of a previous boot."""
        boot = read_boot_id()
        with self._lock:
            if boot and self.state.boot_id != boot:
                self.state.xid = []
                self.state.boot_id = boot
            self.state.pid = os.getpid()
            self.state.started_at = time.time()
            self.state.metrics_addr = metrics_addr
            for n, h in self.state.hosts.items():
                if self.metrics is not None:
                    self.metrics.observe_breaker(n, h.breaker.state, h.breaker.times_opened)
            self.store.save(self.state)
        if self.recovery_store is not None:  # what the ladder said before this run: a reader sees it from the start
            for n, lad in self.recovery_store.load().items():
                if self.engine is None or n in self.engine.hosts:
                    local = self.engine is not None and n == self.engine.local_host
                    self._observe_ladder(n, lad, boot if local else None)

    def run_once(self) -> int:
        self.prepare(None)
        try:
            return self.run_cycle()
        finally:
            self.engine.close()

    def _handle_flags(self) -> None:
        if self._reload:
            self._reload = False
            self.reload()
        if self._reset:
            self._reset = False
            self._reset_breakers()

    def run_forever(self) -> int:
        """Loop until SIGTERM; returns 0 on a clean stop."""
        self._start_xid()
        self.pinger.start()
        first = True
        try:
            while not self._stop:
                self._handle_flags()
                self.pinger.beat()
                started = self.clock.now()
                sched = {}

                def plan_next():
                    # fixed-rate schedule from the cycle's start; a cycle longer than the interval leaves 1 s
                    sched["next"] = max(started + self.config.interval, self.clock.now() + 1.0)

                self.run_cycle(after=plan_next)
                self.pinger.idle()
                next_run = sched["next"]
                status = self._status_line(self.config.interval)
                if first:
                    self.notifier.ready(status)
                    first = False
                else:
                    self.notifier.status(status)
                while not self._stop:
                    self.clock.wait(self._wake, next_run)
                    self._wake.clear()
                    self._handle_flags()
                    if self._run_now:
                        self._run_now = False
                        break
                    if self.clock.now() >= next_run:
                        break
        finally:
            self.notifier.stopping()
            self.pinger.stop()
            if self.xid_watcher is not None:
                self.xid_watcher.stop()
            with self._lock:
                self.state.pid = None
                self.store.save(self.state)
            self.engine.close()
            self.log.info("daemon.stopped")
        return 0
