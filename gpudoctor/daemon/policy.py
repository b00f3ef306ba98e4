"""The daemon's healing policy: which remedies it may apply unattended, and their budgets.

Read from the inventory's `policy:` (docs/daemon.md): `auto_apply` / `never_apply` remedy-id patterns
(never wins) and numbers under `budgets`. Nothing is allowed by default: a daemon without a policy only
watches and reports.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace

from gpudoctor.errors import ConfigError
from gpudoctor.log import get_logger

HOUR, DAY = 3600.0, 86400.0


@dataclass(frozen=True)
class Budget:
    """How often one remedy may be tried: caps per rolling hour (and day) and exponential backoff after failures."""

    max_attempts_per_hour: int = 3
    max_attempts_per_day: int | None = None
    backoff_s: float = 60.0
    backoff_factor: float = 2.0
    backoff_max_s: float = 3600.0

    def backoff_after(self, consecutive_failures: int) -> float:
        """Seconds to wait after the n-th consecutive failure (0 when there is none)."""
        if consecutive_failures <= 0:
            return 0.0
        return min(self.backoff_max_s, self.backoff_s * self.backoff_factor ** (consecutive_failures - 1))

    def windows(self) -> list[tuple[float, int]]:
        """(window seconds, max attempts) pairs that apply."""
        out = [(HOUR, self.max_attempts_per_hour)]
        if self.max_attempts_per_day is not None:
            out.append((DAY, self.max_attempts_per_day))
        return out


@dataclass(frozen=True)
class HealPolicy:
    """Allow/deny patterns, the budget every remedy gets, the tighter one of reboots, breaker settings."""

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    budget: Budget = field(default_factory=Budget)
    reboot_max_per_hour: int = 1
    reboot_max_per_day: int | None = None
    breaker_threshold: int = 3
    breaker_cooldown_s: float = 3600.0

    def allows(self, remedy_id: str) -> bool:
        if any(fnmatch.fnmatchcase(remedy_id, pat) for pat in self.deny):
            return False
        return any(fnmatch.fnmatchcase(remedy_id, pat) for pat in self.allow)

    def budget_for(self, remedy_id: str, reboot: bool = False) -> Budget:
        """The budget of one remedy; a remedy that reboots something is capped by the reboot limits."""
        b = self.budget
        if reboot:
            day = b.max_attempts_per_day
            if self.reboot_max_per_day is not None:
                day = self.reboot_max_per_day if day is None else min(day, self.reboot_max_per_day)
            b = replace(b, max_attempts_per_hour=min(b.max_attempts_per_hour, self.reboot_max_per_hour),
                        max_attempts_per_day=day)
        return b

    def with_allowed(self, extra) -> "HealPolicy":
        return replace(self, allow=tuple(dict.fromkeys([*self.allow, *extra])))


# policy.budgets names the daemon reads -> (field, kind); aliases map the inventory's names onto them.
_BUDGETS = {
    "max_changes_per_hour": ("budget.max_attempts_per_hour", int),
    "max_attempts_per_hour": ("budget.max_attempts_per_hour", int),
    "max_changes_per_day": ("budget.max_attempts_per_day", int),
    "backoff_s": ("budget.backoff_s", float),
    "backoff_factor": ("budget.backoff_factor", float),
    "backoff_max_s": ("budget.backoff_max_s", float),
    "max_reboots_per_hour": ("reboot_max_per_hour", int),
    "max_reboots_per_day": ("reboot_max_per_day", int),
    "breaker_threshold": ("breaker_threshold", int),
    "breaker_cooldown_s": ("breaker_cooldown_s", float),
}
BUDGET_NAMES = tuple(sorted(_BUDGETS))


def _patterns(policy: dict, key: str, path):
    vals = policy.get(key) or []
    if isinstance(vals, str) or not isinstance(vals, (list, tuple)) or not all(isinstance(v, str) and v for v in vals):
        raise ConfigError(f"policy.{key} must be a list of remedy-id patterns", path=path)
    return tuple(vals)


def parse_policy(policy, *, path: str | None = None) -> HealPolicy:
    """HealPolicy from the inventory's policy (a mapping, or an object with as_dict()); bad values raise ConfigError."""
    if policy is None:
        return HealPolicy()
    if hasattr(policy, "as_dict"):
        policy = policy.as_dict()
    if not isinstance(policy, dict):
        raise ConfigError("policy must be a mapping", path=path)
    allow, deny = _patterns(policy, "auto_apply", path), _patterns(policy, "never_apply", path)
    budgets = policy.get("budgets")
    budgets = {} if budgets is None else budgets
    if not isinstance(budgets, dict):
        raise ConfigError("policy.budgets must be a mapping of budget names to numbers", path=path)
    top: dict = {}
    bud: dict = {}
    for name, value in budgets.items():
        if name not in _BUDGETS:
            get_logger("gpudoctor.daemon").warning("daemon.budget_ignored", budget=name, known=list(BUDGET_NAMES))
            continue
        target, kind = _BUDGETS[name]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
        if ok and kind is int:
            ok = float(value).is_integer()
        if not ok:
            what = "an integer >= 0" if kind is int else "a number >= 0"
            raise ConfigError(f"policy.budgets.{name} must be {what}, got {value!r}", path=path)
        if name == "backoff_factor" and value < 1:
            raise ConfigError(f"policy.budgets.backoff_factor must be >= 1, got {value!r}", path=path)
        if name == "breaker_threshold" and value < 1:
            raise ConfigError("policy.budgets.breaker_threshold must be >= 1", path=path)
        if target.startswith("budget."):
            bud[target[7:]] = kind(value)
        else:
            top[target] = kind(value)
    return HealPolicy(allow=allow, deny=deny, budget=replace(Budget(), **bud), **top)
