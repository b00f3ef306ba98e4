"""Move one host's ladder under the store's lock: the one sequence the daemon, a gate and `release` all use.

observe the passive check -> (if due and nobody else is verifying) run the verification outside the lock -> record
its result. The verification is an injectable callable returning a gpudoctor.recovery.verify.Verification (or any
object with passed, reason, to_json()); a verifier that raises is a failed verification, never a pass.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

from gpudoctor.log import get_logger
from gpudoctor.recovery import ladder
from gpudoctor.recovery.ladder import HostLadder, RecoveryPolicy, Step


@dataclass
class Crashed:
    """A verifier that raised: a failed verification naming the exception."""

    reason: str
    passed: bool = False

    def to_json(self) -> dict:
        return {"passed": False, "reason": self.reason, "steps": []}


@dataclass
class Advance:
    host: str
    ladder: HostLadder  # a copy, after every step
    steps: list = field(default_factory=list)
    verification: object | None = None  # what the verifier returned, when it ran
    busy: bool = False  # the verification was due but another process was running it

    @property
    def ready(self) -> bool:
        return self.ladder.state == ladder.READY


def identity(facts) -> tuple[str | None, str | None]:
    """(boot id, driver version) from a check's facts: what a passing verification is scoped to."""
    facts = facts if isinstance(facts, dict) else {}
    host = facts.get("host") if isinstance(facts.get("host"), dict) else {}
    drv = facts.get("driver") if isinstance(facts.get("driver"), dict) else {}
    dfile = host.get("driver_version_file") if isinstance(host.get("driver_version_file"), dict) else {}
    return host.get("boot_id"), drv.get("driver_version") or dfile.get("version")


def _run(verify) -> object:
    try:
        return verify()
    except Exception as exc:  # noqa: BLE001 - a verifier that crashed has not verified anything
        get_logger("gpudoctor.recovery").exception("recovery.verifier_crashed")
        return Crashed(f"the verification crashed: {type(exc).__name__}: {exc}")


def _host(hosts: dict, name: str, now: float) -> HostLadder:
    if name not in hosts:
        hosts[name] = HostLadder(since=now)
    return hosts[name]


def verify_if_due(store, name: str, policy: RecoveryPolicy, verify, clock=time.time) -> Advance:
    """Run the verification when the ladder says it is due; record it. Nothing runs while another process holds
    the verification lock."""
    with store.edit() as hosts:
        h = _host(hosts, name, clock())
        due = ladder.verification_due(h, policy, clock())
        adv = Advance(name, copy.deepcopy(h))
    if not due or verify is None:
        return adv
    with store.verify_lock() as got:
        if not got:
            adv.busy = True
            return adv
        v = _run(verify)
        with store.edit() as hosts:
            h = _host(hosts, name, clock())
            adv.steps.append(ladder.observe_verification(h, policy, clock(), passed=bool(v.passed),
                                                         reason=str(v.reason), record=v.to_json()))
            adv.ladder, adv.verification = copy.deepcopy(h), v
    return adv


def advance(store, name: str, policy: RecoveryPolicy, now: float, *, passed: bool, roots=(), summary: str = "",
            boot_id: str | None = None, driver: str | None = None, verify=None, clock=time.time) -> Advance:
    """Record a passive check, then verify when due. `now` is the check's time (the daemon's clock)."""
    with store.edit() as hosts:
        h = _host(hosts, name, now)
        step: Step = ladder.observe_check(h, policy, now, passed=passed, roots=roots, summary=summary,
                                          boot_id=boot_id, driver=driver)
    adv = verify_if_due(store, name, policy, verify, clock)
    adv.steps.insert(0, step)
    return adv


def record_heal(store, name: str, now: float, remedy: str) -> Step:
    with store.edit() as hosts:
        return ladder.observe_heal(_host(hosts, name, now), now, remedy)


def release(store, name: str, verify, *, boot_id: str | None, driver: str | None, clock=time.time) -> Advance:
    """`gpudoctor release`: verify first (under the verification lock), then release only on a pass."""
    with store.verify_lock() as got:
        if not got:
            adv = Advance(name, copy.deepcopy(store.get(name) or HostLadder(since=clock())), busy=True)
            return adv
        v = _run(verify)
        with store.edit() as hosts:
            h = _host(hosts, name, clock())
            step = ladder.release(h, clock(), passed=bool(v.passed), reason=str(v.reason), record=v.to_json(),
                                  boot_id=boot_id, driver=driver)
            return Advance(name, copy.deepcopy(h), [step], v)
