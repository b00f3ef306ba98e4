"""The inventory's policy `recovery:` section: the clean window, the verification's retry backoff, recurrence."""

from __future__ import annotations

from dataclasses import fields

from gpudoctor.errors import ConfigError
from gpudoctor.recovery.ladder import RecoveryPolicy

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


def verify_policy_of(policy, *, path=None):
    """The VerifyPolicy of an inventory's policy (gpudoctor.inventory.Policy or a plain mapping; None: defaults)."""
    from gpudoctor.recovery.verify import parse_verify_policy

    if policy is None:
        return parse_verify_policy(None, path=path)
    if isinstance(policy, dict):
        return parse_verify_policy(policy.get("verify"), path=path)
    return parse_verify_policy(getattr(policy, "verify", None), path=path, lines=getattr(policy, "verify_lines", None))


def from_inventory(inventory) -> RecoveryPolicy:
    """The recovery policy of a loaded inventory (or the defaults without one)."""
    if inventory is None:
        return RecoveryPolicy()
    return from_policy(getattr(inventory, "policy", None), path=getattr(inventory, "path", None))
