"""The recovery ladder: one pure state machine per host that says whether it may serve (docs/recovery.md).

    failing --heal--> healing --passive ok--> verifying --clean window, then verification passes--> ready
       ^                                        |  (verification fails: stays, retries on a backoff)
       +------- a passive check fails ----------+------------------------------------------------------+
    the same root cause back `recurrences` times within `window_s` --> needs-inspection --release (verified)--> ready

A host that failed, or whose boot id or driver changed since it was last verified, or that was never verified, is
not ready until — in order — its passive checks pass, a clean window passes (clean_cycles checks and clean_seconds)
and the active verification passes. Every function here is pure: observations in, the host's record changed in
place, a Step out. Times are Unix seconds given by the caller; nothing here reads a clock, a file or the network.
`since` moves only when the state changes; `reason` (one line, for Slurm, NPD, /healthz and the gate) may change
while the state stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from gpudoctor.inventory_policy import RecoveryPolicy  # noqa: F401 - the ladder's policy, parsed beside the inventory

FAILING, HEALING, VERIFYING, READY, INSPECT = "failing", "healing", "verifying", "ready", "needs-inspection"
STATES = (FAILING, HEALING, VERIFYING, READY, INSPECT)
HISTORY = 64  # failure onsets kept per host (bounded file)


@dataclass
class HostLadder:
    """One host's place on the ladder and what it needs to remember (persisted by recovery.store)."""

    state: str = FAILING
    since: float | None = None  # when it entered `state`
    reason: str = "never verified: waiting for a passing check"
    failing_now: bool = False  # the last passive check failed
    roots: list = field(default_factory=list)  # root-cause keys of the current failure
    clean_cycles: int = 0  # passing checks in a row
    clean_since: float | None = None
    verify_failures: int = 0  # failed verifications in a row since the checks turned clean
    next_verify_at: float | None = None
    last_verification: dict | None = None  # Verification.to_json() of the last one (daemon, gate or release)
    verified_at: float | None = None
    verified_boot: str | None = None  # the boot id and driver the last passing verification saw
    verified_driver: str | None = None
    boot_id: str | None = None  # as last observed
    driver: str | None = None
    onsets: list = field(default_factory=list)  # [[root key, time], ...] failure onsets, newest last
    last_failure_at: float | None = None
    inspect_count: int = 0  # occurrences of the root cause that sent the host to needs-inspection

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict) -> "HostLadder":
        if not isinstance(d, dict):
            raise ValueError("a host's ladder record must be a mapping")
        known = {f.name for f in fields(cls)}
        h = cls(**{k: v for k, v in d.items() if k in known})
        if h.state not in STATES:
            raise ValueError(f"unknown ladder state {h.state!r}")
        return h


@dataclass
class Step:
    """What one observation did: the state before and after, and a time between failures when a failure began."""

    before: str
    after: str
    since: float | None
    reason: str
    between_failures_s: float | None = None

    @property
    def moved(self) -> bool:
        return self.before != self.after


def _move(h: HostLadder, state: str, now: float, reason: str) -> None:
    if h.state != state or h.since is None:
        h.since = now
    h.state = state
    h.reason = reason


def _step(h: HostLadder, before: str, tbf: float | None = None) -> Step:
    return Step(before, h.state, h.since, h.reason, tbf)


def _changed(h: HostLadder) -> str | None:
    """Why the last verification no longer counts (boot id or driver changed, or none ever passed), or None."""
    if h.verified_at is None:
        return "never verified"
    if h.boot_id != h.verified_boot:
        return "rebooted since it was last verified"
    if h.driver != h.verified_driver:
        return f"driver changed since it was last verified ({h.verified_driver} -> {h.driver})"
    return None


def _clean_reason(h: HostLadder, policy: RecoveryPolicy, now: float) -> str:
    return (f"verifying: clean window {h.clean_cycles}/{policy.clean_cycles} checks, "
            f"{int(now - h.clean_since)}/{int(policy.clean_seconds)} s")


def window_done(h: HostLadder, policy: RecoveryPolicy, now: float) -> bool:
    return (h.clean_since is not None and h.clean_cycles >= policy.clean_cycles
            and now - h.clean_since >= policy.clean_seconds)


def observe_check(h: HostLadder, policy: RecoveryPolicy, now: float, *, passed: bool, roots=(), summary: str = "",
                  boot_id: str | None = None, driver: str | None = None) -> Step:
    """A passive check's result: passed, or the root-cause keys (and one-line summary) of what failed."""
    before = h.state
    h.boot_id, h.driver = boot_id, driver
    if not passed:
        return _fail(h, policy, now, list(roots) or ["check"], summary or "the passive check failed")
    h.failing_now, h.roots = False, []
    if h.state == INSPECT:
        return _step(h, before)
    if h.state == READY:
        why = _changed(h)
        if why is None:
            return _step(h, before)
        h.clean_cycles, h.clean_since, h.verify_failures, h.next_verify_at = 0, None, 0, None
    else:
        why = None
    if h.clean_since is None:
        h.clean_since = now
    h.clean_cycles += 1
    if not window_done(h, policy, now):
        _move(h, VERIFYING, now, _clean_reason(h, policy, now))
    elif h.next_verify_at is not None and now < h.next_verify_at:
        _move(h, VERIFYING, now, h.reason)  # a failed verification's reason stays until its retry
    else:
        _move(h, VERIFYING, now, "verifying: " + (why + ", " if why else "") + "verification due")
    return _step(h, before)


