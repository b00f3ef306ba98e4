"""Remedy budgets and the circuit breaker: pure bookkeeping over clock times, serialised into the state file."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.daemon.policy import DAY, HOUR, Budget


@dataclass
class RemedyLedger:
    """What happened to one remedy on one host: attempt times (last hour), failures in a row, next allowed time."""

    attempts: list[float] = field(default_factory=list)
    consecutive_failures: int = 0
    last_failure: float | None = None
    last_result: str | None = None  # ok | failed | ineffective
    total_attempts: int = 0

    def prune(self, now: float) -> None:
        """Forget attempts older than a day (the longest window) and any from the future (a clock jump)."""
        self.attempts = [t for t in self.attempts if now - t < DAY and t <= now]

    @staticmethod
    def _window_free_at(attempts, window: float, cap: int, now: float) -> float:
        inside = sorted(t for t in attempts if now - t < window)
        if len(inside) < cap:
            return now
        return inside[-cap] + window if cap > 0 else float("inf")

    def decide(self, budget: Budget, now: float) -> tuple[bool, str | None, float]:
        """(allowed, reason when not, retry_at). Reasons: 'disabled', 'hourly_cap', 'daily_cap', 'backoff'."""
        if budget.max_attempts_per_hour <= 0 or budget.max_attempts_per_day == 0:
            return False, "disabled", float("inf")
        self.prune(now)
        for window, cap in budget.windows():
            free_at = self._window_free_at(self.attempts, window, cap, now)
            if free_at > now:
                return False, "hourly_cap" if window == HOUR else "daily_cap", free_at
        if self.last_failure is not None and self.consecutive_failures:
            until = self.last_failure + budget.backoff_after(self.consecutive_failures)
            if now < until:
                return False, "backoff", until
        return True, None, now

    def record_attempt(self, now: float) -> None:
        self.attempts.append(now)
        self.total_attempts += 1

    def record_result(self, ok: bool, now: float, result: str | None = None) -> None:
        self.last_result = result or ("ok" if ok else "failed")
        if ok:
            self.consecutive_failures = 0
            self.last_failure = None
        else:
            self.consecutive_failures += 1
            self.last_failure = now

    def to_json(self) -> dict:
        return {"attempts": self.attempts, "consecutive_failures": self.consecutive_failures,
                "last_failure": self.last_failure, "last_result": self.last_result,
                "total_attempts": self.total_attempts}

    @classmethod
    def from_json(cls, d: dict) -> "RemedyLedger":
        return cls(attempts=[float(t) for t in d.get("attempts", [])],
                   consecutive_failures=int(d.get("consecutive_failures", 0)),
                   last_failure=d.get("last_failure"), last_result=d.get("last_result"),
                   total_attempts=int(d.get("total_attempts", 0)))


CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass
class Breaker:
    """Stops all healing on a host after `threshold` failed remedies in a row, for `cooldown_s`.

    After the cool-down one remedy is let through (half-open): success closes the breaker, failure opens it
    again for another cool-down. `reset()` closes it at once (SIGUSR2 or `gpudoctor daemon --reset-breaker`).
    """

    state: str = CLOSED
    consecutive_failures: int = 0
    opened_at: float | None = None
    times_opened: int = 0

    def allows(self, now: float, cooldown_s: float) -> bool:
        if self.state == OPEN and self.opened_at is not None and now >= self.opened_at + cooldown_s:
            self.state = HALF_OPEN
        return self.state != OPEN

    def reopens_at(self, cooldown_s: float) -> float | None:
        return None if self.state != OPEN or self.opened_at is None else self.opened_at + cooldown_s

    def record(self, ok: bool, now: float, threshold: int) -> bool:
        """Count one remedy result; True when this result opened the breaker."""
        if ok:
            self.state, self.consecutive_failures, self.opened_at = CLOSED, 0, None
            return False
        self.consecutive_failures += 1
        if self.state == HALF_OPEN or self.consecutive_failures >= threshold:
            was_open = self.state == OPEN
            self.state, self.opened_at = OPEN, now
            if not was_open:
                self.times_opened += 1
            return not was_open
        return False

    def reset(self) -> None:
        self.state, self.consecutive_failures, self.opened_at = CLOSED, 0, None

    def to_json(self) -> dict:
        return {"state": self.state, "consecutive_failures": self.consecutive_failures,
                "opened_at": self.opened_at, "times_opened": self.times_opened}

    @classmethod
    def from_json(cls, d: dict) -> "Breaker":
        state = d.get("state", CLOSED)
        if state not in (CLOSED, OPEN, HALF_OPEN):
            state = OPEN  # an unreadable breaker errs on the side of not healing
        return cls(state=state, consecutive_failures=int(d.get("consecutive_failures", 0)),
                   opened_at=d.get("opened_at"), times_opened=int(d.get("times_opened", 0)))
