"""A gate that returns a host to service goes through the ladder: `gate --slurm`, `gate --npd`, `gate --recovery`
(the ExecStartPre= gate). It passes only when its own checks pass AND the ladder says ready.

Who moves the ladder: where gpudoctor's daemon runs (its pid is alive in daemon.json beside the ladder's file) the
daemon does, and the gate only reads it — one writer, so a gate and the daemon never disagree on a clean window or a
recurrence. A reading gate may wait (`--recovery-wait`, e.g. at boot, when the daemon has not yet verified this boot)
while the daemon still has something to do: no record yet, a record of another boot, or a verification pending or
running; it stops waiting as soon as the host is ready or the ladder has settled on not ready. Where no daemon runs, the gate moves the ladder itself through the same code (recovery.advance, under
the store's lock), including the verification when it is due; its checks are the passive check. Either way the
ladder's rules are the only rules.

A gate of a snapshot (a ReplayTarget) moves no ladder and runs no verification: its facts are another machine's,
or another moment's. `judge` gives it a dry verdict that says what a live gate would have recorded, and the ladder is
then "unknown" for it (a gate never passes what it could not judge). Only a LiveTarget reaches the ladder's writer
(`_move`, through gpudoctor.target.live), so no caller can move it on a replay's word.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from gpudoctor.recovery import advance as recovery
from gpudoctor.recovery.ladder import INSPECT, VERIFYING, view
from gpudoctor.target import is_live, live

KEY = "recovery.ladder"
HINT = ("the host returns to service only after its verification passes (docs/recovery.md); "
        "`gpudoctor recovery show` says where it stands, `gpudoctor release HOST` after an inspection")


@dataclass
class LadderVerdict:
    host: str
    state: str
    reason: str
    ready: bool
    since: float | None
    moved_by: str  # "gate" (no daemon here), "daemon" (read only), "nobody" (the gate could not check) or
    #                "replay" (a snapshot: nothing moved, `reason` says what a live gate would have recorded)
    verification: dict | None = None  # what this gate's own verification said, when it ran one

    def to_json(self) -> dict:
        return {"host": self.host, "state": self.state, "ready": self.ready, "since": self.since,
                "reason": self.reason, "moved_by": self.moved_by, "verification": self.verification}


def daemon_pid(state_dir: Path) -> int | None:
    """The pid of a gpudoctor daemon that keeps its state in state_dir and is alive, or None."""
    try:
        pid = int(json.loads((state_dir / "daemon.json").read_text()).get("pid") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return pid if pid > 0 and pid_is_daemon(pid) else None


def pid_is_daemon(pid) -> bool:
    try:
        cmd = Path(f"/proc/{int(pid)}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, TypeError):
        return False
    return any(b"gpudoctor" in part for part in cmd) and b"daemon" in cmd


def _verifier(target):
    """run_verification on a live target's host, per the inventory's policy verify: (a replay is refused here)."""
    from gpudoctor.recovery.verify import run_verification, verify_policy_of

    target = live(target, "run the active verification")
    inv = target.inventory
    policy = verify_policy_of(inv.policy if inv is not None else None, path=str(inv.path) if inv is not None else None)

    def verify():
        return run_verification(target, policy)

    return verify


def pending(lad, boot) -> bool:
    """Whether the daemon still has to move this record before it means anything for this boot."""
    if lad is None or (boot is not None and lad.boot_id != boot):
        return True
    return lad.state == VERIFYING and lad.next_verify_at is None and not lad.failing_now


def _read(store, name, boot, wait_s, sleep=time.sleep, clock=time.monotonic):
    end = clock() + wait_s
    while True:
        lad = store.get(name)
        state, reason, ready = view(lad, boot)
        if ready or not pending(lad, boot) or clock() >= end:
            return lad, state, reason, ready
        sleep(min(1.0, max(end - clock(), 0.0)))


def judge(target, result, store, *, clock=time.time, wait_s: float = 0.0) -> LadderVerdict:
    """Record the gate's result on the ladder (unless a daemon moves it) and read where the host stands."""
    from gpudoctor.inventory_policy import from_inventory
    from gpudoctor.recovery.verify import verify_policy_of

    inv = target.inventory
    policy = from_inventory(inv)
    verify_policy_of(inv.policy if inv is not None else None,
                     path=str(inv.path) if inv is not None else None)  # bad input fails before anything moves
    if not is_live(target) or getattr(result, "replayed", None):
        return dry(target, result)
    return _move(live(target, "move the recovery ladder"), result, store, policy, clock, wait_s)


def dry(target, result) -> LadderVerdict:
    """The verdict for a gate of a replay: nothing read or written; what a live gate would have recorded."""
    what = getattr(target, "recorded", lambda: "a replay")()
    did = ("could not check" if result.error is not None else
           "a passing check" if result.passed else f"a failing check ({result.headline})")
    return LadderVerdict(target.name, "unknown", f"{what} moves no recovery ladder (a live gate would record "
                                                 f"{did} for {target.name}): not judged", False, None, "replay")


def _move(target, result, store, policy, clock, wait_s) -> LadderVerdict:
    """The ladder's writer for a gate: a live target's passive check recorded (unless a daemon moves it)."""
    boot, driver = recovery.identity(getattr(result, "facts", None))
    name = target.name
    if result.error is not None:  # the gate could not check: closed anyway, and it records nothing it did not see
        lad = store.get(name)
        state, reason, ready = view(lad, boot)
        return LadderVerdict(name, state, reason, False, lad.since if lad else None, "nobody")
    if daemon_pid(store.path.parent) is not None:
        lad, state, reason, ready = _read(store, name, boot, wait_s if result.passed else 0.0)
        return LadderVerdict(name, state, reason, ready, lad.since if lad else None, "daemon")
    roots = [b.key for b in result.blockers if not b.symptom_of]
    adv = recovery.advance(store, name, policy, clock(), passed=result.passed, roots=roots,
                           summary=result.headline, boot_id=boot, driver=driver, verify=_verifier(target),
                           clock=clock)
    state, reason, ready = view(adv.ladder, boot)
    if adv.busy and not ready:
        reason += " (a verification is running in another process)"
    v = adv.verification
    return LadderVerdict(name, state, reason, ready, adv.ladder.since, "gate",
                         v.to_json() if v is not None else None)


def apply(result, verdict: LadderVerdict):
    """The gate's result with the ladder's word: a host that is not ready is blocked, the ladder's reason first
    (needs-inspection, or checks that pass but a verification that has not) — a failing check keeps its own
    root cause as the headline, which is the ladder's reason too."""
    from gpudoctor.gate import Blocker

    if verdict.ready or (not result.passed and verdict.state != INSPECT):
        return result
    if verdict.moved_by == "replay":  # not judged: a replay's ladder is unknown, never ready
        result.blockers.insert(0, Blocker(KEY, "unknown", verdict.reason, "gate this machine live (no --snapshot)",
                                          None, True))
        return result
    result.blockers.insert(0, Blocker(KEY, "fail", verdict.reason, HINT, None, True))
    return result


def store_for(path=None):
    from gpudoctor.recovery.store import RecoveryStore

    return RecoveryStore(path)