def _fail(h: HostLadder, policy: RecoveryPolicy, now: float, roots: list, summary: str) -> Step:
    before = h.state
    tbf = None
    new = [r for r in roots if not h.failing_now or r not in h.roots]
    onset = bool(new)
    h.failing_now, h.roots = True, roots
    h.clean_cycles, h.clean_since, h.verify_failures, h.next_verify_at = 0, None, 0, None
    if onset:
        if h.last_failure_at is not None:
            tbf = now - h.last_failure_at
        h.last_failure_at = now
        h.onsets = [o for o in h.onsets if now - o[1] <= policy.window_s]
        h.onsets.extend([r, now] for r in new)
        h.onsets = h.onsets[-HISTORY:]
    counts = {r: sum(1 for o in h.onsets if o[0] == r) for r in roots}
    worst_root = max(roots, key=lambda r: counts[r])
    if h.state == INSPECT:
        h.inspect_count = max(h.inspect_count, counts[worst_root])
        _move(h, INSPECT, now, _inspect_reason(h, summary))
    elif counts[worst_root] - 1 >= policy.recurrences:
        h.inspect_count = counts[worst_root]
        _move(h, INSPECT, now, _inspect_reason(h, summary))
    elif h.state == HEALING and not onset:
        _move(h, HEALING, now, f"healing: {summary}")
    else:
        _move(h, FAILING, now, f"failing: {summary}")
    return _step(h, before, tbf)


def _inspect_reason(h: HostLadder, summary: str) -> str:
    return (f"needs inspection: came back {h.inspect_count - 1} times ({h.inspect_count} failures) within the "
            f"window: {summary}; no unattended heals until `gpudoctor release`")


def may_heal(h: HostLadder) -> bool:
    """Unattended heals are allowed in every state but needs-inspection."""
    return h.state != INSPECT


def observe_heal(h: HostLadder, now: float, remedy: str) -> Step:
    """A remedy was applied (it claims success; the next checks judge it)."""
    before = h.state
    if h.state in (FAILING, HEALING):
        _move(h, HEALING, now, f"healing: applied {remedy}, waiting for a passing check")
    return _step(h, before)


def verification_due(h: HostLadder, policy: RecoveryPolicy, now: float) -> bool:
    """Whether the active verification should run now: verifying, the clean window passed, no backoff pending."""
    return (h.state == VERIFYING and window_done(h, policy, now)
            and (h.next_verify_at is None or now >= h.next_verify_at))


def observe_verification(h: HostLadder, policy: RecoveryPolicy, now: float, *, passed: bool, reason: str = "",
                         record: dict | None = None) -> Step:
    """The active verification's result. Ignored unless it was due (a failure came in between: it proves nothing)."""
    before = h.state
    if not verification_due(h, policy, now):
        return _step(h, before)
    h.last_verification = record
    if passed:
        _verified(h, now)
        _move(h, READY, now, "")
        return _step(h, before)
    h.verify_failures += 1
    wait = policy.retry_after(h.verify_failures)
    h.next_verify_at = now + wait
    _move(h, VERIFYING, now, f"verifying: verification failed ({reason or 'no reason given'}); retry in {int(wait)} s")
    return _step(h, before)


def _verified(h: HostLadder, now: float) -> None:
    h.verified_at, h.verified_boot, h.verified_driver = now, h.boot_id, h.driver
    h.verify_failures, h.next_verify_at = 0, None


def release(h: HostLadder, now: float, *, passed: bool, reason: str = "", record: dict | None = None,
            boot_id: str | None = None, driver: str | None = None) -> Step:
    """A person's `gpudoctor release`: ready only with a passing verification (and no failing check right now);
    it forgets the host's recurrence history. A failed one changes nothing but the reason."""
    before = h.state
    h.boot_id = boot_id if boot_id is not None else h.boot_id
    h.driver = driver if driver is not None else h.driver
    h.last_verification = record
    if not passed:
        if h.state == INSPECT:
            h.reason = f"{h.reason.split('; release refused')[0]}; release refused: verification failed ({reason})"
        elif h.state == READY:  # a failed verification is evidence: a ready host that fails one is not ready
            h.verify_failures += 1
            _move(h, VERIFYING, now, f"verifying: verification failed at release ({reason or 'no reason given'})")
        return _step(h, before)
    if h.failing_now:
        h.reason = f"{h.reason.split('; release refused')[0]}; release refused: the passive check still fails"
        return _step(h, before)
    _verified(h, now)
    h.onsets, h.inspect_count = [], 0
    h.clean_cycles, h.clean_since = 0, None
    _move(h, READY, now, "")
    return _step(h, before)


def view(h: HostLadder | None, boot_id: str | None, driver: str | None = None, *,
         check_driver: bool = False) -> tuple[str, str, bool]:
    """(state, reason, ready) as a reader (gate, /metrics) sees it now: a `ready` record whose verification was on
    another boot (or driver, when the reader knows it) is not ready — whatever the last writer left."""
    if h is None:
        return FAILING, "never verified: no recovery record for this host", False
    if h.state != READY:
        return h.state, h.reason, False
    if boot_id is not None and boot_id != h.verified_boot:
        return VERIFYING, "verifying: rebooted since it was last verified", False
    if check_driver and driver != h.verified_driver:
        return VERIFYING, f"verifying: driver changed since it was last verified ({h.verified_driver} -> {driver})", \
            False
    return READY, "", True
