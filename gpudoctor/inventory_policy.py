"""The inventory's policy `recovery:` section: the recovery ladder's clean window, its verification's retry backoff,
recurrence — parsed here, beside the inventory that validates it, below gpudoctor/recovery/ which uses it."""

from __future__ import annotations

from dataclasses import dataclass, fields

from gpudoctor.errors import ConfigError


@dataclass(frozen=True)
class RecoveryPolicy:
    """The inventory's policy `recovery:` section (parse_recovery_policy); the ladder (recovery/ladder.py) reads it."""

    clean_cycles: int = 1  # passing passive checks in a row before the verification may run
    clean_seconds: float = 0.0  # and this long since the first of them
    retry_s: float = 300.0  # after a failed verification, wait this long before the next one ...
    retry_factor: float = 2.0  # ... times this for every further failure ...
    retry_max_s: float = 3600.0  # ... at most this long
    recurrences: int = 2  # the same root cause coming back this many times within window_s: needs-inspection
    window_s: float = 86400.0

    def retry_after(self, failures: int) -> float:
        """Seconds to wait after the n-th failed verification in a row."""
        return min(self.retry_max_s, self.retry_s * self.retry_factor ** (failures - 1))


INT_KEYS = ("clean_cycles", "recurrences")
KEYS = tuple(f.name for f in fields(RecoveryPolicy))


def parse_recovery_policy(spec, *, path=None) -> RecoveryPolicy:
    """RecoveryPolicy from a mapping (None: the defaults); a bad key or value raises ConfigError naming it."""
    if spec is None:
        return RecoveryPolicy()
    if not isinstance(spec, dict):
        raise ConfigError("policy.recovery must be a mapping of " + ", ".join(KEYS), path=path)
    kw = {}
    for key, val in spec.items():
        if key not in KEYS:
            raise ConfigError(f"policy.recovery: unknown key {key!r} (known: {', '.join(KEYS)})", path=path)
        ok = isinstance(val, (int, float)) and not isinstance(val, bool) and 0 <= val < float("inf")
        if ok and key in INT_KEYS:
            ok = float(val).is_integer()
        if not ok:
            what = "an integer >= 0" if key in INT_KEYS else "a number >= 0"
            raise ConfigError(f"policy.recovery.{key} must be {what}, got {val!r}", path=path)
        kw[key] = int(val) if key in INT_KEYS else float(val)
    if kw.get("retry_factor", 1.0) < 1:
        raise ConfigError("policy.recovery.retry_factor must be >= 1", path=path)
    if kw.get("recurrences", 1) < 1:
        raise ConfigError("policy.recovery.recurrences must be >= 1", path=path)
    return RecoveryPolicy(**kw)


def from_policy(policy, *, path=None) -> RecoveryPolicy:
    """The recovery policy of an inventory's policy (gpudoctor.inventory.Policy or a plain mapping; None: defaults)."""
    if policy is None:
        return RecoveryPolicy()
    spec = policy.get("recovery") if isinstance(policy, dict) else getattr(policy, "recovery", None)
    return parse_recovery_policy(spec or None, path=path)


def from_inventory(inventory) -> RecoveryPolicy:
    """The recovery policy of a loaded inventory (or the defaults without one)."""
    if inventory is None:
        return RecoveryPolicy()
    return from_policy(getattr(inventory, "policy", None), path=getattr(inventory, "path", None))
