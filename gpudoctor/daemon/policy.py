"""The daemon's healing policy: which remedies it may apply unattended, and their budgets.

Read from the inventory's `policy.daemon` mapping (docs/daemon.md shows it). Nothing is allowed by
default: a daemon without a policy only watches and reports.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace

from gpudoctor.errors import ConfigError


@dataclass(frozen=True)
class Budget:
    """How often one remedy may be tried: a cap per rolling hour and exponential backoff after failures."""

    max_attempts_per_hour: int = 3
    backoff_s: float = 60.0
    backoff_factor: float = 2.0
    backoff_max_s: float = 3600.0

    def backoff_after(self, consecutive_failures: int) -> float:
        """Seconds to wait after the n-th consecutive failure (0 when there is none)."""
        if consecutive_failures <= 0:
            return 0.0
        return min(self.backoff_max_s, self.backoff_s * self.backoff_factor ** (consecutive_failures - 1))


@dataclass(frozen=True)
class HealPolicy:
    """Allow-list (fnmatch patterns of remedy ids), default budget, per-remedy budgets, breaker settings."""

    allow: tuple[str, ...] = ()
    budget: Budget = field(default_factory=Budget)
    remedies: dict = field(default_factory=dict)  # remedy id -> Budget
    reboot_max_per_hour: int = 1
    breaker_threshold: int = 3
    breaker_cooldown_s: float = 3600.0

    def allows(self, remedy_id: str) -> bool:
        return any(fnmatch.fnmatchcase(remedy_id, pat) for pat in self.allow)

    def budget_for(self, remedy_id: str, reboot: bool = False) -> Budget:
        """The budget of one remedy; a remedy that reboots a container is capped by reboot_max_per_hour."""
        b = self.remedies.get(remedy_id, self.budget)
        if reboot and b.max_attempts_per_hour > self.reboot_max_per_hour:
            b = replace(b, max_attempts_per_hour=self.reboot_max_per_hour)
        return b

    def with_allowed(self, extra: tuple[str, ...] | list[str]) -> "HealPolicy":
        return replace(self, allow=tuple(dict.fromkeys([*self.allow, *extra])))


_BUDGET_KEYS = {"max_attempts_per_hour": int, "backoff_s": float, "backoff_factor": float, "backoff_max_s": float}
_TOP_KEYS = {"heal": list, "reboot_max_per_hour": int, "breaker_threshold": int, "breaker_cooldown_s": float,
             "remedies": dict, **_BUDGET_KEYS}


def _number(key: str, value, kind, where: str, path: str | None):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok or value < 0:
        raise ConfigError(f"{where}{key} must be a non-negative {'integer' if kind is int else 'number'}, got {value!r}",
                          path=path)
    if key == "backoff_factor" and value < 1:
        raise ConfigError(f"{where}backoff_factor must be >= 1, got {value!r}", path=path)
    return kind(value)


def _budget(d: dict, base: Budget, where: str, path: str | None) -> Budget:
    vals = {}
    for k, v in d.items():
        if k not in _BUDGET_KEYS:
            raise ConfigError(f"{where.rstrip('.')}: unknown key {k!r} (known: {', '.join(sorted(_BUDGET_KEYS))})",
                              path=path)
        vals[k] = _number(k, v, _BUDGET_KEYS[k], where, path)
    return replace(base, **vals)


def parse_policy(policy: dict | None, *, path: str | None = None) -> HealPolicy:
    """Build a HealPolicy from the inventory's `policy` mapping (its `daemon` key); bad values raise ConfigError."""
    if policy is None:
        return HealPolicy()
    if not isinstance(policy, dict):
        raise ConfigError("policy must be a mapping", path=path)
    d = policy.get("daemon")
    d = {} if d is None else d
    if not isinstance(d, dict):
        raise ConfigError("policy.daemon must be a mapping", path=path)
    where = "policy.daemon."
    for k, v in d.items():
        if k not in _TOP_KEYS:
            raise ConfigError(f"{where.rstrip('.')}: unknown key {k!r} (known: {', '.join(sorted(_TOP_KEYS))})",
                              path=path)
        if not isinstance(v, _TOP_KEYS[k]) and _TOP_KEYS[k] in (list, dict):
            raise ConfigError(f"{where}{k} must be a {'list' if _TOP_KEYS[k] is list else 'mapping'}", path=path)
    heal = d.get("heal", [])
    if not all(isinstance(x, str) and x for x in heal):
        raise ConfigError(f"{where}heal must list remedy ids (strings)", path=path)
    base = _budget({k: v for k, v in d.items() if k in _BUDGET_KEYS}, Budget(), where, path)
    per = {}
    for rid, bd in (d.get("remedies") or {}).items():
        if not isinstance(bd, dict):
            raise ConfigError(f"{where}remedies.{rid} must be a mapping", path=path)
        per[str(rid)] = _budget(bd, base, f"{where}remedies.{rid}.", path)
    extra = {k: _number(k, d[k], _TOP_KEYS[k], where, path)
             for k in ("reboot_max_per_hour", "breaker_threshold", "breaker_cooldown_s") if k in d}
    if extra.get("breaker_threshold", 1) < 1:
        raise ConfigError(f"{where}breaker_threshold must be >= 1", path=path)
    return HealPolicy(allow=tuple(heal), budget=base, remedies=per, **extra)
